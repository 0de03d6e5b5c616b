"""Housekeeping on SQLite: the reads of ``ls``, ``gc`` and ``doctor``, shared by the
store and the read-only reader, and the writes of ``gc`` and ``doctor --fix``.

Every query is named in ``sql/sqlite.sql`` and reaches its rows through an
index (migration 0007), so a database of many finished tasks answers as fast
as an empty one.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from ... import crashpoints
from ...errors import StoreError
from ...journal import dumps
from ...locking import (
    TASK_LOCK_NAME,
    TaskLock,
    is_held,
    lock_folder,
    open_lock_folder,
    remove_lock,
)
from ...models import DAMAGED, Deleted, MetricCounts, TaskHold, TaskSummary, step_durations
from .. import sql
from ..housekeeping import LocalFiles
from ..rules import newest_first
from .files import resolved_folder
from .text import lenient_text, rows_of_tasks, shown, undecodable

Q = sql.load_queries("sqlite")
T = TypeVar("T")


class SQLiteHousekeeping:
    """The housekeeping reads; the class that mixes it in supplies :meth:`_reading`."""

    url: str
    path: str
    #: A reader of a file without tables yet: every read answers "nothing".
    _empty: bool = False
    #: The tasks table has a queue column (False: a reader of a schema before 0003).
    _queued: bool = True

    def _reading(self, read: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    def list_tasks(
        self, *, statuses: Sequence[str] = (), queue: str | None = None, limit: int = 50
    ) -> list[TaskSummary]:
        """The newest ``limit`` tasks (of ``statuses`` and ``queue`` when given),
        newest first, each with its steps done, attempts and last event."""

        rows = Q["ls_rows"] if self._queued else Q["ls_rows_unqueued"]

        def read(conn: sqlite3.Connection) -> list[TaskSummary]:
            return _summaries(conn, _page(conn, statuses, queue, limit), limit, rows)

        # A database from before queues holds no task in one.
        none = self._empty or (queue is not None and not self._queued)
        return [] if none else self._reading(read)

    def gc_candidates(
        self, status: str, before: float, *, after: tuple[float, str], limit: int
    ) -> list[tuple[str, float]]:
        """``(id, updated_at)`` of up to ``limit`` tasks of ``status`` last changed
        before ``before`` and after the ``(updated_at, id)`` cursor ``after``, oldest first."""
        params = {"status": status, "before": before, "after_ts": after[0],
                  "after_id": after[1], "limit": limit}  # fmt: skip
        if self._empty:
            return []
        return self._reading(
            lambda conn: [(r[0], r[1]) for r in conn.execute(Q["gc_candidates"], params)]
        )

    def metric_counts(self) -> MetricCounts:
        """Tasks and steps by status, all attempts, all recoveries (``/metrics``)."""
        if self._empty:
            return MetricCounts({}, {}, 0, 0)
        return self._reading(_lenient_metric_counts)

    def tasks_in_status(self, status: str) -> list[TaskHold]:
        """The tasks of ``status`` with their epoch (no lease expires on SQLite)."""
        if self._empty:
            return []
        rows = self._reading(
            lambda conn: conn.execute(Q["tasks_in_status"], {"status": status}).fetchall()
        )
        return [TaskHold(r[0], r[1], r[2], r[3], r[4], False) for r in rows]

    def expired_leases(self) -> list[tuple[str, str, int, str, float]]:
        """None on SQLite: the kernel lock is the claim and dies with its process."""
        return []

    def artifact_folders(self) -> list[str]:
        """Every artifacts folder recorded with a task."""
        if self._empty:
            return []
        rows = self._reading(lambda conn: conn.execute(Q["artifact_folders"]).fetchall())
        return sorted({str(resolved_folder(self.path, r[0])) for r in rows})

    def schema_version(self) -> tuple[int, int]:
        """``(stored, newest this version knows)``."""
        stored = self._reading(lambda conn: int(conn.execute("PRAGMA user_version").fetchone()[0]))
        return stored, sql.migrations("sqlite")[-1][0]

    def dangling_rows(self) -> dict[str, int]:
        """How many journal events and steps belong to no stored task."""
        if self._empty:
            return {}
        rows = self._reading(lambda conn: conn.execute(Q["dangling_rows"]).fetchall())
        return {r[0]: int(r[1]) for r in rows if r[1]}

    def local_files(self) -> LocalFiles | None:
        """This store's files: a SQLite database is one (see :mod:`..housekeeping`)."""
        return self

    def is_held(self, task_id: str) -> bool:
        """Whether a live process holds the task's kernel lock; creates no file."""
        return is_held(self.path, task_id)

    def lock_files(self) -> list[str]:
        """The names in the lock folder (each a hash of a task id); a folder
        that is a symlink or a file is :class:`StoreError`, as a run finds it."""
        try:
            fd = open_lock_folder(lock_folder(self.path))
        except FileNotFoundError:
            return []
        try:
            return sorted(os.listdir(fd))
        finally:
            os.close(fd)

    def wal_bytes(self) -> int:
        """The size of the write-ahead log (0 when there is none)."""
        try:
            return os.stat(self.path + "-wal").st_size
        except OSError:
            return 0


