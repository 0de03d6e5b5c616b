"""The store's protocols, split by role (:class:`StoreReader`, :class:`Runner`,
:class:`Operator`, together :class:`Store`), the read-only stores, and the lease
settings every backend shares.

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

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..errors import StepNotDue as StepNotDue  # its old home: kept importable
from ..errors import StoreError, UnknownTask
from ..models import Event, EventKind, Run, Step, StepStatus, Task

if TYPE_CHECKING:
    from ..blobs import Blobs
    from ..plan import Plan


class StoreReader(Protocol):
    """The reads every store offers, the read-only ones included (``status``,
    ``export``, the checks): a SQLite file opened read-only, a missing database,
    and the full stores."""

    url: str
    #: ``"sqlite"`` or ``"postgres"``: the SQL the store speaks.
    dialect: str

    @property
    def blobs(self) -> Blobs:
        """Where outputs over the blob threshold are kept (:mod:`ninelives.blobs`):
        files beside a SQLite database, tables in a PostgreSQL one."""
        ...

    def get_task(self, task_id: str) -> Task:
        """The task with its steps, read in one snapshot; :class:`UnknownTask` if absent."""
        ...

    def task_ids(self) -> list[str]:
        """Every stored task id, oldest first."""
        ...

    def events(self, task_id: str) -> list[Event]:
        """The task's journal in ``seq`` order (empty for an unknown task)."""
        ...

    def blob_rows(self) -> list[tuple[str, int, str]]:
        """``(task_id, idx, output text)`` of every step output that is, or holds,
        a blob reference, as stored (unresolved): for :mod:`ninelives.blobs`' gc
        and checks."""
        ...

    def integrity_problems(self) -> list[str]:
        """What the engine's own check of its pages finds (SQLite's
        ``PRAGMA quick_check``), empty when sound; always empty on PostgreSQL,
        whose server checks its own pages."""
        ...

    def close(self) -> None:
        """Release every resource; idempotent."""
        ...


