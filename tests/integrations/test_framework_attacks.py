"""The integrations attacked in one process, through the library on a real SQLite
file: outside a workflow, a tool that raises or asks for a retry, an agent run
nested in another's tool, one agent object run by two workflows at once, a
stored reply the adapter cannot read back, a framework version outside the
tested range, arguments that are not JSON."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from agent_kills import create, ran, run, setup
from agents import Agent as OAIAgent
from agents import FunctionTool, Model, RunConfig, Runner, Usage, function_tool
from agents import ModelResponse as OAIResponse
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic_ai import Agent, DeferredToolRequests, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

import ninelives
from ninelives.integrations import openai_agents, pydantic_ai
from ninelives.integrations.openai_agents import durable
from ninelives.integrations.pydantic_ai import NinelivesDurability
from ninelives.parking import approve
from ninelives.testing import Lab

ROOT = Path(__file__).resolve().parents[2]
RAN: list[str] = []


def two_calls_then_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask for the first tool of the agent twice, then answer with the results."""
    RAN.append("model")
    returns = [
        p for m in messages for p in m.parts if p.part_kind in ("tool-return", "retry-prompt")
    ]
    if not returns:
        name = info.function_tools[0].name
        return ModelResponse(
            parts=[ToolCallPart(name, {"n": 1}, "c1"), ToolCallPart(name, {"n": 2}, "c2")]
        )
    return ModelResponse(parts=[TextPart(" | ".join(str(p.content) for p in returns))])


def make_agent(tool: Any, *, durable: bool = True) -> Agent[None, str]:
    capabilities = [NinelivesDurability()] if durable else []
    agent = Agent(FunctionModel(two_calls_then_answer), name="attack", capabilities=capabilities)
    agent.tool_plain(tool)
    return agent


def double(n: int) -> int:
    RAN.append(f"double {n}")
    step = ninelives.current_step()
    return n * 2 + (1000 if step is not None else 0)


SHARED = make_agent(double)


@ninelives.workflow("attack_shared")
def shared_flow(ctx: Any, question: str) -> str:
    return str(SHARED.run_sync(question).output)


@pytest.fixture
def rt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(tmp_path)
    RAN.clear()
    with ninelives.open(str(tmp_path / "state.db")) as runtime:
        yield runtime


def tools_of(rt: Any, task: str) -> list[str]:
    return [s.tool for s in rt.status(task).steps]


def test_outside_a_workflow_the_agents_run_plain_and_touch_no_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("NOTES_LOG", str(tmp_path.parent / "calls.log"))
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "a.txt").write_text("buy milk\n")
    assert SHARED.run_sync("q").output == "2 | 4"  # no step: no +1000
    oai = durable(scripted_oai_agent())
    # In a thread of its own: Runner.run_sync shuts down the async generators of
    # the thread's default loop, which Pydantic AI's run_sync goes on using.
    found: list[Any] = []
    config = RunConfig(tracing_disabled=True)
    thread = threading.Thread(
        target=lambda: found.append(asyncio.run(Runner.run(oai, "q", run_config=config)))
    )
    thread.start()
    thread.join()
    (done,) = found
    assert done.final_output == "done: [\"buy milk\\n\", \"{'posted': 'plain'}\"]"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["input", "notes"]
    assert [p.name for p in (tmp_path / "notes").iterdir()] == ["plain.txt"]


def test_a_tool_sees_its_step_and_each_call_is_a_step(rt: Any) -> None:
    rt.create("t", shared_flow, "q")
    rt.run("t")
    assert rt.result("t") == "1002 | 1004"
    assert tools_of(rt, "t") == ["model:attack", "tool:double", "tool:double", "model:attack"]


