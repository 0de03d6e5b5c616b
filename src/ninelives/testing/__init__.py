"""A kill-test kit: drive the ``ninelives`` command as real processes and check
the five properties of a restart-resilient run.

Used by ninelives' own hard-kill suite and offered to users testing their own
plans and tools: :func:`kill_matrix` (:mod:`ninelives.testing.kit`) generates
every step x every crash point for a plan, and :mod:`ninelives.testing.plugin`
is the pytest plugin. Names load on first use, so the plugin, which pytest
imports in every session, stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .kit import KillKit, kill_matrix
    from .lab import Lab, Result, Snapshot, five_property_violations

__all__ = ["KillKit", "Lab", "Result", "Snapshot", "five_property_violations", "kill_matrix"]

_HOMES = {"KillKit": "kit", "kill_matrix": "kit"}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'ninelives.testing' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_HOMES.get(name, 'lab')}", __name__), name)