class Runner(Protocol):
    """What a runner (``run``, a worker) commits while it holds a task: each
    method is one transaction, fenced by the run's lease epoch."""

    def begin_run(
        self,
        task_id: str,
        run_id: str,
        *,
        start_first: bool = False,
        check: Callable[[Task], None] | None = None,
        max_recoveries: int | None = None,
        tool_version: Callable[[str], str | None] | None = None,
        on_unknown: Callable[[Step], str] | None = None,
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

        A cancelled task raises :class:`~ninelives.errors.TaskCancelled` and a task
        whose stored plan no longer matches its SHA-256
        :class:`~ninelives.errors.PlanTampered`, both before anything is written.
        ``tool_version(name)`` gives the version a tool declares, for the
        ``step_started`` that ``start_first`` journals.
        ``on_unknown(step)`` names the mode of each step found ``running``
        (``rerun`` when not given; see :func:`recover_unknown`): ``rerun``
        recovers it as above; ``refuse`` parks it in the same transaction
        (step and task ``blocked``, ``step_recovered`` then ``step_blocked``);
        ``probe`` leaves it ``running``, journaling nothing for it, for the
        runner to ask the probe and commit the answer (:meth:`settle_step`);
        then the claim starts no step.
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
        on_unknown: Callable[[Step], str] | None = None,
    ) -> tuple[Run, Task] | None:
        """Claim the oldest unfinished task of ``queue`` that no live runner holds,
        as :meth:`begin_run` does (recovery, ``check``, ``max_recoveries`` and
        ``on_unknown`` included). Blocked and waiting tasks are never claimed.

        Returns None at once when there is none; never waits for a held task.
        Ids in ``skip`` are passed over. A task that ``check`` refuses or that
        is damaged raises as in :meth:`begin_run`, nothing written; the caller
        passes it in ``skip`` from then on. The caller must call :meth:`end_run`.
        """
        ...

    def check_lease(self, run: Run) -> None:
        """Raise :class:`~ninelives.errors.LeaseLost` unless this runner surely still
        holds the task: called before a tool's effect, unless the step's fenced
        ``running`` commit came just before. Renews the lease first when too
        little of it is known to remain; otherwise costs no round trip."""
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

    def start_step(self, run: Run, idx: int, tool: str, *, tool_version: str | None = None) -> int:
        """Commit step ``idx`` ``running`` with attempts + 1 and ``step_started``
        (with the ninelives version and ``tool_version``); return the attempt
        number. Fenced; a cancelled task raises
        :class:`~ninelives.errors.TaskCancelled` instead, having written nothing.

        Every fenced method tells the two refusals apart the same way: a task
        cancelled under this runner's epoch is TaskCancelled (a cancel never
        moves the epoch), anything else LeaseLost. ``finish_step`` and
        ``record_error`` still commit what the runner owes after a cancel (the
        step's output, or its ``step_error`` and ``pending``), and nothing else,
        before raising TaskCancelled; the task stays ``cancelled``.

        A step whose ``not_before`` (its backoff) is still ahead raises
        :class:`StepNotDue`, nothing written; the start clears ``not_before``.
        (The claim of ``begin_run(start_first=True)`` likewise leaves such a step
        pending.)"""
        ...

    def append_step(
        self,
        run: Run,
        idx: int,
        tool: str,
        given: str,
        *,
        policy: str | None = None,
        tool_version: str | None = None,
        delay: float | None = None,
    ) -> int:
        """Append step ``idx`` (``tool``, input JSON ``given``, policy JSON) at the end
        of the task and commit it ``running`` (attempt 1) in one transaction:
        ``step_appended`` (data ``tool``, ``by`` = ``idx``: a workflow's step is
        appended by its own call) then ``step_started``, and the plan digest
        carried over it (tool, input and policy). Return the attempt (1).
        With ``delay`` (seconds, a workflow's timer) the step is appended
        ``pending`` instead, not to be started before ``now + delay`` on the
        store's clock (``not_before``, as a backoff), with no ``step_started``;
        return 0. Fenced; :class:`StoreError` (nothing written) unless ``idx``
        is the task's step count."""
        ...

    def finish_step(
        self,
        run: Run,
        idx: int,
        tool: str,
        output: str,
        *,
        last: bool,
        append: Sequence[Appended] = (),
        fail: str | None = None,
    ) -> None:
        """Commit step ``idx`` ``done`` with ``output`` (JSON text) and ``step_finished``.

        ``output`` may be a blob reference (:mod:`ninelives.blobs`), whose blob
        the caller has stored durably first; ``step_finished`` then carries it
        as ``blob``. Reads of the step give the blob's content, checked.

        With ``last``, the same transaction marks the task ``done`` and journals
        ``task_done``. ``append`` adds steps ``(tool, input JSON[, policy
        JSON or None])`` as ``idx + 1, idx + 2, ...``, each ``pending`` with a ``step_appended``
        naming ``idx`` (an agent's turn and the calls it asked for); a step
        already at one of those indexes is a :class:`StoreError` and nothing
        is written. With ``fail``, the task is marked ``failed`` with
        ``task_failed`` and that reason instead. Fenced.
        """
        ...

    def record_error(
        self,
        run: Run,
        idx: int,
        error: str,
        max_attempts: int,
        *,
        delay: float | None = None,
        permanent: bool = False,
        detail: dict[str, Any] | None = None,
    ) -> bool:
        """Journal ``step_error`` and put the step back to ``pending``; if it has
        used ``max_attempts`` or ``permanent``, mark step and task ``failed`` with
        ``task_failed`` (``reason``, ``why``) in the same transaction and return
        True. Fenced.

        With ``delay`` (seconds) the step is not started again before
        ``now + delay`` on the store's clock (``steps.not_before``, committed in
        the same transaction). The ``step_error`` data holds ``error``,
        ``attempt``, the entries of ``detail``, then the decision: ``final`` and
        ``why`` (``attempt_limit``, ``permanent``), or ``retry_at`` and ``delay``
        (see :func:`ninelives.policy.error_data`).
        """
        ...

    def checkpoint(self, run: Run, idx: int, progress: str) -> None:
        """Commit ``progress`` (JSON text) as running step ``idx``'s progress with a
        ``step_progress`` event (data ``progress``) in one transaction. Fenced: a
        runner that lost the task raises :class:`~ninelives.errors.LeaseLost`,
        writing nothing; a step not ``running`` is a :class:`StoreError`."""
        ...

    def finish_task(self, run: Run, *, result: str | None = None) -> None:
        """Mark the task ``done`` with ``task_done`` (a run that found no pending step,
        or a workflow that returned: ``result``, its return value's JSON text, is
        the event's ``result``). Fenced."""
        ...

    def end_run(self, run: Run) -> None:
        """Release the runner's hold on the task (lock or lease). Idempotent; never raises."""
        ...

    def reopen(self) -> Store:
        """Another connection to this database with this store's settings (on
        PostgreSQL its lease and heartbeat, which a fenced commit renews): for a
        commit from another thread while this store's connection is busy."""
        ...

    def park_step(self, run: Run, idx: int, status: StepStatus, data: dict[str, Any]) -> None:
        """Park step ``idx`` (``pending`` or ``running``) and its task as ``status``
        (``blocked`` or ``waiting``), journaling ``step_blocked`` or ``step_waiting``
        with ``data``, in one transaction. :class:`StoreError` (nothing written)
        if the step is neither pending nor running. Fenced; a cancelled task
        raises :class:`~ninelives.errors.TaskCancelled`, nothing written."""
        ...

    def settle_step(
        self,
        run: Run,
        idx: int,
        *,
        output: str | None = None,
        block: str | None = None,
        max_recoveries: int | None = None,
    ) -> str | None:
        """Commit a probe's answer for step ``idx``, left ``running`` by the claim:
        journal its ``step_recovered`` (``on_unknown: probe``), then with ``output``
        (JSON text) the step is ``done`` with it and ``step_reconciled``; with
        ``block`` (a reason) step and task are ``blocked`` with ``step_blocked``;
        with neither the step is ``pending`` to run again, unless that recovery
        is one more than ``max_recoveries`` (counted as :meth:`begin_run` counts
        them): then step and task are ``failed`` with ``task_failed``, whose
        reason is returned (None otherwise). One transaction;
        :class:`StoreError` if the step is not running. Fenced; a cancelled task
        raises :class:`~ninelives.errors.TaskCancelled`, nothing written (the
        step stays ``running``, as the cancel found it)."""
        ...


