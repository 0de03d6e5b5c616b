"""The domain rules as commits, written once against :class:`Transaction`, the
small interface both backends provide (as dbos's ``SystemDatabase`` and huey's
``BaseSqlStorage`` do): cancel, fork, settle/decide, the cancel-aware refusal
and what a cancelled runner still owes. A claim's recovery and parking are
:mod:`.recovery`.

Each function runs inside one transaction the backend opened, so each store
method stays one transaction. What truly differs stays in the backends: the
SQL dialect (the named queries of ``sql/<dialect>.sql``), row locks, the
connection, and whose clock says ``now`` (SQLite passes it, PostgreSQL's
server reads its own).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from .. import crashpoints, lineage
from ..errors import BlobDamaged, LeaseLost, StoreError, TaskExists
from ..journal import dumps
from ..models import EventKind, Run, Step, StepStatus, Task, TaskStatus, damaged
from ..policy import error_data, failure_reason
from .recovery import park, worn_out
from .rules import (
    decision_target,
    task_exists,
)

if TYPE_CHECKING:
    from .base import Appended, Decision


class Transaction(Protocol):
    """One open write transaction of a backend, the small interface that the rules
    of :mod:`.rules` are written against (as dbos's ``SystemDatabase``).

    Queries are named (``sql/<dialect>.sql``, same names in both dialects); the
    backend adds what only it needs (SQLite's ``now``, PostgreSQL's refusals).
    """

    def run(self, query: str, params: dict[str, Any]) -> None:
        """Execute the named query, not reading its result."""
        ...

    def row(self, query: str, params: dict[str, Any]) -> Sequence[Any] | None:
        """The named query's first row, or None."""
        ...

    def rows(self, query: str, params: dict[str, Any]) -> list[Any]:
        """Every row of the named query."""
        ...

    def changes_one(self, query: str, params: dict[str, Any], error: str) -> None:
        """Execute the named query, which must change exactly one row, else the
        transaction fails with :class:`StoreError` (``error``) before it commits."""
        ...

    def event(
        self,
        task_id: str,
        run_id: str,
        kind: EventKind,
        step: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        """Journal one event in this transaction."""
        ...

    def load(self, task_id: str, *, resolve: bool = True) -> Task:
        """The task and its steps as this transaction sees them; :class:`UnknownTask`
        if absent. ``resolve`` False keeps the rows as stored (blob references)."""
        ...

    def fence(self, run: Run, status: TaskStatus) -> None:
        """Refuse (:class:`~ninelives.errors.LeaseLost`) unless ``run`` still holds
        the task, and set its status: the first statement of a fenced commit."""
        ...

    def fence_cancelled(self, run: Run) -> None:
        """As :meth:`fence`, for a task cancelled under ``run``'s epoch."""
        ...

    def fenced_row(self, run: Run, query: str, params: dict[str, Any]) -> Sequence[Any] | None:
        """:meth:`fence` (``running``), then the named query's first row. A backend
        may fold the fence into the query (SQLite: ``<query>_fenced``, falling
        back to the two when it returns nothing), with the same errors."""
        ...

    def lock_task(self, task_id: str) -> None:
        """Keep a runner's commit off the task's row for the rest of the
        transaction (SQLite's write lock already does); :class:`UnknownTask` if absent."""
        ...

    def lock_id(self, task_id: str) -> None:
        """Keep another creator of ``task_id`` (in any case) out until the commit."""
        ...

    def on_running_step(self, query: str, params: dict[str, Any]) -> None:
        """Execute the named query on step ``params["idx"]`` of task ``params["id"]``;
        the transaction fails with :class:`StoreError` unless that step was
        ``running`` (SQLite counts the rows; PostgreSQL's server refuses)."""
        ...

    def stored_folder(self, folder: str | None) -> str | None:
        """An artifacts folder as the backend stores it."""
        ...


class Journaling:
    """What a backend's transaction inherits: :meth:`Transaction.event` over its
    :meth:`Transaction.run` (``insert_event`` takes the same parameters in both
    dialects; SQLite's ``run`` adds its ``now``)."""

    def run(self, query: str, params: dict[str, Any]) -> None:
        raise NotImplementedError

    def event(
        self,
        task_id: str,
        run_id: str,
        kind: EventKind,
        step: int | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        self.run(
            "insert_event",
            {"id": task_id, "run": run_id, "kind": kind.value, "step": step,
             "data": dumps(data or {})},
        )  # fmt: skip


class CancelAware:
    """Around a fenced commit: a refusal because the task was cancelled under this
    runner's epoch raises TaskCancelled, any other LeaseLost as it is.
    ``task_row()`` reads the task's row (or raises :class:`StoreError`), only on
    that path. With ``settle`` (``"finish", idx, tool, output`` or ``"error",
    idx, error``), what the runner owes is committed first, in a
    ``transaction()`` of its own: see :func:`settle_finish`, :func:`settle_error`.

    A class, not a generator: every commit of a step enters one."""

    __slots__ = ("run", "settle", "task_row", "transaction")

    def __init__(
        self,
        run: Run,
        task_row: Callable[[], Sequence[Any] | None],
        transaction: Callable[[], AbstractContextManager[Transaction]],
        *settle: Any,
    ) -> None:
        self.run, self.task_row, self.transaction, self.settle = run, task_row, transaction, settle

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if not isinstance(exc, LeaseLost):
            return
        try:
            row = self.task_row()
        except StoreError:  # the lease error stands
            raise exc from None
        if row is None or row[2] != "cancelled" or row[5] != self.run.epoch:
            raise exc from None
        if self.settle:
            owed = settle_finish if self.settle[0] == "finish" else settle_error
            with self.transaction() as tx:
                owed(tx, self.run, *self.settle[1:])
        raise lineage.cancelled(self.run.task_id) from None


def cancel(tx: Transaction, task_id: str, run_id: str, reason: str | None) -> tuple[Task, bool]:
    """See :meth:`ninelives.store.Store.cancel_task`."""
    tx.lock_task(task_id)
    task = tx.load(task_id)
    if not lineage.cancel_allowed(task):
        return task, False
    tx.run("cancel_task", {"id": task_id})
    tx.event(task_id, run_id, EventKind.TASK_CANCELLED, None,
             {"reason": reason, "status": task.status.value})  # fmt: skip
    return tx.load(task_id), True


def fork(
    tx: Transaction,
    source_id: str,
    new_id: str,
    start: int,
    run_id: str,
    *,
    queue: str | None,
    artifacts: str | None,
) -> Task:
    """See :meth:`ninelives.store.Store.fork_task`."""
    # A consistent snapshot of the source: its row is kept from a runner's
    # commit for the moment of the read (the source is not changed).
    tx.lock_task(source_id)
    # Rows as stored (escapes and blob references kept): a fork copies them
    # as they are, never a decoded value that would read back as another.
    source = tx.load(source_id, resolve=False)
    lineage.check_plan(source)
    turns = lineage.appended_turns(tx.rows("appended_by", {"id": source_id}))
    steps = lineage.fork_steps(source, start, turns)
    tx.lock_id(new_id)
    taken = tx.row("task_id_taken", {"id": new_id})
    if taken is not None:
        raise task_exists(new_id, taken)
    digest, inserts = _fork_rows(source_id, new_id, source.goal, steps)
    tx.run(
        "insert_task",
        {"id": new_id, "goal": source.goal, "queue": queue,
         "artifacts": tx.stored_folder(source.artifacts or artifacts), "plan_sha256": digest},
    )  # fmt: skip
    for query, params in inserts:
        tx.run(query, params)
    tx.event(new_id, run_id, EventKind.TASK_CREATED, None, {"steps": len(steps)})
    tx.event(
        new_id,
        run_id,
        EventKind.TASK_FORKED,
        None,
        {"source": source_id, "from": start},
    )
    try:
        return tx.load(new_id)
    except BlobDamaged as exc:
        # A copied reference whose blob is missing is the source's damage: the
        # fork rolls back, and its new id would name a task that never was.
        text = str(exc).removeprefix(f"task {new_id!r}")
        raise BlobDamaged(f"task {source_id!r}{text}", task_id=source_id, step=exc.step) from None


def _fork_rows(
    source_id: str, new_id: str, goal: str, steps: Sequence[Step]
) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """The plan digest and the step inserts of a fork, all encoded before
    anything is written. A value stored JSON cannot hold (NaN or an infinity,
    as an older version could store in an output) makes the source task
    damaged: copied, it would be a row no strict reader accepts."""
    where = "task"
    try:
        digest = lineage.plan_digest(goal, ((s.tool, s.input, s.policy) for s in steps))
        inserts: list[tuple[str, dict[str, Any]]] = []
        for step in steps:
            where = f"step {step.idx}"
            params = {
                "id": new_id, "idx": step.idx, "tool": step.tool, "input": dumps(step.input),
                "policy": dumps(step.policy) if step.policy else None,
            }  # fmt: skip
            if step.output is not None:
                inserts.append(("insert_copied_step", {**params, "output": dumps(step.output)}))
            else:
                inserts.append(("insert_step", params))
    except ValueError as exc:  # json: "Out of range float values are not JSON compliant"
        raise damaged(source_id, where, exc) from None
    return digest, inserts


def settle_finish(tx: Transaction, run: Run, idx: int, tool: str, output: str) -> None:
    """After a cancel: commit the output of the step this runner was running
    (its effect happened), and nothing else; the task stays cancelled."""
    tx.fence_cancelled(run)
    tx.on_running_step("step_done", {"id": run.task_id, "idx": idx, "output": output})
    tx.event(run.task_id, run.run_id, EventKind.STEP_FINISHED, idx, {"tool": tool})


def settle_error(tx: Transaction, run: Run, idx: int, error: str) -> None:
    """After a cancel: journal the failed attempt of the step this runner was
    running and put it back to ``pending``; the task stays cancelled."""
    tx.fence_cancelled(run)
    params = {"id": run.task_id, "idx": idx, "status": "pending", "delay": None}
    if tx.row("step_back", params) is None:
        raise StoreError(f"task {run.task_id!r} step {idx} is not running")
    tx.event(run.task_id, run.run_id, EventKind.STEP_ERROR, idx, {"error": error})


def extend_plan(
    tx: Transaction,
    task_id: str,
    start: int,
    append: Sequence[Appended],
    *,
    stored: tuple[str | None] | None = None,
) -> None:
    """In a turn's commit (or a workflow step's start): carry the task's plan
    digest over the steps it appends. ``stored``: the digest as the caller
    already read it in this transaction (``append_head``), else read here."""
    if stored is None:
        row = tx.row("plan_sha256", {"id": task_id})
        stored = (row[0] if row else None,)
    digest = lineage.appended_digest(stored[0], start, append)
    if digest is not None:
        tx.run("set_plan_sha256", {"id": task_id, "plan_sha256": digest})


def settle(
    tx: Transaction,
    run: Run,
    idx: int,
    *,
    output: str | None,
    block: str | None,
    max_recoveries: int | None = None,
) -> str | None:
    """See :meth:`ninelives.store.Store.settle_step`."""
    tx.fence(run, TaskStatus.RUNNING)
    params = {"id": run.task_id, "idx": idx}
    not_running = f"task {run.task_id!r} step {idx} is not running"
    # "Did not happen" runs the step again: a recovery like a rerun's, counted
    # against the same limit (read before this one is journaled).
    worn = None
    if output is None and block is None:
        worn = worn_out(tx, run.task_id, idx, max_recoveries)
    tx.event(run.task_id, run.run_id, EventKind.STEP_RECOVERED, idx, {"on_unknown": "probe"})
    if output is not None:
        tx.changes_one("settle_step", {**params, "status": "done", "output": output}, not_running)
        tx.event(run.task_id, run.run_id, EventKind.STEP_RECONCILED, idx)
    elif block is not None:
        tx.changes_one("settle_step", {**params, "status": "blocked", "output": None}, not_running)
        tx.run("park_task", {"id": run.task_id, "status": "blocked"})
        tx.event(run.task_id, run.run_id, EventKind.STEP_BLOCKED, idx, {"reason": block})
    elif worn is not None:
        tx.changes_one("step_failed", params, not_running)
        tx.fence(run, TaskStatus.FAILED)
        tx.event(run.task_id, run.run_id, EventKind.TASK_FAILED, idx, {"reason": worn})
    else:
        tx.changes_one("recover_step", params, not_running)
    crashpoints.crash("settle_before_commit", idx)
    return worn


def decide(tx: Transaction, task_id: str, run_id: str, idx: int, decision: Decision) -> Task:
    """The commit of :meth:`Store.decide_step`, once the backend holds the task."""
    task = tx.load(task_id)
    status = decision_target(task, idx, decision)
    expect = decision.expect.value
    tx.run("decide_task", {"id": task_id, "status": status.value, "expect": expect})
    tx.run(
        "decide_step",
        {"id": task_id, "idx": idx, "status": decision.status.value,
         "output": decision.output, "expect": expect},
    )  # fmt: skip
    tx.event(task_id, run_id, decision.kind, idx, decision.data)
    if status is TaskStatus.FAILED:
        tx.event(task_id, run_id, EventKind.TASK_FAILED, idx,
                 {"reason": decision.reason or "rejected"})  # fmt: skip
    crashpoints.crash("decision_before_commit", idx)
    return task


def append(
    tx: Transaction,
    run: Run,
    idx: int,
    tool: str,
    given: str,
    *,
    policy: str | None,
    tool_version: str | None,
    delay: float | None,
) -> int:
    """See :meth:`ninelives.store.Store.append_step`."""
    # The fence, the end of the steps and the plan digest (the fence holds the
    # task's row, so neither moves before the commit).
    head = tx.fenced_row(run, "append_head", {"id": run.task_id})
    end, stored = (int(head[0]), head[1]) if head is not None else (0, None)
    if idx != end:
        raise StoreError(f"task {run.task_id!r} has {end} steps: step {idx} cannot be appended")
    params = {"id": run.task_id, "idx": idx, "tool": tool, "input": given, "policy": policy}
    # A step started at once is inserted running (attempt 1): what insert_step
    # then step_running would leave, in one statement.
    tx.run("insert_step" if delay is not None else "insert_running_step", params)
    tx.event(run.task_id, run.run_id, EventKind.STEP_APPENDED, idx, {"tool": tool, "by": idx})
    extend_plan(tx, run.task_id, idx, [(tool, given, policy)], stored=(stored,))
    if delay is not None:
        tx.run("step_defer", {**params, "delay": delay})
        return 0
    tx.event(run.task_id, run.run_id, EventKind.STEP_STARTED, idx,
             lineage.started_data(tool, 1, tool_version))  # fmt: skip
    return 1


class SharedCommits:
    """The :class:`~ninelives.store.Store` methods whose rule is all there is to
    them, written once over the backend's hooks: :meth:`transaction`, a
    runner's :meth:`fenced` transaction, an operator's :meth:`operator`
    transaction, and :meth:`task_row`. A backend's store lists this class after
    its own base, whose hooks it uses."""

    #: The driver's error for a duplicate key (a fork racing a create).
    duplicate_key: type[Exception] = Exception

    def transaction(self) -> AbstractContextManager[Transaction]:
        raise NotImplementedError

    def fenced(self, run: Run) -> AbstractContextManager[Transaction]:
        """A transaction of ``run``'s, renewing its lease once committed."""
        raise NotImplementedError

    def operator(
        self, task_id: str, check: Callable[[Task], object]
    ) -> AbstractContextManager[Transaction]:
        """A transaction that holds the task as a claim would, for a person's
        command; ``check`` may refuse it before anything is held."""
        raise NotImplementedError

    def task_row(self, task_id: str) -> Any:
        raise NotImplementedError

    def get_task(self, task_id: str) -> Task:
        raise NotImplementedError

    def _cancel_aware(self, run: Run, *settle: Any) -> AbstractContextManager[None]:
        return CancelAware(run, lambda: self.task_row(run.task_id), self.transaction, *settle)

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
        with self._cancel_aware(run), self.fenced(run) as tx:
            return append(
                tx, run, idx, tool, given, policy=policy, tool_version=tool_version, delay=delay
            )

    def move_artifacts(self, task_id: str, folder: str) -> bool:
        # Read first, so that the common case (a task that has run, or has no
        # folder of its own) costs no write transaction; the UPDATE checks again.
        row = self.task_row(task_id)  # get_task's columns: status 2, artifacts 6
        if row is None or row[2] != TaskStatus.PENDING.value or row[6] is None:
            return False
        with self.transaction() as tx:
            return (
                tx.row("move_artifacts", {"id": task_id, "artifacts": tx.stored_folder(folder)})
                is not None
            )

    def cancel_task(
        self, task_id: str, run_id: str, *, reason: str | None = None
    ) -> tuple[Task, bool]:
        with self.transaction() as tx:
            return cancel(tx, task_id, run_id, reason)

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
        try:
            with self.transaction() as tx:
                return fork(tx, source_id, new_id, start, run_id, queue=queue, artifacts=artifacts)
        except self.duplicate_key as exc:
            raise TaskExists(f"task {new_id!r} already exists") from exc

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
        with self._cancel_aware(run, "error", idx, error), self.fenced(run) as tx:
            tx.fence(run, TaskStatus.RUNNING)
            params = {"id": run.task_id, "idx": idx, "status": "pending", "delay": delay or None}
            row = tx.row("step_back", params)
            if row is None:
                raise StoreError(f"task {run.task_id!r} step {idx} is not running")
            attempts, retry_at = int(row[0]), row[1]
            failed = permanent or attempts >= max_attempts
            why = ("permanent" if permanent else "attempt_limit") if failed else None
            data = error_data(error, attempts, detail, why=why, retry_at=retry_at, delay=delay)
            tx.event(run.task_id, run.run_id, EventKind.STEP_ERROR, idx, data)
            if failed:
                tx.run("step_failed", {"id": run.task_id, "idx": idx})
                tx.fence(run, TaskStatus.FAILED)
                reason = failure_reason(idx, attempts, error, permanent=permanent)
                tx.event(run.task_id, run.run_id, EventKind.TASK_FAILED, idx,
                         {"reason": reason, "why": why})  # fmt: skip
            crashpoints.crash("error_before_commit", idx)
        return failed

    def checkpoint(self, run: Run, idx: int, progress: str) -> None:
        with self._cancel_aware(run), self.fenced(run) as tx:
            tx.fence(run, TaskStatus.RUNNING)
            tx.on_running_step(
                "step_progress", {"id": run.task_id, "idx": idx, "progress": progress}
            )
            tx.event(run.task_id, run.run_id, EventKind.STEP_PROGRESS, idx,
                     {"progress": json.loads(progress)})  # fmt: skip
            crashpoints.crash("checkpoint_before_commit", idx)

    def finish_task(self, run: Run, *, result: str | None = None) -> None:
        data = {"result": json.loads(result)} if result is not None else None
        with self._cancel_aware(run), self.fenced(run) as tx:
            tx.fence(run, TaskStatus.DONE)
            tx.event(run.task_id, run.run_id, EventKind.TASK_DONE, None, data)

    # Parking and a probe's answer are a runner's commits like the others: a
    # cancel that landed before them is TaskCancelled (exit 9), not LeaseLost.
    def park_step(self, run: Run, idx: int, status: StepStatus, data: dict[str, Any]) -> None:
        with self._cancel_aware(run), self.fenced(run) as tx:
            tx.fence(run, TaskStatus(status.value))
            park(tx, run.task_id, run.run_id, idx, status, data)

    def settle_step(
        self,
        run: Run,
        idx: int,
        *,
        output: str | None = None,
        block: str | None = None,
        max_recoveries: int | None = None,
    ) -> str | None:
        with self._cancel_aware(run), self.fenced(run) as tx:
            return settle(tx, run, idx, output=output, block=block, max_recoveries=max_recoveries)

    def decide_step(self, task_id: str, run_id: str, idx: int, decision: Decision) -> Task:
        with self.operator(task_id, lambda found: decision_target(found, idx, decision)) as tx:
            decide(tx, task_id, run_id, idx, decision)
        return self.get_task(task_id)
