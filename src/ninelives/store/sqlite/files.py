"""What a SQLite database path must be before ninelives connects to it.

Every check here runs before :func:`sqlite3.connect`, so a path that is not a
plain database file is refused with a one-line reason and nothing is created,
opened for writing or waited on:

* the path is resolved (:func:`os.path.realpath`): a symlink to a database
  opens that database, and its locks, WAL and lock folder are those of the
  real file, so two names of one file share one lock;
* a path ending with ``/`` is refused: it names a folder (the reads find no
  database there), though :func:`os.path.realpath` would drop the slash;
* a file of another database (its ``-wal``, ``-shm`` or ``-journal``, or a file
  in its lock or blob folder) is refused, see :func:`database_owning`;
* a symlink whose target does not exist is refused (``sqlite3.connect`` would
  create the target through the link, outside the private-mode creation);
* anything but a regular file (a folder, a FIFO, a device) is refused: opening a
  FIFO would hang and a device is not a database;
* a file with more than one hard link is refused: SQLite names the WAL after
  the path it opened, so two names of one file get two WALs, and commits made
  through one name are lost when the other checkpoints;
* the SQLite library must have ``RETURNING`` (3.35+).

:func:`identity` is ``(st_dev, st_ino)``: the store checks after connecting
that the path still names the file it checked.
"""

from __future__ import annotations

import functools
import os
import stat
from typing import Any

from ...errors import StoreError
from ...names import check_folder_text

#: The oldest SQLite library ninelives can use: ``UPDATE ... RETURNING`` is 3.35.
MIN_SQLITE = (3, 35, 0)

#: The three tables of the restart-lab contract; a file without them is not ours.
CONTRACT_TABLES = frozenset({"tasks", "steps", "events"})

_MAGIC = b"SQLite format 3\x00"


def check_sqlite_version(version: tuple[int, ...], text: str) -> None:
    """Raise :class:`StoreError` unless ``version`` (``sqlite3.sqlite_version_info``)
    is at least :data:`MIN_SQLITE`; ``text`` is the version as SQLite spells it."""
    if tuple(version[:3]) < MIN_SQLITE:
        need = ".".join(map(str, MIN_SQLITE[:2]))
        raise StoreError(
            f"the SQLite library is version {text}; ninelives needs {need} or newer "
            "(for UPDATE ... RETURNING): use a Python built with a newer SQLite"
        )


def resolve(path: str, *, create: bool) -> tuple[str, os.stat_result | None]:
    """The real path of the database at ``path`` and its ``stat`` (None if absent).

    Raises :class:`StoreError` for a missing folder, a dangling symlink (when
    ``create``), and anything that is not a single-named regular file.
    """
    shown = path
    if path.endswith(("/", os.sep)):
        # realpath drops the slash and would open the file that every read
        # (os.path.exists("state.db/") is False) says is not there.
        raise StoreError(
            f"database path {shown} ends with '/', which names a folder: a database is a file"
        )
    real = os.path.realpath(path)
    folder = os.path.dirname(real)
    if not os.path.isdir(folder):
        # `--db state.db/x.db`: the folder is there, as a file; "does not exist"
        # sent people looking for a folder they could see.
        why = "is a file, not a folder" if os.path.lexists(folder) else "does not exist"
        raise StoreError(f"database folder {why}: {os.path.dirname(shown) or '.'}")
    owner = database_owning(real)
    if owner is not None:
        raise StoreError(
            f"database path {shown} is a file of the database {owner} (its WAL, journal, "
            "lock or blob files), not a database: name the database itself"
        )
    check_companions(shown, real)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        if create and os.path.islink(path):
            raise StoreError(
                f"database path {shown} is a symlink to {real}, which does not exist: "
                "create the database at its real path, or remove the link"
            ) from None
        return real, None
    except OSError as exc:
        raise StoreError(f"cannot use database {shown}: {exc.strerror}") from None
    check_file(shown, st)
    return real, st


#: What SQLite and ninelives keep beside a database ``D``: ``D-wal``, ``D-shm``,
#: ``D-journal``, and the folders ``D.locks`` and ``D.blobs``.
_FILE_SUFFIXES = ("-wal", "-shm", "-journal")
_FOLDER_SUFFIXES = (".locks", ".blobs")