def _page(
    conn: sqlite3.Connection, statuses: Sequence[str], queue: str | None, limit: int
) -> list[str | bytes]:
    """The ids of a page of ``ls``; bytes for an id that is not UTF-8."""
    if not statuses:
        if queue is None:
            return [r[0] for r in rows_of_tasks(conn, Q["ls_page"], {"limit": limit})]
        params = {"queue": queue, "limit": limit}
        return [r[0] for r in rows_of_tasks(conn, Q["ls_page_queue"], params)]
    ids: list[str | bytes] = []
    # One indexed page per status, merged by the caller: an IN list would
    # make SQLite sort every task of those statuses to find the newest few.
    for status in statuses:
        params = {"status": status, "queue": queue, "limit": limit}
        name = "ls_page_status" if queue is None else "ls_page_status_queue"
        ids.extend(r[0] for r in rows_of_tasks(conn, Q[name], params))
    return ids


def _summaries(
    conn: sqlite3.Connection, ids: list[str | bytes], limit: int, query: str
) -> list[TaskSummary]:
    if not ids:
        return []
    named = [i for i in ids if isinstance(i, str)]
    # A task's text is not UTF-8: listed as damaged, the others as they are.
    rows = rows_of_tasks(conn, query, {"ids": dumps(named)}) if named else []
    # An id that is not UTF-8 names no task: listed, escaped, with nothing else.
    rows += [
        (shown(i), None, None, None, None, None, 0, 0, 0, None, None)
        for i in ids
        if not isinstance(i, str)
    ]
    return newest_first([TaskSummary.from_row(r) for r in rows], limit)


