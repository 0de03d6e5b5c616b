"""The SQLite store: stdlib ``sqlite3`` in WAL mode with ``synchronous=FULL``.

Connections use ``isolation_level=None`` and explicit ``BEGIN IMMEDIATE``: a
deferred BEGIN that later needs the write lock fails at once with "database
is locked" under contention, while BEGIN IMMEDIATE waits on the busy timeout,
so many ``run`` processes can share one file. One host only: a per-task kernel
lock (:mod:`ninelives.locking`) keeps two runners off the same task, and the
lease epoch fences a runner whose lock file was replaced under it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from ... import crashpoints
from ...blobs import FolderBlobs, folder_for, resolve_task
from ...errors import (
    CommitUnknown,
    LeaseLost,
    StoreError,
    UnknownTask,
)
from ...journal import dumps
from ...locking import BLOBS_LOCK, TaskLock, lock_folder
from ...models import (
    EventKind,
    Run,
    Step,
    Task,
    TaskStatus,
)
from .. import sql
from ..commits import Journaling
from ..leases import fencing_disabled
from ..rules import unknown_outcome
from .files import (
    CONTRACT_TABLES,
    cannot_write,
    check_file,
    check_same_file,
    check_sqlite_version,
    identity,
    not_ours,
    resolve,
    resolved_folder,
    stored_folder,
    unwritable,
)
from .housekeeping import SQLiteHousekeepingWrites
from .text import utf8_rows

if TYPE_CHECKING:
    from .group import GroupCommitter

Q = sql.load_queries("sqlite")
T = TypeVar("T")
BUSY_TIMEOUT = 60.0
#: Candidate tasks a worker reads at a time while looking for one it can lock.
CLAIM_PAGE = 64

# Failures after which a write's outcome is unknown: the pages may or may not
# have reached the disk, and SQLite may bring the row back after a crash.
# A corrupt file is not among them: it is unusable (exit 5), and running
# again would not help.
_UNKNOWN_OUTCOME = ("SQLITE_IOERR", "SQLITE_FULL", "SQLITE_CANTOPEN")
_UNKNOWN_TEXT = ("disk i/o error", "disk is full", "unable to open")


def error_name(exc: sqlite3.Error) -> str:
    return getattr(exc, "sqlite_errorname", "") or ""


def describe(exc: sqlite3.Error) -> str:
    return str(exc) or type(exc).__name__


class SQLiteBase(SQLiteHousekeepingWrites):
    """One SQLite file: the connection, transactions, the journal, the fence and
    the load that every part of :class:`~.store.SQLiteStore` commits through.
    Not thread-safe."""

    dialect = "sqlite"
    #: Set by :meth:`join_group`: writes then commit in batches with other stores'.
    _group: GroupCommitter | None = None

    def __init__(
        self,
        path: str,
        *,
        busy_timeout: float = BUSY_TIMEOUT,
        connect: Callable[..., sqlite3.Connection] = sqlite3.connect,
    ) -> None:
        """Open (creating if needed) the database at ``path`` and migrate it.

        ``connect`` stands in for :func:`sqlite3.connect`; only test harnesses
        pass it (the power-loss harness runs SQLite over a recording file layer).
        """
        check_sqlite_version(sqlite3.sqlite_version_info, sqlite3.sqlite_version)
        # The real path, so every name of the file (symlinks) shares one WAL and
        # one lock folder; hard links, FIFOs and devices are refused here.
        self.path, st = resolve(path, create=True)
        self.url = path
        #: Large outputs, as files in ``<real path>.blobs/`` (:mod:`ninelives.blobs`).
        self.blobs = FolderBlobs(
            folder_for(self.path),
            os.path.join(lock_folder(self.path), BLOBS_LOCK),
            held=self.is_held,
        )
        self._locks: dict[str, TaskLock] = {}
        self._busy_timeout = busy_timeout
        self._folder_synced = False
        self._fencing = not fencing_disabled(path)
        if not self._fencing:
            import sys

            warning = f"ninelives: WARNING: fencing is OFF for {path} (test-only switch)"
            print(warning, file=sys.stderr)
        if st is None:
            st = self._create_private(self.path)
        elif not os.access(self.path, os.W_OK):
            # SQLite would open the file read-only without a word and, for a WAL
            # database, create -wal and -shm of the file's read-only mode beside
            # it: a -shm that keeps the database unwritable after its mode is fixed.
            raise cannot_write(path, unwritable(self.path) or "the file is not writable")
        try:
            self._conn = connect(
                self.path,
                isolation_level=None,
                timeout=busy_timeout,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise self._unusable("cannot open", exc) from exc
        try:
            # The file connected to is the one checked: nothing swapped in a
            # link or another file between the checks and the connection.
            check_same_file(path, self.path, identity(st))
            self._configure()
        except sqlite3.Error as exc:
            self._conn.close()
            raise self._unusable("cannot use", exc) from exc
        except BaseException:
            self._conn.close()
            raise

    def _unusable(self, what: str, exc: sqlite3.Error) -> StoreError:
        # SQLite says only "unable to open database file" (or "readonly
        # database") when it cannot write beside the file: say why.
        name, text = error_name(exc), describe(exc).lower()
        if name.startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY")) or any(
            t in text for t in ("unable to open", "readonly database")
        ):
            why = unwritable(self.path)
            if why is not None:
                return cannot_write(self.url, why)
        return StoreError(f"{what} database {self.url}: {describe(exc)}")

    @staticmethod
    def _create_private(path: str) -> os.stat_result:
        # Create the file ourselves, readable by its owner only: SQLite gives
        # the -wal and -shm files the same mode as the database. O_NOFOLLOW and
        # O_EXCL: a link planted at the path since it was resolved is not followed.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            try:
                st = os.lstat(path)  # created meanwhile by another process
            except OSError as exc:
                raise StoreError(f"cannot create database {path}: {exc.strerror}") from None
            check_file(path, st)  # and not a link planted since the path was resolved
            return st
        except OSError as exc:
            raise StoreError(f"cannot create database {path}: {exc.strerror}") from None
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def _configure(self) -> None:
        conn = self._conn
        # Everything is read and checked before the first write (the switch to
        # WAL is one): a file that is not a database fails on the first read, a
        # foreign or newer database is refused byte-for-byte unchanged.
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in conn.execute(Q["table_names"])}
        if tables and not CONTRACT_TABLES <= tables:
            raise not_ours(self.url, tables)
        steps = sql.migrations(self.dialect)
        latest = steps[-1][0]
        if version > latest:
            raise StoreError(
                f"database schema version {version} is newer than this ninelives ({latest})"
            )
        self._use_wal()
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        if version < latest:
            self._migrate(steps)

    def _use_wal(self) -> None:
        """Switch the file to WAL, waiting like any write for another writer.

        The switch turns the statement's read lock into a write lock, and SQLite
        refuses that at once (SQLITE_BUSY, no busy handler) while another
        connection holds the write lock: several processes opening one new
        database together race this way. So the loser looks again, until the
        busy timeout.
        """
        conn = self._conn
        deadline = time.monotonic() + self._busy_timeout
        while conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            try:
                conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError as exc:
                if error_name(exc) != "SQLITE_BUSY" or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _migrate(self, steps: list[tuple[int, str, str]]) -> None:
        with self._write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            for number, _name, path in steps:
                if number > version:
                    for statement in sql.statements(path):
                        conn.execute(statement)
                        crashpoints.crash("migration_statement", number)
            crashpoints.crash("migration_before_commit")
            conn.execute(f"PRAGMA user_version = {int(steps[-1][0])}")

    # -- transactions -------------------------------------------------------

    def join_group(self, group: GroupCommitter) -> None:
        """Write through ``group`` from now on (group commit, :mod:`.group`)."""
        group.attach()
        self._group = group

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``), rolled back
        on any error; SQLite's errors translated (:meth:`_translate`), an
        ``IntegrityError`` left as it is. Through the group when one is joined."""
        if self._group is not None:
            return self._group.write()
        return _Write(self)

    def _sync_folder(self) -> None:
        # SQLite fsyncs the folder when it creates the WAL but ignores a failure
        # of that fsync. The WAL's name must be durable before a commit in it is
        # acknowledged, so the first write fsyncs the folder (the WAL is open by
        # then) and stops if that fails.
        folder = os.path.dirname(self.path)
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            # An I/O error inside a write transaction, like any other: exit 6.
            raise CommitUnknown(
                f"fsync of the database folder {folder} failed ({exc.strerror}); stopping "
                "before writing: the next run recovers",
                failed=f"fsync of the database folder {folder} failed ({exc.strerror})",
            ) from None
        self._folder_synced = True

    def _translate(self, exc: sqlite3.Error) -> StoreError:
        name, text = error_name(exc), describe(exc).lower()
        if name.startswith(_UNKNOWN_OUTCOME) or any(t in text for t in _UNKNOWN_TEXT):
            return unknown_outcome(f"write to {self.url}", describe(exc))
        return StoreError(f"database {self.url}: {describe(exc)}")

    def close(self) -> None:
        """Release the task locks and the group, and close the connection."""
        for lock in self._locks.values():
            lock.release()
        self._locks.clear()
        if self._group is not None:
            self._group.detach()
            self._group = None
        self._conn.close()

    @contextmanager
    def transaction(self) -> Iterator[SQLiteTransaction]:
        """One write transaction (:meth:`_write`) for the shared rules, on the
        clock read as it starts."""
        now = time.time()
        with self._write() as conn:
            yield SQLiteTransaction(self, conn, now)

    def fenced(self, run: Run) -> AbstractContextManager[SQLiteTransaction]:
        """A runner's transaction: on SQLite its kernel lock is the lease."""
        return self.transaction()

    def task_row(self, task_id: str) -> Any:
        """``get_task``'s row of a task, outside any transaction, for
        :class:`~ninelives.store.commits.CancelAware` and a ``run`` of a
        task another process holds."""
        try:
            return self._conn.execute(Q["get_task"], {"id": task_id}).fetchone()
        except sqlite3.Error as exc:
            raise StoreError(describe(exc)) from exc

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn
        try:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read database {self.url}: {describe(exc)}") from exc

    @contextmanager
    def _read_one(self) -> Iterator[sqlite3.Connection]:
        """The connection for a read that is one statement: its own snapshot, so
        no BEGIN and COMMIT around it (two statements fewer); errors as :meth:`_read`'s."""
        try:
            yield self._conn
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read database {self.url}: {describe(exc)}") from exc

    def _reading(self, read: Callable[[sqlite3.Connection], T]) -> T:
        with self._read() as conn:
            return read(conn)

    @staticmethod
    def journal_event(
        conn: sqlite3.Connection,
        task_id: str,
        run_id: str,
        kind: EventKind,
        step: int | None = None,
        data: dict[str, Any] | None = None,
        now: float | None = None,
    ) -> None:
        conn.execute(
            Q["insert_event"],
            {
                "now": time.time() if now is None else now,
                "id": task_id,
                "run": run_id,
                "kind": kind.value,
                "step": step,
                "data": dumps(data or {}),
            },
        )

    def fence(self, conn: sqlite3.Connection, run: Run, status: TaskStatus, now: float) -> None:
        params = {
            "status": status.value,
            "now": now,
            "id": run.task_id,
            "epoch": run.epoch,
        }
        if status is TaskStatus.RUNNING:  # the common case: a step inside a run
            query = Q["fence_read" if self._fencing else "fence_read_unchecked"]
            row = conn.execute(query, params).fetchone()
            if row is None:
                raise lease_lost(run)
            if row[0] == TaskStatus.RUNNING.value:
                return
        if conn.execute(Q["fence" if self._fencing else "fence_unchecked"], params).rowcount != 1:
            raise lease_lost(run)

    def load(self, conn: sqlite3.Connection, task_id: str, *, resolve: bool = True) -> Task:
        """The task and its steps; outputs stored as blobs read back (checked)
        unless ``resolve`` is False (rows as stored: escapes and references kept)."""
        with utf8_rows(task_id):
            rows = conn.execute(Q["get_task_steps"], {"id": task_id}).fetchall()
        if not rows:
            raise UnknownTask(f"unknown task {task_id!r}")
        steps = tuple(Step.from_row(task_id, r[8:]) for r in rows if r[8] is not None)
        task = Task.from_row(rows[0][:8], steps)
        task = task._replace(artifacts=resolved_folder(self.path, task.artifacts))
        return resolve_task(task, self.blobs) if resolve else task

    def _lock(self, task_id: str) -> TaskLock:
        lock = TaskLock(self.path, task_id)
        try:
            lock.acquire()
        except OSError as exc:
            raise StoreError(f"cannot lock task {task_id!r}: {exc.strerror}") from None
        return lock


