"""A runner's step transitions on PostgreSQL: a step's start and finish.

:class:`StepCommits`, a part of :class:`~ninelives.store.postgres.store.PostgresStore`
kept out of that module so that it stays readable. Each transition is one
fenced transaction. Starting and finishing a step, the two commits of every
step, are one statement each (``start_step`` and ``finish_step`` in
``sql/postgres.sql``, after the fence): one round trip and one message; an
agent turn's finish, which appends steps, pipelines BEGIN, its statements and
COMMIT, a round trip more for its plan digest.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from psycopg import errors as pg_errors

from ... import lineage
from ...errors import StoreError
from ...journal import dumps
from ...models import EventKind, Run, TaskStatus
from ..base import Appended, StepNotDue
from ..commits import extend_plan
from ..rules import appended_rows, finished_data
from .base import Conn, PostgresTransaction, Q, Session, around_attempt, not_running


class _NotStartable(StoreError):
    """start_step's refusal: the step is not pending, or not yet due."""


class StepCommits(Session):
    """The :class:`~ninelives.store.Store` methods that start and finish a step."""

    if TYPE_CHECKING:  # from commits.SharedCommits, which the store lists after this class

        def _cancel_aware(self, run: Run, *settle: Any) -> AbstractContextManager[None]: ...

    def start_step(self, run: Run, idx: int, tool: str, *, tool_version: str | None = None) -> int:
        """See :meth:`ninelives.store.Store.start_step`: one statement, the fence first."""
        sent = time.monotonic()
        head, tail = around_attempt(lineage.started_data(tool, 0, tool_version))
        try:
            with self._cancel_aware(run):
                self._refusals = []
                params = {
                    **self._lease_params(run), "status": TaskStatus.RUNNING.value,
                    "idx": idx, "run": run.run_id, "head": head, "tail": tail,
                    "fence": self.refusal(lambda: self.lost(run)),
                    "refusal": self.refusal(_NotStartable),
                }  # fmt: skip
                row = self._one("start_step", params).fetchone()
        except _NotStartable:
            raise self._not_started(run, idx) from None
        if row is None:
            raise StoreError(f"task {run.task_id!r} step {idx}: no attempt returned")
        self._after_commit(run, sent)
        return int(row[0])

    def _not_started(self, run: Run, idx: int) -> Exception:
        """Why a step could not start (read only on that path): not yet due, or not pending."""
        with self._read() as conn:
            left = conn.execute(Q["step_due_in"], {"id": run.task_id, "idx": idx}).fetchone()
        if left is not None and left[0] > 0:
            return StepNotDue(run.task_id, idx, float(left[0]))
        return StoreError(f"task {run.task_id!r} step {idx} is not pending")

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
        """See :meth:`ninelives.store.Store.finish_step`: one statement unless the
        step appends steps (an agent turn), which pipelines its statements."""
        sent = time.monotonic()
        status = TaskStatus.FAILED if fail else TaskStatus.DONE if last else TaskStatus.RUNNING
        owed = ("finish", idx, tool, output)
        if append:
            self._finish_appending(run, idx, tool, output, status, append, fail)
            self._after_commit(run, sent)
            return
        then, then_data = (
            (EventKind.TASK_FAILED.value, dumps({"reason": fail}))
            if fail
            else (EventKind.TASK_DONE.value, dumps({}))
            if last
            else (None, None)
        )
        with self._cancel_aware(run, *owed):
            self._refusals = []
            self._one(
                "finish_step",
                {**self._lease_params(run), "status": status.value, "idx": idx,
                 "run": run.run_id, "output": output,
                 "data": dumps(finished_data(tool, output)), "then": then,
                 "then_data": then_data, "fence": self.refusal(lambda: self.lost(run)),
                 "refusal": self.refusal(not_running(run.task_id, idx))},
            )  # fmt: skip
        self._after_commit(run, sent)

    def _finish_appending(
        self,
        run: Run,
        idx: int,
        tool: str,
        output: str,
        status: TaskStatus,
        append: Sequence[Appended],
        fail: str | None,
    ) -> None:
        """An agent turn's finish: the fence, the step done, the steps it appends,
        then ``task_failed`` or ``task_done`` (``status``), in one pipelined transaction."""
        try:
            with self._cancel_aware(run, "finish", idx, tool, output), self._write() as conn:
                self.fence(conn, run, status)
                refusal = self.refusal(not_running(run.task_id, idx))
                conn.execute(
                    Q["step_done"],
                    {"id": run.task_id, "idx": idx, "output": output, "refusal": refusal},
                )
                self.journal_event(
                    conn, run.task_id, run.run_id, EventKind.STEP_FINISHED, idx,
                    finished_data(tool, output),
                )  # fmt: skip
                self.append_steps(conn, run.task_id, run.run_id, idx, append)
                if fail:
                    self.journal_event(
                        conn, run.task_id, run.run_id, EventKind.TASK_FAILED, None,
                        {"reason": fail},
                    )  # fmt: skip
                elif status is TaskStatus.DONE:
                    self.journal_event(conn, run.task_id, run.run_id, EventKind.TASK_DONE)
        except pg_errors.UniqueViolation as exc:
            raise StoreError(
                f"task {run.task_id!r} already has a step at an index appended after {idx}: "
                "steps are only appended at the end"
            ) from exc

    def append_steps(
        self,
        conn: Conn,
        task_id: str,
        run_id: str,
        by: int,
        append: Sequence[Appended],
    ) -> None:
        """Insert the steps turn ``by`` appends after it, journaled, the digest carried over."""
        for row in appended_rows(task_id, by + 1, append):
            conn.execute(Q["insert_step"], row)
            self.journal_event(
                conn, task_id, run_id, EventKind.STEP_APPENDED, row["idx"],
                {"tool": row["tool"], "by": by},
            )  # fmt: skip
        if append:
            extend_plan(PostgresTransaction(self, conn), task_id, by + 1, append)
