"""A runner's step transitions on PostgreSQL: start, finish, error, progress, done.

Functions of a :class:`~ninelives.store.postgres.store.PostgresStore` (the methods of
the Store protocol call them), kept out of that module so that it stays
readable. Each is one fenced transaction. Starting and finishing a step, the
two commits of every step, are one statement each (``start_step`` and
``finish_step`` in ``sql/postgres.sql``, after the fence): one round trip and
one message; the others pipeline BEGIN, their statements and COMMIT in one
flush, a round trip more when a reply is needed before COMMIT (an error's
attempt count, an agent turn's plan digest).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from psycopg import errors as pg_errors

from ... import lineage
from ...errors import StoreError
from ...journal import dumps
from ...models import EventKind, Run, TaskStatus
from ..base import Appended, StepNotDue
from ..commits import extend_plan
from ..rules import appended_rows, finished_data
from .base import Conn, PostgresTransaction, Q, around_attempt, not_running

if TYPE_CHECKING:
    from .store import PostgresStore


class _NotStartable(StoreError):
    """start_step's refusal: the step is not pending, or not yet due."""


def start_step(
    store: PostgresStore,
    run: Run,
    idx: int,
    tool: str,
    *,
    tool_version: str | None = None,
) -> int:
    """See :meth:`ninelives.store.Store.start_step`: one statement, the fence first."""
    sent = time.monotonic()
    head, tail = around_attempt(lineage.started_data(tool, 0, tool_version))
    try:
        with store._cancel_aware(run):
            store._refusals = []
            params = {
                **store._lease_params(run), "status": TaskStatus.RUNNING.value,
                "idx": idx, "run": run.run_id, "head": head, "tail": tail,
                "fence": store.refusal(lambda: store.lost(run)),
                "refusal": store.refusal(_NotStartable),
            }  # fmt: skip
            row = store._one("start_step", params).fetchone()
    except _NotStartable:
        raise not_started(store, run, idx) from None
    if row is None:
        raise StoreError(f"task {run.task_id!r} step {idx}: no attempt returned")
    store._after_commit(run, sent)
    return int(row[0])


def not_started(store: PostgresStore, run: Run, idx: int) -> Exception:
    """Why a step could not start (read only on that path): not yet due, or not pending."""
    with store._read() as conn:
        left = conn.execute(Q["step_due_in"], {"id": run.task_id, "idx": idx}).fetchone()
    if left is not None and left[0] > 0:
        return StepNotDue(run.task_id, idx, float(left[0]))
    return StoreError(f"task {run.task_id!r} step {idx} is not pending")


def finish_step(
    store: PostgresStore,
    run: Run,
    idx: int,
    tool: str,
    output: str,
    turn: tuple[bool, Sequence[Appended], str | None],
) -> None:
    """See :meth:`ninelives.store.Store.finish_step` (``turn`` is its ``last``,
    ``append`` and ``fail``): one statement unless the step
    appends steps (an agent turn), which pipelines its statements."""
    last, append, fail = turn
    sent = time.monotonic()
    status = TaskStatus.FAILED if fail else TaskStatus.DONE if last else TaskStatus.RUNNING
    owed = ("finish", idx, tool, output)
    if not append:  # the common case: one statement
        then, then_data = (
            (EventKind.TASK_FAILED.value, dumps({"reason": fail}))
            if fail
            else (EventKind.TASK_DONE.value, dumps({}))
            if last
            else (None, None)
        )
        with store._cancel_aware(run, *owed):
            store._refusals = []
            store._one(
                "finish_step",
                {**store._lease_params(run), "status": status.value, "idx": idx,
                 "run": run.run_id, "output": output,
                 "data": dumps(finished_data(tool, output)), "then": then,
                 "then_data": then_data, "fence": store.refusal(lambda: store.lost(run)),
                 "refusal": store.refusal(not_running(run.task_id, idx))},
            )  # fmt: skip
        store._after_commit(run, sent)
        return
    try:
        with store._cancel_aware(run, *owed), store._write() as conn:
            store.fence(conn, run, status)
            refusal = store.refusal(not_running(run.task_id, idx))
            conn.execute(
                Q["step_done"],
                {"id": run.task_id, "idx": idx, "output": output, "refusal": refusal},
            )
            store.journal_event(
                conn, run.task_id, run.run_id, EventKind.STEP_FINISHED, idx,
                finished_data(tool, output),
            )  # fmt: skip
            append_steps(store, conn, run.task_id, run.run_id, idx, append)
            if fail:
                store.journal_event(
                    conn,
                    run.task_id,
                    run.run_id,
                    EventKind.TASK_FAILED,
                    None,
                    {"reason": fail},
                )
            elif last:
                store.journal_event(conn, run.task_id, run.run_id, EventKind.TASK_DONE)
    except pg_errors.UniqueViolation as exc:
        raise StoreError(
            f"task {run.task_id!r} already has a step at an index appended after {idx}: "
            "steps are only appended at the end"
        ) from exc
    store._after_commit(run, sent)


def append_steps(
    store: PostgresStore,
    conn: Conn,
    task_id: str,
    run_id: str,
    by: int,
    append: Sequence[Appended],
) -> None:
    """Insert the steps turn ``by`` appends after it, journaled, the digest carried over."""

    for row in appended_rows(task_id, by + 1, append):
        conn.execute(Q["insert_step"], row)
        store.journal_event(
            conn, task_id, run_id, EventKind.STEP_APPENDED, row["idx"],
            {"tool": row["tool"], "by": by},
        )  # fmt: skip
    if append:
        extend_plan(PostgresTransaction(store, conn), task_id, by + 1, append)
