"""What a workflow's calls are checked for before a step starts, and what a
step records of its arguments (see :mod:`ninelives.replay`): each check raises
having written nothing, so the task is left for fixed code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .durable import StepFunction, is_async_def
from .errors import PlanError, WorkflowError


def refuse_unrunnable(task_id: str, idx: int, name: str, fn: Any, *, sync: bool) -> None:
    """:class:`WorkflowError` (exit 12, nothing written) for a step that no attempt
    can run, so retrying it would only fail the task: ``fn`` is not callable (a
    name or None where the function goes), or is an ``async def`` called from a
    sync workflow, which cannot await it (each attempt stored a coroutine that
    never ran as its error)."""
    target = fn.fn if isinstance(fn, StepFunction) else fn
    if not callable(target):
        raise WorkflowError(
            f"task {task_id!r} step {idx} ({name!r}): its function, a "
            f"{type(target).__name__!r} object, is not callable; nothing was written: "
            "call ctx.step(name, fn, *args, **kwargs)"
        )
    if sync and is_async_def(target):
        raise WorkflowError(
            f"task {task_id!r} step {idx} ({name!r}) is an async def, which a sync workflow "
            "cannot await; nothing was written: make the workflow an async def and await "
            "the step, or the step a plain def"
        )


def discard(awaitable: Any) -> None:
    """Close a coroutine nobody will await: Python would warn on stderr about it."""
    close = getattr(awaitable, "close", None)
    if callable(close):
        close()


def sleep_seconds(value: Any) -> float:
    """``ctx.sleep``'s seconds: a number from 0 to a year, else :class:`PlanError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PlanError(f"ctx.sleep needs a number of seconds, got {value!r}")
    if not 0 <= value <= 31_536_000:  # also refuses NaN
        raise PlanError(f"ctx.sleep needs 0 to 31536000 seconds, got {value!r}")
    return float(value)


def storable_text(text: str) -> bool:
    """False for text no store keeps as text: a NUL (PostgreSQL refuses it) or a
    lone surrogate (not valid UTF-8)."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def step_input(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """A step's stored input and its JSON text: its arguments, or ``{}`` when JSON
    cannot hold them (any Python object may be passed to a step) or they are
    larger than a whole plan may be. They are recorded for people to read
    (status, the web view), never replayed: a step called in a loop with a large
    value would otherwise store it again on every call."""
    if not args and not kwargs:
        return {}, "{}"
    from .journal import storable
    from .plan import MAX_PLAN_BYTES

    given = {"args": list(args), "kwargs": dict(kwargs)}
    try:
        text = storable(given, "the step arguments")
    except ValueError:
        return {}, "{}"
    if len(text) > MAX_PLAN_BYTES // 4 and len(text.encode("utf-8")) > MAX_PLAN_BYTES:
        return {}, "{}"
    return given, text