class Operator(Protocol):
    """What a person's commands commit on a task that no runner needs to hold:
    create, retry, cancel, fork, and the decision on a parked step."""

    def create_task(
        self, task_id: str, plan: Plan, *, queue: str | None = None, artifacts: str | None = None
    ) -> Task:
        """Store the task, all its steps and ``task_created`` in one transaction.

        With ``queue``, workers of that queue find and run the task; without it
        only ``run`` does. ``artifacts`` (an absolute folder) is recorded with the
        task and read back (absolute) as ``Task.artifacts``; every run publishes
        there. SQLite records a folder inside the database's own folder relative
        to it, so that a project moved or copied whole publishes in its new place.
        Raises :class:`~ninelives.errors.TaskExists` (changing nothing) if the id
        is taken.
        """
        ...

    def move_artifacts(self, task_id: str, folder: str) -> bool:
        """Record ``folder`` (absolute) as the task's artifacts folder in place of
        the one of create, in one transaction, if the task is ``pending``, has
        recorded a folder and has never started a step (so nothing can have been
        published in the old one); True if it did. Otherwise, or for an unknown
        task, changes nothing and returns False. Idempotent."""
        ...

    def retry_task(
        self, task_id: str, run_id: str, *, step: int | None = None, grant: Grant | None = None
    ) -> Task:
        """Move a ``failed`` task back to ``pending``, and its failed step too with
        attempts reset to 0, journaling ``task_retried`` in the same transaction.

        ``grant(task)``, asked of the task read in that transaction (without
        ``step``), may instead return ``(by, append, data)``: the steps to append
        after step ``by`` (an agent stopped by ``max_turns``/``max_calls``, given a
        new budget), each with its ``step_appended``, and the ``task_retried`` data.

        Takes the task as a runner would (the kernel lock, or a free lease) for
        the moment of the transaction and increments the lease epoch, so no
        earlier runner can commit to it afterwards. Raises
        :class:`~ninelives.errors.TaskBusy` at once while a live runner holds
        it, :class:`UnknownTask` if absent, and :class:`InputError` (changing
        nothing) if it is not failed or ``step`` is not its failed step.
        """
        ...

    def cancel_task(
        self, task_id: str, run_id: str, *, reason: str | None = None
    ) -> tuple[Task, bool]:
        """Mark the task ``cancelled`` with ``task_cancelled`` (data: ``reason`` and
        the ``status`` it had) in one transaction; return it and True.

        Does not wait for nor move the lease: a runner holding the task stops at
        its next commit (see :meth:`start_step`). A task already cancelled is
        returned unchanged with False (idempotent); a ``done`` task is an
        :class:`InputError` and :class:`UnknownTask` if absent, both changing nothing.
        """
        ...

    def fork_task(
        self,
        source_id: str,
        new_id: str,
        start: int,
        run_id: str,
        *,
        queue: str | None = None,
        artifacts: str | None = None,
    ) -> Task:
        """Store a new task ``new_id`` whose plan is ``source_id``'s, its steps
        before ``start`` copied ``done`` with their outputs (no attempt of its
        own), the rest ``pending`` (see :func:`ninelives.lineage.fork_steps`),
        journaling ``task_created`` and ``task_forked`` (data: ``source``,
        ``from``) in one transaction. The source, read in one snapshot, is not
        changed. The fork keeps the source's artifacts folder (``artifacts``
        when it recorded none) and goes to ``queue`` if given.

        Raises :class:`UnknownTask` (no source), :class:`TaskExists` (``new_id``
        taken, in any case), :class:`InputError` (``start`` is not a step of the
        source or a step before it is not done) and
        :class:`~ninelives.errors.PlanTampered`, each changing nothing.
        """
        ...

    def decide_step(self, task_id: str, run_id: str, idx: int, decision: Decision) -> Task:
        """A person's decision on a parked step (``resolve``, ``approve``), in one
        transaction: the task and step must be ``decision.expect`` (else
        :class:`InputError`, nothing changed); the step becomes
        ``decision.status`` with ``decision.output``, ``decision.kind`` is
        journaled with ``decision.data``, and the task becomes ``pending`` (or
        ``failed`` with ``task_failed`` and ``decision.reason`` when the step
        fails). Takes the task as :meth:`retry_task` does (``TaskBusy`` at once
        while a live runner holds it) and increments the lease epoch, so no
        earlier runner can commit to it afterwards. :class:`UnknownTask` if absent."""
        ...


