"""A plan an older version stored with a goal that begins ``workflow:``.

The guide's own code (and every version before durable code) took any goal
text; workflow tasks now store theirs as ``workflow:`` and their canonical
JSON. A stored plan whose goal only begins with the word is still a plan:
it was taken for a workflow task, so ``status`` and ``run`` refused it for
ever (exit 4, "a workflow task's goal does not parse") and its steps never ran.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "schema" / "v0"


def test_an_older_plan_whose_goal_begins_workflow_resumes_as_a_plan(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    db = lab.root / "state.db"
    shutil.copyfile(FIXTURE / "state.db", db)
    task = "after-effect-1"  # killed by the guide's code after step 1's effect
    conn = sqlite3.connect(db, isolation_level=None)
    try:  # as the guide's code stores a plan of this goal: its tables, its text
        conn.execute("UPDATE tasks SET goal = 'workflow: nightly notes' WHERE id = ?", (task,))
    finally:
        conn.close()
    env = {"AGENT_ARTIFACTS": f"artifacts/{task}"}
    shown = lab.cli("status", task, "--json")
    assert shown.returncode == 0, shown.stderr
    assert shown.json()["goal"] == "workflow: nightly notes"
    assert "workflow" not in shown.json()
    done = lab.cli("run", task, **env)
    assert done.returncode == 0, done.stderr
    status = lab.cli("status", task, "--json").json()
    assert status["status"] == "done"
    assert [s["status"] for s in status["steps"]] == ["done"] * 3
    assert lab.cli("verify", task, "--artifacts", env["AGENT_ARTIFACTS"]).returncode == 0
    # The prefix stays kept for workflow tasks: a new plan may not begin with it.
    lab.write_plan(
        {"goal": "workflow: x", "steps": [{"tool": "fetch", "input": {"path": "notes.txt"}}]}
    )
    assert lab.cli("create", "new", "plan.json").returncode == 4