def database_owning(real: str) -> str | None:
    """The SQLite database whose file ``real`` (a real path) is: the ``-wal``,
    ``-shm`` or ``-journal`` beside it, or a file in its lock or blob folder;
    None when ``real`` is no such file.

    An idle database's WAL is empty, and SQLite takes an empty file for a new
    database: opened as one, it would get a whole database written into it.
    A database is a file starting with the SQLite header."""
    for suffix in _FILE_SUFFIXES:
        if real.endswith(suffix) and _is_sqlite(real.removesuffix(suffix)):
            return real.removesuffix(suffix)
    folder = os.path.dirname(real)
    while folder != os.path.dirname(folder):
        for suffix in _FOLDER_SUFFIXES:
            if folder.endswith(suffix) and _is_sqlite(folder.removesuffix(suffix)):
                return folder.removesuffix(suffix)
        folder = os.path.dirname(folder)
    return None


def _is_sqlite(path: str) -> bool:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False  # and a FIFO is never opened: that would wait for a writer
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:  # absent or unreadable: not a database we can tell
        return False
    try:
        return os.pread(fd, len(_MAGIC), 0) == _MAGIC
    except OSError:
        return False
    finally:
        os.close(fd)


def stored_folder(db: str, folder: str | None) -> str | None:
    """How a task's artifacts folder (absolute) is recorded in database ``db``
    (its real path): relative to the database's folder when inside it, so that
    a project moved or copied whole keeps publishing beside its own database
    rather than into the old place; absolute otherwise. A folder named through
    a symlinked path (``$PWD/out`` in a project reached through a link) is
    inside when its real path is: ``db`` is a real path."""
    if folder is None:
        return None
    base, folder = os.path.dirname(db), os.path.abspath(folder)
    if not _inside(base, folder):
        real = os.path.realpath(folder)  # only then: it asks the file system
        if not _inside(base, real):
            return check_folder_text(folder)
        folder = real
    # Inside base, both normalized: the path below it is the tail of the text.
    return check_folder_text(folder[len(base.rstrip(os.sep)) + 1 :] or os.curdir)


def _inside(base: str, folder: str) -> bool:
    """Whether the normalized absolute ``folder`` is ``base`` or inside it (as
    ``os.path.commonpath([base, folder]) == base``, without its list work: every
    ``create`` asks)."""
    return folder == base or folder.startswith(base.rstrip(os.sep) + os.sep)


@functools.lru_cache(maxsize=64)  # every read of a task; a pure function of text
def resolved_folder(db: str, stored: str | None) -> str | None:
    """The absolute artifacts folder that :func:`stored_folder` recorded (tasks
    of earlier versions recorded absolute folders, kept as they are)."""
    if stored is None or os.path.isabs(stored):
        return stored
    return os.path.normpath(os.path.join(os.path.dirname(db), stored))


def check_companions(shown: str, real: str) -> None:
    """Raise :class:`StoreError` when SQLite's ``-wal``, ``-shm`` or ``-journal``
    name beside the database is taken by something other than a regular file: a
    folder or a FIFO there fails every open with SQLite's bare "disk I/O error",
    which names neither the file nor the fix."""
    for suffix in _FILE_SUFFIXES:
        try:
            mode = os.stat(real + suffix).st_mode
        except OSError:
            continue  # absent (the usual case), or a dangling link SQLite replaces
        if not stat.S_ISREG(mode):
            kind = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO"}.get(
                stat.S_IFMT(mode), "not a regular file"
            )
            raise StoreError(
                f"database {shown}: {real + suffix} is {kind}, where SQLite keeps the "
                f"database's {suffix[1:]} file; move it away"
            )


def check_file(shown: str, st: os.stat_result) -> None:
    """Raise :class:`StoreError` unless ``st`` is a regular file with one name."""
    if stat.S_ISDIR(st.st_mode):
        raise StoreError(f"database path is a directory: {shown}")
    if not stat.S_ISREG(st.st_mode):
        kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "not a regular file"
        raise StoreError(f"database path {shown} is {kind}: not a database")
    if st.st_nlink > 1:
        raise StoreError(
            f"database file {shown} has {st.st_nlink} hard links: SQLite would keep one "
            "WAL per name and lose commits made through one name when the other "
            "checkpoints; keep one name (remove the other links) or copy the file"
        )


