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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from ..errors import InputError, UnknownTask
from ..models import Event, Run, Task

if TYPE_CHECKING:
    from ..plan import Plan


class Store(Protocol):
    """What the runtime needs from a database. SQLite and PostgreSQL implement it."""

    url: str

    def create_task(self, task_id: str, plan: Plan, *, queue: str | None = None) -> Task:
        """Store the task, all its steps and ``task_created`` in one transaction.

        With ``queue``, workers of that queue find and run the task; without it
        only ``run`` does. Raises :class:`~ninelives.errors.TaskExists`
        (changing nothing) if the id is taken.
        """
        ...

    def get_task(self, task_id: str) -> Task:
        """The task with its steps, read in one snapshot; :class:`UnknownTask` if absent."""
        ...

    def task_ids(self) -> list[str]:
        """Every stored task id, oldest first."""
        ...

    def begin_run(
        self, task_id: str, run_id: str, *, start_first: bool = False
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
        """
        ...

    def claim_next(
        self, queue: str, run_id: str, *, skip: Sequence[str] = ()
    ) -> tuple[Run, Task] | None:
        """Claim the oldest unfinished task of ``queue`` that no live runner holds,
        as :meth:`begin_run` does (recovery and ``run_started`` included).

        Returns None at once when there is none; never waits for a held task.
        Ids in ``skip`` are passed over. The caller must call :meth:`end_run`.
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

    def unfinished(self, queue: str) -> int:
        """How many tasks of ``queue`` are still ``pending`` or ``running``."""
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

    def begin_run(
        self, task_id: str, run_id: str, *, start_first: bool = False
    ) -> tuple[Run, Task]:
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


DEFAULT_LEASE = 30.0

#: The value NINELIVES_TEST_DISABLE_FENCING must hold, followed by the database URL.
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


def open_store(
    url: str,
    *,
    create: bool = True,
    lease: float | None = None,
    heartbeat: float | None = None,
) -> Store:
    """Open the store that ``url`` names: a PostgreSQL URL or a SQLite path.

    ``sqlite:///path`` is accepted as well as a plain path. With ``create``
    false, a SQLite file that does not exist is not created: the returned
    store answers every read with "unknown task". ``lease`` and ``heartbeat``
    (seconds) override :func:`lease_settings` on PostgreSQL.
    """
    if is_postgres_url(url):
        from .postgres import PostgresStore  # the only place psycopg gets imported

        lease_s, beat = lease_settings(lease=lease, heartbeat=heartbeat)
        return PostgresStore(url, lease=lease_s, heartbeat=beat)
    from .sqlite import SQLiteStore

    path = url.removeprefix("sqlite://") if url.startswith("sqlite:///") else url
    if not create and not os.path.exists(path):
        return MissingStore(path)  # type: ignore[return-value]
    return SQLiteStore(path)
