"""Cancel, fork and plan integrity on SQLite (the rules are :mod:`ninelives.lineage`'s).

Functions of a :class:`~ninelives.store.sqlite.SQLiteStore`, kept out of it so
that the store stays readable; each is one transaction, like every method.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .. import lineage
from ..errors import LeaseLost, StoreError, TaskCancelled
from ..journal import dumps
from ..models import EventKind, Run, Task, TaskStatus
from .base import Appended
from .rules import task_exists

if TYPE_CHECKING:
    from .sqlite import SQLiteStore

from .sqlite import Q
from .sqlite_files import stored_folder


def cancel_task(
    store: SQLiteStore, task_id: str, run_id: str, reason: str | None
) -> tuple[Task, bool]:
    """See :meth:`ninelives.store.Store.cancel_task`."""
    now = time.time()
    with store._write() as conn:
        task = store._load(conn, task_id)
        if not lineage.cancel_allowed(task):
            return task, False
        conn.execute(Q["cancel_task"], {"id": task_id, "now": now})
        data = {"reason": reason, "status": task.status.value}
        store._event(conn, task_id, run_id, EventKind.TASK_CANCELLED, None, data, now)
        task = store._load(conn, task_id)
    return task, True


def fork_task(
    store: SQLiteStore,
    source_id: str,
    new_id: str,
    start: int,
    run_id: str,
    *,
    queue: str | None,
    artifacts: str | None,
) -> Task:
    """See :meth:`ninelives.store.Store.fork_task`."""
    now = time.time()
    with store._write() as conn:
        # Rows as stored (escapes and blob references kept): a fork copies them
        # as they are, never a decoded value that would read back as another.
        source = store._load(conn, source_id, resolve=False)
        lineage.check_plan(source)
        turns = lineage.appended_turns(conn.execute(Q["appended_by"], {"id": source_id}))
        steps = lineage.fork_steps(source, start, turns)
        taken = conn.execute(Q["task_id_taken"], {"id": new_id}).fetchone()
        if taken is not None:
            raise task_exists(new_id, taken)
        digest = lineage.plan_digest(source.goal, ((s.tool, s.input, s.policy) for s in steps))
        conn.execute(
            Q["insert_task"],
            {"id": new_id, "goal": source.goal, "now": now, "queue": queue,
             "artifacts": stored_folder(store.path, source.artifacts or artifacts),
             "plan_sha256": digest},
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
        store._event(conn, new_id, run_id, EventKind.TASK_CREATED, None, {"steps": len(steps)}, now)
        data = {"source": source_id, "from": start}
        store._event(conn, new_id, run_id, EventKind.TASK_FORKED, None, data, now)
        return store._load(conn, new_id)


@contextmanager
def cancel_aware(store: SQLiteStore, run: Run, *settle: Any) -> Iterator[None]:
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


def fenced(store: SQLiteStore, run: Run, exc: LeaseLost) -> Exception:
    """Why a fenced commit was refused: TaskCancelled when the task was cancelled
    under this runner's epoch, else the LeaseLost itself. Read only on that path."""
    try:
        row = store._conn.execute(Q["get_task"], {"id": run.task_id}).fetchone()
    except sqlite3.Error:  # the lease error stands
        return exc
    if row is not None and row[2] == "cancelled" and row[5] == run.epoch:
        return lineage.cancelled(run.task_id)
    return exc


def _fence_cancelled(conn: sqlite3.Connection, run: Run, now: float) -> None:
    cur = conn.execute(Q["fence_cancelled"], {"id": run.task_id, "epoch": run.epoch, "now": now})
    if cur.rowcount != 1:
        raise LeaseLost(
            f"task {run.task_id!r} was taken over by another runner (epoch {run.epoch} "
            "is no longer current); this runner stops without writing"
        )


def settle_finish(store: SQLiteStore, run: Run, idx: int, tool: str, output: str) -> None:
    """After a cancel: commit the output of the step this runner was running
    (its effect happened), and nothing else; the task stays cancelled."""
    now = time.time()
    with store._write() as conn:
        _fence_cancelled(conn, run, now)
        cur = conn.execute(Q["step_done"], {"id": run.task_id, "idx": idx, "output": output})
        if cur.rowcount != 1:
            raise StoreError(f"task {run.task_id!r} step {idx} is not running")
        store._event(
            conn, run.task_id, run.run_id, EventKind.STEP_FINISHED, idx, {"tool": tool}, now
        )


def settle_error(store: SQLiteStore, run: Run, idx: int, error: str) -> None:
    """After a cancel: journal the failed attempt of the step this runner was
    running and put it back to ``pending``; the task stays cancelled."""
    now = time.time()
    with store._write() as conn:
        _fence_cancelled(conn, run, now)
        row = conn.execute(
            Q["step_back"],
            {"id": run.task_id, "idx": idx, "status": "pending", "now": now, "delay": None},
        ).fetchone()
        if row is None:
            raise StoreError(f"task {run.task_id!r} step {idx} is not running")
        store._event(
            conn, run.task_id, run.run_id, EventKind.STEP_ERROR, idx, {"error": error}, now
        )


def extend_plan(
    conn: sqlite3.Connection, task_id: str, start: int, append: Sequence[Appended]
) -> None:
    """In a turn's commit (or a workflow step's start): carry the task's plan
    digest over the steps it appends."""
    row = conn.execute(Q["plan_sha256"], {"id": task_id}).fetchone()
    digest = lineage.appended_digest(row[0] if row else None, start, append)
    if digest is not None:
        conn.execute(Q["set_plan_sha256"], {"id": task_id, "plan_sha256": digest})


def append_step(
    store: SQLiteStore,
    run: Run,
    idx: int,
    tool: str,
    given: str,
    policy: str | None,
    tool_version: str | None,
    delay: float | None = None,
) -> int:
    """See :meth:`ninelives.store.Store.append_step`."""
    now = time.time()
    with store._cancel_aware(run), store._write() as conn:
        store._fence(conn, run, TaskStatus.RUNNING, now)
        end = int(conn.execute(Q["next_step_idx"], {"id": run.task_id}).fetchone()[0])
        if idx != end:
            raise StoreError(f"task {run.task_id!r} has {end} steps: step {idx} cannot be appended")
        params = {"id": run.task_id, "idx": idx, "tool": tool, "input": given, "policy": policy}
        conn.execute(Q["insert_step"], params)
        store._event(
            conn, run.task_id, run.run_id, EventKind.STEP_APPENDED, idx,
            {"tool": tool, "by": idx}, now,
        )  # fmt: skip
        extend_plan(conn, run.task_id, idx, [(tool, given, policy)])
        if delay is not None:
            conn.execute(Q["step_defer"], {**params, "now": now, "delay": delay})
            return 0
        attempt = int(conn.execute(Q["step_running"], {**params, "now": now}).fetchone()[0])
        store._event(
            conn, run.task_id, run.run_id, EventKind.STEP_STARTED, idx,
            lineage.started_data(tool, attempt, tool_version), now,
        )  # fmt: skip
    return attempt
