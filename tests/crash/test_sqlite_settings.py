"""The SQLite safety settings, read back from the store's own connection.

WAL, ``synchronous=FULL`` and foreign keys are claims about the connection the
store commits on, so they are checked there (``PRAGMA synchronous`` returns 2,
``PRAGMA journal_mode`` ``wal``, ``PRAGMA foreign_keys`` 1), not by the text of
the statements that set them. The connection is handed to the store already
weakened (synchronous OFF, foreign keys off, a database in rollback-journal
mode), as a SQLite built with other defaults would give it: only the store's
own settings can make these checks pass. The power-loss suite shows what
``synchronous=FULL`` protects; ``test_contention.py`` what BEGIN IMMEDIATE does.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ninelives.plan import plan_from_dict
from ninelives.store.sqlite.store import SQLiteStore

PLAN = plan_from_dict({"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "a"}}]})


def weak_connect(path: str, **kwargs: Any) -> sqlite3.Connection:
    """``sqlite3.connect`` with every safety turned off first."""
    conn = sqlite3.connect(path, **kwargs)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("PRAGMA foreign_keys=OFF")
    return conn


def settings(conn: sqlite3.Connection) -> tuple[int, str, int]:
    """(synchronous, journal_mode, foreign_keys) as the connection reports them."""
    return (
        conn.execute("PRAGMA synchronous").fetchone()[0],
        conn.execute("PRAGMA journal_mode").fetchone()[0],
        conn.execute("PRAGMA foreign_keys").fetchone()[0],
    )


def test_control_the_weakened_connection_has_no_safety(tmp_path: Path) -> None:
    conn = weak_connect(str(tmp_path / "bare.db"), isolation_level=None)
    try:
        assert settings(conn) == (0, "delete", 0)
    finally:
        conn.close()


@pytest.mark.parametrize("database", ["new", "existing-in-rollback-mode"])
def test_the_store_commits_with_full_sync_wal_and_foreign_keys(
    tmp_path: Path, database: str
) -> None:
    path = tmp_path / "state.db"
    if database != "new":
        SQLiteStore(str(path)).close()
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            assert conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
        finally:
            conn.close()
    store = SQLiteStore(str(path), connect=weak_connect)
    try:
        assert settings(store._conn) == (2, "wal", 1)
        store.create_task("t", PLAN)
        assert settings(store._conn) == (2, "wal", 1)  # still so after a commit
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            store._conn.execute(
                "INSERT INTO steps (task_id, idx, tool, input) VALUES ('nope', 0, 'fetch', '{}')"
            )
    finally:
        store.close()
