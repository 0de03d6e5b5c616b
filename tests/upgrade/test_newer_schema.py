"""A database of a newer ninelives is refused by every command, untouched.

The newest fixture (real tasks, some in flight) is marked one version ahead
of this code. Every command that reads or writes (``status``, ``export``,
``verify``, ``create``, ``submit``, ``run``, ``retry``, ``worker --drain``)
must end with exit 5 and one line naming the newer version, and leave the
database exactly as it was: the same bytes on SQLite (no ``-wal`` either); on
PostgreSQL every row of every table the same, down to each row's ``xmin`` (the
transaction that wrote it: a row rewritten to the same values still shows).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from test_fixtures import FIXTURES, LATEST, PG_VERSIONS, VERSIONS, load_pg_fixture

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

TASK = "before-effect-1"
COMMANDS = [
    ("status", TASK),
    ("export", TASK),
    ("verify", TASK),
    ("verify", "--all"),
    ("create", "new", "plan.json"),
    ("submit", "queued", "plan.json"),
    ("run", TASK),
    ("retry", "failed"),
    ("worker", "--drain"),
]


def refused_untouched(lab: Lab, state: Any) -> None:
    before = state()
    for args in COMMANDS:
        result = lab.cli(*args)
        assert result.returncode == 5, (args, result)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (args, result.stderr)
        assert f"newer than this ninelives ({LATEST})" in lines[0], (args, lines[0])
        assert state() == before, f"{args} changed the newer database"


@pytest.mark.slow
def test_sqlite_newer_schema_is_refused_untouched(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    db = lab.root / "state.db"
    shutil.copyfile(FIXTURES / f"v{max(VERSIONS)}" / "state.db", db)
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {LATEST + 1}")
    conn.close()
    refused_untouched(lab, lab.files)


def pg_everything(url: str) -> list[list[tuple[Any, ...]]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() ORDER BY 1"
            )
        ]
        assert {"tasks", "steps", "events", "ninelives_schema"} <= set(tables)
        return [
            conn.execute(f"SELECT xmin::text, * FROM {t} ORDER BY 2, 3").fetchall() for t in tables
        ]


@pytest.mark.postgres
def test_postgres_newer_schema_is_refused_untouched(tmp_path: Path, pg_database: str) -> None:
    import psycopg

    lab = Lab(tmp_path / "lab", db=pg_database)
    lab.guide_setup()
    load_pg_fixture(pg_database, max(PG_VERSIONS), lab)
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ninelives_schema (version, name, applied_at) VALUES (%s, 'future', 0)",
            (LATEST + 1,),
        )
    try:
        refused_untouched(lab, lambda: pg_everything(pg_database))
    finally:
        lab.reap()
