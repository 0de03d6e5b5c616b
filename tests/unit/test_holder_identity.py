"""The rule that lets ``run`` take a PostgreSQL lease over early: its holder's
process must be provably gone from this machine and PID namespace."""

from __future__ import annotations

import os
import subprocess
import sys

from ninelives.store.postgres.housekeeping import holder_dead_here, host_identity


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # reaped: the pid names no process now
    return child.pid


def test_a_reaped_holder_of_this_host_is_dead() -> None:
    here = host_identity()
    assert here is not None  # the tests run on Linux
    assert holder_dead_here(f"h/{_dead_pid()}/run/{here}", here)


def test_a_live_holder_is_not_dead() -> None:
    here = host_identity()
    assert not holder_dead_here(f"h/{os.getpid()}/run/{here}", here)


def test_without_a_matching_identity_no_holder_is_dead() -> None:
    here = host_identity()
    pid = _dead_pid()
    assert not holder_dead_here(f"h/{pid}/run/0123456789abcdef", here)  # another host
    assert not holder_dead_here(f"h/{pid}/run", here)  # an older version's owner
    assert not holder_dead_here(f"h/{pid}/run/{here}", None)  # no identity here
    assert not holder_dead_here(None, here)
    assert not holder_dead_here(f"h/x{pid}/run/{here}", here)
