"""Upgrades keep in-flight tasks: every schema version's frozen database, opened by this code.

``tests/fixtures/schema/vN/`` holds a database that the code of schema version
N wrote itself (``make.py`` there says how; version 0 is the guide's layout),
with tasks killed at every crash point that version had, one done, one failed
and one never run. Each is copied to a scratch folder and:

- read first: ``status`` and ``export`` of every task work on the file as it
  is and leave it byte-for-byte unchanged (no migration, no ``-wal``);
- then every task is resumed with ``ninelives run`` (which migrates the file
  to this version), and the interrupted ones must show the five properties
  against what the kill left, and ``ninelives verify`` must pass;
- a done task stays done without starting a step; a failed one stays failed
  until ``retry``, then finishes.

A migration added without a fixture of its version fails
:func:`test_the_newest_schema_version_has_a_fixture`.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from ninelives.store import sql
from ninelives.testing import Lab, Snapshot, five_property_violations
from ninelives.testing.lab import GUIDE_PLAN

pytestmark = pytest.mark.crash

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "schema"
LATEST = sql.migrations("sqlite")[-1][0]
VERSIONS = sorted(int(p.name[1:]) for p in FIXTURES.glob("v*") if (p / "state.db").is_file())
SUMMARY = "Line one\nLine two\nLine three"


def manifest(version: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"v{version}" / "manifest.json").read_text())
    return data


def user_version(db: Path) -> int:
    # From the header (offset 60): opening a WAL database, even read-only,
    # would make a -shm file beside the fixture.
    with open(db, "rb") as fh:
        return int.from_bytes(fh.read(64)[60:64], "big")


def test_the_newest_schema_version_has_a_fixture() -> None:
    assert LATEST in VERSIONS, (
        f"schema version {LATEST} (the newest migration) has no frozen database: run "
        "'python tests/fixtures/schema/make.py' (it writes tests/fixtures/schema/"
        f"v{LATEST}/ with this code's CLI) and commit that folder with the migration"
    )
    assert 0 in VERSIONS, "the guide's layout (version 0) lost its fixture"


@pytest.mark.parametrize("version", VERSIONS)
def test_each_fixture_is_its_version_as_written(version: int) -> None:
    """The files are what they say: that ``user_version``, one file (no WAL left),
    every crash point of that version either a task or a stated reason."""
    folder = FIXTURES / f"v{version}"
    assert user_version(folder / "state.db") == version
    assert not list(folder.glob("state.db-*")), "a fixture is one checkpointed file"
    info = manifest(version)
    assert info["version"] == version
    scenarios = " ".join(t["scenario"] for t in info["tasks"].values())
    for point in info["points"]:
        covered = point in scenarios or (version > 0 and point in NOT_A_TASK)
        assert covered, f"version {version}: no task killed at {point}"


#: Kept in step with make.py's: the points no fixture task can stand for.
NOT_A_TASK = {
    "create_before_commit",
    "migration_before_commit",
    "migration_statement",
    "before_task_done",
    "checkpoint_before_commit",
    "probe_answered",
    "settle_before_commit",
    "decision_before_commit",
    "gc_before_commit",
}


def task_lab(lab: Lab, task: str, info: dict[str, Any]) -> Lab:
    """The lab seen by one task: its own artifacts folder, as the fixture's runs had."""
    return Lab(lab.root, db=lab.db, base_env={"AGENT_ARTIFACTS": info["tasks"][task]["artifacts"]})


