"""ctx.approval, ctx.sleep, ctx.now/uuid/random through the command line and
real processes: an approval parks the task (exit 8) until approve, a rejection
fails it; a kill during a sleep does not shorten it; the values taken once are
replayed; a worker does not hold a slot through a sleep."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

FLOWS = (Path(__file__).parent / "wflows.py").read_text(encoding="utf-8")


@pytest.fixture
def flow_lab(lab: Lab) -> Lab:
    lab.write("wflows.py", FLOWS)
    lab.base_env["NINELIVES_TOOLS"] = "wflows"
    return lab


def _kinds(lab: Lab, task: str) -> list[str]:
    return [e["kind"] for e in lab.cli("export", task).jsonl()]


def test_an_approval_parks_the_task_until_approved(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "g", "--workflow", "gated", "--args", '["T"]').returncode == 0
    waiting = lab.cli("run", "g")
    assert waiting.returncode == 8
    assert "post a note for T?" in waiting.stderr
    assert "ninelives approve g 1" in waiting.stderr
    status = lab.cli("status", "g", "--json").json()
    assert status["status"] == "waiting"
    assert [s["tool"] for s in status["steps"]] == ["read", "review"]
    assert lab.cli("run", "g").returncode == 8  # still waiting: nothing written
    assert lab.cli("approve", "g", "1", "--note", "fine").returncode == 0
    assert lab.cli("approve", "g", "1").returncode == 4  # approved twice: refused
    done = lab.cli("run", "g")
    assert done.returncode == 0, done.stderr
    result = lab.cli("status", "g", "--json").json()["result"]
    assert result == {
        "decision": {"approved": True, "note": "fine"},
        "note": "approved: ticket T\nsecond line",
    }
    assert lab.cli("verify", "g").returncode == 0


def test_a_rejected_approval_fails_the_task(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "g", "--workflow", "gated", "--args", '["T"]').returncode == 0
    assert lab.cli("run", "g").returncode == 8
    assert lab.cli("approve", "g", "1", "--reject", "--note", "no").returncode == 0
    failed = lab.cli("run", "g")
    assert failed.returncode == 2
    assert lab.cli("status", "g", "--json").json()["status"] == "failed"
    assert not (lab.root / "outcome").exists()


def test_an_approval_that_answers_a_rejection_lets_the_code_read_it(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "a", "--workflow", "asking", "--args", '["T"]').returncode == 0
    assert lab.cli("run", "a").returncode == 8
    said = lab.cli("approve", "a", "0", "--reject", "--note", "not now")
    assert said.returncode == 0, said.stderr
    assert "the workflow reads the rejection" in said.stdout
    assert lab.cli("approve", "a", "0").returncode == 4  # decided already: refused
    done = lab.cli("run", "a")
    assert done.returncode == 0, done.stderr
    result = lab.cli("status", "a", "--json").json()["result"]
    assert result == {"decision": {"approved": False, "note": "not now"}, "note": None}
    assert "step_rejected" in _kinds(lab, "a")
    verified = lab.cli("verify", "a")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_plan_approval_rejected_fails_even_if_its_input_asks_for_an_answer(
    flow_lab: Lab,
) -> None:
    """Only a workflow's code can read a rejection: a plan has none after its step."""
    lab = flow_lab
    lab.write_plan({"goal": "g", "steps": [
        {"tool": "approval", "input": {"prompt": "ship?", "on_reject": "answer"}},
    ]})  # fmt: skip
    assert lab.cli("create", "p", "plan.json").returncode == 0
    assert lab.cli("run", "p").returncode == 8
    assert lab.cli("approve", "p", "0", "--reject").returncode == 0
    assert lab.cli("status", "p", "--json").json()["status"] == "failed"
    assert lab.cli("verify", "p").returncode == 0


