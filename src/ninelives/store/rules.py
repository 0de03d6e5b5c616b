"""The domain rules every store applies the same way, whatever its SQL: what a
decision, a retry, a claim's recovery or a new task's rows come to.

Pure functions over :mod:`ninelives.models` records; the backends call them
inside their transactions.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..blobs import row_ref
from ..errors import CommitUnknown, InputError, TaskExists, TaskIdRemoved
from ..journal import dumps
from ..lineage import check_plan
from ..models import (
    APPROVAL_TOOL,
    EventKind,
    Step,
    StepStatus,
    Task,
    TaskStatus,
    TaskSummary,
    is_workflow,
)

if TYPE_CHECKING:
    from ..plan import Plan
    from .base import Appended, Decision


def decision_target(task: Task, idx: int, decision: Decision) -> TaskStatus:
    """The task's status after ``decision`` on step ``idx``, or :class:`InputError`
    when the task and step are not parked as the decision expects."""
    steps = {s.idx: s for s in task.steps}
    step = steps.get(idx)
    want = decision.expect.value
    if task.status.value != want or step is None or step.status is not decision.expect:
        found = "no such step" if step is None else f"step {idx} is {step.status.value}"
        raise InputError(
            f"task {task.id!r} is {task.status.value} ({found}): only a {want} step of a "
            f"{want} task can be decided this way"
        )
    check_plan(task)  # a decision moves the task on, to a run that would refuse it
    return TaskStatus.FAILED if decision.status is StepStatus.FAILED else TaskStatus.PENDING


#: The event that parks a step as each status.
PARK_EVENT = {
    StepStatus.BLOCKED: EventKind.STEP_BLOCKED,
    StepStatus.WAITING: EventKind.STEP_WAITING,
}

#: The reason a step of on_unknown ``refuse`` is parked (``step_blocked`` data).
REFUSE_REASON = (
    "found running after its process died: whether its effect happened is unknown, "
    "and its tool runs it at most once (on_unknown refuse)"
)


def recover_unknown(
    task: Task, recovered: Sequence[int], on_unknown: Callable[[Step], str] | None
) -> dict[int, str]:
    """The ``on_unknown`` mode of each step found ``running`` at a claim (``rerun``
    when the runner gave no ``on_unknown``): what the claim does with it."""
    if on_unknown is None:
        return dict.fromkeys(recovered, "rerun")
    steps = {s.idx: s for s in task.steps}
    return {idx: on_unknown(steps[idx]) for idx in recovered}


def recovered_by(data: str) -> list[Any]:
    """The steps a ``run_started`` event's ``data`` says its claim found running
    (none when the text is not the object the runner wrote)."""
    try:
        found = json.loads(data).get("recovered")
    except (ValueError, TypeError, AttributeError):
        return []
    return found if isinstance(found, list) else []


def first_pending_step(task: Task) -> Step | None:
    """The step a claim starts with the run (``start_first``), or None: the first
    pending one of a pending or running task, unless it is an approval (which
    parks, never runs) or the task is a workflow's (its code starts its own
    steps once it has called them by name: see :mod:`ninelives.durable`).

    Decided here in Python, on the task the claim read, so the claim needs no
    query of its own; and ``is_workflow`` is case-sensitive, as the goal's
    prefix is (SQL's ``LIKE`` is not, on SQLite).
    """
    if task.status not in (TaskStatus.PENDING, TaskStatus.RUNNING) or is_workflow(task.goal):
        return None
    step = next((s for s in task.steps if s.status is StepStatus.PENDING), None)
    if step is None or step.tool == APPROVAL_TOOL:
        return None
    return step


def retry_target(task: Task, step: int | None) -> int:
    """The index of the step that :meth:`Store.retry_task` puts back to ``pending``,
    or :class:`InputError` when the task cannot be retried as asked."""
    failed = [s.idx for s in task.steps if s.status is StepStatus.FAILED]
    if task.status is not TaskStatus.FAILED:
        raise InputError(
            f"task {task.id!r} is {task.status.value}, not failed: only a failed task is retried"
        )
    if not failed:
        raise InputError(
            f"task {task.id!r} failed with no failed step to run again; "
            f"'ninelives fork {task.id} NEW_ID --from STEP' replays it under a new id"
        )
    if step is not None and step != failed[0]:
        raise InputError(f"step {step} of task {task.id!r} has not failed (step {failed[0]} has)")
    check_plan(task)  # "run resumes it" would be false: a run refuses an edited plan
    return failed[0]


def appended_rows(task_id: str, start: int, append: Sequence[Appended]) -> list[dict[str, Any]]:
    """The ``insert_step`` parameters of the steps a turn appends at ``start`` on."""
    return [
        {"id": task_id, "idx": idx, "tool": new[0], "input": new[1],
         "policy": new[2] if len(new) == 3 else None}
        for idx, new in enumerate(append, start=start)
    ]  # fmt: skip


def step_rows(task_id: str, plan: Plan) -> list[dict[str, Any]]:
    """The ``insert_step`` parameters of a new task's steps, the same on both stores."""
    return [
        {
            "id": task_id,
            "idx": i,
            "tool": s.tool,
            "input": dumps(s.input),
            "policy": dumps(s.policy) if s.policy else None,
        }
        for i, s in enumerate(plan.steps)
    ]


def task_exists(task_id: str, taken: Sequence[Any]) -> TaskExists | TaskIdRemoved:
    """The error for a create of ``task_id`` when the row ``taken`` of the
    ``task_id_taken`` query names an id equal but for case: ``(id, None)`` for a
    stored task, ``(id, removed_at)`` for one that gc removed.

    Ids are unique regardless of case: on a case-insensitive file system
    ``Demo`` and ``demo`` would publish to one artifact name. And an id is
    never used twice: a new task would reuse a removed one's idempotency keys.
    """
    stored, removed_at = str(taken[0]), taken[1]
    if removed_at is not None:
        import time

        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(removed_at)))
        shown = "" if stored == task_id else f" (as {stored!r})"
        return TaskIdRemoved(
            f"task id {task_id!r} was used by a task that gc removed{shown} at {when}; "
            f"an id is never used again (its idempotency keys {task_id}-N may name that "
            "task's effects): use another task id",
            removed_at=float(removed_at),
        )
    if stored == task_id:
        return TaskExists(f"task {task_id!r} already exists")
    return TaskExists(
        f"task {task_id!r} already exists as {stored!r} (task ids are unique regardless of case)"
    )


