"""Cancel, fork and plan integrity on PostgreSQL (the rules are :mod:`ninelives.lineage`'s).

Functions of a :class:`~ninelives.store.postgres.PostgresStore`, kept out of
it so that the store stays readable; each is one transaction, like every method.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .. import lineage
from ..errors import LeaseLost, StoreError, TaskCancelled, UnknownTask
from ..journal import dumps
from ..models import EventKind, Run, Task
from .base import Appended
from .postgres_session import Conn, Q, not_running
from .rules import task_exists

if TYPE_CHECKING:
    from .postgres import PostgresStore


def _lock_task(store: PostgresStore, conn: Conn, task_id: str) -> None:
    if store._fetch(conn.execute(Q["task_row_lock"], {"id": task_id})) is None:
        raise UnknownTask(f"unknown task {task_id!r}")


def cancel_task(
    store: PostgresStore, task_id: str, run_id: str, reason: str | None
) -> tuple[Task, bool]:
    """See :meth:`ninelives.store.Store.cancel_task`."""
    with store._write() as conn:
        _lock_task(store, conn, task_id)
        task = store._load(conn, task_id)
        if not lineage.cancel_allowed(task):
            return task, False
        conn.execute(Q["cancel_task"], {"id": task_id})
        data = {"reason": reason, "status": task.status.value}
        store._event(conn, task_id, run_id, EventKind.TASK_CANCELLED, None, data)
        task = store._load(conn, task_id)
    return task, True


def fork_task(
    store: PostgresStore,
    source_id: str,
    new_id: str,
    start: int,
    run_id: str,
    *,
    queue: str | None,
    artifacts: str | None,
) -> Task:
    """See :meth:`ninelives.store.Store.fork_task`."""
    with store._write() as conn:
        # A consistent snapshot of the source: its row is locked against a
        # runner's commit for the moment of the read (the source is not changed).
        _lock_task(store, conn, source_id)
        # Rows as stored (escapes and blob references kept): a fork copies them
        # as they are, never a decoded value that would read back as another.
        source = store._load(conn, source_id, resolve=False)
        lineage.check_plan(source)
        rows = conn.execute(Q["appended_by"], {"id": source_id}).fetchall()
        turns = lineage.appended_turns(rows)
        steps = lineage.fork_steps(source, start, turns)
        conn.execute(Q["task_id_lock"], {"id": new_id})
        taken = store._fetch(conn.execute(Q["task_id_taken"], {"id": new_id}))
        if taken is not None:
            raise task_exists(new_id, taken)
        digest = lineage.plan_digest(source.goal, ((s.tool, s.input, s.policy) for s in steps))
        conn.execute(
            Q["insert_task"],
            {"id": new_id, "goal": source.goal, "queue": queue,
             "artifacts": source.artifacts or artifacts, "plan_sha256": digest},
        )  # fmt: skip
        for step in steps:
            params = {
                "id": new_id, "idx": step.idx, "tool": step.tool, "input": dumps(step.input),
                "policy": dumps(step.policy) if step.policy else None,
            }  # fmt: skip
            if step.output is not None:
                conn.execute(Q["insert_copied_step"], {**params, "output": dumps(step.output)})
            else:
                conn.execute(Q["insert_step"], params)
        store._event(conn, new_id, run_id, EventKind.TASK_CREATED, None, {"steps": len(steps)})
        data = {"source": source_id, "from": start}
        store._event(conn, new_id, run_id, EventKind.TASK_FORKED, None, data)
        return store._load(conn, new_id)


@contextmanager
def cancel_aware(store: PostgresStore, run: Run, *settle: Any) -> Iterator[None]:
    """Around a fenced commit: a refusal because the task was cancelled under this
    runner's epoch raises TaskCancelled, any other LeaseLost as it is. With
    ``settle`` (``"finish", idx, tool, output`` or ``"error", idx, error``), what
    the runner owes is committed first: see :func:`settle_finish`, :func:`settle_error`."""
    try:
        yield
    except LeaseLost as exc:
        error = fenced(store, run, exc)
        if settle and isinstance(error, TaskCancelled):
            owed = settle_finish if settle[0] == "finish" else settle_error
            owed(store, run, *settle[1:])
        raise error from None


def fenced(store: PostgresStore, run: Run, exc: LeaseLost) -> Exception:
    """Why a fenced commit was refused: TaskCancelled when the task was cancelled
    under this runner's epoch, else the LeaseLost itself. Read only on that path."""
    try:
        with store._read() as conn:
            row = conn.execute(Q["get_task"], {"id": run.task_id}).fetchone()
    except StoreError:
        return exc
    if row is not None and row[2] == "cancelled" and row[5] == run.epoch:
        return lineage.cancelled(run.task_id)
    return exc


def _fence_cancelled(store: PostgresStore, conn: Conn, run: Run) -> None:
    cur = conn.execute(Q["fence_cancelled"], {"id": run.task_id, "epoch": run.epoch})

    def check() -> None:
        if cur.rowcount != 1:
            raise store._lost(run)

    store._checks.append(check)


def settle_finish(store: PostgresStore, run: Run, idx: int, tool: str, output: str) -> None:
    """After a cancel: commit the output of the step this runner was running
    (its effect happened), and nothing else; the task stays cancelled."""
    with store._write() as conn:
        _fence_cancelled(store, conn, run)
        refusal = store._refusal(not_running(run.task_id, idx))
        params = {"id": run.task_id, "idx": idx, "output": output, "refusal": refusal}
        conn.execute(Q["step_done"], params)
        store._event(conn, run.task_id, run.run_id, EventKind.STEP_FINISHED, idx, {"tool": tool})


def settle_error(store: PostgresStore, run: Run, idx: int, error: str) -> None:
    """After a cancel: journal the failed attempt of the step this runner was
    running and put it back to ``pending``; the task stays cancelled."""
    with store._write() as conn:
        _fence_cancelled(store, conn, run)
        params = {"id": run.task_id, "idx": idx, "status": "pending", "delay": None}
        if store._fetch(conn.execute(Q["step_back"], params)) is None:
            raise StoreError(f"task {run.task_id!r} step {idx} is not running")
        store._event(conn, run.task_id, run.run_id, EventKind.STEP_ERROR, idx, {"error": error})


def extend_plan(
    store: PostgresStore, conn: Conn, task_id: str, start: int, append: Sequence[Appended]
) -> None:
    """In a turn's commit (or a workflow step's start): carry the task's plan
    digest over the steps it appends."""
    row = store._fetch(conn.execute(Q["plan_sha256"], {"id": task_id}))
    digest = lineage.appended_digest(row[0] if row else None, start, append)
    if digest is not None:
        conn.execute(Q["set_plan_sha256"], {"id": task_id, "plan_sha256": digest})
