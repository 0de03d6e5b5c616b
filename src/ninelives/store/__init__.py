"""Storage: the :class:`Store` protocol and :func:`open_store`, which picks a backend by URL.

A store keeps tasks, their plans, step progress and the append-only journal.
Each method is one transaction: a status change and the journal rows that
record it commit together or not at all. Every method that a runner calls
with a :class:`~ninelives.models.Run` is fenced: it commits only while
``run.epoch`` is still the task's current lease epoch, and otherwise raises
:class:`~ninelives.errors.LeaseLost` having written nothing.
"""

from __future__ import annotations

import os
from typing import Protocol

from ..errors import UnknownTask
from ..models import Event, Run, Task
from ..plan import Plan


class Store(Protocol):
    """What the runtime needs from a database. SQLite and PostgreSQL implement it."""

    url: str

    def create_task(self, task_id: str, plan: Plan) -> Task:
        """Store the task, all its steps and ``task_created`` in one transaction.

        Raises :class:`~ninelives.errors.TaskExists` (changing nothing) if the id is taken.
        """
        ...

    def get_task(self, task_id: str) -> Task:
        """The task with its steps, read in one snapshot; :class:`UnknownTask` if absent."""
        ...

    def task_ids(self) -> list[str]:
        """Every stored task id, oldest first."""
        ...

    def begin_run(self, task_id: str, run_id: str) -> tuple[Run, Task]:
        """Take the task for this runner, recover it, and journal ``run_started``.

        In one transaction: increment the lease epoch, put every ``running`` step
        back to ``pending`` with a ``step_recovered`` each, and journal
        ``run_started`` with the recovered indexes. Returns the run and the task
        as recovered. Raises :class:`~ninelives.errors.TaskBusy` at once if a live
        runner holds the task, :class:`UnknownTask` if there is no such task.
        The caller must call :meth:`end_run`.
        """
        ...

    def start_step(self, run: Run, idx: int, tool: str) -> int:
        """Commit step ``idx`` ``running`` with attempts + 1 and ``step_started``;
        return the attempt number. Fenced."""
        ...

    def finish_step(self, run: Run, idx: int, tool: str, output: str, *, last: bool) -> None:
        """Commit step ``idx`` ``done`` with ``output`` (JSON text) and ``step_finished``.

        With ``last``, the same transaction marks the task ``done`` and journals
        ``task_done``. Fenced.
        """
        ...

    def record_error(self, run: Run, idx: int, error: str, max_attempts: int) -> bool:
        """Journal ``step_error`` and put the step back to ``pending``; if it has
        used ``max_attempts``, mark step and task ``failed`` with ``task_failed``
        in the same transaction and return True. Fenced."""
        ...

    def finish_task(self, run: Run) -> None:
        """Mark the task ``done`` with ``task_done`` (a run that found no pending step). Fenced."""
        ...

    def end_run(self, run: Run) -> None:
        """Release the runner's hold on the task (lock or lease). Idempotent; never raises."""
        ...

    def events(self, task_id: str) -> list[Event]:
        """The task's journal in ``seq`` order (empty for an unknown task)."""
        ...

    def close(self) -> None:
        """Release every resource; idempotent."""
        ...


class MissingStore:
    """A database that does not exist yet, opened by a read-only command.

    Reads answer "unknown task" without creating a file, so ``status`` or
    ``run`` of a typo never leaves an empty database behind.
    """

    def __init__(self, url: str) -> None:
        self.url = url

    def _unknown(self, task_id: str) -> UnknownTask:
        return UnknownTask(f"unknown task {task_id!r} (no database at {self.url})")

    def get_task(self, task_id: str) -> Task:
        raise self._unknown(task_id)

    def begin_run(self, task_id: str, run_id: str) -> tuple[Run, Task]:
        raise self._unknown(task_id)

    def task_ids(self) -> list[str]:
        return []

    def events(self, task_id: str) -> list[Event]:
        return []

    def close(self) -> None:
        pass


def is_postgres_url(url: str) -> bool:
    """True for ``postgresql://`` and ``postgres://`` URLs."""
    return url.startswith(("postgresql://", "postgres://"))


def open_store(url: str, *, create: bool = True) -> Store:
    """Open the store that ``url`` names: a PostgreSQL URL or a SQLite path.

    ``sqlite:///path`` is accepted as well as a plain path. With ``create``
    false, a SQLite file that does not exist is not created: the returned
    store answers every read with "unknown task".
    """
    if is_postgres_url(url):
        from .postgres import PostgresStore  # the only place psycopg gets imported

        return PostgresStore(url)
    from .sqlite import SQLiteStore

    path = url.removeprefix("sqlite://") if url.startswith("sqlite:///") else url
    if not create and not os.path.exists(path):
        return MissingStore(path)  # type: ignore[return-value]
    return SQLiteStore(path)
