"""``ninelives ls``, ``gc`` and ``doctor`` as commands: output, exit codes, bad input
(one line, exit 4, nothing changed), read-only reads, and what ``doctor --fix`` repairs."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from ninelives.locking import lock_folder
from ninelives.testing import Lab

TASKS = ("a", "b", "c")


def _tasks(lab: Lab) -> None:
    """a and b done, c pending (in queue q)."""
    lab.guide_setup()
    for task_id in ("a", "b"):
        assert lab.cli("create", task_id, "plan.json").returncode == 0
        assert lab.cli("run", task_id).returncode == 0
    assert lab.cli("submit", "c", "plan.json", "--queue", "q").returncode == 0


def _one_line_error(result: object, code: int, text: str) -> None:
    assert result.returncode == code, result  # type: ignore[attr-defined]
    lines = result.stderr.splitlines()  # type: ignore[attr-defined]
    assert len(lines) == 1, lines
    assert text in lines[0], lines
    assert "Traceback" not in lines[0], lines


@pytest.mark.slow
def test_ls_lists_newest_first_as_json(lab: Lab) -> None:
    _tasks(lab)
    listed = lab.cli("ls", "--json").jsonl()
    assert [t["task"] for t in listed] == ["c", "b", "a"]
    c, _, a = listed
    assert (a["status"], a["steps_done"], a["steps_total"], a["attempts"], a["last_event"]) == (
        "done", 3, 3, 3, "task_done",
    )  # fmt: skip
    assert (c["status"], c["queue"], c["last_event"]) == ("pending", "q", "task_created")
    assert 0 <= a["age"] < 600
    assert [t["task"] for t in lab.cli("ls", "--status", "done", "--limit", "1").jsonl()] == ["b"]
    assert [t["task"] for t in lab.cli("ls", "--queue", "q").jsonl()] == ["c"]


@pytest.mark.slow
def test_gc_removes_finished_tasks_and_says_which(lab: Lab) -> None:
    _tasks(lab)
    before = lab.fingerprint(*TASKS)
    dry = lab.cli("gc", "--older-than", "0s", "--dry-run")
    assert dry.returncode == 0, dry
    assert sorted(dry.stdout.splitlines()[:2]) == ["would remove a (done)", "would remove b (done)"]
    assert lab.fingerprint(*TASKS) == before  # a dry run changes nothing
    assert lab.cli("gc", "--older-than", "1h", "--json").json()["tasks"] == 0  # too recent
    report = lab.cli("gc", "--older-than", "0s", "--json").json()
    assert (report["tasks"], report["steps"], report["events"]) == (2, 6, 18)
    assert sorted(r["task"] for r in report["removed"]) == ["a", "b"]
    assert lab.cli("status", "a").returncode == 1
    assert lab.cli("status", "c").returncode == 0
    assert (lab.artifacts_dir / "a-2.md").exists()  # artifacts are the user's: kept


@pytest.mark.parametrize(
    ("args", "text"),
    [
        (("gc", "--older-than", "3x"), "duration '3x'"),
        (("gc", "--older-than=-1d"), "duration '-1d'"),
        (("gc", "--older-than", "-1d"), "expected one argument"),
        (("gc", "--older-than", ""), "duration ''"),
        (("gc",), "--older-than"),
        (("gc", "--older-than", "1d", "--status", "running"), "status running"),
        # An empty value (a script's unset variable) is no filter: it widened gc to
        # every finished status, and ls to every task.
        (("gc", "--older-than", "0s", "--status", ""), "status ''"),
        (("gc", "--older-than", "1d", "--batch", "0"), "--batch"),
        (("ls", "--status", "bogus"), "status bogus"),
        (("ls", "--status", ""), "status ''"),
        (("ls", "--limit", "0"), "--limit"),
        (("ls", "--queue", "../x"), "invalid queue name"),
        (("doctor", "--fix", "extra"), "unrecognized arguments"),
    ],
)
@pytest.mark.slow
def test_bad_input_is_one_line_exit_4_and_changes_nothing(
    lab: Lab, args: tuple[str, ...], text: str
) -> None:
    _tasks(lab)
    before = lab.fingerprint(*TASKS)
    _one_line_error(lab.cli(*args), 4, text)
    assert lab.fingerprint(*TASKS) == before
    # control: the same command with good input is accepted
    good = {"gc": ("gc", "--older-than", "30d"), "ls": ("ls",), "doctor": ("doctor",)}
    assert lab.cli(*good[args[0]]).returncode == 0


@pytest.mark.parametrize("command", [("ls",), ("gc", "--older-than", "1d"), ("doctor",)])
def test_no_database_is_exit_5_and_creates_nothing(
    sqlite_lab: Lab, command: tuple[str, ...]
) -> None:
    _one_line_error(sqlite_lab.cli(*command), 5, "no database at state.db")
    assert sqlite_lab.files() == {}


def test_ls_and_doctor_never_write(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    _tasks(lab)
    Path(lock_folder(str(lab.sqlite_path)), "0" * 32 + ".lock").write_bytes(b"")  # a finding
    before = lab.files()
    assert lab.cli("ls").returncode == 0
    assert lab.cli("doctor").returncode == 7
    assert lab.cli("gc", "--older-than", "0s", "--dry-run").returncode == 0
    assert lab.files() == before


def test_doctor_finds_stale_lock_and_temp_files_and_fixes_them(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    _tasks(lab)
    assert lab.cli("doctor").stdout == "doctor: no findings\n"
    stale = Path(lock_folder(str(lab.sqlite_path)), "0" * 32 + ".lock")
    stale.write_bytes(b"")
    old = lab.artifacts_dir / ".gone-2.md.0123456789abcdef.tmp"
    old.write_text("half", encoding="utf-8")
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    fresh = lab.artifacts_dir / ".live-2.md.fedcba9876543210.tmp"  # a write under way
    fresh.write_text("half", encoding="utf-8")
    found = lab.cli("doctor", "--json")
    assert found.returncode == 7
    report = found.json()
    assert report["ok"] is False
    kinds = sorted((f["kind"], Path(f["subject"]).name) for f in report["findings"])
    assert kinds == [("lock", stale.name), ("temp", old.name)]
    assert all("ninelives doctor --fix" in f["fix"] for f in report["findings"])
    fixed = lab.cli("doctor", "--fix")
    assert fixed.returncode == 0, fixed
    assert not stale.exists()
    assert not old.exists()
    assert fresh.exists()
    assert lab.cli("doctor").returncode == 0


@pytest.mark.slow
def test_doctor_fix_claims_a_wal_checkpoint_only_once_it_is_done(sqlite_lab: Lab) -> None:
    """A process reading an older snapshot holds the write-ahead log back: the
    checkpoint cannot finish, so the WAL is still a finding, not "fixed"."""
    import sqlite3

    from ninelives.housekeeping import WAL_LIMIT

    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    db = lab.root / "state.db"
    reader = sqlite3.connect(db, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM tasks").fetchone()  # its snapshot: before the pad
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("CREATE TABLE pad (x BLOB)")
    for _ in range(WAL_LIMIT // (1 << 20) + 4):
        writer.execute("INSERT INTO pad VALUES (?)", (os.urandom(1 << 20),))
    writer.execute("DROP TABLE pad")
    writer.close()
    wal = Path(f"{db}-wal")
    size = wal.stat().st_size
    assert size > WAL_LIMIT
    held = lab.cli("doctor", "--fix", "--json")
    assert held.returncode == 7, held
    report = held.json()
    assert [f["kind"] for f in report["fixed"]] == []
    assert [f["kind"] for f in report["findings"]] == ["wal"]
    assert wal.stat().st_size == size
    # Its snapshot ends; the connection stays open, so its close checkpoints nothing.
    reader.execute("COMMIT")
    fixed = lab.cli("doctor", "--fix", "--json")
    assert wal.stat().st_size == 0
    reader.close()
    assert fixed.returncode == 0, fixed
    assert [f["kind"] for f in fixed.json()["fixed"]] == ["wal"]


def test_doctor_names_a_killed_task_and_its_fix(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "k", "plan.json").returncode == 0
    assert lab.cli("run", "k", AGENT_CRASH_AT="after_effect:1").returncode == -9
    found = lab.cli("doctor")
    assert found.returncode == 7
    [line, summary] = found.stdout.splitlines()
    assert line.startswith("running: k: running, but ")
    assert line.endswith("(fix: ninelives run k)")
    assert summary == "doctor: 1 finding(s)"
    assert lab.cli("run", "k").returncode == 0
    assert json.loads(lab.cli("doctor", "--json").stdout) == {
        "ok": True,
        "findings": [],
        "fixed": [],
    }


@pytest.mark.slow
def test_doctor_leaves_a_queued_task_its_worker_released_into_a_wait_alone(lab: Lab) -> None:
    """A worker releases a task whose step waits out a backoff longer than its
    ``--poll`` (or a workflow's ``ctx.sleep``): ``running``, no holder, nothing
    running, claimed again when due. ``doctor`` called it a task whose process
    died (exit 7) and told to ``run`` it, which would sleep out the wait."""
    lab.write_plan({
        "goal": "waits an hour between attempts",
        "defaults": {"backoff": {"base": 3600, "cap": 3600}},
        "steps": [{"tool": "fetch", "input": {"path": "input/missing.txt"}}],
    })  # fmt: skip
    assert lab.cli("create", "w", "plan.json", "--queue", "q").returncode == 0
    worker = lab.spawn("worker", "--queue", "q", "--poll", "0.2", NINELIVES_BACKOFF="0.5")
    lab.wait_for("w", "step_error", 0)
    time.sleep(0.5)  # the slot releases the task right after the error's commit
    worker.send_signal(signal.SIGTERM)
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert "action=released task=w" in err
    status = lab.cli("status", "w", "--json").json()
    assert status["status"] == "running"
    assert status["steps"][0]["status"] == "pending"
    found = lab.cli("doctor")
    assert found.returncode == 0, found.stdout
    assert found.stdout == "doctor: no findings\n"


def test_doctor_knows_the_blob_stores_lock_and_never_removes_it(sqlite_lab: Lab) -> None:
    """``blobs.lock`` orders blob writers and the sweep: a healthy database that
    stored blobs has no finding, and ``--fix`` leaves that lock (and any name
    ninelives does not make) where it is, while still removing a task's stale lock."""
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "b", "plan.json").returncode == 0
    assert lab.cli("run", "b", NINELIVES_BLOB_THRESHOLD="0").returncode == 0
    folder = Path(lock_folder(str(lab.sqlite_path)))
    blob_lock = folder / "blobs.lock"
    assert blob_lock.is_file()
    inode = blob_lock.stat().st_ino
    foreign = folder / "notes.txt"
    foreign.write_text("not a lock file of ninelives", encoding="utf-8")
    clean = lab.cli("doctor")
    assert (clean.returncode, clean.stdout) == (0, "doctor: no findings\n"), clean
    stale = folder / ("0" * 32 + ".lock")  # control: a task's stale lock is still found
    stale.write_bytes(b"")
    found = lab.cli("doctor", "--json")
    assert found.returncode == 7
    assert [(f["kind"], f["subject"]) for f in found.json()["findings"]] == [("lock", stale.name)]
    fixed = lab.cli("doctor", "--fix")
    assert fixed.returncode == 0, fixed
    assert not stale.exists()
    assert blob_lock.stat().st_ino == inode
    assert foreign.exists()


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_doctor_names_a_lock_folder_that_is_not_a_plain_folder(
    sqlite_lab: Lab, tmp_path: Path, kind: str
) -> None:
    """A lock folder that is a symlink or a file makes every run exit 5; doctor
    says so (exit 5, the same line), and ``--fix`` removes nothing wherever a link
    points: another folder's files named like a task's lock are not its own."""
    lab = sqlite_lab
    _tasks(lab)
    folder = Path(lock_folder(str(lab.sqlite_path)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    theirs = elsewhere / ("0" * 32 + ".lock")
    theirs.write_bytes(b"")
    for name in os.listdir(folder):
        (folder / name).unlink()
    folder.rmdir()
    if kind == "symlink":
        folder.symlink_to(elsewhere)
    else:
        folder.write_bytes(b"")
    refused = lab.cli("run", "c")
    _one_line_error(refused, 5, "is not a plain folder")
    for args in (("doctor",), ("doctor", "--json"), ("doctor", "--fix")):
        result = lab.cli(*args)
        _one_line_error(result, 5, refused.stderr.strip().removeprefix("ninelives: error: "))
        assert result.stdout == "", result
    assert theirs.exists()
    assert folder.is_symlink() if kind == "symlink" else folder.is_file()
