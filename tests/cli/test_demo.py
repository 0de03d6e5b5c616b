"""The guide's demo through the command: the exact shapes of ``status`` and ``export``."""

from __future__ import annotations

import subprocess
import sys

from ninelives.testing import Lab
from ninelives.testing.lab import GUIDE_PLAN

STATUS_KEYS = ["task", "goal", "status", "steps"]
STEP_KEYS = ["idx", "tool", "status", "attempts"]
EXPORT_KEYS = ["seq", "ts", "run", "kind", "step"]
#: The data keys of each contract kind (more may be added, never fewer).
DATA_KEYS = {
    "task_created": {"steps"},
    "run_started": {"recovered"},
    "step_started": {"tool", "attempt"},
    "step_finished": {"tool"},
    "step_recovered": set(),
    "step_error": {"error"},
    "task_done": set(),
    "task_failed": {"reason"},
}


def test_demo_status_and_export_have_the_contract_shapes(lab: Lab) -> None:
    lab.guide_setup()
    created = lab.cli("create", "demo", "plan.json")
    assert created.returncode == 0
    assert created.stderr == ""
    pending = lab.cli("status", "demo", "--json").json()
    assert list(pending) == STATUS_KEYS
    assert pending == {
        "task": "demo",
        "goal": GUIDE_PLAN["goal"],
        "status": "pending",
        "steps": [
            {"idx": i, "tool": s["tool"], "status": "pending", "attempts": 0}
            for i, s in enumerate(GUIDE_PLAN["steps"])
        ],
    }
    killed = lab.cli("run", "demo", AGENT_CRASH_AT="after_effect:1")
    assert killed.returncode == -9
    assert lab.cli("run", "demo").returncode == 0

    for args in (("status", "demo"), ("status", "demo", "--json")):  # not a terminal: JSON
        status = lab.cli(*args).json()
        assert list(status) == STATUS_KEYS
        assert all(list(step) == STEP_KEYS for step in status["steps"])
        assert status["status"] == "done"
        assert [s["attempts"] for s in status["steps"]] == [1, 2, 1]

    lines = lab.cli("export", "demo").stdout.splitlines()
    rows = lab.cli("export", "demo").jsonl()
    assert len(lines) == len(rows) == 12
    for row in rows:
        assert list(row)[:5] == EXPORT_KEYS
        assert set(row) - set(EXPORT_KEYS) >= DATA_KEYS[row["kind"]], row
        assert isinstance(row["ts"], float)
        assert isinstance(row["run"], str)
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == len(seqs)
    assert [(r["kind"], r["step"]) for r in rows] == [
        ("task_created", None),
        ("run_started", None),
        ("step_started", 0),
        ("step_finished", 0),
        ("step_started", 1),
        ("step_recovered", 1),  # the recovery and the new run_started commit together
        ("run_started", None),
        ("step_started", 1),
        ("step_finished", 1),
        ("step_started", 2),
        ("step_finished", 2),
        ("task_done", None),
    ]
    assert rows[6]["recovered"] == [1]
    first, second = rows[1]["run"], rows[6]["run"]
    assert first != second
    assert [r["run"] for r in rows[1:]] == [first] * 4 + [second] * 7
    assert rows[0]["steps"] == 3
    assert rows[7]["attempt"] == 2


def test_python_dash_m_and_the_default_database(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    env = lab.env()
    # No --db: the default is state.db in the working directory.
    module = [sys.executable, "-m", "ninelives"]
    for args in (["create", "demo", "plan.json"], ["run", "demo"]):
        proc = subprocess.run(
            [*module, *args], cwd=lab.root, env=env, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stderr
    assert (lab.root / "state.db").is_file()
    assert lab.cli("status", "demo").json()["status"] == "done"


def test_help_and_version_exit_0(lab: Lab) -> None:
    for args in (("--help",), ("run", "--help"), ("create", "--help")):
        result = lab.cli(*args)
        assert result.returncode == 0
        assert "usage: ninelives" in result.stdout
    assert "exit codes:" in lab.cli("--help").stdout
    version = lab.cli("--version")
    assert version.returncode == 0
    assert version.stdout.startswith("ninelives ")
    assert lab.files() == {}
