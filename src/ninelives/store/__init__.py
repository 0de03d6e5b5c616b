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
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ..errors import InputError, StoreError, TaskExists, TaskIdRemoved, UnknownTask
from ..errors import StepNotDue as StepNotDue  # its old home: kept importable
from ..models import Event, EventKind, Run, Step, StepStatus, Task, TaskStatus

if TYPE_CHECKING:
    from ..blobs import Blobs
    from ..plan import Plan


class Store(Protocol):
    """What the runtime needs from a database. SQLite and PostgreSQL implement it."""

    url: str

    @property
    def blobs(self) -> Blobs:
        """Where outputs over the blob threshold are kept (:mod:`ninelives.blobs`):
        files beside a SQLite database, tables in a PostgreSQL one."""
        ...

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

    def park_step(self, run: Run, idx: int, status: StepStatus, data: dict[str, Any]) -> None:
        """Park step ``idx`` (``pending`` or ``running``) and its task as ``status``
        (``blocked`` or ``waiting``), journaling ``step_blocked`` or ``step_waiting``
        with ``data``, in one transaction. :class:`StoreError` (nothing written)
        if the step is neither pending nor running. Fenced."""
        ...

    def settle_step(
        self, run: Run, idx: int, *, output: str | None = None, block: str | None = None
    ) -> None:
        """Commit a probe's answer for step ``idx``, left ``running`` by the claim:
        journal its ``step_recovered`` (``on_unknown: probe``), then with ``output``
        (JSON text) the step is ``done`` with it and ``step_reconciled``; with
        ``block`` (a reason) step and task are ``blocked`` with ``step_blocked``;
        with neither the step is ``pending`` to run again. One transaction;
        :class:`StoreError` if the step is not running. Fenced."""
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

    def events(self, task_id: str) -> list[Event]:
        """The task's journal in ``seq`` order (empty for an unknown task)."""
        ...

    def blob_rows(self) -> list[tuple[str, int, str]]:
        """``(task_id, idx, output text)`` of every step output that is, or holds,
        a blob reference, as stored (unresolved): for :mod:`ninelives.blobs`' gc
        and checks."""
        ...

    def close(self) -> None:
        """Release every resource; idempotent."""
        ...


class Decision(NamedTuple):
    """What :meth:`Store.decide_step` commits for a person (see :mod:`ninelives.parking`)."""

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


def retry_target(task: Task, step: int | None) -> int:
    """The index of the step that :meth:`Store.retry_task` puts back to ``pending``,
    or :class:`InputError` when the task cannot be retried as asked."""
    from ..models import StepStatus, TaskStatus

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

    def retry_task(self, task_id: str, run_id: str, **options: Any) -> Task:
        raise self._unknown(task_id)

    def cancel_task(self, task_id: str, run_id: str, **options: object) -> tuple[Task, bool]:
        raise self._unknown(task_id)

    def fork_task(self, source_id: str, *args: object, **options: object) -> Task:
        raise self._unknown(source_id)

    def decide_step(self, task_id: str, run_id: str, idx: int, decision: Decision) -> Task:
        raise self._unknown(task_id)

    def events(self, task_id: str) -> list[Event]:
        return []

    def blob_rows(self) -> list[tuple[str, int, str]]:
        return []

    def close(self) -> None:
        pass


#: A step an agent's turn appends: ``(tool, input JSON)`` or ``(tool, input JSON,
#: policy JSON or None)``; the policy is chained into the plan's digest like a planned one.
Appended = tuple[str, str] | tuple[str, str, str | None]
#: What a retry appends instead of putting a failed step back: see :meth:`Store.retry_task`.
Grant = Callable[[Task], "tuple[int, Sequence[Appended], dict[str, Any]] | None"]


