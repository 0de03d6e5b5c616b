"""The SQLite store's part in unknown outcomes and approvals (see :mod:`ninelives.parking`).

Functions of a :class:`~ninelives.store.sqlite.SQLiteStore` rather than more
methods in that module: each runs inside one of its transactions, or is one.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import crashpoints
from ..errors import InputError, StoreError, TaskBusy
from ..models import EventKind, Run, Step, StepStatus, Task, TaskStatus
from . import sql
from .base import Decision
from .rules import PARK_EVENT, REFUSE_REASON, decision_target, recover_unknown

if TYPE_CHECKING:
    from .sqlite import SQLiteStore

Q = sql.load_queries("sqlite")


def recover(
    store: SQLiteStore,
    conn: sqlite3.Connection,
    task: Task,
    run_id: str,
    recovered: Sequence[int],
    on_unknown: Callable[[Step], str] | None,
    now: float,
) -> tuple[list[int], bool]:
    """Inside the claim: each step found running (``task`` as the claim read it),
    by its mode. Returns the steps recovered to be run again (whose
    ``step_recovered`` the caller journals, with its recovery limit) and whether
    a step was left running for its probe."""
    task_id = task.id
    if not recovered:
        return [], False
    if on_unknown is None:
        conn.execute(Q["recover_steps"], {"id": task_id})
        return list(recovered), False
    modes = recover_unknown(task, recovered, on_unknown)
    rerun, probing = [], False
    for idx, mode in modes.items():
        if mode == "probe":
            probing = True  # stays running until the probe's answer is committed
        elif mode == "refuse":
            store._event(
                conn, task_id, run_id, EventKind.STEP_RECOVERED, idx, {"on_unknown": mode}, now
            )
            _park(store, conn, task_id, run_id, idx, StepStatus.BLOCKED,
                  {"reason": REFUSE_REASON}, now)  # fmt: skip
        else:
            conn.execute(Q["recover_step"], {"id": task_id, "idx": idx})
            rerun.append(idx)
    return rerun, probing


def _park(
    store: SQLiteStore,
    conn: sqlite3.Connection,
    task_id: str,
    run_id: str,
    idx: int,
    status: StepStatus,
    data: dict[str, Any],
    now: float,
) -> None:
    cur = conn.execute(Q["park_step"], {"id": task_id, "idx": idx, "status": status.value})
    if cur.rowcount != 1:
        raise StoreError(f"task {task_id!r} step {idx} is neither pending nor running")
    conn.execute(Q["park_task"], {"id": task_id, "status": status.value, "now": now})
    store._event(conn, task_id, run_id, PARK_EVENT[status], idx, data, now)


def park_step(
    store: SQLiteStore, run: Run, idx: int, status: StepStatus, data: dict[str, Any]
) -> None:
    now = time.time()
    with store._write() as conn:
        store._fence(conn, run, TaskStatus(status.value), now)
        _park(store, conn, run.task_id, run.run_id, idx, status, data, now)


def settle_step(
    store: SQLiteStore, run: Run, idx: int, *, output: str | None, block: str | None
) -> None:
    now = time.time()
    with store._write() as conn:
        store._fence(conn, run, TaskStatus.RUNNING, now)
        params = {"id": run.task_id, "idx": idx}
        store._event(conn, run.task_id, run.run_id, EventKind.STEP_RECOVERED, idx,
                     {"on_unknown": "probe"}, now)  # fmt: skip
        if output is not None:
            cur = conn.execute(Q["settle_step"], {**params, "status": "done", "output": output})
            store._event(conn, run.task_id, run.run_id, EventKind.STEP_RECONCILED, idx, None, now)
        elif block is not None:
            cur = conn.execute(Q["settle_step"], {**params, "status": "blocked", "output": None})
            conn.execute(Q["park_task"], {"id": run.task_id, "status": "blocked", "now": now})
            store._event(conn, run.task_id, run.run_id, EventKind.STEP_BLOCKED, idx,
                         {"reason": block}, now)  # fmt: skip
        else:
            cur = conn.execute(Q["recover_step"], params)
        if cur.rowcount != 1:
            raise StoreError(f"task {run.task_id!r} step {idx} is not running")
        crashpoints.crash("settle_before_commit", idx)


def decide_step(
    store: SQLiteStore, task_id: str, run_id: str, idx: int, decision: Decision
) -> Task:
    with store._read() as conn:  # refusals before any lock file is made
        found = store._load(conn, task_id)
    try:
        decision_target(found, idx, decision)
    except InputError:
        if store._held(task_id):
            raise TaskBusy(f"task {task_id!r} is being run by another process") from None
        raise
    lock = store._lock(task_id)  # TaskBusy at once while a runner holds it
    try:
        now = time.time()
        with store._write() as conn:
            task = store._load(conn, task_id)
            status = decision_target(task, idx, decision)
            expect = decision.expect.value
            conn.execute(
                Q["decide_task"],
                {"id": task_id, "status": status.value, "expect": expect, "now": now},
            )
            conn.execute(
                Q["decide_step"],
                {"id": task_id, "idx": idx, "status": decision.status.value,
                 "output": decision.output, "expect": expect},
            )  # fmt: skip
            store._event(conn, task_id, run_id, decision.kind, idx, decision.data, now)
            if status is TaskStatus.FAILED:
                store._event(conn, task_id, run_id, EventKind.TASK_FAILED, idx,
                             {"reason": decision.reason or "rejected"}, now)  # fmt: skip
            crashpoints.crash("decision_before_commit", idx)
    finally:
        lock.release()
    return store.get_task(task_id)
