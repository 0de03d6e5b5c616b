"""What a SQLite ``--db`` path may be: one file, one lock, whatever name reaches it.

Real processes on real files: a second runner through a symlinked alias is
refused while the first runs, a hard-linked database is refused before it
is opened, a dangling link is not followed into a world-readable file, and a
FIFO, a device or a symlinked lock folder is refused at once (never waited on).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

COMMANDS = [("create", "new", "plan.json"), ("run", "t"), ("status", "t"), ("export", "t")]


def assert_one_line_error(result: object, code: int, *words: str) -> None:
    assert result.returncode == code, result  # type: ignore[attr-defined]
    stderr: str = result.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("ninelives: error: ")
    for word in words:
        assert word in lines[0], lines[0]


def alias(lab: Lab, name: str) -> Lab:
    """The same folder and environment, with ``--db`` another name."""
    return Lab(lab.root, db=name)


def test_a_symlinked_alias_is_busy_while_the_first_runner_runs(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    os.symlink("state.db", lab.root / "alias.db")
    runner = lab.spawn("run", "t", AGENT_STEP_DELAY="30")
    try:
        lab.wait_for("t", "step_started", step=0)
        # The control: the same name is refused (the lock works at all).
        assert_one_line_error(lab.cli("run", "t"), 3)
        # Through the alias: the same file, so the same lock.
        assert_one_line_error(alias(lab, "alias.db").cli("run", "t"), 3)
        assert not (lab.root / "alias.db.locks").exists()
    finally:
        Lab.kill(runner)
    assert runner.returncode == -signal.SIGKILL
    # Once the first runner is gone, the alias resumes the task to the end.
    done = alias(lab, "alias.db").cli("run", "t")
    assert done.returncode == 0, done.stderr
    events = lab.cli("export", "t").jsonl()
    assert [e["step"] for e in events if e["kind"] == "step_started"] == [0, 0, 1, 2]
    assert sum(e["kind"] == "run_started" for e in events) == 2
    # SQLite's files sit beside the real file only.
    assert not any(p.startswith("alias.db-") for p in lab.files())


def test_a_hard_linked_database_is_refused_unchanged(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    os.link(lab.root / "state.db", lab.root / "hard.db")
    files = lab.files()
    for name in ("hard.db", "state.db"):
        for args in COMMANDS:
            assert_one_line_error(alias(lab, name).cli(*args), 5, "hard links")
    assert lab.files() == files
    # The control: with one name left, the same file runs to the end.
    (lab.root / "hard.db").unlink()
    assert lab.cli("run", "t").returncode == 0
    assert lab.cli("status", "t").json()["status"] == "done"


def test_a_dangling_symlink_is_not_followed_to_create_a_database(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    os.symlink("real.db", lab.root / "state.db")
    proc = subprocess.run(
        ["/bin/sh", "-c", 'umask 000 && exec "$@"', "sh", *lab.argv(["create", "t", "plan.json"])],
        cwd=lab.root,
        env=lab.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 5, proc
    assert "symlink" in proc.stderr
    assert "real.db" in proc.stderr
    assert not (lab.root / "real.db").exists()
    # Reads through it find no database (and create none).
    assert_one_line_error(lab.cli("status", "t"), 1)
    assert_one_line_error(lab.cli("run", "t"), 1)
    assert not (lab.root / "real.db").exists()


def test_a_symlink_to_a_real_database_opens_that_database(sqlite_lab: Lab) -> None:
    # The decision for an existing link: it is resolved, and everything
    # (WAL, locks, mode) is the real file's.
    lab = sqlite_lab
    lab.guide_setup()
    (lab.root / "data").mkdir()
    assert alias(lab, "data/real.db").cli("create", "t", "plan.json").returncode == 0
    os.symlink("data/real.db", lab.root / "state.db")
    assert lab.cli("run", "t").returncode == 0
    assert alias(lab, "data/real.db").cli("status", "t").json()["status"] == "done"
    assert stat.S_IMODE((lab.root / "data" / "real.db").stat().st_mode) == 0o600
    assert (lab.root / "data" / "real.db.locks").is_dir()
    assert not (lab.root / "state.db.locks").exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_database_path_that_is_not_a_file_is_refused_at_once(sqlite_lab: Lab, kind: str) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    db = lab.root / "state.db"
    if kind == "fifo":
        os.mkfifo(db, 0o600)
    else:
        os.mknod(db, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # a /dev/null of our own
    files = lab.files()
    for args in COMMANDS:
        started = time.monotonic()
        assert_one_line_error(lab.cli(*args, timeout=30), 5, "not a")
        assert time.monotonic() - started < 20
    assert lab.files() == files


def test_a_symlinked_lock_folder_is_refused(sqlite_lab: Lab, tmp_path: Path) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, lab.root / "state.db.locks")
    assert_one_line_error(lab.cli("run", "t"), 5, "lock folder")
    assert list(elsewhere.iterdir()) == []
    assert lab.cli("status", "t").json()["status"] == "pending"
    # The control: once the link is gone the folder is made and the task runs.
    (lab.root / "state.db.locks").unlink()
    assert lab.cli("run", "t").returncode == 0
    assert (lab.root / "state.db.locks").is_dir()


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_fifo_or_folder_at_a_sqlite_file_beside_it_is_named(
    sqlite_lab: Lab, suffix: str, kind: str
) -> None:
    """SQLite says only "disk I/O error" (or "unable to open"): the line names the file."""
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    taken = lab.root / f"state.db{suffix}"
    os.mkfifo(taken, 0o600) if kind == "fifo" else taken.mkdir()
    files = lab.files()
    for args in COMMANDS:
        started = time.monotonic()
        word = "a FIFO" if kind == "fifo" else "a folder"
        assert_one_line_error(lab.cli(*args, timeout=30), 5, f"state.db{suffix} is {word}")
        assert time.monotonic() - started < 20
    assert lab.files() == files
    # The control: once it is moved away the task runs to the end.
    os.unlink(taken) if kind == "fifo" else taken.rmdir()
    assert lab.cli("run", "t").returncode == 0
