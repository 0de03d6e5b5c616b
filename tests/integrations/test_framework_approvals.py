"""Approval-required tools of a framework agent inside a workflow, through the CLI.

``post_note`` is declared ``requires_approval=True`` (Pydantic AI) or
``needs_approval=True`` (OpenAI Agents SDK). Inside a workflow the model's call
of it parks the task on a ninelives approval step instead of ending the run
with the framework's own deferred requests: ``run`` exits 8, ``status`` shows
the task waiting at ``approve:post_note``, ``ninelives approve`` lets the run
go on (the tool runs once, as its own durable step, also across a SIGKILL
between the approval and the tool's completion), and ``approve --reject``
hands the model the person's note instead of running the tool.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from agent_kills import HERE, create, ran, run, setup
from pydantic_ai import Agent, ApprovalRequired, RunContext
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel

import ninelives
from ninelives.integrations.pydantic_ai import NinelivesDurability
from ninelives.parking import approve
from ninelives.testing import Lab
from ninelives.verify import verify_store

pytestmark = [pytest.mark.crash, pytest.mark.slow]

MODULES = ["pai_notes", "oai_notes"]


def park(lab: Lab, task: str, workflow: str) -> int:
    """Create ``task`` and run it until it waits; the index of its approval step."""
    create(lab, task, workflow)
    parked = run(lab, task)
    assert parked.returncode == 8, parked.stderr
    stderr = parked.stderr.strip()
    assert "Traceback" not in stderr
    assert f"ninelives approve {task} " in stderr, stderr
    assert 'run tool post_note with {"text": "remember the milk"}' in stderr, stderr
    status = lab.cli("status", task, "--json")
    assert status.returncode == 0, status.stderr
    found = status.json()
    assert found["status"] == "waiting", found
    (waiting,) = [s for s in found["steps"] if s["status"] == "waiting"]
    assert waiting["tool"] == "approve:post_note"
    assert ran(lab, task) == {"model": 1, "tool:read_note": 1}
    return int(waiting["idx"])


@pytest.mark.parametrize("workflow", ["notes_sync", "notes_async"])
@pytest.mark.parametrize("module", MODULES)
def test_approve_then_a_kill_before_the_tool_runs_it_once(
    sqlite_lab: Lab, module: str, workflow: str
) -> None:
    lab = sqlite_lab
    setup(lab, module)
    lab.base_env["NOTES_APPROVE"] = "1"
    task = "approved"
    idx = park(lab, task, workflow)
    again = run(lab, task)
    assert again.returncode == 8, "a waiting task stays parked until a person decides"
    approved = lab.cli("approve", task, str(idx), "--note", "fine by me")
    assert approved.returncode == 0, approved.stderr
    killed = run(lab, task, AGENT_CRASH_AT=f"before_effect:{idx + 1}")
    assert killed.returncode == -9, killed.stderr
    resumed = run(lab, task)
    assert resumed.returncode == 0, resumed.stderr
    assert ran(lab, task) == {"model": 2, "tool:read_note": 1, "tool:post_note": 1, "report": 1}
    notes = sorted(p.name for p in (lab.root / "notes").glob(f"{task}-*.txt"))
    assert notes == [f"{task}-{idx + 1}.txt"]
    found = lab.cli("status", task, "--json").json()
    assert found["status"] == "done"
    assert f"{task}-{idx + 1}" in found["result"]["answer"]  # what the model read: the post
    tools = [s["tool"] for s in found["steps"]]
    assert tools[idx : idx + 2] == ["approve:post_note", "tool:post_note"]
    verified = lab.cli("verify", task)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_a_tool_of_an_agent_made_durable_twice_still_waits_for_approval(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    setup(lab, "oai_notes")
    lab.base_env["NOTES_APPROVE"] = "1"
    task = "twice"
    idx = park(lab, task, "notes_wrapped_twice")  # the tool did not run unasked
    approved = lab.cli("approve", task, str(idx))
    assert approved.returncode == 0, approved.stderr
    resumed = run(lab, task)
    assert resumed.returncode == 0, resumed.stderr
    assert ran(lab, task) == {"model": 2, "tool:read_note": 1, "tool:post_note": 1, "report": 1}
    tools = [s["tool"] for s in lab.cli("status", task, "--json").json()["steps"]]
    assert tools[idx : idx + 2] == ["approve:post_note", "tool:post_note"]


@pytest.mark.parametrize("module", MODULES)
def test_a_rejection_is_what_the_model_reads(sqlite_lab: Lab, module: str) -> None:
    lab = sqlite_lab
    setup(lab, module)
    lab.base_env["NOTES_APPROVE"] = "1"
    task = "rejected"
    idx = park(lab, task, "notes_sync")
    rejected = lab.cli("approve", task, str(idx), "--reject", "--note", "not on a Friday")
    assert rejected.returncode == 0, rejected.stderr
    assert "rejected; the workflow reads the rejection" in rejected.stdout
    resumed = run(lab, task)
    assert resumed.returncode == 0, resumed.stderr
    assert ran(lab, task) == {"model": 2, "tool:read_note": 1, "report": 1}
    assert not list((lab.root / "notes").glob(f"{task}-*.txt"))
    found = lab.cli("status", task, "--json").json()
    assert found["status"] == "done"
    assert "not on a Friday" in found["result"]["answer"]
    verified = lab.cli("verify", task)
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("module", MODULES)
def test_outside_a_workflow_the_framework_defers_as_before(
    module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No database is touched: the framework's own approval interruption comes back."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("NOTES_APPROVE", "1")
    monkeypatch.setenv("NOTES_LOG", str(tmp_path / "calls.log"))
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "a.txt").write_text("buy milk\n", encoding="utf-8")
    from replies import in_thread

    notes = importlib.import_module(module)
    agent = notes.build()
    # Each run_sync in a thread of its own: the two frameworks share a thread's
    # default event loop badly (the SDK's shuts down what Pydantic AI's reuses).
    if module == "pai_notes":
        from pydantic_ai.tools import DeferredToolRequests

        run = in_thread(lambda: agent.run_sync("q", output_type=[str, DeferredToolRequests]))
        assert isinstance(run.output, DeferredToolRequests)
        assert [c.tool_name for c in run.output.approvals] == ["post_note"]
    else:
        from agents import Runner

        result = in_thread(lambda: Runner.run_sync(agent, "q", run_config=notes.run_config()))
        assert [i.tool_name for i in result.interruptions] == ["post_note"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calls.log", "input"]


RAISED: list[str] = []


def build_asking_agent() -> Any:
    """A Pydantic AI agent whose tool asks for approval itself (``ApprovalRequired``)."""

    def script(messages: list[Any], info: Any) -> ModelResponse:
        RAISED.append("model")
        if not any(m.kind == "response" for m in messages):
            return ModelResponse(parts=[ToolCallPart("wire", {"amount": 900}, tool_call_id="w1")])
        returns = [p.content for m in messages for p in m.parts if p.part_kind == "tool-return"]
        return ModelResponse(parts=[TextPart(f"done: {returns}")])

    agent = Agent(FunctionModel(script), name="bank", capabilities=[NinelivesDurability()])

    @agent.tool
    def wire(ctx: RunContext[None], amount: int) -> str:
        """Wire money; large amounts need a person's approval."""
        if amount > 500 and not ctx.tool_call_approved:
            RAISED.append("asked")
            raise ApprovalRequired(metadata={"amount": amount})
        RAISED.append("wired")
        return f"wired {amount}"

    return agent