def relocate(db: Path, old_root: str, new_root: Path) -> None:
    """Move the recorded artifacts folders (absolute, from version 5 on) with the
    files, as anyone moving a project folder would."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(tasks)")}
        if "artifacts" in columns:
            conn.execute(
                "UPDATE tasks SET artifacts = ? || substr(artifacts, ?) WHERE artifacts LIKE ?",
                (str(new_root), len(old_root) + 1, old_root + "/%"),
            )
    finally:
        conn.close()


def runs_in(snapshot: Snapshot) -> int:
    return len({e["run"] for e in snapshot.events if e["kind"] == "run_started"})


def resume_every_task(lab: Lab, version: int, info: dict[str, Any]) -> None:
    """Resume each task of a fixture (opened in ``lab``) and check what it must show."""
    before = {task: lab.snapshot(task) for task in info["tasks"]}
    for task, about in info["tasks"].items():
        one = task_lab(lab, task, info)
        was = before[task]
        status = was.status["status"]
        if about["scenario"] == "run to done":
            assert status == "done"
            assert one.cli("run", task).returncode == 0
            after = one.snapshot(task)
            assert [e for e in after.events if e["kind"] == "step_started"] == [
                e for e in was.events if e["kind"] == "step_started"
            ], f"{task}: a done task started a step"
            runs = runs_in(after)
        elif status == "failed":
            refused = one.cli("run", task)
            assert refused.returncode == 2, refused
            assert one.snapshot(task).status == was.status
            retried = one.cli("retry", task)
            assert retried.returncode == 0, retried
            resumed = one.cli("run", task)
            assert resumed.returncode == 0, resumed
            # Not an interrupted task: ``retry`` is an operator's act with no
            # run of its own, so the five properties do not apply; verify does.
            assert one.snapshot(task).status["status"] == "done"
            assert one.artifacts() == {f"{task}-2.md": SUMMARY}
            verified = one.cli("verify", task, "--artifacts", about["artifacts"])
            assert verified.returncode == 0, (task, verified)
            continue
        else:
            resumed = one.cli("run", task)
            assert resumed.returncode == 0, (task, resumed)
            after = one.snapshot(task)
            runs = runs_in(was) + 1
        problems = five_property_violations(
            plan=GUIDE_PLAN,
            after=after,
            before=was,
            runs=runs,
            artifacts=one.artifacts(),
            expected_artifacts={f"{task}-2.md": SUMMARY},
        )
        assert problems == [], f"version {version}, {task} ({about['scenario']}): {problems}"
        verified = one.cli("verify", task, "--artifacts", about["artifacts"])
        assert verified.returncode == 0, (task, verified)
    assert lab.cli("verify", "--all").returncode == 0


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.slow
def test_a_fixture_opens_resumes_and_verifies(sqlite_lab: Lab, version: int) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    source = FIXTURES / f"v{version}"
    info = manifest(version)
    db = lab.root / "state.db"
    shutil.copyfile(source / "state.db", db)
    if (source / "artifacts").is_dir():
        shutil.copytree(source / "artifacts", lab.root / "artifacts")
    pristine = db.read_bytes()
    files = lab.files()
    # Reading an older file never migrates it.
    for task in info["tasks"]:
        lab.snapshot(task)
    assert lab.files() == files, "status/export changed the files of an older schema"
    assert db.read_bytes() == pristine
    relocate(db, info["root"], lab.root)
    resume_every_task(lab, version, info)
    assert user_version(db) == LATEST


# -- PostgreSQL: the same tasks, dumped by each version's code ---------------------

PG_VERSIONS = sorted(int(p.parent.parent.name[1:]) for p in FIXTURES.glob("v*/postgres/dump.sql"))

#: The contract's columns: a migration may add, never change these.
CONTRACT_ROWS = (
    "SELECT id, goal, status, created_at, updated_at FROM tasks ORDER BY id",
    "SELECT task_id, idx, tool, input, status, output, attempts FROM steps ORDER BY task_id, idx",
    "SELECT seq, ts, task_id, run_id, kind, step_idx, data FROM events ORDER BY seq",
)


def pg_rows(url: str) -> list[list[tuple[Any, ...]]]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return [conn.execute(query).fetchall() for query in CONTRACT_ROWS]


def pg_version(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute("SELECT max(version) FROM ninelives_schema").fetchone()[0])


def load_pg_fixture(url: str, version: int, lab: Lab) -> dict[str, Any]:
    """Load ``vN/postgres/dump.sql`` into the empty database ``url`` and its
    artifacts into ``lab``, with the recorded folders moved to ``lab``."""
    import psycopg

    source = FIXTURES / f"v{version}" / "postgres"
    info = manifest_at(source)
    dump = (source / "dump.sql").read_text(encoding="utf-8")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(dump.replace(info["root"] + "/", f"{lab.root}/"))  # type: ignore[arg-type]
        conn.execute("RESET search_path")  # the dump empties it for its own session
        row = conn.execute("SELECT max(lease_expires_at) FROM tasks").fetchone()
    # The killed runs' leases come from another server, so they are honoured
    # until they expire (exit 3 before): long past for a committed fixture, not
    # for one made a moment ago. Wait out the recorded expiry, at most a minute.
    expires = float(row[0] or 0) if row else 0.0
    wait = expires - time.time()
    assert wait < 60, f"a lease of the fixture runs {wait:.0f}s more"
    if wait > 0:
        time.sleep(wait + 0.1)
    if (source / "artifacts").is_dir():
        shutil.copytree(source / "artifacts", lab.root / "artifacts")
    return info


def manifest_at(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "manifest.json").read_text())
    return data


@pytest.mark.postgres
def test_the_newest_schema_version_has_a_postgres_fixture() -> None:
    assert LATEST in PG_VERSIONS, (
        f"schema version {LATEST} has no PostgreSQL dump: run 'python tests/fixtures/"
        "schema/make.py' (it starts a test cluster and writes tests/fixtures/schema/"
        f"v{LATEST}/postgres/) and commit that folder with the migration"
    )


@pytest.mark.postgres
@pytest.mark.parametrize("version", PG_VERSIONS)
def test_a_postgres_fixture_migrates_resumes_and_verifies(
    tmp_path: Path, pg_database: str, version: int
) -> None:
    from ninelives.store import open_store

    lab = Lab(tmp_path / "lab", db=pg_database)
    lab.guide_setup()
    info = load_pg_fixture(pg_database, version, lab)
    assert pg_version(pg_database) == version
    rows = pg_rows(pg_database)
    if version < LATEST:
        # A reader never migrates PostgreSQL: it names the command that does.
        refused = lab.cli("status", next(iter(info["tasks"])))
        assert refused.returncode == 5, refused
        assert "reading never does" in refused.stderr
        assert pg_rows(pg_database) == rows
    open_store(pg_database).close()  # what the first write command does first
    assert pg_version(pg_database) == LATEST
    assert pg_rows(pg_database) == rows, "the migration changed the contract's rows"
    try:
        resume_every_task(lab, version, info)
    finally:
        lab.reap()
