"""A kill-test kit: drive the ``ninelives`` command as real processes and check
the five properties of a restart-resilient run.

Used by ninelives' own hard-kill suite and offered to users testing their own
plans and tools (see :mod:`ninelives.testing.plugin` for the pytest plugin).
"""

from __future__ import annotations

from .lab import Lab, Result, Snapshot, five_property_violations

__all__ = ["Lab", "Result", "Snapshot", "five_property_violations"]
