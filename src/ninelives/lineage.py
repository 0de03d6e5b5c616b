"""Cancel, fork and plan integrity: the rules both stores apply (pure, no I/O).

* **Plan integrity.** :func:`plan_digest` is a SHA-256 chain over the canonical
  plan as the runner executes it: the goal, then each step's index, tool, input
  and policy, in index order, each as :func:`ninelives.journal.dumps` text.
  Stored at create (and at fork) in ``tasks.plan_sha256``; an agent turn that
  appends steps extends the chain (:func:`extend_digest`) in the transaction
  that appends them, so appended steps are covered too. ``run``, workers and
  ``verify`` refuse a task whose rows no longer hash to it
  (:class:`~ninelives.errors.PlanTampered`, exit 5). The policy is covered: a
  hand edit turning ``on_unknown`` ``refuse`` into ``rerun``, or raising
  ``max_attempts``, changes what runs as surely as an edited input does.
  Tasks without a stored digest (older versions) are not checked.
* **Cancel.** :func:`cancel_allowed`: every status but ``done`` can be
  cancelled; cancelling a cancelled task changes nothing.
* **Fork.** :func:`fork_steps`: the steps a fork of a task from step ``k``
  starts with.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import InputError, PlanTampered, TaskCancelled
from .journal import dumps, storable
from .models import Step, StepStatus, Task, TaskStatus, is_workflow
from .version import __version__

#: Labels the chain, so that a digest of another kind can never match one of ours.
_CHAIN = "ninelives-plan-v1"
#: Longest ``--reason`` a cancel journals (and ``--note`` an approval), in characters.
MAX_REASON_CHARS = 1000


def _link(digest: str, idx: int, tool: str, given: Any, policy: Any) -> str:
    text = dumps([idx, tool, given, policy or None])
    return hashlib.sha256(f"{digest}\n{text}".encode()).hexdigest()


def extend_digest(digest: str, start: int, steps: Iterable[tuple[str, Any, Any]]) -> str:
    """``digest`` carried over ``steps`` ``(tool, input, policy)`` at indexes
    ``start, start + 1, ...``: what a task's digest becomes when they are appended."""
    for idx, (tool, given, policy) in enumerate(steps, start=start):
        digest = _link(digest, idx, tool, given, policy)
    return digest


def plan_digest(goal: str, steps: Iterable[tuple[str, Any, Any]]) -> str:
    """The SHA-256 (hex) of a plan: its goal and its steps ``(tool, input, policy)``
    in index order. The one place the canonical form is defined."""
    start = hashlib.sha256(dumps([_CHAIN, goal]).encode()).hexdigest()
    return extend_digest(start, 0, steps)


def task_digest(task: Task) -> str:
    """:func:`plan_digest` of a stored task's goal and steps, as read back."""
    return plan_digest(task.goal, ((s.tool, s.input, s.policy) for s in task.steps))


def check_plan(task: Task) -> None:
    """Raise :class:`~ninelives.errors.PlanTampered` when the task's stored goal or
    steps no longer match its recorded digest; a task without one passes."""
    if task.plan_sha256 is None or task_digest(task) == task.plan_sha256:
        return
    raise PlanTampered(
        f"task {task.id!r} was changed after it was created: its stored goal or steps no "
        "longer match the SHA-256 recorded at create, so it is not run (nothing written); "
        "restore the rows, or create a new task from the plan",
        task_id=task.id,
    )


def check_reason(reason: str | None, what: str = "--reason") -> str | None:
    """``reason`` if a journal can keep it (standard text, at most
    :data:`MAX_REASON_CHARS` characters, no NUL), else :class:`InputError`
    naming it as ``what`` (a cancel's ``--reason``, an approval's ``--note``)."""
    if reason is None:
        return None
    if not isinstance(reason, str):
        raise InputError(f"{what} must be text, got {reason!r}")
    if len(reason) > MAX_REASON_CHARS or "\x00" in reason:
        raise InputError(f"{what} must be at most {MAX_REASON_CHARS} characters, without NUL")
    try:
        storable(reason, what)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    return reason


def cancel_allowed(task: Task) -> bool:
    """True when a cancel must write (the task is pending, running, failed,
    blocked or waiting); False for an already cancelled task (a no-op);
    :class:`InputError` for a done task (there is nothing left to cancel)."""
    if task.status is TaskStatus.DONE:
        raise InputError(f"task {task.id!r} is done: there is nothing left to cancel")
    return task.status is not TaskStatus.CANCELLED


