"""A database that cannot be used (SQLite files): exit 5, one line, the file untouched."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ninelives.testing import Lab, Result
from unprivileged import UserLab

COMMANDS = [("create", "new", "plan.json"), ("run", "t"), ("status", "t"), ("export", "t")]


def assert_one_line_error(result: Result, code: int) -> None:
    assert result.returncode == code, result
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ninelives: error: ")


@pytest.fixture(scope="module")
def good_db(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real database holding one task run to done."""
    lab = Lab(tmp_path_factory.mktemp("good") / "lab")
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 0
    return (lab.root / "state.db").read_bytes()


def _garbage_pages(data: bytes) -> bytes:
    # Keep page 1 (header and schema root), scribble over every later page.
    return data[:4096] + bytes([0xA5]) * (len(data) - 4096)


def _garbage_schema(data: bytes) -> bytes:
    return data[:100] + bytes([0x5A]) * (4096 - 100) + data[4096:]


CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "text file": lambda _: b"hello, I am not a database\n",
    "random bytes": lambda _: bytes(range(256)) * 64,
    "header then garbage": lambda _: b"SQLite format 3\x00" + bytes([0xA5]) * 8000,
    "truncated header": lambda data: data[:100],
    "truncated after page 1": lambda data: data[:4096],
    "garbage pages": _garbage_pages,
    "garbage schema": _garbage_schema,
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupt_or_foreign_database_exits_5_and_is_not_modified(
    sqlite_lab: Lab, good_db: bytes, case: str
) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    db = lab.root / "state.db"
    db.write_bytes(CORRUPTIONS[case](good_db))
    files = lab.files()
    for args in COMMANDS:
        assert_one_line_error(lab.cli(*args), 5)
        assert lab.files() == files, args  # same bytes, no -wal, -shm or lock files


def test_the_uncorrupted_database_works(sqlite_lab: Lab, good_db: bytes) -> None:
    # The control: the same bytes, not scribbled over, answer normally.
    lab = sqlite_lab
    lab.guide_setup()
    (lab.root / "state.db").write_bytes(good_db)
    assert lab.cli("status", "t").json()["status"] == "done"
    assert lab.cli("run", "t").returncode == 0


def test_database_path_that_is_a_folder_exits_5(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    (lab.root / "state.db").mkdir()
    files = lab.files()
    for args in COMMANDS:
        assert_one_line_error(lab.cli(*args), 5)
    assert lab.files() == files


def test_database_in_a_missing_folder_exits_5_and_creates_nothing(
    sqlite_lab: Lab, tmp_path: Path
) -> None:
    lab = Lab(sqlite_lab.root, db="no/such/folder/state.db")
    lab.guide_setup()
    everything = lab.files(tmp_path)
    assert_one_line_error(lab.cli("create", "t", "plan.json"), 5)
    assert lab.files(tmp_path) == everything
    # Reads of a database that does not exist are "unknown task", still creating nothing.
    for args in COMMANDS[1:]:
        assert_one_line_error(lab.cli(*args), 1)
    assert lab.files(tmp_path) == everything


def test_database_in_an_existing_folder_by_absolute_path(sqlite_lab: Lab, tmp_path: Path) -> None:
    # The control of the missing-folder case: once the folder exists, it works.
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    lab = Lab(sqlite_lab.root, db=str(folder / "state.db"))
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 0
    assert (folder / "state.db").is_file()
    assert not (lab.root / "state.db").exists()


def test_a_newer_schema_is_refused_unchanged(sqlite_lab: Lab, good_db: bytes) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    db = lab.root / "state.db"
    db.write_bytes(good_db)
    conn = sqlite3.connect(db)
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    conn.execute(f"PRAGMA user_version = {version + 1}")
    conn.close()
    files = lab.files()
    for args in COMMANDS:
        result = lab.cli(*args)
        assert_one_line_error(result, 5)
        assert "newer" in result.stderr
    assert lab.files() == files


@pytest.fixture
def user_lab(tmp_path: Path) -> Iterator[UserLab]:
    lab = UserLab(tmp_path / "lab")
    lab.guide_setup()
    yield lab
    lab.reap()


def test_a_write_to_a_read_only_database_file_is_refused_and_leaves_no_file(
    user_lab: UserLab,
) -> None:
    lab = user_lab
    assert lab.cli("create", "t", "plan.json").returncode == 0
    db = lab.root / "state.db"
    db.chmod(0o444)
    files = lab.files()
    for args in (
        ("create", "new", "plan.json"), ("run", "t"), ("cancel", "t"),
        ("gc", "--older-than", "0s"), ("worker", "--drain"),
    ):  # fmt: skip
        result = lab.cli(*args)
        assert_one_line_error(result, 5)
        assert "the file is not writable by this user" in result.stderr, args
        # No -wal, -shm (they would take the file's read-only mode) or lock folder.
        assert lab.files() == files, args
    # Reads still work on the read-only file.
    assert lab.cli("status", "t").json()["status"] == "pending"
    # Once its mode is restored the database is writable as before: nothing
    # left beside it keeps it read-only.
    db.chmod(0o644)
    assert lab.cli("create", "new", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 0


@pytest.mark.parametrize("name", ["state.db-wal", "state.db-journal", "state.db.locks/tasks.lock"])
def test_a_file_of_another_database_is_not_a_database(sqlite_lab: Lab, name: str) -> None:
    # A WAL is empty while its database is open and idle (a worker waiting for
    # work), and SQLite takes an empty file for a new database: `--db state.db-wal`
    # would write a whole database into the WAL of the live one.
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 0  # makes the lock folder too
    idle = sqlite3.connect(lab.root / "state.db")  # the idle worker: it keeps the -wal
    try:
        idle.execute("SELECT count(*) FROM tasks").fetchone()
        (lab.root / name).touch()
        assert (lab.root / name).stat().st_size == 0
        files = lab.files()
        for args in COMMANDS:
            result = Lab(lab.root, db=name).cli(*args)
            assert_one_line_error(result, 5)
            assert "of the database" in result.stderr, result.stderr
            assert lab.files() == files, args
    finally:
        idle.close()
    # The control: the database itself still answers.
    assert lab.cli("status", "t").json()["status"] == "done"


@pytest.mark.parametrize("exists", [True, False], ids=["database there", "no database"])
def test_a_database_path_ending_in_a_slash_is_refused(sqlite_lab: Lab, exists: bool) -> None:
    # "state.db/" names a folder: the reads find no database there, so a create
    # that wrote into state.db would store a task that no later command finds.
    lab = sqlite_lab
    lab.guide_setup()
    if exists:
        assert lab.cli("create", "t", "plan.json").returncode == 0
    files = lab.files()
    slashed = Lab(lab.root, db="state.db/")
    for args in (("create", "new", "plan.json"), ("submit", "new", "plan.json")):
        result = slashed.cli(*args)
        assert_one_line_error(result, 5)
        assert "ends with '/'" in result.stderr
        assert lab.files() == files, args
    assert slashed.cli("status", "new").returncode == 1  # nothing stored, as reads agree