class _Write:
    """:meth:`SQLiteBase._write` outside a group: a class, not a generator, as
    every commit enters one."""

    __slots__ = ("base",)

    def __init__(self, base: SQLiteBase) -> None:
        self.base = base

    def __enter__(self) -> sqlite3.Connection:
        base, conn = self.base, self.base._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot start a write on {base.url}: {describe(exc)}") from exc
        if not base._folder_synced:
            try:
                base._sync_folder()
            except BaseException as exc:
                self._roll_back(exc)
                raise
        return conn

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            try:
                self.base._conn.execute("COMMIT")
            except BaseException as failed:
                self._roll_back(failed)
                raise
        else:
            self._roll_back(exc)  # then the body's error goes on as it is

    def _roll_back(self, exc: BaseException) -> None:
        """Roll back after ``exc``; raise SQLite's error translated (an
        ``IntegrityError`` aside: the caller tells a taken id by it)."""
        try:
            self.base._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # already rolled back by SQLite, or the file is gone
        if isinstance(exc, sqlite3.Error) and not isinstance(exc, sqlite3.IntegrityError):
            raise self.base._translate(exc) from exc


def lease_lost(run: Run) -> LeaseLost:
    return LeaseLost(
        f"task {run.task_id!r} was taken over by another runner (epoch {run.epoch} "
        "is no longer current); this runner stops without writing"
    )