def test_a_kill_during_a_sleep_does_not_shorten_it_and_values_are_replayed(
    flow_lab: Lab,
) -> None:
    lab = flow_lab
    assert lab.cli("create", "n", "--workflow", "napping", "--args", "[2]").returncode == 0
    proc = lab.spawn("run", "n")
    lab.wait_for("n", "step_appended", 1)
    assert lab.kill(proc) == -9  # killed while it sleeps
    status = lab.cli("status", "n", "--json").json()
    assert [s["tool"] for s in status["steps"]] == ["ctx.now", "ctx.sleep"]
    assert status["steps"][1]["status"] == "pending"
    assert "not_before" in status["steps"][1]
    done = lab.cli("run", "n")
    assert done.returncode == 0, done.stderr
    result = lab.cli("status", "n", "--json").json()["result"]
    assert result["slept"] >= 2  # from the first run's clock: the kill did not shorten it
    assert lab.cli("run", "n").returncode == 0  # done: the same values again
    assert lab.cli("status", "n", "--json").json()["result"] == result
    assert lab.cli("verify", "n").returncode == 0


def test_a_worker_releases_a_sleeping_task_and_takes_it_back_when_due(
    flow_lab: Lab,
) -> None:
    lab = flow_lab
    made = lab.cli("create", "n", "--workflow", "napping", "--args", "[1.5]", "--enqueue")
    assert made.returncode == 0
    began = time.time()
    drained = lab.cli("worker", "--drain", "--poll", "0.05")
    assert drained.returncode == 0, drained.stderr
    assert "action=released" in drained.stderr  # the slot did not sleep with it
    assert time.time() - began >= 1.5
    assert lab.cli("status", "n", "--json").json()["status"] == "done"


def test_an_async_workflow_sleeps_and_waits_for_approval(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "a", "--workflow", "anapping", "--args", "[0.2]").returncode == 0
    assert lab.cli("run", "a").returncode == 8
    assert lab.cli("approve", "a", "2").returncode == 0
    done = lab.cli("run", "a")
    assert done.returncode == 0, done.stderr
    result = lab.cli("status", "a", "--json").json()["result"]
    assert result["decision"] == {"approved": True}
    assert result["slept"] >= 0.2


PROMPTS = """
import ninelives


@ninelives.workflow
def asks(ctx):
    ctx.step("first", str, "first")
    return ctx.approval("review", prompt="pay \\udcff?")
"""


def test_an_approval_prompt_that_cannot_be_stored_is_refused_naming_it(lab: Lab) -> None:
    """A prompt holding a lone surrogate (as undecodable bytes arrive) cannot be
    stored as text: it was the driver's UnicodeEncodeError at the approval's
    commit, reported as the workflow's own error "raised outside a step"."""
    lab.write("prompts.py", PROMPTS)
    lab.base_env["NINELIVES_TOOLS"] = "prompts"
    assert lab.cli("create", "t", "--workflow", "asks").returncode == 0
    refused = lab.cli("run", "t")
    assert refused.returncode == 12, refused.stderr
    lines = refused.stderr.splitlines()
    errors = [line for line in lines if line.startswith("ninelives: error:")]
    assert len(errors) == 1, refused.stderr
    assert "ctx.approval's prompt cannot be stored" in errors[0]
    assert "UnicodeEncodeError" not in errors[0]
    status = lab.cli("status", "t", "--json").json()
    assert [(s["tool"], s["status"]) for s in status["steps"]] == [("first", "done")]
    assert status["status"] == "running"


def test_an_approval_without_a_prompt_is_named_without_an_empty_one(sqlite_lab: Lab) -> None:
    # ctx.approval("review") stores the prompt "": the line read "waiting for
    # approval at step 2: ; decide with ...", an empty prompt quoted.
    lab = sqlite_lab
    lab.write("wflows.py", FLOWS)
    lab.base_env["NINELIVES_TOOLS"] = "wflows"
    assert lab.cli("create", "n", "--workflow", "anapping", "--args", "[0]").returncode == 0
    waiting = lab.cli("run", "n", "-q")
    assert waiting.returncode == 8, waiting
    line = waiting.stderr.strip()
    assert line.startswith("ninelives: error: task 'n' is waiting for approval at step "), line
    assert ": ;" not in line, line
    assert "; decide with 'ninelives approve n " in line, line
