"""Many processes at once on one database: one runner per task, every task finishes."""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ninelives.testing import Lab, five_property_violations

pytestmark = pytest.mark.crash

RUNNERS = 6
TASKS = 12


def _plan(name: str) -> dict[str, Any]:
    return {
        "goal": f"Report on {name}",
        "steps": [
            {"tool": "fetch", "input": {"path": f"input/{name}.txt"}},
            {"tool": "summarize", "input": {"from": 0}},
            {"tool": "write_artifact", "input": {"from": 1}},
        ],
    }


def _notes(i: int) -> tuple[str, str]:
    """Distinct notes per task, and their stub summary, so no task can pass with
    another task's output."""
    lines = [f"Task {i} line {n}" for n in range(5)]
    return "\n\n".join(lines) + "\n", "\n".join(lines[:3])


def test_same_task_started_by_several_processes_at_once(lab: Lab) -> None:
    notes, summary = _notes(0)
    lab.write("input/t0.txt", notes)
    lab.write_plan(_plan("t0"))
    assert lab.cli("create", "t0", "plan.json").returncode == 0
    runners = [lab.spawn("run", "t0", AGENT_STEP_DELAY="0.3") for _ in range(RUNNERS)]
    outcomes = [(r.communicate(timeout=120), r.returncode) for r in runners]
    codes = sorted(code for _, code in outcomes)
    assert set(codes) <= {0, 3}, outcomes
    assert codes.count(3) >= 1, "no runner was refused: the processes did not overlap"
    for (_, err), code in outcomes:
        if code == 3:
            assert err.splitlines() == [err.splitlines()[0]]
            assert err.startswith("ninelives: error: ")

    after = lab.snapshot("t0")
    # Exactly one process worked; any other that exited 0 only found the task done.
    workers = {e["run"] for e in after.events if e["kind"] == "step_started"}
    assert len(workers) == 1
    assert [s["attempts"] for s in after.status["steps"]] == [1, 1, 1]
    assert (
        five_property_violations(
            plan=_plan("t0"),
            after=after,
            runs=codes.count(0),
            artifacts=lab.artifacts(),
            expected_artifacts={"t0-2.md": summary},
        )
        == []
    )


@pytest.mark.slow
def test_a_dozen_tasks_created_and_run_by_a_dozen_processes_at_once(lab: Lab) -> None:
    ids = [f"t{i}" for i in range(TASKS)]
    expected = {}
    for i, task_id in enumerate(ids):
        notes, summary = _notes(i)
        lab.write(f"input/{task_id}.txt", notes)
        lab.write_plan(_plan(task_id), f"{task_id}.json")
        expected[f"{task_id}-2.md"] = summary

    # All creates at once, on a database that does not exist yet: the schema
    # is made once and every task lands.
    creators = [lab.spawn("create", task_id, f"{task_id}.json") for task_id in ids]
    for proc in creators:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err

    runners = [lab.spawn("run", task_id, AGENT_STEP_DELAY="0.05") for task_id in ids]
    for proc in runners:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "Traceback" not in err

    artifacts = lab.artifacts()
    assert artifacts == expected
    for task_id in ids:
        after = lab.snapshot(task_id)
        mine = {k: v for k, v in artifacts.items() if k.startswith(f"{task_id}-")}
        problems = five_property_violations(
            plan=_plan(task_id),
            after=after,
            runs=1,
            artifacts=mine,
            expected_artifacts={f"{task_id}-2.md": expected[f"{task_id}-2.md"]},
        )
        assert problems == [], task_id
        assert after.outputs[0]["text"].startswith(f"Task {ids.index(task_id)} line 0")

    db = lab.sqlite_path
    if db is not None:
        conn = sqlite3.connect(db)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            assert conn.execute("SELECT COUNT(*) FROM tasks").fetchone() == (TASKS,)
        finally:
            conn.close()


# -- BEGIN IMMEDIATE, and its negative control ------------------------------------

DEFERRED = Path(__file__).with_name("deferred_runner.py")


