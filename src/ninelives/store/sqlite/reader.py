"""Read-only access to a SQLite database: what ``status``, ``export`` and ``verify`` use.

A reader never writes: it never creates the file, never migrates it, never
switches its journal mode, and leaves no file behind (no ``-wal``, ``-shm`` or
lock folder that was not there), so a database of another application, or of
a newer ninelives, is refused byte-for-byte unchanged, and a database on a
read-only file system can be read.

How it connects depends on what the folder shows:

* a WAL database whose ``-wal`` exists (a writer has it open, or died with
  commits in it): ``mode=ro``, through SQLite's own locks and the existing
  ``-wal``/``-shm``, so a reader sees every commit while runners run;
* a WAL database without ``-wal`` (no writer has it open): SQLite's
  ``mode=ro`` would create the ``-wal`` and ``-shm`` files and, unable to
  delete them, leave them behind. The reader instead holds a POSIX read lock
  on SQLite's SHARED byte range (which keeps a closing writer from
  checkpointing into the file and a rollback-mode writer from writing it) and
  reads the file as ``immutable``; after each read it checks the file is
  unchanged, and if a writer got in meanwhile it reads again through ``mode=ro``;
* a rollback-journal database: ``mode=ro`` (SQLite creates nothing to read it).

Older schemas are read as they are: the guide's version 0 has no lease
columns, which read as their defaults, and no queue column (no task is in one).
Queries name their columns, so columns added by later migrations change nothing here.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

from ...errors import StoreError, UnknownTask
from ...models import Event, Step, Task
from .. import sql
from ..base import MissingStore, ReadOnly
from .files import (
    CONTRACT_TABLES,
    header,
    header_is_wal,
    integrity_findings,
    not_ours,
    resolve,
    resolved_folder,
)
from .housekeeping import SQLiteHousekeeping
from .text import blob_rows, utf8_rows

Q = sql.load_queries("sqlite")
T = TypeVar("T")

# SQLite's lock bytes (os_unix.c): a reader holds a read lock on the SHARED range.
_SHARED_FIRST = 0x40000000 + 2
_SHARED_SIZE = 510
_BUSY_TIMEOUT = 60.0


def open_reader(path: str) -> SQLiteReader | MissingStore:
    """A reader of the database at ``path``; a :class:`MissingStore` if there is none."""
    if not os.path.exists(path):  # follows links: a dangling one reads as no database
        return MissingStore(path)
    real, st = resolve(path, create=False)
    if st is None:
        return MissingStore(path)
    return SQLiteReader(path, real, wal=header_is_wal(header(real, st.st_size)))


#: SQLite's SQLITE_READONLY_ROLLBACK: a hot journal that a read-only connection cannot roll back.
_READONLY_ROLLBACK = 776


def _describe(exc: sqlite3.Error, path: str) -> str:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+; 3.10 by the words
    rollback = code == _READONLY_ROLLBACK or (
        code is None and "readonly database" in str(exc) and _hot_journal(path)
    )
    if rollback:
        # SQLite's own words ("attempt to write a readonly database") read as a
        # permission problem; the file is whole once a writer puts the pages back.
        return (
            "its -journal holds a transaction that a writer killed mid-way left "
            "unfinished, which a command that only reads cannot roll back: run "
            "'ninelives doctor --fix' (it rolls it back), then this command again"
        )
    return str(exc) or type(exc).__name__


def _hot_journal(path: str) -> bool:
    try:
        return os.path.getsize(path + "-journal") > 0
    except OSError:
        return False


def _uri(path: str, **params: str) -> str:
    # The characters a SQLite URI path gives a meaning to, escaped by hand:
    # urllib.parse would cost every status a few milliseconds of imports.
    quoted = path.replace("%", "%25").replace("?", "%3f").replace("#", "%23")
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"file:{quoted}?{query}"


class SQLiteReader(ReadOnly, SQLiteHousekeeping):
    """The reads of :class:`~ninelives.store.Store` on one SQLite file, opened
    read-only; every commit is refused (:class:`~ninelives.store.ReadOnly`)."""

    dialect = "sqlite"

    def __init__(self, url: str, path: str, *, wal: bool) -> None:
        """Open ``path`` (already resolved and checked) for reading; ``url`` is the
        name the user gave. Raises :class:`StoreError` for a file that is not a
        ninelives database or has a newer schema, having changed nothing."""
        self.url = url
        self.path = path
        from ...blobs import FolderBlobs, folder_for

        #: The database's blobs, read only (:mod:`ninelives.blobs`).
        self.blobs = FolderBlobs(folder_for(path), held=self.is_held)
        self._lock_fd: int | None = None
        self._stamp: tuple[int, int, int] | None = None
        self._conn: sqlite3.Connection | None = None
        try:
            self._conn = self._connect(wal)
            self._get_task, self._get_steps, self._empty = self._inspect()
        except BaseException:
            self.close()
            raise

    # -- connecting -----------------------------------------------------------

    def _connect(self, wal: bool) -> sqlite3.Connection:
        if wal and not os.path.exists(self.path + "-wal") and self._hold_shared():
            # Checked again under the lock: a writer that opened since made a -wal.
            if not os.path.exists(self.path + "-wal"):
                self._stamp = self._file_stamp()
                return self._open(_uri(self.path, immutable="1"))
            self._drop_shared()
        try:
            return self._open(_uri(self.path, mode="ro"))
        except StoreError:
            if not self._readonly_media():
                raise
        # A read-only file system, without the -shm a WAL reader needs: nobody
        # can write here, so reading the file as immutable is exact, provided
        # no -wal holds commits that are not in the file yet.
        wal_file = self.path + "-wal"
        if os.path.exists(wal_file) and os.path.getsize(wal_file) > 0:
            raise StoreError(
                f"cannot read database {self.url}: its -wal holds commits but its -shm "
                "is missing and the folder is read-only"
            )
        return self._open(_uri(self.path, immutable="1"))

    def _open(self, uri: str) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                uri,
                uri=True,
                isolation_level=None,
                timeout=_BUSY_TIMEOUT,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise self._cannot("open", exc) from exc
        try:
            conn.execute("PRAGMA query_only=ON")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            conn.close()
            raise self._cannot("read", exc) from exc
        return conn

    def _cannot(self, verb: str, exc: sqlite3.Error) -> StoreError:
        return StoreError(f"cannot {verb} database {self.url}: {_describe(exc, self.path)}")

    def _readonly_media(self) -> bool:
        folder = os.path.dirname(self.path)
        try:
            return bool(os.statvfs(folder).f_flag & os.ST_RDONLY) or not os.access(folder, os.W_OK)
        except OSError:
            return False

    def _hold_shared(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return False
        try:
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, _SHARED_SIZE, _SHARED_FIRST)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False  # a writer holds the file: read through SQLite's locks
            raise StoreError(f"cannot lock database {self.url}: {exc.strerror}") from None
        self._lock_fd = fd
        return True

    def _drop_shared(self) -> None:
        # Closing the descriptor drops the lock. No SQLite connection of this
        # process has the file open with locks of its own at this point (POSIX
        # locks are per process and a close would drop them too).
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _file_stamp(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _inspect(self) -> tuple[str, str, bool]:
        def look(conn: sqlite3.Connection) -> tuple[int, set[str], set[str]]:
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            tables = {r[0] for r in conn.execute(Q["table_names"])}
            columns = {r[0] for r in conn.execute(Q["task_columns"])}
            columns |= {f"steps.{r[0]}" for r in conn.execute(Q["step_columns"])}
            return version, tables, columns

        version, tables, columns = self._reading(look)
        if not tables:
            return Q["get_task"], Q["get_steps"], True  # an empty file: no task yet
        if not CONTRACT_TABLES <= tables:
            raise not_ours(self.url, tables)
        latest = sql.migrations("sqlite")[-1][0]
        if version > latest:
            raise StoreError(
                f"database schema version {version} is newer than this ninelives ({latest})"
            )
        steps = Q["get_steps"] if "steps.policy" in columns else Q["get_steps_v5"]
        self._queued = "queue" in columns
        if "lease_epoch" not in columns:
            return Q["get_task_unleased"], steps, False
        if "artifacts" not in columns:
            return Q["get_task_unrecorded"], steps, False
        if "plan_sha256" not in columns:
            return Q["get_task_v5"], steps, False
        return Q["get_task"], steps, False

    # -- reading ------------------------------------------------------------

    def _reading(self, read: Callable[[sqlite3.Connection], T]) -> T:
        """``read`` in one read transaction; again through ``mode=ro`` if the file
        changed under an immutable read (a writer got in)."""
        if self._conn is None:
            raise StoreError(f"cannot read database {self.url}: it is closed")
        try:
            result = self._transaction(self._conn, read)
        except sqlite3.Error as exc:
            if not self._changed():
                raise self._cannot("read", exc) from exc
        else:
            if not self._changed():
                return result
        self._conn.close()
        self._conn = None
        self._drop_shared()
        self._stamp = None
        self._conn = self._open(_uri(self.path, mode="ro"))
        try:
            return self._transaction(self._conn, read)
        except sqlite3.Error as exc:
            raise self._cannot("read", exc) from exc

    @staticmethod
    def _transaction(conn: sqlite3.Connection, read: Callable[[sqlite3.Connection], T]) -> T:
        conn.execute("BEGIN")
        try:
            return read(conn)
        finally:
            conn.execute("COMMIT")

    def _changed(self) -> bool:
        if self._stamp is None:
            return False  # read through SQLite's own locks: consistent as it is
        try:
            return self._file_stamp() != self._stamp or os.path.exists(self.path + "-wal")
        except OSError:
            return True

    # -- the reads of the Store protocol --------------------------------------

    def get_task(self, task_id: str) -> Task:
        """The task with its steps, in one snapshot; :class:`UnknownTask` if absent."""
        if self._empty:
            raise UnknownTask(f"unknown task {task_id!r}")

        def load(conn: sqlite3.Connection) -> Task | None:
            with utf8_rows(task_id):
                row = conn.execute(self._get_task, {"id": task_id}).fetchone()
                if row is None:
                    return None
                steps = conn.execute(self._get_steps, {"id": task_id}).fetchall()
            task = Task.from_row(row, tuple(Step.from_row(task_id, r) for r in steps))
            return task._replace(artifacts=resolved_folder(self.path, task.artifacts))

        task = self._reading(load)
        if task is None:
            raise UnknownTask(f"unknown task {task_id!r}")
        from ...blobs import resolve_task

        return resolve_task(task, self.blobs)

    def task_ids(self) -> list[str]:
        """Every stored task id, oldest first."""
        if self._empty:
            return []
        return self._reading(lambda conn: [row[0] for row in conn.execute(Q["task_ids"])])

    def events(self, task_id: str) -> list[Event]:
        """The task's journal in ``seq`` order (empty for an unknown task)."""
        if self._empty:
            return []

        def read(conn: sqlite3.Connection) -> list[Any]:
            with utf8_rows(task_id, "journal"):
                return conn.execute(Q["events"], {"id": task_id}).fetchall()

        return [Event.from_row(row) for row in self._reading(read)]

    def blob_rows(self) -> list[tuple[str, int, str]]:
        """``(task_id, idx, output)`` of every output that is, or holds, a blob reference."""
        if self._empty:
            return []
        return self._reading(lambda conn: blob_rows(conn, Q["blob_rows"]))

    def integrity_problems(self) -> list[str]:
        """:func:`~.files.integrity_findings`; empty when the file is sound."""
        try:
            return self._reading(integrity_findings)
        except StoreError as exc:
            return [f"quick_check failed: {exc}"]

    def close(self) -> None:
        """Close the connection and drop the read lock; idempotent."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._drop_shared()
