"""Storage: the :class:`Store` protocol and :func:`open_store`, which picks a backend by URL.

The protocols, split by role, are :mod:`.base`'s; the rules both backends apply
the same way are :mod:`.rules`'; the backends are the :mod:`.sqlite` and
:mod:`.postgres` packages (the latter the only place psycopg is imported).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ..errors import StoreError
from .base import (
    Appended,
    Decision,
    Grant,
    MissingStore,
    Operator,
    ReadOnly,
    Runner,
    StepNotDue,
    Store,
    StoreReader,
    journal,
)
from .leases import DEFAULT_LEASE, fencing_disabled, heartbeat_disabled, lease_settings
from .rules import (
    PARK_EVENT,
    REFUSE_REASON,
    appended_rows,
    decision_target,
    finished_data,
    recover_unknown,
    recovery_limit_reason,
    retry_target,
    step_rows,
    task_exists,
)

if TYPE_CHECKING:
    from .postgres.store import PostgresStore

__all__ = [
    "DEFAULT_LEASE",
    "PARK_EVENT",
    "POSTGRES_EXTRA",
    "REFUSE_REASON",
    "Appended",
    "Decision",
    "Grant",
    "GroupCommit",
    "MissingStore",
    "Operator",
    "ReadOnly",
    "Runner",
    "StepNotDue",
    "Store",
    "StoreReader",
    "appended_rows",
    "decision_target",
    "fencing_disabled",
    "finished_data",
    "heartbeat_disabled",
    "is_postgres_url",
    "journal",
    "lease_settings",
    "open_group_commit",
    "open_store",
    "recover_unknown",
    "recovery_limit_reason",
    "retry_target",
    "step_rows",
    "task_exists",
]


def is_postgres_url(url: str) -> bool:
    """True for ``postgresql://`` and ``postgres://`` URLs, and for libpq keyword
    strings (``host=db dbname=ninelives``; see :func:`~.conninfo.is_keyword_string`)."""
    if url.startswith(("postgresql://", "postgres://")):
        return True
    from .conninfo import is_keyword_string

    return is_keyword_string(url)


def sqlite_path(url: str) -> str:
    """The file a SQLite ``url`` names: ``sqlite:///path`` or a plain path."""
    return url.removeprefix("sqlite://") if url.startswith("sqlite:///") else url


def sqlite_behind(url: str) -> bool:
    """True when ``url`` is a SQLite file whose schema is older than this code's,
    read from the file's header (``user_version``, offset 60) without opening it:
    a writable open of it would migrate it. False for anything else (PostgreSQL,
    no file, not a database), which the open itself then names."""
    if is_postgres_url(url):
        return False
    try:
        # Never blocked on: a FIFO there is refused by the open itself, at once.
        fd = os.open(sqlite_path(url), os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        header = os.read(fd, 64) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
    except OSError:
        return False
    finally:
        os.close(fd)
    if len(header) < 64 or not header.startswith(b"SQLite format 3\0"):
        return False
    from . import sql

    return int.from_bytes(header[60:64], "big") < sql.migrations("sqlite")[-1][0]


#: Printed instead of a traceback when PostgreSQL is asked for without its driver.
POSTGRES_EXTRA = "pip install 'ninelives[postgres]'"


def _postgres_store() -> type[PostgresStore]:
    """The PostgresStore class, or :class:`StoreError` naming the extra to install
    when psycopg is missing or cannot be loaded here."""
    try:
        from .postgres.store import (
            PostgresStore,  # the only place psycopg gets imported
        )
    except ImportError as exc:
        if (exc.name or "").startswith("ninelives"):
            raise  # our own module is broken: not the user's to fix
        import importlib.util

        if importlib.util.find_spec("psycopg") is None:
            why = "psycopg, the PostgreSQL driver, is not installed"
        else:
            why = f"psycopg cannot be loaded ({str(exc).splitlines()[0] if str(exc) else exc!r})"
        raise StoreError(f"PostgreSQL needs its extra: {why}; {POSTGRES_EXTRA}") from None
    return PostgresStore


def open_store(
    url: str,
    *,
    create: bool = True,
    readonly: bool = False,
    lease: float | None = None,
    heartbeat: float | None = None,
) -> Store:
    """Open the store that ``url`` names: a PostgreSQL URL or a SQLite path.

    ``sqlite:///path`` is accepted as well as a plain path; a libpq keyword
    string (``host=db dbname=x``) is PostgreSQL. Without psycopg a PostgreSQL
    URL is a :class:`StoreError` naming ``pip install 'ninelives[postgres]'``. With ``create``
    false, a SQLite file that does not exist is not created: the returned
    store answers every read with "unknown task". With ``readonly`` (implies
    not ``create``) a SQLite file is opened for reading only: never created,
    migrated or switched to WAL, byte-for-byte unchanged, readable on a
    read-only file system; the store offers only the reads (``get_task``,
    ``task_ids``, ``events``). On PostgreSQL ``readonly`` gives a session whose
    transactions are all read-only and that never migrates. ``lease`` and
    ``heartbeat`` (seconds) override :func:`lease_settings` on PostgreSQL.
    """
    if "\0" in url:  # no file name or connection string holds one (the library API could)
        raise StoreError("a database path or URL cannot hold a NUL character")
    if is_postgres_url(url):
        store = _postgres_store()
        lease_s, beat = lease_settings(lease=lease, heartbeat=heartbeat)
        return store(url, lease=lease_s, heartbeat=beat, readonly=readonly)
    if url.startswith("sqlite:") and not url.startswith("sqlite:///"):
        # Not a file named "sqlite:" (what "sqlite://" would create).
        raise StoreError(f"a sqlite: URL names an absolute path, sqlite:///path (got {url})")
    if not url.startswith("sqlite:///") and "://" in url:
        from .conninfo import URL_SCHEME, redact_url

        if URL_SCHEME.match(url):
            # Not a file name: a SQLite path read from it would print its password.
            raise StoreError(
                f"{redact_url(url)} is not a database URL ninelives takes: use postgresql://, "
                "postgres:// or sqlite:///PATH (a file so named is written ./NAME)"
            )
    path = sqlite_path(url)
    if readonly:
        from .sqlite.reader import open_reader

        return open_reader(path)
    from .sqlite.store import SQLiteStore

    if not create and not os.path.exists(path):
        return MissingStore(path)
    return SQLiteStore(path)


class GroupCommit(Protocol):
    """A committer that several stores write their transitions through in batches."""

    def close(self) -> None:
        """Commit what is left and stop; call it once every store using it has ended."""


def open_group_commit(
    stores: Sequence[Store], open_one: Callable[[], Store], *, linger: float
) -> GroupCommit | None:
    """One committer every store in ``stores`` writes through (``linger`` seconds at
    most between a transition and its batch's commit), on a store of its own from
    ``open_one``; None when they are not all SQLite. PostgreSQL already shares WAL
    flushes between connections (a backend's flush covers every commit record
    before it), so there each store commits alone."""
    from .sqlite.group import GroupCommitter
    from .sqlite.store import SQLiteStore

    joined = [s for s in stores if isinstance(s, SQLiteStore)]
    if len(joined) != len(stores):
        return None
    own = open_one()
    if not isinstance(own, SQLiteStore):
        own.close()
        return None
    group = GroupCommitter(own, linger=linger)
    for store in joined:
        store.join_group(group)
    return group
