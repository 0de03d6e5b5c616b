"""A migration killed half-way leaves the database fully old; the next open completes it.

Each store starts from the frozen database of the version before the newest
(written by that version's code, ``tests/fixtures/schema``) and is SIGKILLed
inside the newest migration, after its first statement
(``AGENT_CRASH_AT=migration_statement:N``; on PostgreSQL that statement has
reached the server). The schema and every row must be those of the old
version; the next ``run`` migrates, resumes the task and ``verify`` passes.
The schema compared is the whole catalogue (tables, columns, indexes), not a
column or two.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from test_fixtures import (
    FIXTURES,
    LATEST,
    PG_VERSIONS,
    SUMMARY,
    VERSIONS,
    load_pg_fixture,
    manifest,
    relocate,
    task_lab,
)

from ninelives.store import sql
from ninelives.testing import Lab

pytestmark = pytest.mark.crash

#: The newest migration with more than one statement: the one a kill can split.
SPLIT = max(n for n, _, path in sql.migrations("sqlite") if len(sql.statements(path)) > 1)
TASK = "before-effect-1"


def sqlite_state(db: Path) -> tuple[Any, ...]:
    conn = sqlite3.connect(db)
    try:
        return (
            conn.execute("PRAGMA user_version").fetchone()[0],
            conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall(),
            [conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in TABLES],
        )
    finally:
        conn.close()


def pg_state(url: str) -> tuple[Any, ...]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return (
            conn.execute("SELECT version, name FROM ninelives_schema ORDER BY 1").fetchall(),
            conn.execute(
                "SELECT table_name, column_name, data_type, column_default, is_nullable "
                "FROM information_schema.columns WHERE table_schema = current_schema() "
                "ORDER BY 1, 2"
            ).fetchall(),
            conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes "
                "WHERE schemaname = current_schema() ORDER BY 1"
            ).fetchall(),
            [conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in TABLES],
        )


TABLES = ("tasks", "steps", "events")


def killed_then_completed(lab: Lab, info: dict[str, Any], state: Any) -> None:
    old = state()
    one = task_lab(lab, TASK, info)
    killed = one.cli("run", TASK, AGENT_CRASH_AT=f"migration_statement:{SPLIT}")
    assert killed.returncode == -9, f"the migration was not reached: {killed}"
    assert state() == old, "a migration killed half-way left part of itself behind"
    resumed = one.cli("run", TASK)
    assert resumed.returncode == 0, resumed
    assert one.artifacts() == {f"{TASK}-2.md": SUMMARY}
    assert lab.cli("verify", "--all").returncode == 0


def older(versions: list[int]) -> int:
    below = [v for v in versions if v < SPLIT]
    assert below, f"no fixture older than migration {SPLIT}"
    return max(below)


def test_sqlite_migration_killed_half_way(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    version = older(VERSIONS)
    info = manifest(version)
    db = lab.root / "state.db"
    shutil.copyfile(FIXTURES / f"v{version}" / "state.db", db)
    if (FIXTURES / f"v{version}" / "artifacts").is_dir():
        shutil.copytree(FIXTURES / f"v{version}" / "artifacts", lab.root / "artifacts")
    relocate(db, info["root"], lab.root)
    killed_then_completed(lab, info, lambda: sqlite_state(db))
    assert sqlite_state(db)[0] == LATEST


@pytest.mark.postgres
def test_postgres_migration_killed_half_way(tmp_path: Path, pg_database: str) -> None:
    lab = Lab(tmp_path / "lab", db=pg_database)
    lab.guide_setup()
    info = load_pg_fixture(pg_database, older(PG_VERSIONS), lab)
    try:
        killed_then_completed(lab, info, lambda: pg_state(pg_database))
    finally:
        lab.reap()
    assert pg_state(pg_database)[0][-1][0] == LATEST