class SQLiteTransaction(Journaling):
    """One write transaction of a :class:`SQLiteBase`: the
    :class:`~ninelives.store.commits.Transaction` the shared rules commit
    through. SQLite's clock is the caller's: every statement gets ``now``."""

    def __init__(self, store: SQLiteBase, conn: sqlite3.Connection, now: float) -> None:
        self.store, self.conn, self.now = store, conn, now

    def _exec(self, query: str, params: dict[str, Any]) -> sqlite3.Cursor:
        return self.conn.execute(Q[query], {**params, "now": self.now})

    def run(self, query: str, params: dict[str, Any]) -> None:
        self._exec(query, params)

    def row(self, query: str, params: dict[str, Any]) -> Any:
        return self._exec(query, params).fetchone()

    def rows(self, query: str, params: dict[str, Any]) -> list[Any]:
        return self._exec(query, params).fetchall()

    def changes_one(self, query: str, params: dict[str, Any], error: str) -> None:
        if self._exec(query, params).rowcount != 1:
            raise StoreError(error)

    def load(self, task_id: str, *, resolve: bool = True) -> Task:
        return self.store.load(self.conn, task_id, resolve=resolve)

    def fence(self, run: Run, status: TaskStatus) -> None:
        self.store.fence(self.conn, run, status, self.now)

    def fence_cancelled(self, run: Run) -> None:
        if self._exec("fence_cancelled", {"id": run.task_id, "epoch": run.epoch}).rowcount != 1:
            raise lease_lost(run)

    def fenced_row(self, run: Run, query: str, params: dict[str, Any]) -> Any:
        if self.store._fencing:
            row = self.row(f"{query}_fenced", {**params, "epoch": run.epoch})
            if row is not None:
                return row
        self.fence(run, TaskStatus.RUNNING)
        return self.row(query, params)

    def lock_task(self, task_id: str) -> None:
        pass  # BEGIN IMMEDIATE already holds the database's write lock

    def lock_id(self, task_id: str) -> None:
        pass  # likewise

    def on_running_step(self, query: str, params: dict[str, Any]) -> None:
        self.changes_one(
            query, params, f"task {params['id']!r} step {params['idx']} is not running"
        )

    def stored_folder(self, folder: str | None) -> str | None:
        return stored_folder(self.store.path, folder)
