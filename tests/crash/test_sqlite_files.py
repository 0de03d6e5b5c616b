"""SQLite specifics: private files, no lock file per task, an earlier build's lock
file honoured, and a kernel lock that dies with its process."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ninelives.locking import RANGES, lock_path
from ninelives.testing import Lab, five_property_violations
from ninelives.testing.lab import GUIDE_PLAN

pytestmark = pytest.mark.crash

SUMMARY = "Line one\nLine two\nLine three"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def spawn_with_umask(lab: Lab, *args: str, **env: str) -> subprocess.Popen[str]:
    """Start the command with umask 000, so only the program's own modes protect its files."""
    return subprocess.Popen(
        ["/bin/sh", "-c", 'umask 000 && exec "$@"', "sh", *lab.argv(args)],
        cwd=lab.root,
        env=lab.env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_database_wal_and_lock_files_are_private(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    create = spawn_with_umask(lab, "create", "secret-task", "plan.json")
    create.communicate(timeout=60)
    assert create.returncode == 0
    runner = spawn_with_umask(lab, "run", "secret-task", AGENT_STEP_DELAY="3")
    try:
        lab.wait_for("secret-task", "step_started", step=0)
        db = lab.root / "state.db"
        wal = lab.root / "state.db-wal"
        locks = lab.root / "state.db.locks"
        assert wal.exists(), "the runner holds the database open in WAL mode"
        assert mode(db) == 0o600
        assert mode(wal) == 0o600
        assert mode(locks) == 0o700
        (lock,) = locks.iterdir()
        assert mode(lock) == 0o600
        shm = lab.root / "state.db-shm"
        if shm.exists():
            assert mode(shm) == 0o600
    finally:
        Lab.kill(runner)
    assert runner.returncode == -signal.SIGKILL
    resume = spawn_with_umask(lab, "run", "secret-task")
    resume.communicate(timeout=60)
    assert resume.returncode == 0
    # The control: files the program does not protect on purpose show the
    # umask really was 000 (the artifacts folder is world-writable).
    assert mode(lab.root / "artifacts") == 0o777
    assert mode(lab.root / "state.db") == 0o600


def test_no_lock_file_carries_a_task_id(sqlite_lab: Lab) -> None:
    """On Linux every task's lock is a byte of ``tasks.lock``: running tasks makes no
    file per task. Elsewhere a task's file is named by a hash of its id
    (``test_a_task_file_is_named_by_a_hash_of_its_id`` in ``tests/unit/test_locking.py``)."""
    lab = sqlite_lab
    lab.guide_setup()
    ids = ["secret-task", "Another.Task_2"]
    for task_id in ids:
        assert lab.cli("create", task_id, "plan.json").returncode == 0
        assert lab.cli("run", task_id).returncode == 0
    assert RANGES, "the suite runs where byte-range locks are (64-bit Linux)"
    assert sorted(os.listdir(lab.root / "state.db.locks")) == ["tasks.lock"]
    # Nothing anywhere carries the id as a file name, apart from the artifacts.
    named = [p for p in lab.files() if any(i in p for i in ids)]
    assert sorted(named) == sorted(f"artifacts/{i}-2.md" for i in ids)


HOLD_AS_AN_EARLIER_BUILD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
time.sleep(60)
"""


def test_a_lock_file_of_an_earlier_build_still_excludes(sqlite_lab: Lab) -> None:
    """Through an upgrade, a runner of an earlier build (one ``flock``ed file per
    task) and one of this build must not both hold a task: a task's own file is
    locked too when it is there. Control: with that file free the run goes on."""
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    own = lock_path(str(lab.sqlite_path), "t")
    os.makedirs(os.path.dirname(own), exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AS_AN_EARLIER_BUILD, own], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        before = lab.snapshot("t")
        refused = lab.cli("run", "t")
        assert refused.returncode == 3, refused
        assert "is being run by another process" in refused.stderr
        assert lab.snapshot("t") == before
    finally:
        Lab.kill(holder)
    resumed = lab.cli("run", "t")
    assert resumed.returncode == 0, resumed.stderr
    assert lab.snapshot("t").status["status"] == "done"


def test_kernel_lock_dies_with_sigkill(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    runner = lab.spawn("run", "t", AGENT_STEP_DELAY="30")
    lab.wait_for("t", "step_started", step=0)
    # While it lives, the lock holds (the control).
    assert lab.cli("run", "t").returncode == 3
    assert Lab.kill(runner) == -signal.SIGKILL
    # The lock file is still there, but no process holds it any more: a new
    # runner gets the task at once, without waiting out any timeout.
    assert len(os.listdir(lab.root / "state.db.locks")) == 1
    started = time.monotonic()
    resumed = lab.cli("run", "t")
    assert resumed.returncode == 0, resumed.stderr
    assert time.monotonic() - started < 10
    after = lab.snapshot("t")
    assert (
        five_property_violations(
            plan=GUIDE_PLAN,
            after=after,
            runs=2,
            artifacts=lab.artifacts(),
            expected_artifacts={"t-2.md": SUMMARY},
        )
        == []
    )
    assert [s["attempts"] for s in after.status["steps"]] == [2, 1, 1]


def test_lock_descriptor_is_close_on_exec(sqlite_lab: Lab) -> None:
    # A process a tool starts must not inherit the lock and keep the task
    # locked after the runner is killed: the kernel shows the descriptor's flags.
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    runner = lab.spawn("run", "t", AGENT_STEP_DELAY="30")
    lab.wait_for("t", "step_started", step=0)
    fds = os.listdir(f"/proc/{runner.pid}/fd")
    flags = []
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{runner.pid}/fd/{fd}")
        except OSError:
            continue
        if target.endswith(".lock"):
            with open(f"/proc/{runner.pid}/fdinfo/{fd}", encoding="ascii") as fh:
                info = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
            flags.append(int(info["flags"].strip(), 8))
    Lab.kill(runner)
    assert len(flags) == 1, fds
    assert flags[0] & os.O_CLOEXEC, "the lock's descriptor would leak into tool subprocesses"


def test_a_runner_overtaken_before_its_effect_exits_3_without_it(sqlite_lab: Lab) -> None:
    """A runner that another took the task from while it was between a step's
    start and its effect (here in the test delay, its lock folder removed under
    it) checks the lease, stops with exit 3 and never runs the effect; the other
    runner runs it once. With no time between (no delay), the start's own fenced
    commit is the check. Control: without the check the effect runs twice."""
    lab = sqlite_lab
    shutil.copy(Path(__file__).with_name("effect_tools.py"), lab.root / "effect_tools.py")
    lab.base_env["NINELIVES_TOOLS"] = "effect_tools"
    lab.write_plan({"goal": "pay once", "steps": [{"tool": "charge_rerun", "input": {}}]})
    assert lab.cli("create", "pay", "plan.json").returncode == 0
    slow = lab.spawn("run", "pay", AGENT_STEP_DELAY="3")
    lab.wait_for("pay", "step_started", step=0)
    shutil.rmtree(lab.root / "state.db.locks")
    taken = lab.cli("run", "pay")
    assert taken.returncode == 0, taken.stderr
    _, err = slow.communicate(timeout=60)
    assert slow.returncode == 3, err
    assert "taken over" in err
    assert "Traceback" not in err
    log = (lab.root / "effects.log").read_text(encoding="utf-8").splitlines()
    assert log == ["pay-0"]
    assert lab.snapshot("pay").status["status"] == "done"