class Store(StoreReader, Runner, Operator, Protocol):
    """What the runtime needs from a database: the reads, a runner's commits and
    an operator's. SQLite and PostgreSQL implement it; a read-only store
    (:class:`ReadOnly`) refuses every commit."""


class Decision(NamedTuple):
    """What :meth:`Store.decide_step` commits for a person
    (see :mod:`ninelives.runtime.decisions`)."""

    #: The status the task and step must have: ``blocked`` or ``waiting``.
    expect: StepStatus
    #: The step's new status: ``done``, ``pending`` (run it again) or ``failed``.
    status: StepStatus
    #: ``step_resolved``, ``step_approved`` or ``step_rejected``.
    kind: EventKind
    data: dict[str, Any]
    #: The step's output (JSON text) when it becomes done.
    output: str | None = None
    #: The ``task_failed`` reason when the step fails.
    reason: str | None = None


class ReadOnly:
    """The commits of :class:`Store` on a store opened for reading only: each
    raises the store's refusal (:meth:`refusal`) having written nothing.

    A read-only store inherits these and implements :class:`StoreReader` and
    ``blobs``; it is then a :class:`Store` whose every commit is refused, so
    that ``status`` and ``export`` use it where a runtime takes a store.
    """

    url: str

    def refusal(self, target: object) -> Exception:
        """The error for a commit on ``target`` (a task id or a :class:`Run`)."""
        return StoreError(f"database {self.url} is open read-only")

    def create_task(self, task_id: str, *args: Any, **options: Any) -> Task:
        raise self.refusal(task_id)

    def begin_run(self, task_id: str, *args: Any, **options: Any) -> tuple[Run, Task]:
        raise self.refusal(task_id)

    def claim_next(self, *args: Any, **options: Any) -> tuple[Run, Task] | None:
        raise self.refusal(None)

    def check_lease(self, run: Run) -> None:
        raise self.refusal(run)

    def abandon_run(self, run: Run) -> None:
        pass  # never raises: a read-only store holds no task

    def unfinished(self, *args: Any, **options: Any) -> int:
        return 0

    def start_step(self, run: Run, *args: Any, **options: Any) -> int:
        raise self.refusal(run)

    def append_step(self, run: Run, *args: Any, **options: Any) -> int:
        raise self.refusal(run)

    def finish_step(self, run: Run, *args: Any, **options: Any) -> None:
        raise self.refusal(run)

    def record_error(self, run: Run, *args: Any, **options: Any) -> bool:
        raise self.refusal(run)

    def checkpoint(self, run: Run, *args: Any, **options: Any) -> None:
        raise self.refusal(run)

    def finish_task(self, run: Run, *args: Any, **options: Any) -> None:
        raise self.refusal(run)

    def end_run(self, run: Run) -> None:
        pass  # idempotent and never raises, as on every store

    def reopen(self) -> Store:
        raise self.refusal(None)

    def park_step(self, run: Run, *args: Any, **options: Any) -> None:
        raise self.refusal(run)

    def settle_step(self, run: Run, *args: Any, **options: Any) -> str | None:
        raise self.refusal(run)

    def move_artifacts(self, task_id: str, folder: str) -> bool:
        raise self.refusal(task_id)

    def retry_task(self, task_id: str, *args: Any, **options: Any) -> Task:
        raise self.refusal(task_id)

    def cancel_task(self, task_id: str, *args: Any, **options: Any) -> tuple[Task, bool]:
        raise self.refusal(task_id)

    def fork_task(self, source_id: str, *args: Any, **options: Any) -> Task:
        raise self.refusal(source_id)

    def decide_step(self, task_id: str, *args: Any, **options: Any) -> Task:
        raise self.refusal(task_id)


