"""Task locks (``ninelives.locking``): a byte of ``tasks.lock`` on 64-bit Linux, a
file per task elsewhere, and an earlier build's file per task honoured on Linux."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ninelives import locking
from ninelives.errors import TaskBusy
from ninelives.locking import TaskLock, is_held, lock_path

HOLD = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
sys.stdin.read()
"""


def _refused(db: str, task_id: str) -> bool:
    try:
        TaskLock(db, task_id).acquire()
    except TaskBusy:
        return True
    return False


@pytest.mark.parametrize("ranges", [True, False], ids=["byte-of-tasks.lock", "file-per-task"])
def test_one_holder_per_task_also_within_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ranges: bool
) -> None:
    """Two locks of one task exclude each other even in one process (each is its
    own open file); other tasks are free; a release frees the task at once."""
    if not ranges:
        monkeypatch.setattr(locking, "RANGES", False)
    db = str(tmp_path / "state.db")
    held = TaskLock(db, "t")
    assert not is_held(db, "t")
    held.acquire()
    assert is_held(db, "t")
    assert _refused(db, "t")
    others = [TaskLock(db, f"other-{i}") for i in range(50)]
    for other in others:
        other.acquire()  # 50 other tasks at once: none shares the held one's byte
    held.release()
    held.release()  # idempotent
    assert not is_held(db, "t")
    again = TaskLock(db, "t")
    again.acquire()
    again.release()
    for other in others:
        other.release()
    names = sorted(os.listdir(tmp_path / "state.db.locks"))
    if ranges:
        assert names == ["tasks.lock"]
    else:
        assert len(names) == 51
        assert "tasks.lock" not in names


@pytest.mark.parametrize("ranges", [True, False], ids=["byte-of-tasks.lock", "file-per-task"])
def test_a_lock_is_surely_free_only_as_a_missing_file_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ranges: bool
) -> None:
    """What gc may leave untaken: a task without its own file, where each task has
    one. A held byte of ``tasks.lock`` leaves no file of the task, so there a lock
    is never known to be free without taking it."""
    if not ranges:
        monkeypatch.setattr(locking, "RANGES", False)
    db = str(tmp_path / "state.db")
    assert TaskLock(db, "t").surely_free() is not ranges
    held = TaskLock(db, "t")
    held.acquire()
    assert not TaskLock(db, "t").surely_free()
    held.release()
    assert not TaskLock(db, "t").surely_free()  # a file per task stays after its release


def test_a_task_file_is_named_by_a_hash_of_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(locking, "RANGES", False)
    db = str(tmp_path / "state.db")
    for task_id in ("secret-task", "../Another.Task_2"):
        lock = TaskLock(db, task_id)
        lock.acquire()
        lock.release()
    names = sorted(os.listdir(tmp_path / "state.db.locks"))
    ids = ("secret-task", "../Another.Task_2")
    assert names == sorted(hashlib.sha256(i.encode()).hexdigest()[:32] + ".lock" for i in ids)


def test_a_file_an_earlier_build_holds_refuses_the_task(tmp_path: Path) -> None:
    """A process of an earlier build holds ``flock`` on the task's own file: this
    build's lock is refused too, and ``is_held`` says so. Control: once that
    process is gone, the same lock is taken."""
    assert locking.RANGES
    db = str(tmp_path / "state.db")
    own = lock_path(db, "t")
    os.makedirs(os.path.dirname(own))
    earlier = subprocess.Popen(
        [sys.executable, "-c", HOLD, own], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert earlier.stdout is not None
        assert earlier.stdout.readline() == "held\n"
        assert is_held(db, "t")
        assert _refused(db, "t")
        assert not _refused(db, "u")
    finally:
        earlier.communicate("")
    assert not is_held(db, "t")
    lock = TaskLock(db, "t")
    lock.acquire()
    # Held by this build, the task's own file is locked as well: an earlier
    # build's runner starting now is refused.
    check = subprocess.run([sys.executable, "-c", HOLD, own], input="", capture_output=True)
    assert check.returncode != 0
    assert b"BlockingIOError" in check.stderr
    lock.release()


@pytest.mark.parametrize("ranges", [True, False], ids=["byte-of-tasks.lock", "file-per-task"])
def test_a_lock_taken_without_making_makes_nothing_and_holds_as_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ranges: bool
) -> None:
    """``acquire(make=False)``, a run's try before its claim's checks: where taking
    the lock would make a folder or a file, it takes nothing and makes nothing (a
    task that cannot run leaves no trace); where the shared file exists, it holds
    the task as a full acquire does."""
    if not ranges:
        monkeypatch.setattr(locking, "RANGES", False)
    db, folder = str(tmp_path / "state.db"), tmp_path / "state.db.locks"
    assert TaskLock(db, "t").acquire(make=False) is False
    assert not folder.exists()
    other = TaskLock(db, "other")
    other.acquire()  # the folder, and the shared file or the other task's own
    other.release()
    made = sorted(os.listdir(folder))
    early = TaskLock(db, "t")
    assert early.acquire(make=False) is ranges
    assert sorted(os.listdir(folder)) == made
    assert is_held(db, "t") is ranges
    if ranges:
        assert _refused(db, "t")
        with pytest.raises(TaskBusy):
            TaskLock(db, "t").acquire(make=False)
    early.release()
    assert not is_held(db, "t")
