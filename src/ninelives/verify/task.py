"""Every guarantee about one task and its journal (:func:`check_task`).

The journal's own shape comes first (sequence, ``task_created``), then what
the journal says of each step (:class:`StepJournal`) is held against the
step rows, and the task's status against the journal; the rule families of
:mod:`ninelives.verify.rules` follow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..journal import CLOSING_KINDS, journal_problems
from ..models import Event, EventKind, Step, StepStatus, Task, TaskStatus
from .rules import (
    appended_violations,
    forked_steps,
    lineage_violations,
    parking_violations,
    past_limits,
    policy_violations,
)
from .status import (
    DONE_KINDS,
    STEP_KINDS,
    STEP_STATUS_AFTER,
    TASK_END_STATUS,
    status_after,
    task_status_from,
)
from .violation import Findings, Violation


def check_task(
    task: Task, events: Sequence[Event], *, limits: tuple[int, int] | None = None
) -> list[Violation]:
    """Every violation in one task and its journal (``events`` in ``seq`` order).

    Beyond :func:`ninelives.journal.journal_problems`: ``task_created`` once and
    first; a start still open at the end only while its step is ``running``;
    no step finished twice; each step's status and attempts agree with its
    journal; the task's status agrees with its journal; every ``done`` step
    has an output; a ``done`` task has only ``done`` steps. With ``limits``
    (``max_attempts``, ``max_recoveries``), also that no step went past them:
    more ``step_error`` events than the attempt limit, or more ``step_recovered``
    than the recovery limit plus the one that fails the task.
    """
    found = journal_shape_violations(task, events)
    found.extend(appended_violations(task, events))
    found.extend(lineage_violations(task, events))
    journal = StepJournal.read(task, events, found)
    found.extend(journal.unclosed_and_repeated(task))
    copied = forked_steps(events)
    for step in task.steps:
        found.extend(step_record_violations(task.id, step, journal, copied))
    found.extend(task_record_violations(task, events))
    found.extend(policy_violations(task, events))
    found.extend(parking_violations(task, events))
    if limits is not None:
        found.extend(past_limits(task, events, *limits))
    return found


def journal_shape_violations(task: Task, events: Sequence[Event]) -> Findings:
    """Sequence numbers strictly increasing, the journal's own invariants, and
    exactly one ``task_created``, first."""
    found = Findings(task.id)
    seqs = [e.seq for e in events]
    if seqs != sorted(set(seqs)):
        found.add("order", "journal sequence numbers are not strictly increasing")
    for problem in journal_problems(events):
        found.add("journal", problem.message, problem.seqs)
    created = [e.seq for e in events if e.kind == EventKind.TASK_CREATED.value]
    if len(created) != 1 or (events and events[0].kind != EventKind.TASK_CREATED.value):
        found.add(
            "task_created",
            f"{len(created)} task_created events, expected exactly one first",
            created,
        )
    return found


@dataclass
class StepJournal:
    """What the journal says of each step, by step index."""

    #: ``seq`` of each ``step_started`` since the step's last retry.
    starts: dict[int, list[int]] = field(default_factory=dict)
    #: ``seq`` of each event that committed the step ``done``.
    finishes: dict[int, list[int]] = field(default_factory=dict)
    #: The latest event that set the step's status.
    last: dict[int, Event] = field(default_factory=dict)
    #: ``seq`` of a start that no closing event followed.
    open_start: dict[int, int] = field(default_factory=dict)

    @classmethod
    def read(cls, task: Task, events: Sequence[Event], found: Findings) -> StepJournal:
        """Walk ``events`` once; a step-level event naming a step the plan lacks
        is added to ``found`` as ``unknown_step`` and left out."""
        journal = cls()
        planned = {s.idx for s in task.steps}
        for event in events:
            idx = event.step_idx
            if idx is None:
                continue
            if event.kind in STEP_KINDS or event.kind in STEP_STATUS_AFTER:
                if idx not in planned:
                    found.add(
                        "unknown_step",
                        f"{event.kind} names step {idx}, which the plan lacks",
                        [event.seq],
                    )
                    continue
            journal.note(idx, event)
        return journal

    def note(self, idx: int, event: Event) -> None:
        """Take one event of step ``idx`` into account."""
        if event.kind == EventKind.TASK_RETRIED.value:
            self.starts.pop(idx, None)  # a retry resets the step's attempts to 0
        if event.kind == EventKind.STEP_STARTED.value:
            self.starts.setdefault(idx, []).append(event.seq)
            self.open_start[idx] = event.seq
        elif event.kind in CLOSING_KINDS:
            self.open_start.pop(idx, None)
        if event.kind in DONE_KINDS and status_after(event) is StepStatus.DONE:
            self.finishes.setdefault(idx, []).append(event.seq)
        if event.kind in STEP_STATUS_AFTER:
            self.last[idx] = event

    def unclosed_and_repeated(self, task: Task) -> Findings:
        """A start left open while its step is not ``running``; a step finished twice."""
        found = Findings(task.id)
        by_idx = {s.idx: s for s in task.steps}
        for idx, seq in sorted(self.open_start.items()):
            step = by_idx[idx]
            if step.status is not StepStatus.RUNNING:
                found.add(
                    "open_step",
                    f"step {idx} started and never finished, recovered or errored, "
                    f"but it is {step.status.value}",
                    [seq],
                )
        for idx, done in sorted(self.finishes.items()):
            if len(done) > 1:
                found.add("finished_twice", f"step {idx} finished {len(done)} times", done)
        return found


def step_record_violations(
    task_id: str, step: Step, journal: StepJournal, copied: frozenset[int]
) -> Findings:
    """One step's row against its journal: status, attempts, an output when
    ``done``, and the blob its ``step_finished`` recorded."""
    found = Findings(task_id)
    latest = journal.last.get(step.idx)
    if latest is not None:
        expected = status_after(latest)
    else:  # a fork's copied steps are done without a start of their own
        expected = StepStatus.DONE if step.idx in copied else StepStatus.PENDING
    if step.status is not expected:
        found.add(
            "step_status",
            f"step {step.idx} is {step.status.value} but its journal says {expected.value}",
            [latest.seq] if latest else [],
        )
    started = journal.starts.get(step.idx, [])
    if step.attempts != len(started):
        found.add(
            "attempts",
            f"step {step.idx} has attempts={step.attempts} but {len(started)} step_started",
            started,
        )
    if step.status is StepStatus.DONE and step.output is None:
        found.add(
            "output",
            f"step {step.idx} is done without an output",
            journal.finishes.get(step.idx, []),
        )
    if (
        step.status is StepStatus.DONE
        and latest is not None
        and latest.kind == EventKind.STEP_FINISHED.value
        and latest.data.get("blob") != step.output_blob
    ):
        stored = f"blob {step.output_blob}" if step.output_blob else "in the row"
        found.add(
            "output_blob",
            f"step {step.idx}: its step_finished records blob {latest.data.get('blob')} "
            f"but its output is {stored}",
            [latest.seq],
        )
    return found


def task_record_violations(task: Task, events: Sequence[Event]) -> Findings:
    """The task's status against its journal; a ``done`` task with only ``done``
    steps; at most one end since the last retry."""
    found = Findings(task.id)
    expected, status_seq = task_status_from(events)
    if task.status is not expected:
        found.add(
            "task_status",
            f"task is {task.status.value} but its journal says {expected.value}",
            [status_seq] if status_seq is not None else [],
        )
    if task.status is TaskStatus.DONE:
        undone = [s.idx for s in task.steps if s.status is not StepStatus.DONE]
        if undone:
            found.add("task_status", f"task is done but steps {undone} are not")
    retried = [e.seq for e in events if e.kind == EventKind.TASK_RETRIED.value]
    since = retried[-1] if retried else -1  # a retried task may end once more after it
    ends = [e.seq for e in events if e.kind in TASK_END_STATUS and e.seq > since]
    if len(ends) > 1:
        found.add("task_end", f"{len(ends)} task_done/task_failed events", ends)
    return found
