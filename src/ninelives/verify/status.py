"""What each journal event leaves a step or a task: the status a journal implies.

:func:`status_after` reads one step-level event; :func:`task_status_from`
replays a whole journal to the task status it must end in. The checks compare
these with the statuses the store holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..journal import CLOSING_KINDS
from ..models import Event, EventKind, StepStatus, TaskStatus

#: The step status each step-level event leaves behind. Kinds not listed here
#: (added by later versions) do not change what a step is expected to be.
STEP_STATUS_AFTER: dict[str, StepStatus] = {
    EventKind.STEP_STARTED.value: StepStatus.RUNNING,
    EventKind.STEP_FINISHED.value: StepStatus.DONE,
    EventKind.STEP_RECOVERED.value: StepStatus.PENDING,
    EventKind.STEP_ERROR.value: StepStatus.PENDING,
    EventKind.TASK_FAILED.value: StepStatus.FAILED,
    EventKind.TASK_RETRIED.value: StepStatus.PENDING,
    EventKind.STEP_APPENDED.value: StepStatus.PENDING,
    EventKind.STEP_RECONCILED.value: StepStatus.DONE,
    EventKind.STEP_BLOCKED.value: StepStatus.BLOCKED,
    EventKind.STEP_WAITING.value: StepStatus.WAITING,
    #: ``done`` when a person gave the output; ``pending`` for ``--retry`` (data ``outcome``).
    EventKind.STEP_RESOLVED.value: StepStatus.DONE,
    EventKind.STEP_APPROVED.value: StepStatus.DONE,
    EventKind.STEP_REJECTED.value: StepStatus.FAILED,
}

#: Kinds that commit a step ``done`` (at most once each step, retries aside).
DONE_KINDS = frozenset(
    {
        EventKind.STEP_FINISHED.value,
        EventKind.STEP_RECONCILED.value,
        EventKind.STEP_APPROVED.value,
        EventKind.STEP_RESOLVED.value,
        EventKind.STEP_REJECTED.value,  # only with outcome "answer" (see status_after)
    }
)

#: A person's decision, and the parking event the step's journal must show just before it.
DECIDES = {
    EventKind.STEP_RESOLVED.value: EventKind.STEP_BLOCKED.value,
    EventKind.STEP_APPROVED.value: EventKind.STEP_WAITING.value,
    EventKind.STEP_REJECTED.value: EventKind.STEP_WAITING.value,
}
#: The parking events, and the task status each leaves.
PARKED = {
    EventKind.STEP_BLOCKED.value: TaskStatus.BLOCKED,
    EventKind.STEP_WAITING.value: TaskStatus.WAITING,
}


def status_after(event: Event) -> StepStatus:
    """The step status that a step-level event (a kind in :data:`STEP_STATUS_AFTER`) leaves."""
    if event.kind == EventKind.STEP_RESOLVED.value and event.data.get("outcome") == "retry":
        return StepStatus.PENDING
    if event.kind == EventKind.STEP_REJECTED.value and event.data.get("outcome") == "answer":
        return StepStatus.DONE  # a workflow's approval whose code reads the rejection
    return STEP_STATUS_AFTER[event.kind]


#: Events after which the task has ended; nothing moves it out of these states.
TASK_END_STATUS: dict[str, TaskStatus] = {
    EventKind.TASK_DONE.value: TaskStatus.DONE,
    EventKind.TASK_FAILED.value: TaskStatus.FAILED,
}

#: A step's start and every event that closes its attempt.
STEP_KINDS = frozenset({EventKind.STEP_STARTED.value, *CLOSING_KINDS})


def task_status_from(events: Sequence[Event]) -> tuple[TaskStatus, int | None]:
    """The task status ``events`` end in, and the ``seq`` of the event that set it."""
    status, seq = TaskStatus.PENDING, None
    for event in events:
        if status is TaskStatus.CANCELLED:
            break  # nothing moves a cancelled task on
        if event.kind == EventKind.TASK_CANCELLED.value:
            status, seq = TaskStatus.CANCELLED, event.seq
            continue
        if event.kind == EventKind.TASK_RETRIED.value:
            status, seq = TaskStatus.PENDING, event.seq
            continue
        if status in (TaskStatus.DONE, TaskStatus.FAILED):
            continue  # only a retry moves an ended task on
        if event.kind in TASK_END_STATUS:
            status, seq = TASK_END_STATUS[event.kind], event.seq
        elif event.kind in PARKED:
            status, seq = PARKED[event.kind], event.seq
        elif event.kind in DECIDES:
            status, seq = TaskStatus.PENDING, event.seq  # a rejection's task_failed follows
        elif status in (TaskStatus.BLOCKED, TaskStatus.WAITING):
            continue  # parked until a person decides (a claim that parked it goes on journaling)
        elif event.kind == EventKind.RUN_STARTED.value or event.kind in STEP_KINDS:
            status, seq = TaskStatus.RUNNING, event.seq
    return status, seq
