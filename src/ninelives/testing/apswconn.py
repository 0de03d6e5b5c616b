"""SQLite over apsw, shaped like the stdlib ``sqlite3`` the store expects.

The store talks to ``sqlite3.Connection``; the power-loss harness needs SQLite
on a Python VFS, which only apsw offers (stdlib ``sqlite3`` cannot see an apsw
VFS: it links another copy of the library). :class:`ApswConnection` is the
subset of ``sqlite3.Connection`` that :class:`~ninelives.store.sqlite.store.SQLiteStore`
uses, over an apsw connection, with apsw errors turned into the ``sqlite3``
exceptions (and ``sqlite_errorname``) the stdlib would raise. It also records,
in a :class:`CommitTracker`, the database state of each commit, of the one in
flight, and of the last one a caller was told about.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import apsw

from .disklayer import PowerCut, Trigger

_DML = ("INSERT", "UPDATE", "DELETE", "REPLACE")
#: What a new connection starts with before the store sets anything (see ApswConnection).
PLATFORM_SYNCHRONOUS = "NORMAL"

# -- the database state a commit leaves ---------------------------------------


@dataclass(frozen=True, kw_only=True)
class DbState:
    """Every row of every table, and the schema version: what a commit leaves."""

    version: int = 0
    tables: tuple[tuple[str, tuple[tuple[Any, ...], ...]], ...] = ()

    def rows(self, table: str) -> frozenset[tuple[Any, ...]]:
        """The rows of ``table`` (empty if it does not exist)."""
        return frozenset(next((rows for name, rows in self.tables if name == table), ()))


EMPTY = DbState()


def read_state(query: Callable[[str], Iterable[tuple[Any, ...]]]) -> DbState:
    """The state of the database that ``query`` reads."""
    names = sorted(
        str(row[0])
        for row in query(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        )
    )
    version = int(next(iter(query("PRAGMA user_version")))[0])
    tables = tuple(
        (name, tuple(sorted((tuple(r) for r in query(f'SELECT * FROM "{name}"')), key=repr)))
        for name in names
    )
    return DbState(version=version, tables=tables)


class CommitTracker:
    """What the database may hold after a cut: the commits SQLite returned from,
    the one in flight, and the last state a caller was told is durable.

    A commit is *acknowledged* when the store's write returns to its caller
    (:meth:`acknowledge`, called by the harness's store), not when a COMMIT
    returns on some connection: with group commit the COMMIT runs on another
    connection than the write, and a write released to its caller before its
    COMMIT is exactly what must show as a lost commit.
    """

    def __init__(self, acked: DbState) -> None:
        #: The state the last write that returned to its caller left.
        self.acked = acked
        #: The state of the last COMMIT that returned, acknowledged or not.
        self.committed = acked
        #: States committed since the last acknowledgement: a cut may keep any.
        self.unacked: list[DbState] = []
        self.inflight: DbState | None = None
        self.commits = 0
        #: A phase that failed without a cut: what it raised.
        self.error: str | None = None
        #: ``(synchronous, journal_mode)`` read back from each store connection.
        self.settings: set[tuple[int, str]] = set()

    def acknowledge(self, state: DbState) -> None:
        """A write returned to its caller, leaving ``state``: from now on the
        database must hold at least that."""
        self.acked = state
        self.unacked = []

    def valid(self) -> list[DbState]:
        """The states a cut may leave: the acknowledged one, any commit since, the one in flight."""
        pending = [self.inflight] if self.inflight is not None else []
        return [self.acked, *self.unacked, *pending]


# -- apsw behind the sqlite3 interface ----------------------------------------


class _Rows:
    """A finished statement: rows fetched eagerly, like a ``sqlite3.Cursor``."""

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int) -> None:
        self._rows = rows
        self._next = 0
        self.rowcount = rowcount

    def fetchone(self) -> tuple[Any, ...] | None:
        if self._next >= len(self._rows):
            return None
        self._next += 1
        return self._rows[self._next - 1]

    def fetchall(self) -> list[tuple[Any, ...]]:
        rest, self._next = self._rows[self._next :], len(self._rows)
        return rest

    def __iter__(self) -> Any:
        return iter(self.fetchall())


def translate(exc: apsw.Error) -> sqlite3.Error:
    """The ``sqlite3`` exception the stdlib would raise for this apsw one."""
    code = getattr(exc, "extendedresult", None)
    name = apsw.mapping_extended_result_codes.get(code or -1) or apsw.mapping_result_codes.get(
        getattr(exc, "result", -1) or -1, ""
    )
    kind: type[sqlite3.Error] = sqlite3.OperationalError
    if isinstance(exc, apsw.ConstraintError):
        kind = sqlite3.IntegrityError
    elif isinstance(exc, apsw.CorruptError | apsw.NotADBError):
        kind = sqlite3.DatabaseError
    error = kind(str(exc).partition(": ")[2] or str(exc))
    setattr(error, "sqlite_errorname", name)  # noqa: B010 - not in the 3.10 stubs
    setattr(error, "sqlite_errorcode", code)  # noqa: B010
    return error


class ApswConnection:
    """The subset of ``sqlite3.Connection`` that :class:`SQLiteStore` uses, over apsw.

    Runs on the VFS named ``vfs``; records acknowledged commits in ``tracker``;
    after a cut every call raises :class:`PowerCut`.

    A new connection starts with ``synchronous=NORMAL`` (:data:`PLATFORM_SYNCHRONOUS`),
    as SQLite built with ``SQLITE_DEFAULT_WAL_SYNCHRONOUS=1`` gives it, so that
    only the store's own setting can make it FULL: the harness reads the
    setting back from the connection (:meth:`safety_settings`), never from the
    text of the statements the store sends.
    """

    def __init__(
        self,
        path: str,
        *,
        vfs: str,
        trigger: Trigger,
        tracker: CommitTracker,
        timeout: float = 5.0,
    ) -> None:
        self._trigger = trigger
        self._tracker = tracker
        self._db = self._call(lambda: apsw.Connection(path, vfs=vfs))
        self._db.setbusytimeout(int(timeout * 1000))
        self._call(lambda: self._db.execute(f"PRAGMA synchronous={PLATFORM_SYNCHRONOUS}"))

    def safety_settings(self) -> tuple[int, str]:
        """``(PRAGMA synchronous, PRAGMA journal_mode)`` as the connection reports them."""
        sync = self._query("PRAGMA synchronous")[0][0]
        mode = self._query("PRAGMA journal_mode")[0][0]
        return int(sync), str(mode)

    def _call(self, fn: Callable[[], Any]) -> Any:
        try:
            result = fn()
        except apsw.Error as exc:
            if self._trigger.dead:
                raise PowerCut("the power went during this statement") from exc
            raise translate(exc) from exc
        if self._trigger.dead:  # SQLite swallowed the failed write: stop anyway
            raise PowerCut("the power went during this statement")
        return result

    def execute(self, sql: str, parameters: Any = None) -> _Rows:
        # The verb of the first line that is not a comment (named queries keep theirs).
        code = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
        words = " ".join(code).split(None, 1)
        verb = words[0].upper() if words else ""
        # A commit of a write transaction, whatever began it: the connection's
        # own state says so, not the text of the BEGIN.
        commit = verb.startswith(("COMMIT", "END")) and self._writes()
        if commit:
            self._tracker.inflight = read_state(self._query)
        rows = self._call(lambda: [tuple(r) for r in self._db.execute(sql, parameters or None)])
        if commit:
            tracker = self._tracker
            assert tracker.inflight is not None
            tracker.committed, tracker.inflight = tracker.inflight, None
            tracker.unacked.append(tracker.committed)
            tracker.commits += 1
        changed = self._db.changes() if verb.startswith(_DML) else -1
        return _Rows(rows, changed)

    def _writes(self) -> bool:
        """True inside a transaction that holds (or has used) the write lock."""
        return bool(self._db.txn_state("main") == apsw.SQLITE_TXN_WRITE)

    def executemany(self, sql: str, seq: Iterable[Any]) -> _Rows:
        self._call(lambda: list(self._db.executemany(sql, seq)))
        return _Rows([], self._db.changes())

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._call(lambda: list(self._db.execute(sql)))]

    def close(self) -> None:
        try:
            self._db.close(force=True)
        except apsw.Error as exc:
            if not self._trigger.dead:
                raise translate(exc) from exc