def unwritable(real: str) -> str | None:
    """Why SQLite cannot write the database at ``real`` (a real path), or None:
    its folder is on a read-only file system or not writable (SQLite creates
    the ``-wal`` and ``-shm`` files beside the database), or the file is not."""
    folder = os.path.dirname(real)
    try:
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        read_only = False
    if read_only:
        return f"its folder {folder} is on a read-only file system"
    if not os.access(folder, os.W_OK):
        return f"its folder {folder} is not writable by this user"
    if os.path.exists(real) and not os.access(real, os.W_OK):
        return "the file is not writable by this user"
    return None


def cannot_write(shown: str, why: str) -> StoreError:
    """The error for a database that this command must write but cannot."""
    return StoreError(
        f"cannot write database {shown}: {why} (SQLite writes {os.path.basename(shown)}-wal "
        "and -shm beside it); commands that only read it (status, export, verify, ls) "
        "still work"
    )


def identity(st: os.stat_result) -> tuple[int, int]:
    """``(st_dev, st_ino)``: which file a path names."""
    return st.st_dev, st.st_ino


def check_same_file(shown: str, real: str, expected: tuple[int, int]) -> None:
    """Raise :class:`StoreError` unless ``real`` is still the single-named regular
    file whose identity is ``expected`` (nothing swapped it between check and open)."""
    try:
        st = os.lstat(real)
    except OSError as exc:
        raise StoreError(f"cannot use database {shown}: {exc.strerror}") from None
    check_file(shown, st)
    if identity(st) != expected:
        raise StoreError(f"database {shown} was replaced while it was being opened; try again")


def header(real: str, size: int) -> bytes:
    """The first 100 bytes of the file (its SQLite header), read without SQLite.

    Raises :class:`StoreError` when a non-empty file does not start like a
    SQLite database, so a foreign file is refused before any connection."""
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise StoreError(f"cannot read database {real}: {exc.strerror}") from None
    try:
        data = os.pread(fd, 100, 0)
    except OSError as exc:
        raise StoreError(f"cannot read database {real}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if size and not data.startswith(_MAGIC):
        raise StoreError(f"{real} is not a SQLite database (file is not a database)")
    return data


def header_is_wal(data: bytes) -> bool:
    """True when the header says WAL mode (file format read/write versions 2)."""
    return len(data) >= 20 and data[18] == 2 and data[19] == 2


def not_ours(shown: str, tables: set[str]) -> StoreError:
    """The error for a SQLite file that holds other tables but not the contract's."""
    listed = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
    return StoreError(
        f"{shown} is not a ninelives database (a SQLite file without the tasks, steps "
        f"and events tables; it has: {listed}); nothing was changed"
    )


def quick_check_findings(rows: list[Any]) -> list[str]:
    """The findings of ``PRAGMA quick_check`` rows, one per line; empty when sound.
    SQLite prefixes them with a "*** in database" header, which is dropped."""
    return [
        line
        for row in rows
        if row[0] != "ok"
        for line in str(row[0]).splitlines()
        if line.strip() and not line.startswith("*** in database")
    ]


def integrity_findings(conn: Any) -> list[str]:
    """``PRAGMA quick_check``'s findings, then :func:`missing_columns`' once the
    file is at this version's schema (an older one lacks columns until migrated)."""
    from .. import sql

    found = quick_check_findings(conn.execute("PRAGMA quick_check").fetchall())
    if conn.execute("PRAGMA user_version").fetchone()[0] == sql.migrations("sqlite")[-1][0]:
        found += missing_columns(conn)
    return found


def missing_columns(conn: Any) -> list[str]:
    """The columns this version's migrations make that the file lacks, as
    findings (``steps.policy``): a hand edit ``quick_check`` cannot see, on which
    every run fails with "no such column". Compared with the same migrations
    applied to an empty database in memory."""
    import sqlite3

    from .. import sql

    made = sqlite3.connect(":memory:")
    try:
        for _number, _name, path in sql.migrations("sqlite"):
            for statement in sql.statements(path):
                made.execute(statement)
        wanted = {table: _columns(made, table) for table in _tables(made)}
    finally:
        made.close()
    have = {table: _columns(conn, table) for table in _tables(conn)}
    return [
        f"table {table} lacks its column {column}" if table in have else f"table {table} is missing"
        for table, columns in wanted.items()
        for column in (columns if table in have else columns[:1])
        if table not in have or column not in have[table]
    ]


def _tables(conn: Any) -> list[str]:
    query = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    return [row[0] for row in conn.execute(query)]


def _columns(conn: Any, table: str) -> list[str]:
    return [row[0] for row in conn.execute("SELECT name FROM pragma_table_info(?)", (table,))]
