"""``async def`` tools, through the installed command and real processes: a
plan step, a timeout, a workflow's ``ctx.call_tool`` (with and without a
running event loop) and a SIGKILL under the effect all behave as with a plain
tool, and no coroutine is left unawaited."""

from __future__ import annotations

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

TOOLS = """
import asyncio
import os

import ninelives
from ninelives import tool


def effect(line):
    with open("effects.log", "a") as f:
        f.write(line + "\\n")
        f.flush()
        os.fsync(f.fileno())


@tool("aecho", schema={"type": "object", "properties": {"x": {"type": "integer"}}})
async def aecho(step_input, ctx):
    await asyncio.sleep(0.01)
    effect(f"aecho {ctx.idem_key} {ctx.attempt}")
    return {"ok": step_input.get("x"), "key": ctx.idem_key}


@tool("aslow")
async def aslow(step_input, ctx, idem_key):
    await asyncio.sleep(step_input["seconds"])
    effect("aslow finished")
    return {"slept": step_input["seconds"]}


@tool("slow")
def slow(step_input, ctx, idem_key):
    import time

    time.sleep(step_input["seconds"])
    effect("slow finished")
    return {"slept": step_input["seconds"]}


@ninelives.workflow
def calls_sync(ctx):
    return ctx.call_tool({"name": "aecho", "arguments": {"x": 7}})


@ninelives.workflow
async def calls_async(ctx):
    first = await ctx.call_tool({"name": "aecho", "arguments": {"x": 8}})
    second = await ctx.step("direct", lambda: 9)
    return {"first": first, "second": second}


LOOPS = []


@tool("aloop", schema={"type": "object"})
async def aloop(step_input, ctx):
    return {"on_the_workflows_loop": asyncio.get_running_loop() in LOOPS}


@ninelives.workflow
async def on_its_loop(ctx):
    LOOPS.append(asyncio.get_running_loop())
    return await ctx.call_tool({"name": "aloop", "arguments": {}})


def registered(name):
    from ninelives.tools import Registry, load_tool_modules

    return load_tool_modules(Registry(entry_points=False), ["atools"]).lookup(name)


def doubled(x):
    # A plain step calling the tool itself, in the async workflow's loop thread.
    return registered("aecho")({"x": x}, {}, ninelives.current_step().idem_key)["ok"] * 2


@ninelives.step(timeout=0.5, max_attempts=2)
def slow_inside():
    return registered("aslow")({"seconds": 5}, {}, "t-0")["slept"]


@ninelives.workflow
async def steps_async(ctx):
    return await ctx.step("doubled", doubled, 21)


@ninelives.workflow
async def slow_async(ctx):
    return await ctx.step("slow_inside", slow_inside)
"""


@pytest.fixture
def tool_lab(lab: Lab) -> Lab:
    lab.write("atools.py", TOOLS)
    lab.base_env["NINELIVES_TOOLS"] = "atools"
    lab.base_env["NINELIVES_BACKOFF"] = "0"
    lab.base_env["PYTHONDONTWRITEBYTECODE"] = "1"
    return lab


def _effects(lab: Lab) -> list[str]:
    log = lab.root / "effects.log"
    return log.read_text().splitlines() if log.exists() else []


def _clean(stderr: str) -> None:
    assert "RuntimeWarning" not in stderr, stderr
    assert "never awaited" not in stderr, stderr
    assert "Traceback" not in stderr, stderr


def test_a_plan_step_of_an_async_tool_runs_to_done(tool_lab: Lab) -> None:
    tool_lab.write_plan({"goal": "g", "steps": [{"tool": "aecho", "input": {"x": 1}}]})
    assert tool_lab.cli("create", "t", "plan.json").returncode == 0
    ran = tool_lab.cli("run", "t")
    assert ran.returncode == 0, ran.stderr
    _clean(ran.stderr)
    assert tool_lab.snapshot("t").outputs[0] == {"ok": 1, "key": "t-0"}
    assert _effects(tool_lab) == ["aecho t-0 1"]