class SQLiteHousekeepingWrites(SQLiteHousekeeping):
    """The housekeeping writes of the store (not of the reader)."""

    _conn: sqlite3.Connection

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError

    def _lock(self, task_id: str) -> TaskLock:
        raise NotImplementedError

    def delete_tasks(self, ids: Sequence[str], statuses: Sequence[str], before: float) -> Deleted:
        """Delete those of ``ids`` that are still of ``statuses`` and last changed
        before ``before``, with their steps and journal, in one transaction;
        tasks a live process holds are left. Each id deleted is recorded in
        ``removed_tasks`` (never used again: its idempotency keys may name the
        old task's effects). Their lock files are unlinked
        inside the transaction, each under its lock: a kill leaves the tasks
        with their rows and perhaps without a lock file (made again on demand),
        or gone with their lock files, never a lock file of a task that is gone."""
        locks = list(self._locks_of(ids))
        try:
            taken = [lock.task_id for lock in locks]
            with self._write() as conn:
                params = {
                    "ids": dumps(taken),
                    "statuses": dumps(list(statuses)),
                    "before": before,
                }
                gone = [r[0] for r in conn.execute(Q["gc_recheck"], params)]
                which = {"ids": dumps(gone)}
                events = conn.execute(Q["gc_events"], which).rowcount
                steps = conn.execute(Q["gc_steps"], which).rowcount
                conn.execute(Q["gc_tasks"], which)
                conn.execute(Q["gc_remember"], {**which, "now": time.time()})
                for lock in locks:
                    if lock.task_id in gone:
                        remove_lock(lock)
                crashpoints.crash("gc_before_commit")
        finally:
            for lock in locks:
                lock.release()
        return Deleted(tasks=tuple(gone), steps=steps, events=events)

    def _locks_of(self, ids: Sequence[str]) -> Iterator[TaskLock]:
        """The locks of ``ids`` this process could take; a task held elsewhere is skipped."""
        from ...errors import TaskBusy

        for task_id in ids:
            free = TaskLock(self.path, task_id)
            if free.surely_free():
                # Not taken: a runner starting now takes it and then finds the
                # task gone or changed (gc_recheck) in its claim.
                yield free
                continue
            try:
                yield self._lock(task_id)
            except TaskBusy:
                continue

    def delete_dangling(self) -> None:
        """Delete the journal events and steps that belong to no stored task."""
        with self._write() as conn:
            conn.execute(Q["delete_dangling_events"])
            conn.execute(Q["delete_dangling_steps"])

    def checkpoint_wal(self) -> bool:
        """Copy the write-ahead log into the database and truncate it; False when
        it could not finish within the busy timeout (a process reading an older
        snapshot, or writing, holds the log back): the log is then as it was."""
        try:
            busy = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.Error as exc:
            raise StoreError(f"checkpoint of {self.url} failed: {exc}") from exc
        # The answer, not an error, says whether it finished: (busy, frames, copied).
        return not busy

    def remove_lock_file(self, name: str) -> bool:
        """Unlink lock file ``name`` of a task that is gone, under its lock; False
        when a live process holds it (then it stays)."""
        if not re.fullmatch(TASK_LOCK_NAME, name):
            return False  # the blob store's lock, or a name ninelives does not make
        # Opened and unlinked inside the folder's own descriptor: a folder
        # swapped for a link meanwhile cannot steer the unlink elsewhere.
        try:
            dir_fd = open_lock_folder(lock_folder(self.path))
        except FileNotFoundError:
            return True
        try:
            return _unlink_unheld(name, dir_fd)
        finally:
            os.close(dir_fd)


def _unlink_unheld(name: str, dir_fd: int) -> bool:
    """Unlink lock file ``name`` in ``dir_fd`` under its lock; False when a
    live process holds it."""
    import errno
    import fcntl

    try:
        fd = os.open(name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        os.unlink(name, dir_fd=dir_fd)
        return True
    finally:
        os.close(fd)


def _lenient_metric_counts(conn: sqlite3.Connection) -> MetricCounts:
    """:func:`_metric_counts`; a status that is not UTF-8 (a hand edit, another
    program) is counted as ``damaged``, not a scrape that fails for every task."""
    try:
        return _metric_counts(conn)
    except sqlite3.OperationalError as exc:
        if not undecodable(exc):
            raise
    with lenient_text(conn):
        return _metric_counts(conn)


def _metric_counts(conn: Any) -> MetricCounts:
    """The counts of ``/metrics`` in one read (a DB-API connection of either store)."""
    tasks: dict[str, int] = {}
    for status, count in conn.execute(Q["metric_tasks"]):
        label = status if isinstance(status, str) else DAMAGED
        tasks[label] = tasks.get(label, 0) + int(count)
    steps: dict[str, int] = {}
    attempts = 0
    for status, count, tried in conn.execute(Q["metric_steps"]):
        label = status if isinstance(status, str) else DAMAGED
        steps[label] = steps.get(label, 0) + int(count)
        attempts += int(tried)
    recoveries = int(conn.execute(Q["metric_recoveries"]).fetchone()[0])
    started, durations = step_durations(conn.execute(Q["metric_durations"]).fetchall())
    return MetricCounts(tasks, steps, attempts, recoveries, started, durations)