def fork_steps(source: Task, start: int, appended_by: Mapping[int, int]) -> list[Step]:
    """The steps a fork of ``source`` from step ``start`` begins with.

    Steps before ``start`` are copied ``done`` with their outputs (attempts 0:
    the fork ran none of them); the rest are ``pending`` with their inputs and
    policies. ``appended_by`` maps each appended step to the agent turn that
    appended it (``step_appended``'s ``by``): a step appended by a turn at or
    after ``start`` is left out, since that turn runs again in the fork and
    appends what its new reply asks for. Raises :class:`InputError` unless
    ``start`` is one of the source's steps (or, for a workflow task, one past
    the last) and every step before it is done.
    """
    count = len(source.steps)
    # A workflow task's steps are those its code reached: a fork from one past
    # the last keeps every committed step and runs the code on from there (after
    # a cancel, the one fork that runs no done step's effect again).
    workflow = is_workflow(source.goal)
    if not 0 <= start < count + workflow:
        if workflow:
            raise InputError(
                f"--from {start}: task {source.id!r} has steps 0-{count - 1}; --from {count} "
                "keeps them all and runs the workflow on from there"
                if count
                else f"--from {start}: task {source.id!r} has no steps yet: --from 0 runs it"
            )
        raise InputError(
            f"--from {start}: task {source.id!r} has steps 0-{count - 1}"
            if count
            else f"task {source.id!r} has no steps to fork from"
        )
    undone = [s.idx for s in source.steps[:start] if s.status is not StepStatus.DONE]
    if undone:
        raise InputError(
            f"task {source.id!r} cannot be forked from step {start}: step {undone[0]} before "
            "it is not done (a fork reuses only committed outputs)"
        )
    kept: list[Step] = []
    for step in source.steps:
        by = appended_by.get(step.idx)
        if step.idx >= start and by is not None and by >= start:
            continue
        copied = step.idx < start
        kept.append(
            step._replace(
                status=StepStatus.DONE if copied else StepStatus.PENDING,
                output=step.output if copied else None,
                attempts=0,
                progress=None,
                not_before=None,
            )
        )
    # Turns append at the end, so what is left out is a tail; a gap would mean
    # a journal that does not match its steps, and a fork would renumber them.
    if [s.idx for s in kept] != list(range(len(kept))):
        raise InputError(
            f"task {source.id!r} cannot be forked from step {start}: its appended steps "
            "do not follow the turns that appended them (see 'ninelives verify')"
        )
    return kept


def started_data(tool: str, attempt: int, tool_version: str | None = None) -> dict[str, Any]:
    """The data of a ``step_started``: the tool and attempt, the ninelives
    version running it and, when the tool declares one, the tool's version."""
    data: dict[str, Any] = {"tool": tool, "attempt": attempt, "ninelives": __version__}
    if tool_version is not None:
        data["tool_version"] = tool_version
    return data


def cancelled(task_id: str) -> TaskCancelled:
    """What a runner raises when it finds its task cancelled (exit 9)."""
    return TaskCancelled(
        f"task {task_id!r} was cancelled: it is not run again (its committed steps stand; "
        f"'ninelives fork {task_id} NEW_ID --from STEP' replays it under a new id)"
    )


def appended_turns(rows: Iterable[tuple[int | None, str | None]]) -> dict[int, int]:
    """``step -> turn that appended it`` from ``appended_by`` rows ``(step_idx, data)``."""
    import json

    found: dict[int, int] = {}
    for idx, data in rows:
        try:
            by = json.loads(data or "{}").get("by")
        except (ValueError, AttributeError):
            by = None
        if idx is not None and isinstance(by, int):
            found[idx] = by
    return found


def appended_digest(
    stored: str | None, start: int, append: Iterable[tuple[str, str] | tuple[str, str, str | None]]
) -> str | None:
    """A task's digest once ``append`` (``(tool, input JSON[, policy JSON or None])``)
    is added at ``start``; None when the task has none (older versions)."""
    import json

    if stored is None:
        return None
    steps = (
        (new[0], json.loads(new[1]), json.loads(new[2]) if len(new) == 3 and new[2] else None)
        for new in append
    )
    return extend_digest(stored, start, steps)