def test_an_async_tool_over_its_timeout_is_stopped_as_a_plain_one_is(tool_lab: Lab) -> None:
    for task, name in (("sync", "slow"), ("async", "aslow")):
        step = {"tool": name, "input": {"seconds": 5}, "timeout": 0.5, "max_attempts": 2}
        tool_lab.write_plan({"goal": "g", "steps": [step]}, f"{task}.json")
        assert tool_lab.cli("create", task, f"{task}.json").returncode == 0
    plain = tool_lab.cli("run", "sync")
    ran = tool_lab.cli("run", "async", timeout=20)
    assert (ran.returncode, plain.returncode) == (2, 2), ran.stderr
    _clean(ran.stderr)
    assert "failed 2 times; last error: timeout after 0.5s" in ran.stderr
    errors = [e for e in tool_lab.snapshot("async").journal() if e.kind == "step_error"]
    assert [e.data.get("timeout") for e in errors] == [0.5, 0.5]
    # Each attempt was cancelled at its timeout: nothing of it landed later.
    assert _effects(tool_lab) == []


@pytest.mark.parametrize("flow", ["calls_sync", "calls_async"])
def test_an_async_tool_through_a_workflows_call_tool(tool_lab: Lab, flow: str) -> None:
    assert tool_lab.cli("create", "t", "--workflow", flow).returncode == 0
    ran = tool_lab.cli("run", "t")
    assert ran.returncode == 0, ran.stderr
    _clean(ran.stderr)
    value = tool_lab.cli("status", "t", "--json").json()
    assert value["status"] == "done"
    expected = {"ok": 7, "key": "t-0"} if flow == "calls_sync" else {"ok": 8, "key": "t-0"}
    assert tool_lab.snapshot("t").outputs[0] == {"value": expected}
    assert _effects(tool_lab) == ["aecho t-0 1"]


def test_an_async_workflows_call_tool_runs_an_async_tool_on_the_workflows_loop(
    tool_lab: Lab,
) -> None:
    """Clients an async workflow made are bound to its loop: the tool it calls
    is awaited there, not run in a loop of its own on another thread."""
    assert tool_lab.cli("create", "t", "--workflow", "on_its_loop").returncode == 0
    ran = tool_lab.cli("run", "t")
    assert ran.returncode == 0, ran.stderr
    _clean(ran.stderr)
    assert tool_lab.snapshot("t").outputs[0] == {"value": {"on_the_workflows_loop": True}}


def test_an_async_tool_called_inside_an_async_workflows_step(tool_lab: Lab) -> None:
    assert tool_lab.cli("create", "t", "--workflow", "steps_async").returncode == 0
    ran = tool_lab.cli("run", "t")
    assert ran.returncode == 0, ran.stderr
    _clean(ran.stderr)
    assert tool_lab.snapshot("t").outputs[0] == {"value": 42}
    assert _effects(tool_lab) == ["aecho t-0 0"]


def test_an_async_tool_inside_an_async_workflows_step_keeps_the_timeout(tool_lab: Lab) -> None:
    assert tool_lab.cli("create", "t", "--workflow", "slow_async").returncode == 0
    ran = tool_lab.cli("run", "t", timeout=20)
    assert ran.returncode == 2, ran.stderr
    _clean(ran.stderr)
    errors = [e for e in tool_lab.snapshot("t").journal() if e.kind == "step_error"]
    assert [e.data.get("timeout") for e in errors] == [0.5, 0.5]
    # The coroutine on its own thread was cancelled, not left to land later.
    assert _effects(tool_lab) == []


def test_a_kill_after_an_async_tools_effect_is_recovered(tool_lab: Lab) -> None:
    tool_lab.write_plan({"goal": "g", "steps": [{"tool": "aecho", "input": {"x": 2}}]})
    assert tool_lab.cli("create", "t", "plan.json").returncode == 0
    killed = tool_lab.cli("run", "t", AGENT_CRASH_AT="after_effect:0")
    assert killed.returncode == -9, killed.stderr
    assert _effects(tool_lab) == ["aecho t-0 1"]
    ran = tool_lab.cli("run", "t")
    assert ran.returncode == 0, ran.stderr
    _clean(ran.stderr)
    assert tool_lab.snapshot("t").outputs[0] == {"ok": 2, "key": "t-0"}
    # At least once: the recovered step ran the tool again, by the same key.
    assert _effects(tool_lab) == ["aecho t-0 1", "aecho t-0 2"]
    assert tool_lab.cli("verify", "t").returncode == 0
