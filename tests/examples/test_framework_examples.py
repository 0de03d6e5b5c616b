"""examples/pydantic-ai-agent and examples/openai-agents-agent, run as their READMEs
run them: with the scripted model (no model server), SIGKILLed right after the
post and resumed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ARGS = '["Summarize my notes"]'


@pytest.mark.parametrize("example", ["pydantic-ai-agent", "openai-agents-agent"])
def test_the_example_survives_a_kill_right_after_the_post(sqlite_lab: Lab, example: str) -> None:
    shutil.copytree(EXAMPLES / example, sqlite_lab.root, dirs_exist_ok=True)
    sqlite_lab.base_env["NINELIVES_TOOLS"] = "notes_agent"
    assert (
        sqlite_lab.cli("create", "notes-1", "--workflow", "notes", "--args", ARGS).returncode == 0
    )
    killed = sqlite_lab.cli("run", "notes-1", AGENT_CRASH_AT="after_effect:3")
    assert killed.returncode == -9, killed.stderr
    posted = sorted(p.name for p in (sqlite_lab.root / "posted").iterdir())
    assert posted == ["notes-1-3.md"]  # the post happened; its done commit did not
    resumed = sqlite_lab.cli("run", "notes-1")
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(p.name for p in (sqlite_lab.root / "posted").iterdir()) == posted
    assert (sqlite_lab.root / "posted" / "notes-1-3.md").read_text() == "Buy milk."
    status = json.loads(sqlite_lab.cli("status", "notes-1", "--json").stdout)
    assert status["status"] == "done"
    assert "Posted the summary" in status["result"]
    assert status["model_calls"] == 3
    assert status["model_calls_saved"] == 2  # the two model calls before the kill
    assert [s["tool"] for s in status["steps"]] == [
        "model:notes", "tool:read_notes", "model:notes", "tool:post_summary", "model:notes"
    ]  # fmt: skip
    assert sqlite_lab.cli("verify", "notes-1").returncode == 0


@pytest.mark.slow
@pytest.mark.parametrize("example", ["pydantic-ai-agent", "openai-agents-agent"])
def test_the_example_waits_for_a_person_to_approve_the_post(sqlite_lab: Lab, example: str) -> None:
    """The README's approval section: approved, the post is made; rejected, the
    model reads the note and the task is done without posting."""
    lab = sqlite_lab
    shutil.copytree(EXAMPLES / example, lab.root, dirs_exist_ok=True)
    lab.base_env.update(NINELIVES_TOOLS="notes_agent", NOTES_APPROVE="1")
    for task in ("notes-3", "notes-4"):
        assert lab.cli("create", task, "--workflow", "notes", "--args", ARGS).returncode == 0
        waiting = lab.cli("run", task)
        assert waiting.returncode == 8, waiting.stderr
        assert f"ninelives approve {task} 3" in waiting.stderr
        steps = json.loads(lab.cli("status", task, "--json").stdout)["steps"]
        assert (steps[3]["tool"], steps[3]["status"]) == ("approve:post_summary", "waiting")
    assert lab.cli("approve", "notes-3", "3", "--note", "looks right").returncode == 0
    assert lab.cli("approve", "notes-4", "3", "--reject", "--note", "not today").returncode == 0
    for task in ("notes-3", "notes-4"):
        done = lab.cli("run", task)
        assert done.returncode == 0, done.stderr
        assert lab.cli("verify", task).returncode == 0
    posted = sorted(p.name for p in (lab.root / "posted").iterdir())
    assert posted == ["notes-3-4.md"]
    rejected = json.loads(lab.cli("status", "notes-4", "--json").stdout)
    assert rejected["status"] == "done"
    assert rejected["result"] == "Not posted: not today"
