"""examples/code-agent: its README's commands as written (the stub engine, a kill right
after the publish), the workflow against a loopback model server killed after a model
turn and after the publish, and its own kill tests run as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ninelives.testing import Lab
from ninelives.testing.fakellm import Turn, fake_model_server
from readme_blocks import blocks, run_shell

pytestmark = pytest.mark.crash

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "code-agent"
GOAL = "Summarize the notes for the team"
REPORT = "# Notes\n- 1.4 ships Friday"
SCRIPT = (
    Turn(calls=[("write_artifact", {"name": "report.md", "text": REPORT})]),
    Turn(text="Published report.md."),
)
WRITE_STEP = 2  # 0 read_notes, 1 model, 2 write_artifact, 3 model


@pytest.fixture
def example(sqlite_lab: Lab) -> Lab:
    shutil.copytree(EXAMPLE, sqlite_lab.root, dirs_exist_ok=True)
    sqlite_lab.base_env["NINELIVES_TOOLS"] = "code_agent"
    return sqlite_lab


def _create(lab: Lab) -> None:
    made = lab.cli("create", "report", "--workflow", "report_agent", "--args", json.dumps([GOAL]))
    assert made.returncode == 0, made


def test_the_readme_commands_work_as_written(tmp_path: Path) -> None:
    folder = tmp_path / "code-agent"
    shutil.copytree(EXAMPLE, folder)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AGENT_", "NINELIVES_")) and k != "PYTHONPATH"
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    consoles = [b for b in blocks(folder / "README.md") if b.lang == "console"]
    assert len(consoles) == 1
    _, problems = run_shell(consoles, folder, env)
    assert problems == [], "\n".join(problems)
    assert sorted(os.listdir(folder / "artifacts")) == ["report-2.md"]
    # The README shows the test module's one call as it is written there.
    shown = next(b for b in blocks(folder / "README.md") if b.lang == "python")
    assert shown.text.strip() in (folder / "test_kills.py").read_text(encoding="utf-8")


def test_killed_after_a_turn_and_after_the_publish_each_lands_once(example: Lab) -> None:
    _create(example)
    with fake_model_server(*SCRIPT, by_turn=True) as fake:
        env = {"NINELIVES_LLM": "ollama", "NINELIVES_LLM_URL": fake.url, "NINELIVES_LLM_MODEL": "m"}
        # The first turn answered, not committed: the one model call a kill can cost.
        killed = example.cli("run", "report", AGENT_CRASH_AT="after_effect:1", **env)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        killed = example.cli("run", "report", AGENT_CRASH_AT=f"after_effect:{WRITE_STEP}", **env)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert example.artifacts() == {"report-2.md": REPORT}  # published, not committed
        resumed = example.cli("run", "report", **env)
        assert resumed.returncode == 0, resumed.stderr
        assert fake.turns() == [0, 0, 1]  # turn 0 asked again once; no committed turn again
    assert example.artifacts() == {"report-2.md": REPORT}
    status = example.cli("status", "report", "--json").json()
    assert status["result"] == {"answer": "Published report.md.", "turns": 2}
    assert [s["attempts"] for s in status["steps"]] == [1, 2, 2, 1]
    assert example.cli("verify", "report", "--artifacts", "artifacts").returncode == 0


def test_a_wrong_tool_call_is_the_models_next_input(example: Lab) -> None:
    """A call to a tool that does not exist, or with arguments of the wrong type, is
    answered to the model and the loop goes on: the task does not fail."""
    _create(example)
    script = (
        Turn(calls=[("delete_everything", {}), ("write_artifact", {"name": 3})]),
        Turn(text="Sorry."),
    )
    with fake_model_server(*script, by_turn=True) as fake:
        env = {"NINELIVES_LLM": "ollama", "NINELIVES_LLM_URL": fake.url, "NINELIVES_LLM_MODEL": "m"}
        ran = example.cli("run", "report", **env)
        assert ran.returncode == 0, ran.stderr
        second = fake.requests[1].body["messages"]
    answers = [json.loads(m["content"]) for m in second if m["role"] == "tool"]
    assert answers == [
        {"error": "no tool 'delete_everything'"},
        {"error": "write_artifact takes a string name and a string text"},
    ]
    assert example.artifacts() == {}


def test_its_own_kill_tests_pass(tmp_path: Path) -> None:
    """``pytest test_kills.py`` in the example, as a user runs it (a few cases: the whole
    matrix is the kit's own test, tests/kit/test_kit_workflow.py)."""
    folder = tmp_path / "code-agent"
    shutil.copytree(EXAMPLE, folder)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_", "PYTEST_"))}
    selected = "baseline or after_effect-step1 or artifact_before_link-step2 or negative_control"
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_kills.py",
         "--collect-only"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert "21 tests collected" in listed.stdout, listed.stdout + listed.stderr
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_kills.py",
         "-k", selected],
        cwd=folder, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "4 passed" in ran.stdout, ran.stdout