def _deferred(lab: Lab) -> Lab:
    """The same lab, its commands run by the deferred-BEGIN control runner."""
    return Lab(lab.root, db=lab.db, command=[sys.executable, str(DEFERRED)])


@pytest.mark.parametrize("begin", ["immediate", "deferred-control"])
def test_a_migration_waits_for_the_write_lock(sqlite_lab: Lab, begin: str) -> None:
    """Another connection holds the write lock while ``run`` opens a database of
    the guide's (schema version 0), which it must migrate. With BEGIN IMMEDIATE
    the runner waits and then finishes; the control, with a deferred BEGIN,
    fails at once with "database is locked" while the lock is still held: the
    migration reads the schema version first, and SQLite does not wait to
    upgrade a read to a write. (Many processes making one fresh database at
    once, above, race the same way, but not at every try.)"""
    from ninelives.testing.lab import GUIDE_PLAN
    from ninelives.testing.simulation import write_legacy_database

    lab = sqlite_lab if begin == "immediate" else _deferred(sqlite_lab)
    lab.guide_setup()
    db = lab.root / "state.db"
    write_legacy_database(str(db), GUIDE_PLAN, {}, task_id="t")
    holder = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        holder.execute("BEGIN IMMEDIATE")
        runner = lab.spawn("run", "t")
        if begin == "immediate":
            time.sleep(1.5)  # long enough to reach the lock; if it does not, it passes anyway
            assert runner.poll() is None, runner.communicate()
            holder.execute("COMMIT")
            _, err = runner.communicate(timeout=120)
            assert runner.returncode == 0, err
        else:
            _, err = runner.communicate(timeout=120)  # the lock is held all along
            holder.execute("COMMIT")
            assert runner.returncode == 5, err
            assert "database is locked" in err
            assert err.count("\n") == 1
    finally:
        holder.close()
    conn = sqlite3.connect(db)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
    finally:
        conn.close()
    assert (version > 0) is (begin == "immediate")


def test_a_busy_task_is_refused_at_once_while_another_write_is_open(sqlite_lab: Lab) -> None:
    """Exit 3 never waits: not for the task (held by another process here) and
    not for the database's write lock, held all along by another connection."""
    from ninelives.locking import TaskLock

    sqlite_lab.guide_setup()
    assert sqlite_lab.cli("create", "t", "plan.json").returncode == 0
    db = sqlite_lab.root / "state.db"
    lock = TaskLock(str(db.resolve()), "t")
    lock.acquire()
    holder = sqlite3.connect(db, isolation_level=None, timeout=0)
    try:
        holder.execute("BEGIN IMMEDIATE")
        began = time.monotonic()
        busy = sqlite_lab.cli("run", "t", timeout=30)
        waited = time.monotonic() - began
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        lock.release()
    assert busy.returncode == 3, busy.stderr
    assert "being run by another process" in busy.stderr
    assert waited < 20  # the write lock was held all along: it did not wait for it
    assert sqlite_lab.cli("run", "t").returncode == 0


def test_a_new_database_waits_for_another_writer_before_switching_to_wal(
    sqlite_lab: Lab,
) -> None:
    """Switching a new file to WAL needs the write lock, and SQLite refuses it at
    once, without its busy timeout, while another connection holds it: so a
    dozen processes creating one new database together could lose the race
    (exit 5, "database is locked"). The switch waits like any write."""
    sqlite_lab.guide_setup()
    db = sqlite_lab.root / "state.db"
    holder = sqlite3.connect(db, isolation_level=None, timeout=0)  # a new, empty file
    try:
        holder.execute("BEGIN IMMEDIATE")
        creator = sqlite_lab.spawn("create", "t", "plan.json")
        time.sleep(1.0)
        assert creator.poll() is None, creator.communicate()  # waiting, not refused
        holder.execute("COMMIT")
    finally:
        holder.close()
    _, err = creator.communicate(timeout=120)
    assert creator.returncode == 0, err
    assert sqlite_lab.cli("run", "t").returncode == 0
