"""The PostgreSQL store's part in unknown outcomes and approvals (see :mod:`ninelives.parking`).

Functions of a :class:`~ninelives.store.postgres.PostgresStore` rather than
more methods in that module: each runs inside one of its transactions, or is one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .. import crashpoints
from ..errors import UnknownTask
from ..models import EventKind, Run, Step, StepStatus, Task, TaskStatus
from .base import Decision
from .postgres_session import LOCK_TIMEOUT_MS, Conn, Q
from .rules import PARK_EVENT, REFUSE_REASON, decision_target, recover_unknown

if TYPE_CHECKING:
    from .postgres import PostgresStore


def recover(
    store: PostgresStore,
    conn: Conn,
    task_id: str,
    run_id: str,
    recovered: Sequence[int],
    on_unknown: Callable[[Step], str] | None,
) -> tuple[list[int], bool]:
    """Inside the claim: each step found running, by its mode. Returns the steps
    recovered to be run again (whose ``step_recovered`` the caller journals, with
    its recovery limit) and whether a step was left running for its probe."""
    if on_unknown is None:
        if recovered:
            conn.execute(Q["recover_steps"], {"id": task_id})
        return list(recovered), False
    if not recovered:
        return [], False
    modes = recover_unknown(store._load(conn, task_id), recovered, on_unknown)
    rerun, probing = [], False
    for idx, mode in modes.items():
        if mode == "probe":
            probing = True  # stays running until the probe's answer is committed
        elif mode == "refuse":
            store._event(conn, task_id, run_id, EventKind.STEP_RECOVERED, idx, {"on_unknown": mode})
            _park(store, conn, task_id, run_id, idx, StepStatus.BLOCKED, {"reason": REFUSE_REASON})
        else:
            conn.execute(Q["recover_step"], {"id": task_id, "idx": idx})
            rerun.append(idx)
    return rerun, probing


def _park(
    store: PostgresStore,
    conn: Conn,
    task_id: str,
    run_id: str,
    idx: int,
    status: StepStatus,
    data: dict[str, Any],
) -> None:
    cur = conn.execute(Q["park_step"], {"id": task_id, "idx": idx, "status": status.value})
    store._expect_one(cur, f"task {task_id!r} step {idx} is neither pending nor running")
    conn.execute(Q["park_task"], {"id": task_id, "status": status.value})
    store._event(conn, task_id, run_id, PARK_EVENT[status], idx, data)


def park_step(
    store: PostgresStore, run: Run, idx: int, status: StepStatus, data: dict[str, Any]
) -> None:
    sent = time.monotonic()
    with store._write() as conn:
        store._fence(conn, run, TaskStatus(status.value))
        _park(store, conn, run.task_id, run.run_id, idx, status, data)
    store._after_commit(run, sent)


def settle_step(
    store: PostgresStore, run: Run, idx: int, *, output: str | None, block: str | None
) -> None:
    sent = time.monotonic()
    with store._write() as conn:
        store._fence(conn, run, TaskStatus.RUNNING)
        params = {"id": run.task_id, "idx": idx}
        store._event(conn, run.task_id, run.run_id, EventKind.STEP_RECOVERED, idx,
                     {"on_unknown": "probe"})  # fmt: skip
        if output is not None:
            cur = conn.execute(Q["settle_step"], {**params, "status": "done", "output": output})
            store._event(conn, run.task_id, run.run_id, EventKind.STEP_RECONCILED, idx)
        elif block is not None:
            cur = conn.execute(Q["settle_step"], {**params, "status": "blocked", "output": None})
            conn.execute(Q["park_task"], {"id": run.task_id, "status": "blocked"})
            store._event(conn, run.task_id, run.run_id, EventKind.STEP_BLOCKED, idx,
                         {"reason": block})  # fmt: skip
        else:
            cur = conn.execute(Q["recover_step"], params)
        store._expect_one(cur, f"task {run.task_id!r} step {idx} is not running")
        crashpoints.crash("settle_before_commit", idx)
    store._after_commit(run, sent)


def decide_step(
    store: PostgresStore, task_id: str, run_id: str, idx: int, decision: Decision
) -> Task:
    with store._write() as conn:
        conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
        row = conn.execute(Q["lease_state"], {"id": task_id}).fetchone()
        if row is None:
            raise UnknownTask(f"unknown task {task_id!r}")
        held, live = row
        if live:  # as in begin_run: free only if its holder is provably gone
            store._take_over_early(conn, task_id, held)
        task = store._load(conn, task_id)
        status = decision_target(task, idx, decision)
        expect = decision.expect.value
        conn.execute(Q["decide_task"], {"id": task_id, "status": status.value, "expect": expect})
        conn.execute(
            Q["decide_step"],
            {"id": task_id, "idx": idx, "status": decision.status.value,
             "output": decision.output, "expect": expect},
        )  # fmt: skip
        store._event(conn, task_id, run_id, decision.kind, idx, decision.data)
        if status is TaskStatus.FAILED:
            store._event(conn, task_id, run_id, EventKind.TASK_FAILED, idx,
                         {"reason": decision.reason or "rejected"})  # fmt: skip
        crashpoints.crash("decision_before_commit", idx)
    return store.get_task(task_id)
