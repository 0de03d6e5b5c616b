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

from .errors import DamagedTask, StoreError
from .journal import CLOSING_KINDS, journal_problems
from .models import Event, EventKind, StepStatus, Task, TaskStatus

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
}

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
        if event.kind == EventKind.STEP_FINISHED.value:
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
        expected = STEP_STATUS_AFTER[latest.kind] if latest is not None else StepStatus.PENDING
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
    if limits is not None:
        found.extend(_past_limits(task, events, *limits))
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
    for kind, allowed, check, variable in checks:
        seqs: dict[int, list[int]] = {}
        for event in events:
            if event.kind == kind and event.step_idx is not None:
                seqs.setdefault(event.step_idx, []).append(event.seq)
        for idx, seen in sorted(seqs.items()):
            if len(seen) > allowed:
                message = (
                    f"step {idx} has {len(seen)} {kind} events, more than the limit allows "
                    f"({variable} as verify runs): it was run again instead of failing"
                )
                found.append(Violation(task_id=task.id, check=check, message=message,
                                       seqs=tuple(seen[allowed:])))  # fmt: skip
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
        if event.kind == EventKind.TASK_RETRIED.value:
            status, seq = TaskStatus.PENDING, event.seq
            continue
        if status in (TaskStatus.DONE, TaskStatus.FAILED):
            continue  # only a retry moves an ended task on
        if event.kind in TASK_END_STATUS:
            status, seq = TASK_END_STATUS[event.kind], event.seq
        elif event.kind == EventKind.RUN_STARTED.value or event.kind in _STEP_KINDS:
            status, seq = TaskStatus.RUNNING, event.seq
    return status, seq


def artifact_outputs(task: Task) -> dict[int, dict[str, Any]]:
    """Done steps whose output records a published file: ``path`` and ``sha256`` texts."""
    return {
        s.idx: s.output
        for s in task.steps
        if s.status is StepStatus.DONE
        and isinstance(s.output, dict)
        and isinstance(s.output.get("path"), str)
        and isinstance(s.output.get("sha256"), str)
    }


def check_artifacts(task: Task, events: Sequence[Event], folder: str) -> list[Violation]:
    """Each published artifact exists in ``folder`` and matches its recorded
    ``sha256`` (and ``bytes``); no temporary file of this task is left behind."""
    from .tools import files
    from .tools.effects import temp_pattern

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
    pattern = temp_pattern(task.id)
    for name in names:
        if pattern.fullmatch(name):
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
            check = "damaged" if isinstance(exc, DamagedTask) else "unreadable"
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
