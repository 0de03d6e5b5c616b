"""Storage: the :class:`Store` protocol and :func:`open_store`, which picks a backend by URL.

A store keeps tasks, their plans, step progress and the append-only journal.
Each method is one transaction: a status change and the journal rows that
record it commit together or not at all. Every method that a runner calls
with a :class:`~ninelives.models.Run` is fenced: it commits only while
``run.epoch`` is still the task's current lease epoch, and otherwise raises
:class:`~ninelives.errors.LeaseLost` having written nothing.

Leases: on PostgreSQL a claim holds the task until ``lease_expires_at`` (on
the database's clock), renewed by every commit and by a heartbeat every
``heartbeat`` seconds; a runner that stops renewing (killed, paused,
partitioned) loses the task at expiry to the next claimer, which recovers it
exactly as a restart does. On SQLite the per-task kernel lock is the claim.
``NINELIVES_LEASE`` (seconds, default 30) and ``NINELIVES_HEARTBEAT`` (default
a third of the lease) set both for every command; ``worker`` has flags too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from ..errors import InputError, TaskExists, UnknownTask
from ..models import Event, Run, Task

if TYPE_CHECKING:
    from ..plan import Plan


class Store(Protocol):
    """What the runtime needs from a database. SQLite and PostgreSQL implement it."""

    url: str

    def create_task(
        self, task_id: str, plan: Plan, *, queue: str | None = None, artifacts: str | None = None
    ) -> Task:
        """Store the task, all its steps and ``task_created`` in one transaction.

        With ``queue``, workers of that queue find and run the task; without it
        only ``run`` does. ``artifacts`` (an absolute folder) is recorded with the
        task and read back as ``Task.artifacts``; every run publishes there.
        Raises :class:`~ninelives.errors.TaskExists` (changing nothing) if the id
        is taken.
        """
        ...

    def get_task(self, task_id: str) -> Task:
        """The task with its steps, read in one snapshot; :class:`UnknownTask` if absent."""
        ...

    def task_ids(self) -> list[str]:
        """Every stored task id, oldest first."""
        ...

    def begin_run(
        self,
        task_id: str,
        run_id: str,
        *,
        start_first: bool = False,
        check: Callable[[Task], None] | None = None,
        max_recoveries: int | None = None,
    ) -> tuple[Run, Task]:
        """Take the task for this runner, recover it, and journal ``run_started``.

        In one transaction: increment the lease epoch, put every ``running`` step
        back to ``pending`` with a ``step_recovered`` each, and journal
        ``run_started`` with the recovered indexes. With ``start_first``, the same
        transaction also commits the first pending step ``running`` as
        :meth:`start_step` would (reported in ``Run.started``), so a run costs
        no commit beyond its steps' two each. Returns the run and the task
        as recovered. Raises :class:`~ninelives.errors.TaskBusy` at once if a live
        runner holds the task, :class:`UnknownTask` if there is no such task.
        The caller must call :meth:`end_run`.

        ``check`` is called with the task as stored, inside the transaction and
        before anything is written: if it raises, the claim is not made, nothing
        is written and the error propagates (a tool this host lacks). A task
        whose rows cannot be read raises :class:`~ninelives.errors.DamagedTask`,
        also having written nothing.

        With ``max_recoveries``, a step recovered for more than that many times
        in all (its process died each time it ran) is not run again: the same
        transaction marks it and the task ``failed`` with ``task_failed``
        (reason from :func:`recovery_limit_reason`). The count is read only
        when there is a step to recover.
        """
        ...

    def claim_next(
        self,
        queue: str,
        run_id: str,
        *,
        skip: Sequence[str] = (),
        check: Callable[[Task], None] | None = None,
        max_recoveries: int | None = None,
    ) -> tuple[Run, Task] | None:
        """Claim the oldest unfinished task of ``queue`` that no live runner holds,
        as :meth:`begin_run` does (recovery, ``check`` and ``max_recoveries`` included).

        Returns None at once when there is none; never waits for a held task.
        Ids in ``skip`` are passed over. A task that ``check`` refuses or that
        is damaged raises as in :meth:`begin_run`, nothing written; the caller
        passes it in ``skip`` from then on. The caller must call :meth:`end_run`.
        """
        ...

    def check_lease(self, run: Run) -> None:
        """Raise :class:`~ninelives.errors.LeaseLost` unless this runner surely still
        holds the task: called before a tool's effect. Renews the lease first when
        too little of it is known to remain; otherwise costs no round trip."""
        ...

    def abandon_run(self, run: Run) -> None:
        """Give the task up now, from any thread: a new epoch fences the runner out
        (its next commit raises LeaseLost) and the next claim recovers its step.
        Never raises."""
        ...

    def unfinished(self, queue: str, *, skip: Sequence[str] = ()) -> int:
        """How many tasks of ``queue`` are still ``pending`` or ``running``,
        leaving out the ids in ``skip``."""
        ...

    def start_step(self, run: Run, idx: int, tool: str) -> int:
        """Commit step ``idx`` ``running`` with attempts + 1 and ``step_started``;
        return the attempt number. Fenced."""
        ...

    def finish_step(
        self,
        run: Run,
        idx: int,
        tool: str,
        output: str,
        *,
        last: bool,
        append: Sequence[tuple[str, str]] = (),
        fail: str | None = None,
    ) -> None:
        """Commit step ``idx`` ``done`` with ``output`` (JSON text) and ``step_finished``.

        With ``last``, the same transaction marks the task ``done`` and journals
        ``task_done``. ``append`` adds steps ``(tool, input JSON)`` as
        ``idx + 1, idx + 2, ...``, each ``pending`` with a ``step_appended``
        naming ``idx`` (an agent's turn and the calls it asked for); a step
        already at one of those indexes is a :class:`StoreError` and nothing
        is written. With ``fail``, the task is marked ``failed`` with
        ``task_failed`` and that reason instead. Fenced.
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

    def retry_task(self, task_id: str, run_id: str, *, step: int | None = None) -> Task:
        """Move a ``failed`` task back to ``pending``, and its failed step too with
        attempts reset to 0, journaling ``task_retried`` in the same transaction.

        Takes the task as a runner would (the kernel lock, or a free lease) for
        the moment of the transaction and increments the lease epoch, so no
        earlier runner can commit to it afterwards. Raises
        :class:`~ninelives.errors.TaskBusy` at once while a live runner holds
        it, :class:`UnknownTask` if absent, and :class:`InputError` (changing
        nothing) if it is not failed or ``step`` is not its failed step.
        """
        ...

    def events(self, task_id: str) -> list[Event]:
        """The task's journal in ``seq`` order (empty for an unknown task)."""
        ...

    def close(self) -> None:
        """Release every resource; idempotent."""
        ...


def retry_target(task: Task, step: int | None) -> int:
    """The index of the step that :meth:`Store.retry_task` puts back to ``pending``,
    or :class:`InputError` when the task cannot be retried as asked."""
    from ..models import StepStatus, TaskStatus

    failed = [s.idx for s in task.steps if s.status is StepStatus.FAILED]
    if task.status is not TaskStatus.FAILED or not failed:
        raise InputError(
            f"task {task.id!r} is {task.status.value}, not failed: only a failed task is retried"
        )
    if step is not None and step != failed[0]:
        raise InputError(f"step {step} of task {task.id!r} has not failed (step {failed[0]} has)")
    return failed[0]


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

    def begin_run(self, task_id: str, run_id: str, **options: object) -> tuple[Run, Task]:
        raise self._unknown(task_id)

    def task_ids(self) -> list[str]:
        return []

    def retry_task(self, task_id: str, run_id: str, *, step: int | None = None) -> Task:
        raise self._unknown(task_id)

    def events(self, task_id: str) -> list[Event]:
        return []

    def close(self) -> None:
        pass


def task_exists(task_id: str, stored: str) -> TaskExists:
    """The error for a create of ``task_id`` when ``stored`` (equal but for case) exists.

    Ids are unique regardless of case: on a case-insensitive file system
    ``Demo`` and ``demo`` would publish to one artifact name.
    """
    if stored == task_id:
        return TaskExists(f"task {task_id!r} already exists")
    return TaskExists(
        f"task {task_id!r} already exists as {stored!r} (task ids are unique regardless of case)"
    )


def recovery_limit_reason(idx: int, count: int, limit: int | None) -> str:
    """The ``task_failed`` reason when step ``idx`` reached the recovery limit."""
    return (
        f"step {idx} was found running after its process died {count} times "
        f"(limit {limit}, NINELIVES_MAX_RECOVERIES): it is not run again; "
        "a step that kills its process every time (out of memory, a crash) "
        "would otherwise be retried forever"
    )


def is_postgres_url(url: str) -> bool:
    """True for ``postgresql://`` and ``postgres://`` URLs."""
    return url.startswith(("postgresql://", "postgres://"))


DEFAULT_LEASE = 30.0

#: The value the NINELIVES_TEST_DISABLE_* switches must hold, followed by the database URL.
_UNFENCED_PREFIX = "unsafe-test-only:"


def lease_settings(
    env: Mapping[str, str] | None = None,
    *,
    lease: float | None = None,
    heartbeat: float | None = None,
) -> tuple[float, float]:
    """``(lease, heartbeat)`` in seconds: the arguments, else ``NINELIVES_LEASE`` and
    ``NINELIVES_HEARTBEAT``, else 30 s and a third of the lease.

    The heartbeat must be shorter than the lease; bad values are an :class:`InputError`.
    """
    env = os.environ if env is None else env

    def seconds(name: str, given: float | None, default: float) -> float:
        if given is not None:
            value = float(given)
        elif env.get(name):
            try:
                value = float(env[name])
            except ValueError:
                raise InputError(f"{name} must be a number of seconds, got {env[name]!r}") from None
        else:
            return default
        if not 0.05 <= value <= 86400:  # also refuses NaN
            raise InputError(f"{name.lower()} must be 0.05-86400 seconds, got {value!r}")
        return value

    lease_s = seconds("NINELIVES_LEASE", lease, DEFAULT_LEASE)
    beat = seconds("NINELIVES_HEARTBEAT", heartbeat, lease_s / 3)
    if beat >= lease_s:
        raise InputError(
            f"the heartbeat ({beat:g} s) must be shorter than the lease ({lease_s:g} s)"
        )
    return lease_s, beat


def fencing_disabled(url: str, env: Mapping[str, str] | None = None) -> bool:
    """True only in the negative-control tests that prove fencing is what protects.

    TEST-ONLY. ``NINELIVES_TEST_DISABLE_FENCING`` must hold exactly
    ``unsafe-test-only:`` followed by this very database URL (or SQLite path):
    a stray ``=1`` or a value exported for another database does nothing, so
    the switch cannot be thrown by accident. When it is, the store says so on
    stderr each time it opens.
    """
    env = os.environ if env is None else env
    return env.get("NINELIVES_TEST_DISABLE_FENCING", "") == _UNFENCED_PREFIX + url


def heartbeat_disabled(url: str, env: Mapping[str, str] | None = None) -> bool:
    """True only in the negative-control tests that prove the heartbeat is what
    keeps a lease through a step longer than the lease.

    TEST-ONLY, thrown exactly like :func:`fencing_disabled`:
    ``NINELIVES_TEST_DISABLE_HEARTBEAT`` must hold ``unsafe-test-only:`` followed
    by this very database URL. Commits and the check before each tool still
    renew; only the renewals between them stop.
    """
    env = os.environ if env is None else env
    return env.get("NINELIVES_TEST_DISABLE_HEARTBEAT", "") == _UNFENCED_PREFIX + url


def open_store(
    url: str,
    *,
    create: bool = True,
    readonly: bool = False,
    lease: float | None = None,
    heartbeat: float | None = None,
) -> Store:
    """Open the store that ``url`` names: a PostgreSQL URL or a SQLite path.

    ``sqlite:///path`` is accepted as well as a plain path. With ``create``
    false, a SQLite file that does not exist is not created: the returned
    store answers every read with "unknown task". With ``readonly`` (implies
    not ``create``) a SQLite file is opened for reading only: never created,
    migrated or switched to WAL, byte-for-byte unchanged, readable on a
    read-only file system; the store offers only the reads (``get_task``,
    ``task_ids``, ``events``). On PostgreSQL ``readonly`` gives a session whose
    transactions are all read-only and that never migrates. ``lease`` and
    ``heartbeat`` (seconds) override :func:`lease_settings` on PostgreSQL.
    """
    if is_postgres_url(url):
        from .postgres import PostgresStore  # the only place psycopg gets imported

        lease_s, beat = lease_settings(lease=lease, heartbeat=heartbeat)
        return PostgresStore(url, lease=lease_s, heartbeat=beat, readonly=readonly)
    path = url.removeprefix("sqlite://") if url.startswith("sqlite:///") else url
    if readonly:
        from .sqlite_reader import open_reader

        return open_reader(path)  # type: ignore[return-value]
    from .sqlite import SQLiteStore

    if not create and not os.path.exists(path):
        return MissingStore(path)  # type: ignore[return-value]
    return SQLiteStore(path)
