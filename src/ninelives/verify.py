"""Check a database after the fact: journal, statuses, outputs and published artifacts.

The checks are pure functions over a :class:`~ninelives.models.Task` and its
journal (:func:`check_task`), plus one that reads the artifacts folder
(:func:`check_artifacts`); :func:`verify_store` reads tasks through the
:class:`~ninelives.store.Store` protocol, so it works on every backend. A
store may offer ``integrity_problems() -> list[str]`` (SQLite runs
``PRAGMA quick_check``); stores without it skip that part.

Every finding is a :class:`Violation` naming the check, the task and the
``seq`` numbers of the journal events involved.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import BlobDamaged, DamagedTask, PlanTampered, StoreError
from .journal import CLOSING_KINDS, journal_problems
from .models import Event, EventKind, StepStatus, Task, TaskStatus, is_workflow

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
_DONE_KINDS = frozenset(
    {
        EventKind.STEP_FINISHED.value,
        EventKind.STEP_RECONCILED.value,
        EventKind.STEP_APPROVED.value,
        EventKind.STEP_RESOLVED.value,
        EventKind.STEP_REJECTED.value,  # only with outcome "answer" (see status_after)
    }
)

#: A person's decision, and the parking event the step's journal must show just before it.
_DECIDES = {
    EventKind.STEP_RESOLVED.value: EventKind.STEP_BLOCKED.value,
    EventKind.STEP_APPROVED.value: EventKind.STEP_WAITING.value,
    EventKind.STEP_REJECTED.value: EventKind.STEP_WAITING.value,
}
_PARKED = {
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

_STEP_KINDS = frozenset({EventKind.STEP_STARTED.value, *CLOSING_KINDS})


@dataclass(frozen=True, kw_only=True)
class Violation:
    """One broken guarantee: which check, which task, and the journal events involved."""

    task_id: str
    check: str
    message: str
    seqs: tuple[int, ...] = ()

    def __str__(self) -> str:
        where = f" [seq {', '.join(map(str, self.seqs))}]" if self.seqs else ""
        return f"{self.task_id or '(database)'}: {self.check}: {self.message}{where}"


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """What :func:`verify_store` checked and found."""

    tasks: int
    events: int
    violations: tuple[Violation, ...]
    integrity_checked: bool

    @property
    def ok(self) -> bool:
        """True when nothing was found."""
        return not self.violations


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
    found: list[Violation] = []

    def add(check: str, message: str, seqs: Iterable[int] = ()) -> None:
        found.append(Violation(task_id=task.id, check=check, message=message, seqs=tuple(seqs)))

    seqs = [e.seq for e in events]
    if seqs != sorted(set(seqs)):
        add("order", "journal sequence numbers are not strictly increasing")
    for problem in journal_problems(events):
        add("journal", problem.message, problem.seqs)

    created = [e.seq for e in events if e.kind == EventKind.TASK_CREATED.value]
    if len(created) != 1 or (events and events[0].kind != EventKind.TASK_CREATED.value):
        add(
            "task_created",
            f"{len(created)} task_created events, expected exactly one first",
            created,
        )

    by_idx = {s.idx: s for s in task.steps}
    found.extend(_appended_violations(task, events))
    found.extend(lineage_violations(task, events))
    copied = forked_steps(events)
    starts: dict[int, list[int]] = {}
    finishes: dict[int, list[int]] = {}
    last: dict[int, Event] = {}
    open_start: dict[int, int] = {}
    for event in events:
        idx = event.step_idx
        if idx is None:
            continue
        if event.kind in _STEP_KINDS or event.kind in STEP_STATUS_AFTER:
            if idx not in by_idx:
                add(
                    "unknown_step",
                    f"{event.kind} names step {idx}, which the plan lacks",
                    [event.seq],
                )
                continue
        if event.kind == EventKind.TASK_RETRIED.value:
            starts.pop(idx, None)  # a retry resets the step's attempts to 0
        if event.kind == EventKind.STEP_STARTED.value:
            starts.setdefault(idx, []).append(event.seq)
            open_start[idx] = event.seq
        elif event.kind in CLOSING_KINDS:
            open_start.pop(idx, None)
        if event.kind in _DONE_KINDS and status_after(event) is StepStatus.DONE:
            finishes.setdefault(idx, []).append(event.seq)
        if event.kind in STEP_STATUS_AFTER:
            last[idx] = event

    for idx, seq in sorted(open_start.items()):
        step = by_idx[idx]
        if step.status is not StepStatus.RUNNING:
            add(
                "open_step",
                f"step {idx} started and never finished, recovered or errored, "
                f"but it is {step.status.value}",
                [seq],
            )
    for idx, done in sorted(finishes.items()):
        if len(done) > 1:
            add("finished_twice", f"step {idx} finished {len(done)} times", done)

    for step in task.steps:
        latest = last.get(step.idx)
        if latest is not None:
            expected = status_after(latest)
        else:  # a fork's copied steps are done without a start of their own
            expected = StepStatus.DONE if step.idx in copied else StepStatus.PENDING
        if step.status is not expected:
            add(
                "step_status",
                f"step {step.idx} is {step.status.value} but its journal says {expected.value}",
                [latest.seq] if latest else [],
            )
        started = starts.get(step.idx, [])
        if step.attempts != len(started):
            add(
                "attempts",
                f"step {step.idx} has attempts={step.attempts} but {len(started)} step_started",
                started,
            )
        if step.status is StepStatus.DONE and step.output is None:
            add("output", f"step {step.idx} is done without an output", finishes.get(step.idx, []))
        finished = last.get(step.idx)
        if (
            step.status is StepStatus.DONE
            and finished is not None
            and finished.kind == EventKind.STEP_FINISHED.value
            and finished.data.get("blob") != step.output_blob
        ):
            stored = f"blob {step.output_blob}" if step.output_blob else "in the row"
            add(
                "output_blob",
                f"step {step.idx}: its step_finished records blob {finished.data.get('blob')} "
                f"but its output is {stored}",
                [finished.seq],
            )

    expected_task, status_seq = _task_status_from(events)
    if task.status is not expected_task:
        add(
            "task_status",
            f"task is {task.status.value} but its journal says {expected_task.value}",
            [status_seq] if status_seq is not None else [],
        )
    if task.status is TaskStatus.DONE:
        undone = [s.idx for s in task.steps if s.status is not StepStatus.DONE]
        if undone:
            add("task_status", f"task is done but steps {undone} are not")
    retried = [e.seq for e in events if e.kind == EventKind.TASK_RETRIED.value]
    since = retried[-1] if retried else -1  # a retried task may end once more after it
    ends = [e.seq for e in events if e.kind in TASK_END_STATUS and e.seq > since]
    if len(ends) > 1:
        add("task_end", f"{len(ends)} task_done/task_failed events", ends)
    found.extend(_policy_violations(task, events))
    found.extend(_parking_violations(task, events))
    if limits is not None:
        found.extend(_past_limits(task, events, *limits))
    return found


def _policy_violations(task: Task, events: Sequence[Event]) -> list[Violation]:
    """``step_progress`` only inside an attempt, the stored progress equal to the
    last one journaled, and no attempt started before the ``retry_at`` of the
    ``step_error`` before it (a backoff that a restart cut short)."""
    found: list[Violation] = []
    open_steps: set[int] = set()
    journaled: dict[int, Event] = {}
    due: dict[int, tuple[float, int]] = {}
    for event in events:
        idx = event.step_idx
        if idx is None:
            continue
        if event.kind == EventKind.STEP_STARTED.value:
            open_steps.add(idx)
            wait = due.pop(idx, None)
            if wait is not None and event.ts < wait[0]:
                found.append(Violation(
                    task_id=task.id, check="backoff",
                    message=f"step {idx} started {wait[0] - event.ts:.3f}s before the "
                    "retry_at of its step_error",
                    seqs=(wait[1], event.seq),
                ))  # fmt: skip
        elif event.kind == EventKind.STEP_PROGRESS.value:
            journaled[idx] = event
            if idx not in open_steps:
                found.append(Violation(
                    task_id=task.id, check="progress",
                    message=f"step {idx} journaled progress while not running",
                    seqs=(event.seq,),
                ))  # fmt: skip
        elif event.kind in CLOSING_KINDS or event.kind == EventKind.TASK_FAILED.value:
            open_steps.discard(idx)
            retry_at = event.data.get("retry_at")
            if event.kind == EventKind.STEP_ERROR.value and isinstance(retry_at, (int, float)):
                due[idx] = (float(retry_at), event.seq)
        elif event.kind == EventKind.TASK_RETRIED.value:
            due.pop(idx, None)  # a retry is due at once
    for step in task.steps:
        last = journaled.get(step.idx)
        expected = last.data.get("progress") if last is not None else None
        if step.progress != expected:
            found.append(Violation(
                task_id=task.id, check="progress",
                message=f"step {step.idx} holds progress that its journal does not end with",
                seqs=(last.seq,) if last is not None else (),
            ))  # fmt: skip
    return found


def _parking_violations(task: Task, events: Sequence[Event]) -> list[Violation]:
    """Unknown outcomes and approvals: a step is reconciled only right after its
    recovery for a probe, in the same run; a person decides only a step parked
    for that (``step_resolved`` after ``step_blocked``, ``step_approved`` or
    ``step_rejected`` after ``step_waiting``); a rejection fails the task at once
    (unless a workflow's code reads it: ``outcome: answer``);
    a block says why."""
    found = []

    def add(check: str, message: str, seqs: Iterable[int]) -> None:
        found.append(Violation(task_id=task.id, check=check, message=message, seqs=tuple(seqs)))

    before: dict[int, Event] = {}
    for i, event in enumerate(events):
        idx = event.step_idx
        if idx is None or event.kind not in STEP_STATUS_AFTER:
            continue
        prior = before.get(idx)
        if event.kind == EventKind.STEP_RECONCILED.value and not (
            prior is not None
            and prior.kind == EventKind.STEP_RECOVERED.value
            and prior.data.get("on_unknown") == "probe"
            and prior.run_id == event.run_id
        ):
            add("reconciled", f"step {idx} reconciled without a probe's recovery before it",
                [event.seq])  # fmt: skip
        wanted = _DECIDES.get(event.kind)
        if wanted is not None and (prior is None or prior.kind != wanted):
            add("decided", f"{event.kind} of step {idx} does not follow its {wanted}",
                [event.seq, *([prior.seq] if prior else [])])  # fmt: skip
        if event.kind == EventKind.STEP_REJECTED.value and status_after(event) is StepStatus.FAILED:
            following = events[i + 1] if i + 1 < len(events) else None
            if following is None or following.kind != EventKind.TASK_FAILED.value:
                add("rejected", f"step {idx} was rejected but the task did not fail with it",
                    [event.seq])  # fmt: skip
        if event.kind == EventKind.STEP_BLOCKED.value and not event.data.get("reason"):
            add("blocked", f"step {idx} was blocked without a reason", [event.seq])
        before[idx] = event
    return found


def _past_limits(
    task: Task, events: Sequence[Event], max_attempts: int, max_recoveries: int
) -> list[Violation]:
    """Steps that were run again past a limit instead of failing the task."""
    found = []
    checks = (
        (EventKind.STEP_ERROR.value, max_attempts, "attempt_limit", "AGENT_MAX_ATTEMPTS"),
        # The recovery past the limit is journaled too: it is the one that fails the task.
        (EventKind.STEP_RECOVERED.value, max_recoveries + 1, "recovery_limit",
         "NINELIVES_MAX_RECOVERIES"),
    )  # fmt: skip
    policies = {s.idx: s.policy for s in task.steps if s.policy}
    for kind, allowed, check, variable in checks:
        seqs: dict[int, list[int]] = {}
        for event in events:
            if event.kind == kind and event.step_idx is not None:
                seqs.setdefault(event.step_idx, []).append(event.seq)
        for idx, seen in sorted(seqs.items()):
            limit, name = allowed, variable
            if kind == EventKind.STEP_ERROR.value and "max_attempts" in policies.get(idx, {}):
                limit, name = int(policies[idx]["max_attempts"]), "its max_attempts policy"
            if len(seen) > limit:
                message = (
                    f"step {idx} has {len(seen)} {kind} events, more than the limit allows "
                    f"({name} as verify runs): it was run again instead of failing"
                )
                found.append(Violation(task_id=task.id, check=check, message=message,
                                       seqs=tuple(seen[limit:])))  # fmt: skip
    return found


def _appended_violations(task: Task, events: Sequence[Event]) -> list[Violation]:
    """Steps past the plan's count each have one ``step_appended``; planned ones none."""
    created = next((e for e in events if e.kind == EventKind.TASK_CREATED.value), None)
    planned = created.data.get("steps") if created is not None else None
    if not isinstance(planned, int):
        return []
    appended: dict[int, list[int]] = {}
    for event in events:
        if event.kind == EventKind.STEP_APPENDED.value and event.step_idx is not None:
            appended.setdefault(event.step_idx, []).append(event.seq)
    found = []
    for step in task.steps:
        seqs = appended.get(step.idx, [])
        expected = 1 if step.idx >= planned else 0
        if len(seqs) != expected:
            what = "appended" if step.idx >= planned else "planned"
            found.append(
                Violation(
                    task_id=task.id,
                    check="appended",
                    message=f"{what} step {step.idx} has {len(seqs)} step_appended events, "
                    f"expected {expected}",
                    seqs=tuple(seqs),
                )
            )
    return found


def _task_status_from(events: Sequence[Event]) -> tuple[TaskStatus, int | None]:
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
        elif event.kind in _PARKED:
            status, seq = _PARKED[event.kind], event.seq
        elif event.kind in _DECIDES:
            status, seq = TaskStatus.PENDING, event.seq  # a rejection's task_failed follows
        elif status in (TaskStatus.BLOCKED, TaskStatus.WAITING):
            continue  # parked until a person decides (a claim that parked it goes on journaling)
        elif event.kind == EventKind.RUN_STARTED.value or event.kind in _STEP_KINDS:
            status, seq = TaskStatus.RUNNING, event.seq
    return status, seq


def forked_steps(events: Sequence[Event]) -> frozenset[int]:
    """The steps a fork copied done (those before its ``task_forked``'s ``from``)."""
    for event in events:
        if event.kind == EventKind.TASK_FORKED.value:
            start = event.data.get("from")
            return frozenset(range(start)) if isinstance(start, int) else frozenset()
    return frozenset()


def lineage_violations(task: Task, events: Sequence[Event]) -> list[Violation]:
    """The invariants of cancel, fork and the plan's SHA-256.

    ``plan_integrity``: the stored goal and steps hash to the digest kept since
    create. ``cancel``: at most one ``task_cancelled``, none after the task was
    done, and after it no ``step_started``, ``task_done`` or ``task_failed``
    (a cancelled task starts no step). ``fork``: at most one ``task_forked``,
    right after ``task_created``; each step it copied is done with an output
    and was never started in this task.
    """
    from .lineage import check_plan

    found: list[Violation] = []

    def add(check: str, message: str, seqs: Iterable[int] = ()) -> None:
        found.append(Violation(task_id=task.id, check=check, message=message, seqs=tuple(seqs)))

    try:
        check_plan(task)
    except PlanTampered as exc:
        add("plan_integrity", str(exc))
    cancels = [e.seq for e in events if e.kind == EventKind.TASK_CANCELLED.value]
    if len(cancels) > 1:
        add("cancel", f"{len(cancels)} task_cancelled events", cancels)
    if cancels:
        done = [e.seq for e in events if e.kind == EventKind.TASK_DONE.value and e.seq < cancels[0]]
        if done:
            add("cancel", "task_cancelled after task_done", [*done, cancels[0]])
        after = [
            e.seq
            for e in events
            if e.seq > cancels[0]
            and e.kind
            in (
                EventKind.STEP_STARTED.value,
                EventKind.TASK_DONE.value,
                EventKind.TASK_FAILED.value,
            )
        ]
        if after:
            add("cancel", f"{len(after)} step_started/task_done/task_failed after task_cancelled",
                [cancels[0], *after])  # fmt: skip
    forks = [e for e in events if e.kind == EventKind.TASK_FORKED.value]
    if len(forks) > 1 or (forks and (len(events) < 2 or events[1] is not forks[0])):
        add("fork", "task_forked must be the one event right after task_created",
            [e.seq for e in forks])  # fmt: skip
    copied = forked_steps(events)
    if copied:
        by_idx = {s.idx: s for s in task.steps}
        for idx in sorted(copied):
            step = by_idx.get(idx)
            if step is None or step.output is None:
                add("fork", f"step {idx} was copied by the fork but has no output",
                    [forks[0].seq])  # fmt: skip
        started = [
            e.seq for e in events if e.kind == EventKind.STEP_STARTED.value and e.step_idx in copied
        ]
        if started:
            add("fork", "a step the fork copied done was started again", started)
    return found


def artifact_outputs(task: Task) -> dict[int, dict[str, Any]]:
    """Done steps whose output records a published file: ``path`` and ``sha256`` texts
    (a workflow step's record is the value it returned, inside ``{"value": ...}``)."""
    found = {}
    for s in task.steps:
        output: Any = s.output
        if s.status is StepStatus.DONE and is_workflow(task.goal):
            from .replay import value_of

            output = value_of(output)
        if (
            s.status is StepStatus.DONE
            and isinstance(output, dict)
            and isinstance(output.get("path"), str)
            and isinstance(output.get("sha256"), str)
        ):
            found[s.idx] = output
    return found


def check_artifacts(task: Task, events: Sequence[Event], folder: str) -> list[Violation]:
    """Each published artifact exists in ``folder`` and matches its recorded
    ``sha256`` (and ``bytes``); no temporary file of this task is left behind."""
    from . import files
    from .tools.effects import is_temp_of

    found: list[Violation] = []

    def add(check: str, message: str, seqs: tuple[int, ...] = ()) -> None:
        found.append(Violation(task_id=task.id, check=check, message=message, seqs=seqs))

    finished = {e.step_idx: e.seq for e in events if e.kind == EventKind.STEP_FINISHED.value}
    for idx, output in sorted(artifact_outputs(task).items()):
        seqs = (finished[idx],) if idx in finished else ()
        name = os.path.basename(output["path"])
        path = os.path.join(folder, name)
        # Never blocks on a FIFO, never follows a symlink, hashes in chunks.
        try:
            fd = files.open_regular(path, shown=name)
        except FileNotFoundError:
            add("artifact_missing", f"step {idx}: {name} is not in {folder}", seqs)
            continue
        except files.NotRegularFile as exc:
            add("artifact_type", f"step {idx}: {exc}", seqs)
            continue
        except OSError as exc:
            add("artifact_missing", f"step {idx}: cannot read {path}: {exc.strerror}", seqs)
            continue
        try:
            digest, length = files.sha256_of(fd)
        except OSError as exc:
            add("artifact_missing", f"step {idx}: cannot read {path}: {exc.strerror}", seqs)
            continue
        finally:
            os.close(fd)
        size = output.get("bytes")
        if digest != output["sha256"] or (isinstance(size, int) and size != length):
            add(
                "artifact_content",
                f"step {idx}: {name} holds {length} bytes that do not match the "
                "sha256 its committed output records",
                seqs,
            )
    try:
        names = sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        names = []
    except OSError as exc:
        add("artifacts_unreadable", f"cannot list {folder}: {exc.strerror}")
        names = []
    for name in names:
        if is_temp_of(task.id, name):
            add("stray_temp", f"temporary file {name} left in {folder}")
    return found


def read_consistent(store: Any, task_id: str, *, tries: int = 20) -> tuple[Task, list[Event]]:
    """The task and its journal as of one moment, through the Store protocol.

    Every status change commits together with a journal event, so when the
    journal has the same length before and after reading the task, the task
    read matches it, even while a runner is writing.
    """
    events: list[Event] = store.events(task_id)
    task: Task = store.get_task(task_id)
    for _ in range(tries):
        again: list[Event] = store.events(task_id)
        if len(again) == len(events):
            return task, again
        events = again
        task = store.get_task(task_id)
    return task, events


def verify_store(
    store: Any,
    task_ids: Sequence[str] | None = None,
    *,
    artifacts: str | None = None,
    limits: tuple[int, int] | None = None,
) -> VerifyReport:
    """Check ``task_ids`` (every task when None) of ``store``; with ``artifacts``,
    also the published files in that folder; with ``limits`` (``max_attempts``,
    ``max_recoveries``), that no step went past them. Raises
    :class:`~ninelives.errors.UnknownTask` for a named task that is not stored."""
    found: list[Violation] = []
    integrity = getattr(store, "integrity_problems", None)
    if integrity is not None:
        found.extend(Violation(task_id="", check="integrity", message=line) for line in integrity())
    ids = list(store.task_ids()) if task_ids is None else list(task_ids)
    total = 0
    for task_id in ids:
        try:
            task, events = read_consistent(store, task_id)
        except StoreError as exc:
            # A damaged file or task may still let the others be read: report and go on.
            check = (
                "blob"
                if isinstance(exc, BlobDamaged)
                else "damaged"
                if isinstance(exc, DamagedTask)
                else "unreadable"
            )
            found.append(Violation(task_id=task_id, check=check, message=str(exc)))
            continue
        total += len(events)
        found.extend(check_task(task, events, limits=limits))
        if artifacts is not None:
            found.extend(check_artifacts(task, events, artifacts))
    return VerifyReport(
        tasks=len(ids),
        events=total,
        violations=tuple(found),
        integrity_checked=integrity is not None,
    )


def count_by_check(violations: Iterable[Violation]) -> dict[str, int]:
    """How many violations each check found."""
    return dict(Counter(v.check for v in violations))
