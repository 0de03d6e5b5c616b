"""Reading a PostgreSQL database never writes: no schema is created or migrated, and
the reading session's transactions are all read-only."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from errorlines import one_line
from ninelives.errors import StoreError
from ninelives.store import open_store
from ninelives.testing import Lab

pytestmark = pytest.mark.postgres


def tables(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1"
        ).fetchall()
    return [r[0] for r in rows]


def test_reading_an_empty_database_creates_no_schema(tmp_path: Path, pg_database: str) -> None:
    lab = Lab(tmp_path, db=pg_database)
    for args in (("status", "t"), ("export", "t")):
        result = lab.cli(*args)
        assert result.returncode == 1, result.stderr
        assert "unknown task" in result.stderr
    assert lab.cli("verify", "--all").returncode == 0
    assert tables(pg_database) == []
    # The control: a command that writes does create the schema.
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert "tasks" in tables(pg_database)


def test_an_older_schema_is_refused_by_readers_and_left_as_it_is(
    tmp_path: Path, pg_database: str
) -> None:
    lab = Lab(tmp_path, db=pg_database)
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    with psycopg.connect(pg_database, autocommit=True) as conn:
        latest = conn.execute("SELECT max(version) FROM ninelives_schema").fetchone()[0]
        conn.execute("DELETE FROM ninelives_schema WHERE version = %s", (latest,))
        # The version before it (numbers may have gaps while branches add migrations).
        older = conn.execute("SELECT max(version) FROM ninelives_schema").fetchone()[0]
        assert older < latest
    result = lab.cli("status", "t")
    assert result.returncode == 5
    assert "reading never does" in result.stderr
    with psycopg.connect(pg_database, autocommit=True) as conn:
        assert conn.execute("SELECT max(version) FROM ninelives_schema").fetchone()[0] == older


def test_the_reading_session_cannot_write(pg_database: str) -> None:
    open_store(pg_database).close()  # a writer makes the schema
    reader = open_store(pg_database, readonly=True)
    try:
        assert reader.task_ids() == []
        conn = reader._connection()  # type: ignore[attr-defined]
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TABLE planted (x integer)")
    finally:
        reader.close()
    # The control: the writer's session can.
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE planted (x integer)")
    assert "planted" in tables(pg_database)


def test_a_newer_schema_is_refused_by_readers(pg_database: str) -> None:
    open_store(pg_database).close()
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ninelives_schema (version, name, applied_at) VALUES (9999, 'future', 0)"
        )
    with pytest.raises(StoreError, match="newer"):
        open_store(pg_database, readonly=True)


def test_a_database_the_server_keeps_read_only_refuses_writes_as_known_failures(
    tmp_path: Path, pg_database: str
) -> None:
    """A database whose sessions are read-only (a hot standby after a failover,
    ``default_transaction_read_only``): the server refuses the first write, so
    the transaction committed nothing. That is exit 5, the database cannot be
    written, not exit 6's "whether task 'u' was stored is unknown"."""
    lab = Lab(tmp_path, db=pg_database)
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    name = pg_database.rsplit("/", 1)[1]
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
    before = lab.fingerprint("t")
    for args in (("create", "u", "plan.json"), ("submit", "v", "plan.json")):
        line = one_line(lab.cli(*args), 5, "read-only transaction")
        assert "unknown" not in line
    one_line(lab.cli("fork", "t", "w", "--from", "0"), 5, "read-only transaction")
    assert lab.fingerprint("t") == before
    for task_id in ("u", "v", "w"):
        one_line(lab.cli("status", task_id), 1, "unknown task")


def test_a_database_holding_another_applications_tasks_table_is_not_ours(
    tmp_path: Path, pg_database: str
) -> None:
    # Another application's `tasks` (an id of another type): doctor advised
    # "doctor --fix (migrates it)", which then failed on a foreign key, and
    # create failed the same way. It is refused as SQLite refuses such a file.
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute("CREATE TABLE tasks (id INTEGER PRIMARY KEY, title TEXT)")
        conn.execute("INSERT INTO tasks VALUES (1, 'theirs')")
    lab = Lab(tmp_path, db=pg_database)
    lab.guide_setup()
    for args in (("doctor",), ("doctor", "--fix"), ("create", "t", "plan.json"), ("ls",)):
        one_line(lab.cli(*args), 5, "is not a ninelives database", "tasks")
    assert tables(pg_database) == ["tasks"]
    with psycopg.connect(pg_database, autocommit=True) as conn:
        assert conn.execute("SELECT id, title FROM tasks").fetchall() == [(1, "theirs")]
