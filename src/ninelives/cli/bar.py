"""The live progress bar of ``run`` and ``worker`` on a terminal.

A tool that checkpoints progress shaped ``{"done": N, "total": M}`` (two
integers, ``M`` > 0; other keys beside them are fine) gets a bar on one line
of stderr, redrawn in place with a carriage return::

    t: step 1 count [########............] 2/5  0.3 s

``{"done": N}`` alone shows the count; any other shape shows nothing. The
bar is drawn only when stderr is a terminal and ``-q`` was not given, at most
ten times a second, and it is erased before the next progress line (the
step's ``done`` line replaces it). Through a pipe the runtime gets no
progress callback at all, so the output and its cost are as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from ..humanize import duration
from ..models import StepProgress

_WIDTH = 20  # cells of the bar itself
_INTERVAL = 0.1  # seconds between redraws: ten a second at most
_ERASE = "\r\x1b[K"  # back to column 0, clear to the end of the line


def counts(progress: Any) -> tuple[int, int | None] | None:
    """``(done, total)`` of a progress value following the convention, ``total``
    None when only ``done`` is given; None for any other shape."""
    if not isinstance(progress, dict):
        return None
    done, total = _count(progress.get("done")), _count(progress.get("total"))
    if done is None:
        return None
    return done, total if total else None


def _count(value: Any) -> int | None:
    # bool is an int subclass: {"done": true} is not a count.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def render(update: StepProgress, clean: Callable[[str], str]) -> str | None:
    """The bar's text for ``update`` (``clean`` escapes stored names), or None."""
    shape = counts(update.progress)
    if shape is None:
        return None
    done, total = shape
    head = clean(f"{update.task_id}: step {update.step} {update.tool}")
    if total is None:
        return f"{head} {done} done  {duration(update.elapsed)}"
    filled = _WIDTH * min(done, total) // total
    bar = "#" * filled + "." * (_WIDTH - filled)
    return f"{head} [{bar}] {done}/{total}  {duration(update.elapsed)}"


class TerminalBar:
    """One bar line on ``stream`` (a terminal), shared by every thread that
    reports: the latest update wins. Writes are best effort, like the lines."""

    def __init__(
        self,
        stream: TextIO,
        clean: Callable[[str], str],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = stream
        self._clean = clean
        self._clock = clock
        self._lock = threading.Lock()
        self._shown = False
        self._drawn_at = float("-inf")

    def update(self, update: StepProgress) -> None:
        """Redraw the bar for ``update``, unless one was drawn under 0.1 s ago."""
        now = self._clock()
        with self._lock:
            if now - self._drawn_at < _INTERVAL:
                return
            text = render(update, self._clean)
            if text is None:
                return
            columns = _columns(self._stream)
            if len(text) >= columns:  # a wrapped line cannot be redrawn in place
                text = text[: max(columns - 2, 0)] + "…"
            self._write(_ERASE + text)
            self._shown = True
            self._drawn_at = now

    def above(self, emit: Callable[[], None]) -> None:
        """Erase the bar, if one is shown, and call ``emit`` to print a line in its
        place; under the bar's lock, so no redraw lands in the middle of the line."""
        with self._lock:
            if self._shown:
                self._write(_ERASE)
                self._shown = False
            # The next step's first update is drawn at once.
            self._drawn_at = float("-inf")
            emit()

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            pass


def terminal_bar(stream: TextIO | None, clean: Callable[[str], str]) -> TerminalBar | None:
    """A bar on ``stream`` if it is a terminal that can redraw a line, else None."""
    import os

    if stream is None or os.environ.get("TERM") == "dumb":  # no cursor control
        return None
    try:
        return TerminalBar(stream, clean) if stream.isatty() else None
    except (OSError, ValueError):
        return None


def _columns(stream: TextIO) -> int:
    import os

    try:
        return os.get_terminal_size(stream.fileno()).columns or 80
    except (OSError, ValueError, AttributeError):
        return 80
