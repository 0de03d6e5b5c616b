"""Commands that only read (``status``, ``export``, ``verify``) never write.

They open a SQLite file read-only: no migration, no journal-mode switch, no
file created beside it, the database byte-for-byte unchanged, and they work on
a read-only file system. A SQLite file of another application is named as
such (exit 5), and so is a newer schema, before anything is written. Older
schemas (the guide's version 0, ninelives' own earlier versions) are read
as they are.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ninelives.store import open_store, sql
from ninelives.testing import Lab, Result
from ninelives.testing.iofault import SmallDiskUnavailable, small_disk
from ninelives.testing.lab import GUIDE_SCHEMA

READS = [("status", "t"), ("export", "t"), ("verify", "t"), ("verify", "--all")]
WRITES = [("create", "new", "plan.json"), ("run", "t")]
LATEST = sql.migrations("sqlite")[-1][0]


def assert_one_line_error(result: Result, code: int, *words: str) -> None:
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ninelives: error: ")
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture(scope="module")
def done_db(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real database holding task ``t`` run to done (closed: no -wal)."""
    lab = Lab(tmp_path_factory.mktemp("done") / "lab")
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 0
    assert not (lab.root / "state.db-wal").exists()
    return (lab.root / "state.db").read_bytes()


def foreign_db(path: Path, *, wal: bool) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO photos (name) VALUES ('cat.jpg')")
    conn.execute("PRAGMA user_version = 7")
    conn.close()