def appended_rows(task_id: str, start: int, append: Sequence[Appended]) -> list[dict[str, Any]]:
    """The ``insert_step`` parameters of the steps a turn appends at ``start`` on."""
    return [
        {"id": task_id, "idx": idx, "tool": new[0], "input": new[1],
         "policy": new[2] if len(new) == 3 else None}
        for idx, new in enumerate(append, start=start)
    ]  # fmt: skip


def step_rows(task_id: str, plan: Plan) -> list[dict[str, Any]]:
    """The ``insert_step`` parameters of a new task's steps, the same on both stores."""
    from ..journal import dumps

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
    from ..blobs import row_ref

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


def is_postgres_url(url: str) -> bool:
    """True for ``postgresql://`` and ``postgres://`` URLs, and for libpq keyword
    strings (``host=db dbname=ninelives``; see :func:`~.conninfo.is_keyword_string`)."""
    if url.startswith(("postgresql://", "postgres://")):
        return True
    from .conninfo import is_keyword_string

    return is_keyword_string(url)


#: Printed instead of a traceback when PostgreSQL is asked for without its driver.
POSTGRES_EXTRA = "pip install 'ninelives[postgres]'"


def _postgres_store() -> Any:
    """The PostgresStore class, or :class:`StoreError` naming the extra to install
    when psycopg is missing or cannot be loaded here."""
    try:
        from .postgres import PostgresStore  # the only place psycopg gets imported
    except ImportError as exc:
        if (exc.name or "").startswith("ninelives"):
            raise  # our own module is broken: not the user's to fix
        import importlib.util

        if importlib.util.find_spec("psycopg") is None:
            why = "psycopg, the PostgreSQL driver, is not installed"
        else:
            why = f"psycopg cannot be loaded ({str(exc).splitlines()[0] if str(exc) else exc!r})"
        raise StoreError(f"PostgreSQL needs its extra: {why}; {POSTGRES_EXTRA}") from None
    return PostgresStore


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


def open_store(
    url: str,
    *,
    create: bool = True,
    readonly: bool = False,
    lease: float | None = None,
    heartbeat: float | None = None,
) -> Store:
    """Open the store that ``url`` names: a PostgreSQL URL or a SQLite path.

    ``sqlite:///path`` is accepted as well as a plain path; a libpq keyword
    string (``host=db dbname=x``) is PostgreSQL. Without psycopg a PostgreSQL
    URL is a :class:`StoreError` naming ``pip install 'ninelives[postgres]'``. With ``create``
    false, a SQLite file that does not exist is not created: the returned
    store answers every read with "unknown task". With ``readonly`` (implies
    not ``create``) a SQLite file is opened for reading only: never created,
    migrated or switched to WAL, byte-for-byte unchanged, readable on a
    read-only file system; the store offers only the reads (``get_task``,
    ``task_ids``, ``events``). On PostgreSQL ``readonly`` gives a session whose
    transactions are all read-only and that never migrates. ``lease`` and
    ``heartbeat`` (seconds) override :func:`lease_settings` on PostgreSQL.
    """
    if "\0" in url:  # no file name or connection string holds one (the library API could)
        raise StoreError("a database path or URL cannot hold a NUL character")
    if is_postgres_url(url):
        store = _postgres_store()
        lease_s, beat = lease_settings(lease=lease, heartbeat=heartbeat)
        return store(url, lease=lease_s, heartbeat=beat, readonly=readonly)  # type: ignore[no-any-return]
    if url.startswith("sqlite:") and not url.startswith("sqlite:///"):
        # Not a file named "sqlite:" (what "sqlite://" would create).
        raise StoreError(f"a sqlite: URL names an absolute path, sqlite:///path (got {url})")
    path = url.removeprefix("sqlite://") if url.startswith("sqlite:///") else url
    if readonly:
        from .sqlite_reader import open_reader

        return open_reader(path)  # type: ignore[return-value]
    from .sqlite import SQLiteStore

    if not create and not os.path.exists(path):
        return MissingStore(path)  # type: ignore[return-value]
    return SQLiteStore(path)
