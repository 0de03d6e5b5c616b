"""Check a database after the fact: journal, statuses, outputs and published artifacts.

The checks are pure functions over a :class:`~ninelives.models.Task` and its
journal (:func:`check_task`), plus one that reads the artifacts folder
(:func:`check_artifacts`); :func:`verify_store` reads tasks through the
:class:`~ninelives.store.Store` protocol, so it works on every backend. A
store may offer ``integrity_problems() -> list[str]`` (SQLite runs
``PRAGMA quick_check``); stores without it skip that part.

Every finding is a :class:`Violation` naming the check, the task and the
``seq`` numbers of the journal events involved.

The parts: :mod:`~ninelives.verify.status` (the status a journal implies),
:mod:`~ninelives.verify.task` (:func:`check_task`), :mod:`~ninelives.verify.rules`
(policies, unknown outcomes and approvals, appended steps, cancel and fork),
:mod:`~ninelives.verify.artifacts` (the published files); this module reads
a store and runs them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import BlobDamaged, DamagedTask, StoreError
from ..models import Event, Task
from .artifacts import artifact_outputs, check_artifacts
from .rules import forked_steps, lineage_violations
from .status import STEP_STATUS_AFTER, TASK_END_STATUS, status_after
from .task import check_task
from .violation import Violation

__all__ = [
    "STEP_STATUS_AFTER",
    "TASK_END_STATUS",
    "VerifyReport",
    "Violation",
    "artifact_outputs",
    "check_artifacts",
    "check_task",
    "count_by_check",
    "forked_steps",
    "lineage_violations",
    "read_consistent",
    "status_after",
    "verify_store",
]


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
    found.extend(
        Violation(task_id="", check="integrity", message=line)
        for line in store.integrity_problems()
    )
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
            total += _events_read(store, task_id)
            continue
        total += len(events)
        found.extend(check_task(task, events, limits=limits))
        if artifacts is not None:
            found.extend(check_artifacts(task, events, artifacts))
    return VerifyReport(
        tasks=len(ids),
        events=total,
        violations=tuple(found),
        integrity_checked=store.dialect == "sqlite",  # a server checks its own pages
    )


def _events_read(store: Any, task_id: str) -> int:
    """How many journal events of a task whose task or step rows cannot be used
    were read all the same: its journal needs no output (a missing blob leaves
    it whole), and a summary of "0 event(s)" would say there was none."""
    try:
        return len(store.events(task_id))
    except StoreError:  # the journal itself is what is damaged
        return 0


def count_by_check(violations: Iterable[Violation]) -> dict[str, int]:
    """How many violations each check found."""
    return dict(Counter(v.check for v in violations))
