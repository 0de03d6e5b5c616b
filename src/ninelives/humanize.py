"""Ages and durations as people read them: the runtime's log lines, the CLI's
tables and progress bar, the web view and the report all show time this way.

A leaf: the standard library only, and none of it imported.
"""

from __future__ import annotations


def duration(seconds: float) -> str:
    """How long something took: ``3.2 ms``, ``45 ms``, ``1.2 s``, ``4 min``, ``2.5 h``."""
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def age(seconds: float) -> str:
    """How long ago, in one whole unit: ``45s``, ``12m``, ``3h``, ``2d`` (never negative)."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(int(seconds), 0)}s"