@pytest.mark.parametrize("wal", [False, True], ids=["rollback", "wal"])
def test_a_foreign_sqlite_file_is_named_and_left_unchanged(sqlite_lab: Lab, wal: bool) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    foreign_db(lab.root / "state.db", wal=wal)
    files = lab.files()
    for args in READS + WRITES:
        assert_one_line_error(lab.cli(*args), 5, "not a ninelives database")
        assert lab.files() == files, args  # same bytes, no -wal, -shm or lock folder
    conn = sqlite3.connect(lab.root / "state.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == ("wal" if wal else "delete")
    conn.close()


def test_a_newer_schema_is_refused_before_anything_is_written(
    sqlite_lab: Lab, done_db: bytes
) -> None:
    # In rollback-journal mode, so that a switch to WAL before the refusal shows.
    lab = sqlite_lab
    lab.guide_setup()
    db = lab.root / "state.db"
    db.write_bytes(done_db)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.execute(f"PRAGMA user_version = {LATEST + 1}")
    conn.close()
    files = lab.files()
    for args in READS + WRITES:
        assert_one_line_error(lab.cli(*args), 5, "newer")
        assert lab.files() == files, args


def _killed_mid_transaction(db: Path) -> None:
    """A rollback-journal writer SIGKILLed inside a transaction: its hot
    ``-journal`` stays beside the file, holding the pages to put back."""
    import os
    import signal

    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")
    conn.close()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child dies by SIGKILL
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("PRAGMA cache_size=1")  # spill: the file holds changed pages
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("UPDATE tasks SET goal = 'half-written'")
        conn.execute("UPDATE events SET data = data")
        os.kill(os.getpid(), signal.SIGKILL)
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGKILL
    assert Path(f"{db}-journal").stat().st_size > 0


def test_a_hot_journal_left_by_a_killed_writer_is_named_with_its_fix(
    sqlite_lab: Lab, done_db: bytes
) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    db = lab.root / "state.db"
    db.write_bytes(done_db)
    _killed_mid_transaction(db)
    files = lab.files()
    for args in [*READS, ("ls",), ("doctor",)]:
        assert_one_line_error(lab.cli(*args), 5, "-journal", "ninelives doctor --fix")
        assert lab.files() == files, args  # a reader rolls nothing back
    fixed = lab.cli("doctor", "--fix")
    assert fixed.returncode == 0, fixed
    assert not Path(f"{db}-journal").exists()
    shown = lab.cli("status", "t").json()
    assert (shown["status"], shown["goal"]) == ("done", "Summarize notes into a report")


def test_reads_of_a_closed_database_create_no_file(sqlite_lab: Lab, done_db: bytes) -> None:
    lab = sqlite_lab
    (lab.root / "state.db").write_bytes(done_db)
    files = lab.files()
    assert lab.cli("status", "t").json()["status"] == "done"
    assert len(lab.cli("export", "t").jsonl()) > 5
    assert lab.cli("verify", "--all").returncode == 0
    assert lab.files() == files  # no -wal, -shm, lock folder; the same bytes
    # The control: a write does change the folder's files.
    assert lab.cli("run", "t").returncode == 0
    assert lab.files() != files


def test_an_empty_file_reads_as_no_task_and_stays_empty(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    (lab.root / "state.db").write_bytes(b"")
    for args in READS[:3]:
        assert_one_line_error(lab.cli(*args), 1)
    assert lab.files() == {"state.db": "sha256:" + hashlib.sha256(b"").hexdigest()}


#: The guide's rows of a task killed mid-step (its schema is ``GUIDE_SCHEMA``).
GUIDE_ROWS = """
INSERT INTO tasks (id, goal, status, created_at, updated_at)
VALUES ('t', 'the guide''s goal', 'running', 1.0, 2.0);
INSERT INTO steps (task_id, idx, tool, input, status, output, attempts)
VALUES ('t', 0, 'fetch', '{"path": "input/notes.txt"}', 'done', '{"chars": 5, "text": "a b c"}', 1),
       ('t', 1, 'summarize', '{"from": 0}', 'running', NULL, 1);
INSERT INTO events (ts, task_id, run_id, kind, step_idx, data) VALUES
    (1.0, 't', 'c', 'task_created', NULL, '{"steps": 2}'),
    (1.5, 't', 'r1', 'run_started', NULL, '{"recovered": []}');
"""


def schema_at(path: Path, version: int) -> None:
    """A database as ninelives ``version`` left it (0: the guide's own schema)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    if version == 0:
        conn.executescript(GUIDE_SCHEMA + GUIDE_ROWS)
    else:
        for number, _name, migration in sql.migrations("sqlite"):
            if number <= version:
                for statement in sql.statements(migration):
                    conn.execute(statement)
        conn.executescript(GUIDE_ROWS)
        conn.execute(f"PRAGMA user_version = {version}")
    conn.close()


@pytest.mark.parametrize("version", range(LATEST))
def test_older_schemas_are_read_without_migrating(sqlite_lab: Lab, version: int) -> None:
    lab = sqlite_lab
    db = lab.root / "state.db"
    schema_at(db, version)
    files = lab.files()
    status = lab.cli("status", "t")
    assert status.returncode == 0, status.stderr
    assert status.json() == {
        "task": "t",
        "goal": "the guide's goal",
        "status": "running",
        "steps": [
            {"idx": 0, "tool": "fetch", "status": "done", "attempts": 1},
            {"idx": 1, "tool": "summarize", "status": "running", "attempts": 1},
        ],
    }
    export = lab.cli("export", "t")
    assert [e["kind"] for e in export.jsonl()] == ["task_created", "run_started"]
    assert lab.files() == files  # not migrated: the same bytes
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == version
    conn.close()
    # The control: a write command does migrate it.
    assert lab.cli("run", "t").returncode == 0
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == LATEST
    conn.close()


def test_columns_added_later_do_not_disturb_a_reader(sqlite_lab: Lab, done_db: bytes) -> None:
    # A later migration adding a column (say, to tasks) must not change what is read.
    lab = sqlite_lab
    db = lab.root / "state.db"
    db.write_bytes(done_db)
    before = lab.snapshot("t")
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("ALTER TABLE tasks ADD COLUMN later TEXT")
    conn.execute("ALTER TABLE steps ADD COLUMN note TEXT")
    conn.close()
    assert lab.snapshot("t") == before


def test_a_reader_keeps_a_closing_writer_from_checkpointing(
    sqlite_lab: Lab, done_db: bytes
) -> None:
    # A reader of a database no writer has open reads the file itself; while it
    # is open a writer's commits stay in the WAL (the reader's read lock keeps
    # the closing writer from copying them into the file), and the reader
    # sees them by reading again through SQLite's locks.
    lab = sqlite_lab
    lab.guide_setup()
    db = lab.root / "state.db"
    db.write_bytes(done_db)
    reader = open_store(str(db), readonly=True)
    try:
        assert reader.get_task("t").status.value == "done"
        assert lab.cli("create", "t2", "plan.json").returncode == 0
        assert db.read_bytes() == done_db
        assert (lab.root / "state.db-wal").stat().st_size > 0
        assert reader.get_task("t2").status.value == "pending"
        assert reader.get_task("t").status.value == "done"
    finally:
        reader.close()
    # The control: with no reader open, a closing writer does checkpoint.
    assert lab.cli("create", "t3", "plan.json").returncode == 0
    assert db.read_bytes() != done_db
    assert not (lab.root / "state.db-wal").exists()


@pytest.fixture
def readonly_mount(tmp_path: Path) -> Iterator[Path]:
    """A real tmpfs, remounted read-only once :func:`seal` is called on it."""
    try:
        with small_disk(tmp_path / "ro", "8m") as disk:
            yield disk
    except SmallDiskUnavailable as exc:
        pytest.fail(f"cannot mount a tmpfs for the read-only test: {exc}", pytrace=False)


def seal(disk: Path) -> None:
    done = subprocess.run(
        ["mount", "-o", "remount,ro", str(disk)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.linux
@pytest.mark.parametrize("wal", [False, True], ids=["closed", "with-wal"])
def test_reads_work_on_a_read_only_file_system(
    tmp_path: Path, readonly_mount: Path, done_db: bytes, wal: bool
) -> None:
    lab = Lab(tmp_path / "lab", db=str(readonly_mount / "state.db"))
    lab.guide_setup()
    (readonly_mount / "state.db").write_bytes(done_db)
    if wal:
        # A runner killed after a commit leaves its -wal and -shm behind.
        assert lab.cli("create", "t2", "plan.json").returncode == 0
        assert lab.cli("run", "t2", AGENT_CRASH_AT="before_effect:0").returncode == -9
        assert (readonly_mount / "state.db-wal").stat().st_size > 0
    seal(readonly_mount)
    files = lab.files(readonly_mount)
    assert lab.cli("status", "t").json()["status"] == "done"
    assert len(lab.cli("export", "t").jsonl()) > 5
    verify = lab.cli("verify", "t")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    if wal:
        # The commit that only the -wal holds is read too.
        assert lab.cli("status", "t2").json()["steps"][0]["status"] == "running"
    assert lab.files(readonly_mount) == files
    # The control: the file system really is read-only.
    with pytest.raises(OSError, match="Read-only file system"):
        (readonly_mount / "probe").write_text("x")
    shutil.rmtree(lab.root)
