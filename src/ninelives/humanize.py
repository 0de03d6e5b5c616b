"""Stored text, ages and durations as people read them: the runtime's log lines,
the CLI's tables and progress bar, the web view and the report all show them
this way.

A leaf: the standard library only, and none of it imported until used.
"""

from __future__ import annotations

from typing import Any

# Characters that a terminal acts on instead of showing: C0 and C1 controls
# (ESC, CSI, OSC, "\r", "\n"), DEL, and the bidirectional and line-separator
# formats that reorder what is shown; and lone surrogates (undecodable bytes of
# a file name or argument), which a UTF-8 stream cannot write at all. Stored
# text (a plan's goal, a step's name, a tool's output or error, a file name) is
# data: in a human view it is escaped. A page lays out newlines and tabs itself
# and escapes the rest the same way: a browser reorders text too.
_FORMATS = "\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
#: The characters :func:`visible` escapes, as a regular expression's class.
UNSAFE = f"[\x00-\x1f\x7f-\x9f{_FORMATS}]"
_UNSAFE_IN_PAGE = f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_FORMATS}]"
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(match: Any) -> str:
    char = str(match.group())
    return _NAMED.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def visible(text: str) -> str:
    """``text`` with every character a terminal would act on escaped (``\\x1b``, ``\\n``)."""
    import re

    return re.sub(UNSAFE, _escape_char, text)


def html_text(value: object) -> str:
    """``str(value)`` for an HTML page: markup escaped, and every character that
    :func:`visible` escapes but a newline and a tab (a NUL, a reordering format)."""
    import html
    import re

    return html.escape(re.sub(_UNSAFE_IN_PAGE, _escape_char, str(value)), quote=True)


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
