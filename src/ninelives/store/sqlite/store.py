"""The SQLite store, assembled: the :class:`~ninelives.store.Store` methods that
are SQLite's own (create, claims and recovery, a step's start and finish, retry),
over :class:`.base.SQLiteBase` (the file, its transactions and locks), with the
rules of :mod:`ninelives.store.commits` that both backends share.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ... import crashpoints, lineage
from ...errors import (
    InputError,
    StoreError,
    TaskBusy,
    TaskExists,
    UnknownTask,
)
from ...journal import dumps
from ...locking import TaskLock, is_held
from ...models import Event, EventKind, Run, Step, StepStatus, Task, TaskStatus, damaged
from .. import commits, recovery
from ..base import Appended, Grant, StepNotDue
from ..rules import (
    appended_rows,
    finished_data,
    first_pending_step,
    retry_target,
    step_rows,
    task_exists,
)
from .base import CLAIM_PAGE, Q, SQLiteBase, SQLiteTransaction, describe, lease_lost
from .files import (
    integrity_findings,
    stored_folder,
)
from .text import blob_rows, rows_of_tasks, shown, utf8_rows

if TYPE_CHECKING:
    from ...plan import Plan


def _admitted(found: Task, queue: str | None, check: Callable[[Task], None] | None) -> bool:
    """Whether a claim may take ``found`` (a worker's, with ``queue``: False once
    it is finished); raises for a cancelled task asked for by id, an edited
    plan, or a refusal by ``check``, before anything is written."""
    if queue is None and found.status is TaskStatus.CANCELLED:
        raise lineage.cancelled(found.id)
    if queue is not None or check is not None:
        if queue is not None and found.status not in (TaskStatus.PENDING, TaskStatus.RUNNING):
            return False
        lineage.check_plan(found)
        if check is not None:
            check(found)
    return True


def _insert_steps(conn: sqlite3.Connection, task_id: str, rows: list[dict[str, Any]]) -> None:
    """Every step of a new task in one statement (insert_steps says how the texts
    travel); one insert per step when a tool's name holds a NUL, at which
    insert_steps' json_extract would end the name (input and policy are JSON
    texts, whose NULs are escaped)."""
    if not rows:  # a workflow's task starts with none
        return
    if any("\x00" in r["tool"] for r in rows):
        conn.executemany(Q["insert_step"], rows)
        return
    # ensure_ascii off: a text SQLite cannot take fails here as it would bound
    # on its own, never decoded as another.
    texts = json.dumps([[r["tool"], r["input"], r["policy"]] for r in rows], ensure_ascii=False)
    conn.execute(Q["insert_steps"], {"id": task_id, "steps": texts})


def _digest(conn: sqlite3.Connection, task_id: str, plan: Plan) -> str:
    """The plan's digest, in create's write. A plan it cannot be computed for (a
    text that cannot be encoded, a value JSON lacks) is refused with the taken
    id's error first, as when create read task_id_taken before it."""
    try:
        return lineage.plan_digest(plan.goal, ((s.tool, s.input, s.policy) for s in plan.steps))
    except Exception:
        taken = conn.execute(Q["task_id_taken"], {"id": task_id}).fetchone()
        if taken is not None:
            raise task_exists(task_id, taken) from None
        raise