@ninelives.workflow("asking_bank")
async def asking_bank(ctx: Any, question: str) -> str:
    return str((await build_asking_agent().run(question)).output)


def test_a_tool_that_raises_approval_required_parks_and_runs_once_approved(
    tmp_path: Path,
) -> None:
    from replies import in_thread

    db = str(tmp_path / "state.db")

    def run_it() -> None:
        with ninelives.open(db) as rt:
            rt.run("t")

    RAISED.clear()
    with ninelives.open(db) as rt:
        rt.create("t", asking_bank, "q")
    with pytest.raises(ninelives.TaskWaiting, match="run tool wire with"):
        in_thread(run_it)
    with ninelives.open(db) as rt:
        steps = rt.status("t").steps
        assert [s.tool for s in steps] == ["model:bank", "tool:wire", "approve:wire"]
        approve(rt.store, "t", 2, note="ok")
    in_thread(run_it)
    with ninelives.open(db) as rt:
        assert rt.result("t") == "done: ['wired 900']"
        tools = [s.tool for s in rt.status("t").steps]
        assert tools == ["model:bank", "tool:wire", "approve:wire", "tool:wire", "model:bank"]
        assert verify_store(rt.store).ok
    # The deferral is the first tool step's committed result: not raised again by the tool.
    assert RAISED == ["model", "asked", "wired", "model"]
