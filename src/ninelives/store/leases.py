"""Lease settings, and the test-only switches that turn fencing or the heartbeat
off for one database: the same for every backend."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import InputError

DEFAULT_LEASE = 30.0

#: The value the NINELIVES_TEST_DISABLE_* switches must hold, followed by the database URL.
_UNFENCED_PREFIX = "unsafe-test-only:"


def lease_settings(
    env: Mapping[str, str] | None = None,
    *,
    lease: float | None = None,
    heartbeat: float | None = None,
) -> tuple[float, float]:
    """``(lease, heartbeat)`` in seconds: the arguments, else ``NINELIVES_LEASE`` and
    ``NINELIVES_HEARTBEAT``, else 30 s and a third of the lease.

    The heartbeat must be shorter than the lease; bad values are an :class:`InputError`.
    """
    env = os.environ if env is None else env

    def seconds(name: str, given: float | None, default: float) -> float:
        # Here, not at import: status and export open a store without the settings.
        from ..settings import env_number

        if given is None:
            return env_number(env, name, default, float, minimum=0.05, maximum=86400)
        value = float(given)
        if not 0.05 <= value <= 86400:  # also refuses NaN
            option = f"--{name.removeprefix('NINELIVES_').lower()}"
            raise InputError(f"{option} must be 0.05-86400 seconds, got {value!r}")
        return value

    lease_s = seconds("NINELIVES_LEASE", lease, DEFAULT_LEASE)
    beat = seconds("NINELIVES_HEARTBEAT", heartbeat, lease_s / 3)
    if beat >= lease_s:
        raise InputError(
            f"the heartbeat ({beat:g} s) must be shorter than the lease ({lease_s:g} s)"
        )
    return lease_s, beat


def fencing_disabled(url: str, env: Mapping[str, str] | None = None) -> bool:
    """True only in the negative-control tests that prove fencing is what protects.

    TEST-ONLY. ``NINELIVES_TEST_DISABLE_FENCING`` must hold exactly
    ``unsafe-test-only:`` followed by this very database URL (or SQLite path):
    a stray ``=1`` or a value exported for another database does nothing, so
    the switch cannot be thrown by accident. When it is, the store says so on
    stderr each time it opens.
    """
    env = os.environ if env is None else env
    return env.get("NINELIVES_TEST_DISABLE_FENCING", "") == _UNFENCED_PREFIX + url


def heartbeat_disabled(url: str, env: Mapping[str, str] | None = None) -> bool:
    """True only in the negative-control tests that prove the heartbeat is what
    keeps a lease through a step longer than the lease.

    TEST-ONLY, thrown exactly like :func:`fencing_disabled`:
    ``NINELIVES_TEST_DISABLE_HEARTBEAT`` must hold ``unsafe-test-only:`` followed
    by this very database URL. Commits and the check before each tool still
    renew; only the renewals between them stop.
    """
    env = os.environ if env is None else env
    return env.get("NINELIVES_TEST_DISABLE_HEARTBEAT", "") == _UNFENCED_PREFIX + url
