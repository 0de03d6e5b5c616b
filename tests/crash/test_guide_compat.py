"""Databases written by the guide's own restart-lab code open, migrate and finish.

The database is built here with plain ``sqlite3`` exactly as that code leaves
it: only the contract's tables and columns, ``user_version`` 0, WAL.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from ninelives.store import sql
from ninelives.testing import Lab, Snapshot, five_property_violations
from ninelives.testing.lab import GUIDE_PLAN, GUIDE_SCHEMA, SUMMARY_NOTES

pytestmark = pytest.mark.crash

SUMMARY = "Line one\nLine two\nLine three"
GUIDE_COLUMNS = {
    "tasks": ["id", "goal", "status", "created_at", "updated_at"],
    "steps": ["task_id", "idx", "tool", "input", "status", "output", "attempts"],
    "events": ["seq", "ts", "task_id", "run_id", "kind", "step_idx", "data"],
}


class GuideDb:
    """Writes rows the way the guide's code does, one transaction per change."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.executescript(GUIDE_SCHEMA)
        self.now = time.time() - 60
        self.events: list[dict[str, Any]] = []

    def event(self, task: str, run: str, kind: str, step: int | None, **data: Any) -> None:
        self.now += 0.01
        cur = self.conn.execute(
            "INSERT INTO events (ts, task_id, run_id, kind, step_idx, data) VALUES (?,?,?,?,?,?)",
            (self.now, task, run, kind, step, json.dumps(data)),
        )
        row = {"seq": cur.lastrowid, "ts": self.now, "run": run, "kind": kind, "step": step}
        self.events.append({**row, **data})

    def create(self, task: str, plan: dict[str, Any]) -> None:
        self.conn.execute("BEGIN")
        self.conn.execute(
            "INSERT INTO tasks VALUES (?, ?, 'pending', ?, ?)",
            (task, plan["goal"], self.now, self.now),
        )
        for idx, step in enumerate(plan["steps"]):
            self.conn.execute(
                "INSERT INTO steps (task_id, idx, tool, input) VALUES (?, ?, ?, ?)",
                (task, idx, step["tool"], json.dumps(step["input"])),
            )
        self.event(task, "guide-create", "task_created", None, steps=len(plan["steps"]))
        self.conn.execute("COMMIT")

    def start_run(self, task: str, run: str) -> None:
        self.conn.execute("BEGIN")
        self.conn.execute("UPDATE tasks SET status = 'running' WHERE id = ?", (task,))
        self.event(task, run, "run_started", None, recovered=[])
        self.conn.execute("COMMIT")

    def start_step(self, task: str, run: str, idx: int, tool: str) -> None:
        self.conn.execute("BEGIN")
        self.conn.execute(
            "UPDATE steps SET status = 'running', attempts = attempts + 1 "
            "WHERE task_id = ? AND idx = ?",
            (task, idx),
        )
        self.event(task, run, "step_started", idx, tool=tool, attempt=1)
        self.conn.execute("COMMIT")

    def finish_step(self, task: str, run: str, idx: int, tool: str, output: Any) -> None:
        self.conn.execute("BEGIN")
        self.conn.execute(
            "UPDATE steps SET status = 'done', output = ? WHERE task_id = ? AND idx = ?",
            (json.dumps(output), task, idx),
        )
        self.event(task, run, "step_finished", idx, tool=tool)
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


def read(db: Path, query: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


def check_schema_kept_and_migrated(db: Path) -> None:
    latest = sql.migrations("sqlite")[-1][0]
    assert read(db, "PRAGMA user_version") == [(latest,)]
    assert read(db, "PRAGMA journal_mode") == [("wal",)]
    for table, columns in GUIDE_COLUMNS.items():
        have = [row[1] for row in read(db, f"PRAGMA table_info({table})")]
        assert have[: len(columns)] == columns, table
    assert read(db, "PRAGMA integrity_check") == [("ok",)]


def test_guide_database_killed_after_publishing_is_finished(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    db = lab.root / "state.db"
    guide = GuideDb(db)
    assert read(db, "PRAGMA user_version") == [(0,)]
    task, run = "report", "guide-run-1"
    fetched = {
        "chars": len(SUMMARY_NOTES),
        "sha256": hashlib.sha256(SUMMARY_NOTES.encode()).hexdigest(),
        "text": SUMMARY_NOTES,
    }
    summarized = {"summary": SUMMARY, "engine": "stub"}
    guide.create(task, GUIDE_PLAN)
    guide.start_run(task, run)
    guide.start_step(task, run, 0, "fetch")
    guide.finish_step(task, run, 0, "fetch", fetched)
    guide.start_step(task, run, 1, "summarize")
    guide.finish_step(task, run, 1, "summarize", summarized)
    guide.start_step(task, run, 2, "write_artifact")
    # The guide's write_artifact published, then the process was killed
    # before its `done` commit.
    lab.write(f"artifacts/{task}-2.md", SUMMARY)
    before = Snapshot(
        status={
            "task": task,
            "goal": GUIDE_PLAN["goal"],
            "status": "running",
            "steps": [
                {"idx": 0, "tool": "fetch", "status": "done", "attempts": 1, "output": fetched},
                {"idx": 1, "tool": "summarize", "status": "done", "attempts": 1,
                 "output": summarized},
                {"idx": 2, "tool": "write_artifact", "status": "running", "attempts": 1,
                 "output": None},
            ],
        },
        events=list(guide.events),
    )  # fmt: skip
    guide.close()

    result = lab.cli("run", task)
    assert result.returncode == 0, result.stderr

    check_schema_kept_and_migrated(db)
    after = lab.snapshot(task)
    assert after.outputs[2]["deduplicated"] is True
    assert {k: after.outputs[k] for k in (0, 1)} == {0: fetched, 1: summarized}
    assert lab.artifacts() == {f"{task}-2.md": SUMMARY}
    assert (
        five_property_violations(
            plan=GUIDE_PLAN,
            before=before,
            after=after,
            runs=2,
            artifacts=lab.artifacts(),
            expected_artifacts={f"{task}-2.md": SUMMARY},
        )
        == []
    )
    # The guide's own queries still read the result.
    assert read(db, f"SELECT status FROM tasks WHERE id = '{task}'") == [("done",)]
    assert read(db, "SELECT idx, status, attempts FROM steps ORDER BY idx") == [
        (0, "done", 1),
        (1, "done", 1),
        (2, "done", 2),
    ]
    counts = dict(read(db, "SELECT kind, COUNT(*) FROM events GROUP BY kind"))
    assert counts["step_started"] == (
        counts["step_finished"] + counts["step_recovered"] + counts.get("step_error", 0)
    )


def test_guide_database_with_a_pending_task_runs_to_done(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    db = lab.root / "state.db"
    guide = GuideDb(db)
    guide.create("fresh", GUIDE_PLAN)
    guide.close()
    assert read(db, "PRAGMA user_version") == [(0,)]

    result = lab.cli("run", "fresh")
    assert result.returncode == 0, result.stderr
    check_schema_kept_and_migrated(db)
    after = lab.snapshot("fresh")
    assert after.outputs[2]["deduplicated"] is False
    assert (
        five_property_violations(
            plan=GUIDE_PLAN,
            after=after,
            runs=1,
            artifacts=lab.artifacts(),
            expected_artifacts={"fresh-2.md": SUMMARY},
        )
        == []
    )
    # And the migrated database takes new tasks next to the guide's.
    assert lab.cli("create", "next", "plan.json").returncode == 0
    assert lab.cli("run", "next").returncode == 0
    assert sorted(lab.artifacts()) == ["fresh-2.md", "next-2.md"]