def finished_data(tool: str, output: str) -> dict[str, Any]:
    """The data of a ``step_finished`` event: the tool, and the reference when the
    output is stored as a blob (so that ``export`` shows it)."""
    ref = row_ref(output)
    if ref is None:
        return {"tool": tool}
    return {"tool": tool, "blob": {"sha256": ref.sha256, "size": ref.size}}


def recovery_limit_reason(idx: int, count: int, limit: int | None) -> str:
    """The ``task_failed`` reason when step ``idx`` reached the recovery limit."""
    return (
        f"step {idx} was found running after its process died {count} times "
        f"(limit {limit}, NINELIVES_MAX_RECOVERIES): it is not run again; "
        "a step that kills its process every time (out of memory, a crash) "
        "would otherwise be retried forever"
    )


def unknown_outcome(what: str, why: str) -> CommitUnknown:
    """The error of a commit whose outcome is unknown (``what``: "write to DB")."""
    return CommitUnknown(
        f"{what} failed ({why}); its outcome is unknown, stopping now: the next run recovers",
        failed=f"{what} failed ({why})",
    )


def newest_first(found: list[TaskSummary], limit: int) -> list[TaskSummary]:
    """The ``limit`` newest of ``found``, ordered as the page queries order them."""
    return sorted(found, key=lambda s: (s.created_at, s.id), reverse=True)[:limit]
