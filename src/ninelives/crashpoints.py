"""Named crash points: where ``AGENT_CRASH_AT=POINT:IDX`` SIGKILLs the process.

A crash point is a named boundary in the runtime. Tests set ``AGENT_CRASH_AT``
to kill the process exactly there, instead of sleeping and hoping. Every point
is registered in :data:`POINTS`, so a test can check that the suite exercises
each one.

``NINELIVES_CRASH_PAUSE=SECONDS`` makes the process sleep at every point, so
that kills sent at random moments from outside (``ninelives torture``) land
between every pair of boundaries rather than mostly in interpreter start-up.

An in-process simulation can route every point to a handler of its own with
:func:`set_handler` (which then decides, say, to raise instead of dying); with
no handler set, only ``AGENT_CRASH_AT`` acts.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

#: Every crash point, with the boundary it stands for.
POINTS: dict[str, str] = {
    "before_effect": "after the step's `running` commit, before the tool runs",
    "after_effect": "after the tool returned, before the `done` commit",
    "after_commit": "after the step's `done` commit",
    "blob_before_reference": "an output over the blob threshold stored as a blob, its "
    "reference not yet committed",
    "artifact_before_link": "write_artifact: temp file written and fsynced, not yet linked",
    "artifact_before_dirsync": "write_artifact: final name linked, folder not yet fsynced",
    "create_before_commit": "create: task, steps and task_created written, not committed",
    "recovery_before_commit": "run start: steps recovered and run_started written, not committed",
    "migration_before_commit": "schema migration applied, not committed",
    "migration_statement": "schema migration IDX: a statement of it applied, not committed",
    "error_before_commit": "the tool raised: step_error (and task_failed) written, not committed",
    "checkpoint_before_commit": "ctx.checkpoint: progress and step_progress written, not committed",
    "after_recovery": "run start: recovery committed, orphan temp files not yet removed",
    "before_task_done": "run start found no pending step: task_done not yet committed",
    "probe_answered": "a step left running was probed: the answer known, nothing yet written",
    "settle_before_commit": "the probe's answer (reconciled, rerun or blocked) written, "
    "not committed",
    "decision_before_commit": "resolve/approve: the person's decision written, not committed",
    "gc_before_commit": "gc: a batch of tasks, their steps and journal deleted, not committed",
}

#: Called as ``handler(point, step)`` at every crash point when set.
Handler = Callable[[str, int | None], None]
_handler: Handler | None = None

#: ``AGENT_CRASH_AT`` parsed (None: unset) and ``NINELIVES_CRASH_PAUSE``, read from
#: the environment once, at the first point a process reaches: a run passes a
#: dozen points per task, and they are test hooks set before a process starts.
_env: tuple[tuple[str, int | None] | None, str] | None = None


def parse(value: str) -> tuple[str, int | None]:
    """Parse ``POINT`` or ``POINT:IDX``; raise ValueError for an unknown point."""
    point, sep, idx = value.partition(":")
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r} (known: {', '.join(POINTS)})")
    if not sep:
        return point, None
    if not (idx.isascii() and idx.isdigit()):  # not "\u0663" (3) nor "\u00b2"
        raise ValueError(f"crash point step must be a number, got {idx!r}")
    return point, int(idx)


def crash(point: str, step: int | None = None) -> None:
    """SIGKILL this process if ``AGENT_CRASH_AT`` names this point (and step).

    ``POINT`` alone matches every step; ``POINT:IDX`` matches step IDX only.
    With a handler set (:func:`set_handler`), the handler is called instead.
    """
    global _env
    if _handler is not None:
        _handler(point, step)
        return
    if _env is None:
        value = os.environ.get("AGENT_CRASH_AT", "")
        _env = (parse(value) if value else None, os.environ.get("NINELIVES_CRASH_PAUSE", ""))
    target, pause = _env
    if pause:
        _pause(pause)
    if target is None:
        return
    name, idx = target
    if name == point and (idx is None or idx == step):
        os.kill(os.getpid(), signal.SIGKILL)


def set_handler(handler: Handler | None) -> Handler | None:
    """Route every crash point to ``handler(point, step)``; None restores the default.

    For in-process simulations: the handler may raise (a ``BaseException``
    that no ``except Exception`` swallows) to stand for the process dying
    there. Returns the handler that was set before.
    """
    global _handler
    previous, _handler = _handler, handler
    return previous


def _pause(value: str) -> None:
    import time

    try:
        seconds = float(value)
    except ValueError:
        return  # a test hook: a malformed value pauses nothing
    if 0 < seconds <= 60:
        time.sleep(seconds)