def test_one_agent_object_in_two_workflows_at_once(tmp_path: Path) -> None:
    db = str(tmp_path / "state.db")
    with ninelives.open(db) as rt:
        for task in ("a", "b"):
            rt.create(task, shared_flow, task)
    errors: list[BaseException] = []

    def run(task: str) -> None:
        try:
            with ninelives.open(db) as own:
                own.run(task)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:  # run_sync leaves its thread's default loop open for the thread's next run
            asyncio.get_event_loop_policy().get_event_loop().close()

    threads = [threading.Thread(target=run, args=(t,)) for t in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with ninelives.open(db) as rt:
        for task in ("a", "b"):
            assert rt.result(task) == "1002 | 1004"
            assert len(rt.status(task).steps) == 4


def flaky(n: int) -> int:
    RAN.append(f"flaky {n}")
    if n == 1:
        raise ModelRetry("n must not be 1")
    raise ValueError("the service is down")


@ninelives.workflow("attack_raises")
def raises_flow(ctx: Any, question: str) -> str:
    return str(make_agent(flaky).run_sync(question).output)


def test_a_tool_that_raises_is_a_step_error_and_model_retry_is_its_result(rt: Any) -> None:
    rt.create("t", raises_flow, "q")
    with pytest.raises(ninelives.TaskFailed, match="the service is down"):
        rt.run("t")
    steps = rt.status("t").steps
    assert [s.status.value for s in steps] == ["done", "done", "failed"]
    assert steps[1].output["value"]["retry"]["parts"][0]["content"] == "n must not be 1"
    assert RAN.count("flaky 2") == 3  # AGENT_MAX_ATTEMPTS' default
    assert RAN.count("flaky 1") == 1


async def delegate(n: int) -> str:
    inner = make_agent(double)
    return str((await inner.run(f"inner {n}")).output)


@ninelives.workflow("attack_nested")
def nested_flow(ctx: Any, question: str) -> str:
    # A sync workflow (an async tool): asyncio.run, which runs an async workflow,
    # would drop the thread's default loop that Pydantic AI's run_sync keeps open,
    # a ResourceWarning in this process; the async path runs in test_framework_kills.
    return str(make_agent(delegate).run_sync(question).output)


def test_an_agent_run_nested_in_a_tool_is_part_of_that_tools_step(rt: Any) -> None:
    rt.create("t", nested_flow, "q")
    rt.run("t")
    # The inner runs are plain (no step of their own), inside the outer tool steps.
    assert tools_of(rt, "t") == ["model:attack", "tool:delegate", "tool:delegate", "model:attack"]
    # Their tools see the outer tool's step (its key): their effects are its own.
    assert rt.result("t") == "1002 | 1004 | 1002 | 1004"


@pytest.mark.crash
@pytest.mark.parametrize("module", ["pai_notes", "oai_notes"])
def test_a_stored_reply_that_cannot_be_read_back_stops_the_run_unchanged(
    sqlite_lab: Lab, module: str
) -> None:
    setup(sqlite_lab, module)
    create(sqlite_lab, "t", "notes_sync")
    assert run(sqlite_lab, "t", AGENT_CRASH_AT="after_commit:0").returncode == -9
    bad = {"value": {"response": {"kind": "response", "parts": "not parts", "output": 7}}}
    with sqlite3.connect(sqlite_lab.root / "state.db") as db:
        db.execute("UPDATE steps SET output = ? WHERE idx = 0", (json.dumps(bad),))
    db.close()
    steps = sqlite_lab.cli("status", "t", "--outputs").json()["steps"]
    again = run(sqlite_lab, "t")
    assert again.returncode == 12
    assert "stored model response cannot be read back" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1
    assert sqlite_lab.cli("status", "t", "--outputs").json()["steps"] == steps
    assert ran(sqlite_lab, "t")["model"] == 1  # the model was not asked again


def test_arguments_and_results_that_are_not_json_fail_the_step_not_the_process(
    rt: Any,
) -> None:
    def nan(n: int) -> float:
        return float("nan")

    @ninelives.workflow("attack_nan")
    def nan_flow(ctx: Any, question: str) -> str:
        return str(make_agent(nan).run_sync(question).output)

    rt.create("t", nan_flow, "q")
    with pytest.raises(ninelives.TaskFailed, match="tool:nan"):
        rt.run("t")


def scripted_oai_agent() -> OAIAgent[Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        import oai_notes
    finally:
        sys.path.pop(0)
    agent = oai_notes.build()
    return agent.clone(tools=[t for t in agent.tools if isinstance(t, FunctionTool)])


@pytest.mark.parametrize(
    ("module", "distribution", "package"),
    [(pydantic_ai, "pydantic-ai-slim", "pydantic_ai"), (openai_agents, "openai-agents", "agents")],
)
def test_a_framework_version_outside_the_tested_range_is_refused_at_import(
    tmp_path: Path, module: Any, distribution: str, package: str
) -> None:
    dist = tmp_path / f"{distribution.replace('-', '_')}-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.0.1\n")
    probe = (
        "import sys\n"
        "try:\n"
        f"    import {module.__name__}\n"
        "except ImportError as exc:\n"
        "    print(type(exc).__name__, exc)\n"
        f"print({package!r} in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    first, second = proc.stdout.splitlines()
    assert first == (
        f"FrameworkVersionError ninelives supports {distribution}>={module.SUPPORTED[0]},"
        f"<{module.SUPPORTED[1]}, found {distribution} 0.0.1: a replay journaled by another "
        f"version may not read back the same; pip install 'ninelives[{extra_of(distribution)}]'"
    )
    assert second == "False"  # refused before the framework itself loads


def extra_of(distribution: str) -> str:
    return {"pydantic-ai-slim": "pydantic-ai", "openai-agents": "openai-agents"}[distribution]


def test_the_extras_pin_the_ranges_the_modules_check() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    for extra, distribution, module in (
        ("pydantic-ai", "pydantic-ai-slim", pydantic_ai),
        ("openai-agents", "openai-agents", openai_agents),
    ):
        pinned = f'"{distribution}>={module.SUPPORTED[0]},<{module.SUPPORTED[1]}"'
        assert re.search(rf"^{extra} = \[{re.escape(pinned)}\]$", text, re.M), extra
        assert text.count(pinned) == 2  # the extra and the test extra


@ninelives.workflow("attack_two_loops")
def two_loops_flow(ctx: Any, question: str) -> list[str]:
    # Two runs on two event loops, one after the other, each with two tool
    # calls the SDK starts at once: the second must not meet a lock of the first loop.
    config = RunConfig(tracing_disabled=True)
    agent = durable(scripted_oai_agent())
    return [
        str(asyncio.run(Runner.run(agent, question, run_config=config)).final_output)
        for _ in range(2)
    ]


def test_a_sync_workflow_runs_the_sdks_agent_on_two_event_loops(
    rt: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTES_LOG", str(tmp_path / "calls.log"))
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "a.txt").write_text("buy milk\n")
    rt.create("t", two_loops_flow, "q")
    # In a thread of its own: asyncio.run would drop the main thread's default
    # loop, which Pydantic AI's run_sync in this process goes on using.
    errors: list[BaseException] = []

    def go() -> None:
        try:
            rt.run("t")
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=go)
    thread.start()
    thread.join()
    assert errors == []
    first, second = rt.result("t")
    assert "t-2" in first  # each run's post, a step of its own
    assert "t-6" in second
    assert [s.status.value for s in rt.status("t").steps] == ["done"] * 8


def one_call_then_answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Ask for the agent's first tool once, then answer."""
    if not any(m.kind == "response" for m in messages):
        return ModelResponse(parts=[ToolCallPart(info.function_tools[0].name, {"n": 1}, "c1")])
    return ModelResponse(parts=[TextPart("answered")])


def gated_inner(output_type: Any = str) -> Agent[None, Any]:
    inner = Agent(
        FunctionModel(one_call_then_answer),
        output_type=output_type,
        capabilities=[NinelivesDurability()],
    )

    @inner.tool_plain(requires_approval=True)
    def wire(n: int) -> int:
        RAN.append("wire")
        return n

    return inner


async def ask_inner(n: int) -> str:
    RAN.append("ask_inner")
    return str((await gated_inner().run("q")).output)


@ninelives.workflow("attack_nested_approval")
def nested_approval_flow(ctx: Any, question: str) -> str:
    outer = Agent(FunctionModel(one_call_then_answer), capabilities=[NinelivesDurability()])
    outer.tool_plain(ask_inner)
    return str(outer.run_sync(question).output)


def test_a_nested_run_asking_for_approval_fails_its_step_at_once(rt: Any) -> None:
    rt.create("t", nested_approval_flow, "q")
    with pytest.raises(ninelives.TaskFailed, match="cannot wait for a person"):
        rt.run("t")
    # Failed on its first attempt: the outer tool (and its effects) ran once,
    # the gated tool never.
    assert RAN == ["ask_inner"]
    assert [(s.tool, s.attempts) for s in rt.status("t").steps] == [
        ("model:agent", 1),
        ("tool:ask_inner", 1),
    ]


async def ask_inner_deferred(n: int) -> str:
    found = await gated_inner([str, DeferredToolRequests]).run("q")
    return type(found.output).__name__


@ninelives.workflow("attack_nested_deferred")
def nested_deferred_flow(ctx: Any, question: str) -> str:
    outer = Agent(FunctionModel(one_call_then_answer), capabilities=[NinelivesDurability()])
    outer.tool_plain(ask_inner_deferred)
    return str(outer.run_sync(question).output)


def test_a_nested_run_that_takes_deferred_requests_gets_them(rt: Any) -> None:
    rt.create("t", nested_deferred_flow, "q")
    rt.run("t")
    # As without the capability: the inner run ends with its requests, for the tool's code.
    assert rt.result("t") == "answered"
    steps = rt.status("t").steps
    assert steps[1].output["value"]["return"] == "DeferredToolRequests"
    assert "wire" not in RAN


class NoArguments(Model):
    """Calls the agent's ``launch`` tool with arguments ``""`` (as some servers
    send for a tool without parameters), then answers with what it read."""

    async def get_response(self, system_instructions: Any, input: Any, *a: Any, **k: Any) -> Any:
        items = input if isinstance(input, list) else []
        outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
        usage = Usage(requests=1, input_tokens=1, output_tokens=1, total_tokens=2)
        if not outputs:
            call = ResponseFunctionToolCall(
                type="function_call", call_id="c1", name="launch", arguments="", id="f1"
            )
            return OAIResponse(output=[call], usage=usage, response_id=None)
        message = ResponseOutputMessage(
            type="message", id="m1", role="assistant", status="completed",
            content=[ResponseOutputText(type="output_text", text=str(outputs), annotations=[])],
        )  # fmt: skip
        return OAIResponse(output=[message], usage=usage, response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@function_tool(needs_approval=True)
def launch() -> str:
    """Launch, once a person agrees."""
    RAN.append("launch")
    return "launched"


@ninelives.workflow("attack_no_arguments")
def no_arguments_flow(ctx: Any, question: str) -> Any:
    agent = durable(OAIAgent(name="launcher", model=NoArguments(), tools=[launch]))
    return Runner.run_sync(
        agent, question, run_config=RunConfig(tracing_disabled=True)
    ).final_output


def test_a_gated_call_with_empty_arguments_waits_for_approval(tmp_path: Path) -> None:
    from replies import in_thread

    db = str(tmp_path / "state.db")

    def run_it() -> None:
        with ninelives.open(db) as own:
            own.run("t")

    RAN.clear()
    with ninelives.open(db) as rt:
        rt.create("t", no_arguments_flow, "q")
    # Not the SDK's own interruption (a run ending with no output): ninelives' approval.
    with pytest.raises(ninelives.TaskWaiting, match="run tool launch with"):
        in_thread(run_it)
    with ninelives.open(db) as rt:
        assert [s.tool for s in rt.status("t").steps] == ["model:launcher", "approve:launch"]
        approve(rt.store, "t", 1)
    in_thread(run_it)
    with ninelives.open(db) as rt:
        assert rt.result("t") == "['launched']"
    assert RAN == ["launch"]