class SQLiteStore(SQLiteBase, commits.SharedCommits):
    """A :class:`~ninelives.store.Store` on one SQLite file. Not thread-safe."""

    duplicate_key = sqlite3.IntegrityError

    # -- the Store protocol -------------------------------------------------

    def create_task(
        self,
        task_id: str,
        plan: Plan,
        *,
        queue: str | None = None,
        artifacts: str | None = None,
    ) -> Task:
        now = time.time()
        run_id = os.urandom(16).hex()
        try:
            with self._write() as conn:
                digest = _digest(conn, task_id, plan)
                inserted = conn.execute(
                    Q["insert_task_unless_taken"],
                    {"id": task_id, "goal": plan.goal, "now": now, "queue": queue,
                     "artifacts": stored_folder(self.path, artifacts), "plan_sha256": digest},
                )  # fmt: skip
                if inserted.rowcount != 1:  # taken (in any case, or by a removed task): by whom
                    taken = conn.execute(Q["task_id_taken"], {"id": task_id}).fetchone()
                    if taken is None:  # cannot be, under the write lock; refuse all the same
                        raise TaskExists(f"task {task_id!r} already exists")
                    raise task_exists(task_id, taken)
                rows = step_rows(task_id, plan)
                _insert_steps(conn, task_id, rows)
                self.journal_event(
                    conn, task_id, run_id, EventKind.TASK_CREATED, None,
                    {"steps": len(plan.steps)}, now,
                )  # fmt: skip
                crashpoints.crash("create_before_commit")
        except sqlite3.IntegrityError as exc:
            raise TaskExists(f"task {task_id!r} already exists") from exc
        # The task as stored, built from what was written rather than read back.
        steps = tuple(
            Step.from_row(task_id, (r["idx"], r["tool"], r["input"], "pending", None, 0,
                                    r["policy"], None, None))
            for r in rows
        )  # fmt: skip
        return Task(
            id=task_id, goal=plan.goal, status=TaskStatus.PENDING, created_at=now,
            updated_at=now, steps=steps, artifacts=artifacts, plan_sha256=digest,
        )  # fmt: skip

    def get_task(self, task_id: str) -> Task:
        with self._read_one() as conn:  # load is one statement
            return self.load(conn, task_id)

    def task_ids(self) -> list[str]:
        with self._read() as conn:
            return [row[0] for row in conn.execute(Q["task_ids"])]

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
        # One write transaction reads the task, checks it, takes its kernel lock
        # (tried, never waited on) and claims it: no other runner can commit
        # between the read and the claim. UnknownTask, DamagedTask, a cancel, an
        # edited plan and a refusal by ``check`` come before the lock file is
        # made: a task that cannot run here leaves no trace. Another holder is
        # found at once, not after waiting for the write lock: where the lock is
        # a byte of a shared file that exists, it is taken now (nothing made, two
        # opens fewer than looking first); else looked at now, taken in the claim.
        try:
            held = self._early_lock(task_id)
            if held is None and is_held(self.path, task_id):
                raise TaskBusy(f"task {task_id!r} is being run by another process")
        except TaskBusy:
            # A cancel is final, and its holder may not find it before its next
            # commit (asleep in a backoff): a cancelled task is refused as such.
            row = self.task_row(task_id)
            if row is not None and row[2] == TaskStatus.CANCELLED.value:
                raise lineage.cancelled(task_id) from None
            raise

        def admit(found: Task) -> None:
            nonlocal held
            if check is not None:
                check(found)
            if held is None:
                held = self._lock(task_id)

        try:
            claimed = self._claim(
                task_id, run_id, queue=None, start_first=start_first, check=admit,
                max_recoveries=max_recoveries, tool_version=tool_version,
                on_unknown=on_unknown,
            )  # fmt: skip
        except BaseException:
            if held is not None:
                held.release()
            raise
        assert claimed is not None
        assert held is not None
        self._locks[run_id] = held
        return claimed

    def _early_lock(self, task_id: str) -> TaskLock | None:
        """The task's lock if it can be taken before the claim's checks without
        making anything; None leaves it to the claim (a folder to refuse is
        refused there, after the checks that come first)."""
        lock = TaskLock(self.path, task_id)
        try:
            return lock if lock.acquire(make=False) else None
        except (OSError, StoreError):
            return None

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
        # One host: the kernel lock is the claim, so a worker tries the oldest
        # unfinished tasks, a page at a time, until it gets one that no live
        # process holds: any number of slots finds work.
        after: tuple[float, str] = (float("-inf"), "")
        while True:
            with self._read() as conn:
                page = rows_of_tasks(
                    conn, Q["claim_candidates"],
                    {"queue": queue, "after_ts": after[0], "after_id": after[1],
                     "page": CLAIM_PAGE, "now": time.time()},
                )  # fmt: skip
            for task_id, created_at in page:
                after = (created_at, task_id)
                if not isinstance(task_id, str):
                    # An id that is not UTF-8 (bytes here) names a task no one
                    # can run: refused by name, never stopping the queue behind it.
                    task_id = shown(task_id)
                    if task_id not in skip:
                        raise damaged(task_id, "task", ValueError("its id is not UTF-8"))
                if task_id in skip:
                    continue
                try:
                    lock = self._lock(task_id)
                except TaskBusy:
                    continue
                try:
                    claimed = self._claim(
                        task_id, run_id, queue=queue, check=check,
                        max_recoveries=max_recoveries, on_unknown=on_unknown,
                    )  # fmt: skip
                except BaseException:
                    lock.release()
                    raise
                if claimed is None:  # finished by another worker since the page was read
                    lock.release()
                    continue
                self._locks[run_id] = lock
                return claimed
            if len(page) < CLAIM_PAGE:
                return None

    def _claim(
        self,
        task_id: str,
        run_id: str,
        *,
        queue: str | None,
        start_first: bool = False,
        check: Callable[[Task], None] | None = None,
        max_recoveries: int | None = None,
        tool_version: Callable[[str], str | None] | None = None,
        on_unknown: Callable[[Step], str] | None = None,
    ) -> tuple[Run, Task] | None:
        """Under the task's lock (which ``check`` takes when the caller holds none
        yet): a new epoch, recovery and ``run_started`` in one
        transaction. With ``queue``: None if the task can no longer be claimed.
        ``check`` sees the task first; if it raises, nothing is written."""
        now = time.time()
        with self._write() as conn:
            found = self.load(conn, task_id)  # DamagedTask here writes nothing
            if not _admitted(found, queue, check):
                return None
            claim = conn.execute(Q["claim"], {"id": task_id, "now": now}).fetchone()
            if claim is None:  # removed by gc since it was read
                raise UnknownTask(f"unknown task {task_id!r}")
            epoch = claim[0]
            # The task as the claim leaves it, known without reading it again.
            task = found._replace(
                lease_epoch=epoch,
                updated_at=now,
                status=TaskStatus.RUNNING if found.status is TaskStatus.PENDING else found.status,
            )
            recovered = [s.idx for s in task.steps if s.status is StepStatus.RUNNING]
            probing, changed = self._recover(
                conn, task, run_id, recovered, max_recoveries, on_unknown, now
            )
            if changed:
                task = self.load(conn, task_id)  # recovery changed steps: read them back
            started = (
                self._start_first(conn, task, run_id, now, tool_version)
                if start_first and not probing  # steps run in order: the probe comes first
                else None
            )
            crashpoints.crash("recovery_before_commit")
            if started is not None:
                idx, attempt = started
                steps = tuple(
                    s._replace(status=StepStatus.RUNNING, attempts=attempt, not_before=None)
                    if s.idx == idx
                    else s
                    for s in task.steps
                )
                task = task._replace(steps=steps)
        run = Run(
            task_id=task_id, run_id=run_id, epoch=epoch, recovered=tuple(recovered),
            started=started,
        )  # fmt: skip
        return run, task

    def _recover(
        self,
        conn: sqlite3.Connection,
        task: Task,
        run_id: str,
        recovered: list[int],
        max_recoveries: int | None,
        on_unknown: Callable[[Step], str] | None,
        now: float,
    ) -> tuple[bool, bool]:
        """Inside the claim: :func:`ninelives.store.commits.recover`."""
        tx = SQLiteTransaction(self, conn, now)
        return recovery.recover(tx, task.id, run_id, recovered, on_unknown, task, max_recoveries)

    def _start_first(
        self,
        conn: sqlite3.Connection,
        task: Task,
        run_id: str,
        now: float,
        tool_version: Callable[[str], str | None] | None = None,
    ) -> tuple[int, int] | None:
        # The first pending step, found in the task the claim holds rather than
        # read again (first_pending_step says which, and why).
        step = first_pending_step(task)
        if step is None:
            return None
        params = {"id": task.id, "idx": step.idx, "now": now}
        started = conn.execute(Q["step_running"], params).fetchone()
        if started is None:
            return None  # waiting out its backoff: the runner waits, then starts it
        attempt = int(started[0])
        version = tool_version(step.tool) if tool_version is not None else None
        self.journal_event(
            conn, task.id, run_id, EventKind.STEP_STARTED, step.idx,
            lineage.started_data(step.tool, attempt, version), now,
        )  # fmt: skip
        return step.idx, attempt

    def reopen(self) -> SQLiteStore:
        return SQLiteStore(self.path, busy_timeout=self._busy_timeout)

    def check_lease(self, run: Run) -> None:
        # The kernel lock cannot lapse; only a replaced lock file lets another
        # runner in, and then the epoch has moved. One indexed read, no fsync.
        if not self._fencing:
            return
        try:
            row = self._conn.execute(Q["get_task"], {"id": run.task_id}).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read database {self.url}: {describe(exc)}") from exc
        if row is None or row[5] != run.epoch:
            raise lease_lost(run)

    def abandon_run(self, run: Run) -> None:
        try:
            with self._write() as conn:
                conn.execute(
                    Q["abandon"],
                    {"id": run.task_id, "epoch": run.epoch, "now": time.time()},
                )
        except (StoreError, sqlite3.Error):
            pass  # the kernel lock dies with this process anyway

    def unfinished(self, queue: str, *, skip: Sequence[str] = ()) -> int:
        with self._read() as conn:
            params = {"queue": queue, "skip": dumps(list(skip))}
            rows = rows_of_tasks(conn, Q["unfinished"], params)
        # An id that is not UTF-8 (bytes) is skipped under the name it was refused by.
        return sum(isinstance(r[0], str) or shown(r[0]) not in skip for r in rows)

    def start_step(self, run: Run, idx: int, tool: str, *, tool_version: str | None = None) -> int:
        now = time.time()
        with self._cancel_aware(run), self._write() as conn:
            params = {"id": run.task_id, "idx": idx, "now": now, "epoch": run.epoch}
            # The fence folded into the step's UPDATE: one statement when it holds
            # and the step is due; else the fence, then the step, say why.
            row = (
                conn.execute(Q["step_running_fenced"], params).fetchone() if self._fencing else None
            )
            if row is None:
                self.fence(conn, run, TaskStatus.RUNNING, now)
                row = conn.execute(Q["step_running"], params).fetchone()
            if row is None:
                left = conn.execute(Q["step_due_in"], params).fetchone()
                if left is not None and left[0] > 0:
                    raise StepNotDue(run.task_id, idx, float(left[0]))
                raise StoreError(f"task {run.task_id!r} step {idx} is not pending")
            attempt = int(row[0])
            self.journal_event(
                conn, run.task_id, run.run_id, EventKind.STEP_STARTED, idx,
                lineage.started_data(tool, attempt, tool_version), now,
            )  # fmt: skip
        return attempt

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
        now = time.time()
        status = TaskStatus.FAILED if fail else TaskStatus.DONE if last else TaskStatus.RUNNING
        with (
            self._cancel_aware(run, "finish", idx, tool, output),
            self._write() as conn,
        ):
            self._done(conn, run, idx, output, status, now)
            self.journal_event(
                conn, run.task_id, run.run_id, EventKind.STEP_FINISHED, idx,
                finished_data(tool, output), now,
            )  # fmt: skip
            self._append(conn, run.task_id, run.run_id, idx, append, now)
            if fail:
                self.journal_event(
                    conn, run.task_id, run.run_id, EventKind.TASK_FAILED, None,
                    {"reason": fail}, now,
                )  # fmt: skip
            elif last:
                self.journal_event(
                    conn, run.task_id, run.run_id, EventKind.TASK_DONE, None, None, now
                )

    def _done(
        self,
        conn: sqlite3.Connection,
        run: Run,
        idx: int,
        output: str,
        status: TaskStatus,
        now: float,
    ) -> None:
        """The fence, setting the task's ``status``, and step ``idx`` done."""
        params = {"id": run.task_id, "idx": idx, "output": output, "epoch": run.epoch}
        # A step that leaves its task running: the fence folded into the step's
        # UPDATE (one statement). Otherwise, or when it matched nothing, the
        # fence, then the step, which say why.
        if status is TaskStatus.RUNNING and self._fencing:
            if conn.execute(Q["step_done_fenced"], params).rowcount == 1:
                return
        self.fence(conn, run, status, now)
        if conn.execute(Q["step_done"], params).rowcount != 1:
            raise StoreError(f"task {run.task_id!r} step {idx} is not running")

    def _append(
        self,
        conn: sqlite3.Connection,
        task_id: str,
        run_id: str,
        by: int,
        append: Sequence[Appended],
        now: float,
    ) -> None:
        """Insert the steps turn ``by`` appends after it, journaled, the digest carried over."""
        for row in appended_rows(task_id, by + 1, append):
            try:
                conn.execute(Q["insert_step"], row)
            except sqlite3.IntegrityError as exc:
                raise StoreError(
                    f"task {task_id!r} already has a step {row['idx']}: steps are only "
                    "appended at the end"
                ) from exc
            self.journal_event(
                conn, task_id, run_id, EventKind.STEP_APPENDED, row["idx"],
                {"tool": row["tool"], "by": by}, now,
            )  # fmt: skip
        if append:
            commits.extend_plan(SQLiteTransaction(self, conn, now), task_id, by + 1, append)

    def end_run(self, run: Run) -> None:
        lock = self._locks.pop(run.run_id, None)
        if lock is not None:
            lock.release()

    def retry_task(
        self,
        task_id: str,
        run_id: str,
        *,
        step: int | None = None,
        grant: Grant | None = None,
    ) -> Task:
        def check(found: Task) -> None:
            if grant is None or step is not None or grant(found) is None:
                retry_target(found, step)
            else:
                lineage.check_plan(found)

        with self.operator(task_id, check) as tx:
            conn, now = tx.conn, tx.now
            task = self.load(conn, task_id)
            granted = grant(task) if grant is not None and step is None else None
            if granted is not None:
                lineage.check_plan(task)
                by, append, data = granted
                self._append(conn, task_id, run_id, by, append, now)
                conn.execute(Q["retry_task"], {"id": task_id, "now": now})
                self.journal_event(conn, task_id, run_id, EventKind.TASK_RETRIED, None, data, now)
            else:
                idx = retry_target(task, step)
                conn.execute(Q["retry_task"], {"id": task_id, "now": now})
                conn.execute(Q["retry_step"], {"id": task_id, "idx": idx})
                attempts = task.steps[idx].attempts
                self.journal_event(
                    conn, task_id, run_id, EventKind.TASK_RETRIED, idx,
                    {"attempts": attempts}, now,
                )  # fmt: skip
        return self.get_task(task_id)

    @contextmanager
    def operator(
        self, task_id: str, check: Callable[[Task], object]
    ) -> Iterator[SQLiteTransaction]:
        """A person's command on a task (retry, a decision): ``check`` refuses it
        before any lock file is made, then the transaction holds the task's kernel
        lock (:class:`TaskBusy` at once while a runner holds it)."""
        with self._read() as conn:
            found = self.load(conn, task_id)
        try:
            check(found)
        except InputError:
            # Busy says more than the refusal while a runner may still move the
            # task on; a cancelled task never moves again, whoever holds it.
            if found.status is not TaskStatus.CANCELLED and is_held(self.path, task_id):
                raise TaskBusy(f"task {task_id!r} is being run by another process") from None
            raise
        lock = self._lock(task_id)
        try:
            with self.transaction() as tx:
                yield tx
        finally:
            lock.release()

    def events(self, task_id: str) -> list[Event]:
        with self._read() as conn, utf8_rows(task_id, "journal"):
            rows = conn.execute(Q["events"], {"id": task_id}).fetchall()
        return [Event.from_row(row) for row in rows]

    def blob_rows(self) -> list[tuple[str, int, str]]:
        """``(task_id, idx, output)`` of every output that is, or holds, a blob
        reference (:func:`ninelives.blobs.references`)."""
        with self._read() as conn:
            return blob_rows(conn, Q["blob_rows"])

    def integrity_problems(self) -> list[str]:
        """:func:`~.files.integrity_findings`; empty when the file is sound."""
        try:
            return integrity_findings(self._conn)
        except sqlite3.Error as exc:
            return [f"quick_check failed: {describe(exc)}"]