class MissingStore(ReadOnly):
    """A database that does not exist yet, opened by a read-only command.

    Reads answer "unknown task" without creating a file, so ``status`` or
    ``run`` of a typo never leaves an empty database behind.
    """

    dialect = "sqlite"  # a PostgreSQL URL always names a database that exists

    def __init__(self, url: str) -> None:
        self.url = url

    def refusal(self, target: object) -> Exception:
        """Every commit names a task that this missing database does not hold."""
        task_id = target.task_id if isinstance(target, Run) else target
        return UnknownTask(f"unknown task {task_id!r} (no database at {self.url})")

    @property
    def blobs(self) -> Blobs:
        """No database, so no blobs: a :class:`StoreError`."""
        raise StoreError(f"no database at {self.url}")

    def get_task(self, task_id: str) -> Task:
        raise self.refusal(task_id)

    def task_ids(self) -> list[str]:
        return []

    def events(self, task_id: str) -> list[Event]:
        return []

    def blob_rows(self) -> list[tuple[str, int, str]]:
        return []

    def integrity_problems(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


#: A step an agent's turn appends: ``(tool, input JSON)`` or ``(tool, input JSON,
#: policy JSON or None)``; the policy is chained into the plan's digest like a planned one.
Appended = tuple[str, str] | tuple[str, str, str | None]
#: What a retry appends instead of putting a failed step back: see :meth:`Store.retry_task`.
Grant = Callable[[Task], "tuple[int, Sequence[Appended], dict[str, Any]] | None"]


def journal(store: Store, task_id: str) -> list[Event]:
    """The task's journal in ``seq`` order; :class:`UnknownTask` if absent.

    Also for a task whose output blob is missing or damaged: the journal needs
    no output, and it shows the reference that cannot be read.
    """
    from ..errors import BlobDamaged

    try:
        store.get_task(task_id)
    except BlobDamaged:
        pass  # the task exists
    return store.events(task_id)
