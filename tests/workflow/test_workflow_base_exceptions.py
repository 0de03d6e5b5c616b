"""A BaseException that is not an Exception (``GeneratorExit``, a library's own
timeout or a test framework's failure), raised by a workflow's step, by its code
between steps or by a plan's tool: one line and exit 5, as a worker's slot that
ends so; a step it left running is recovered by the next run, as after a kill."""

from __future__ import annotations

import pytest

from ninelives.testing import Lab, Result

pytestmark = pytest.mark.crash

FLOWS = """
import os

import ninelives
from ninelives.tools import tool


class Halt(BaseException):
    pass


def work(name):
    with open("calls.log", "a") as f:
        f.write(name + "\\n")
    if os.path.exists("halt-" + name):
        raise Halt("halted in " + name)
    return name


@ninelives.workflow
def in_step(ctx):
    return [ctx.step("first", work, "first"), ctx.step("second", work, "second")]


@ninelives.workflow
def between(ctx):
    ctx.step("first", work, "first")
    if os.path.exists("halt-between"):
        raise GeneratorExit()
    return ctx.step("second", work, "second")


@tool("halting")
def halting(step_input, ctx):
    return {"name": work("tool")}
"""


@pytest.fixture
def flow_lab(lab: Lab) -> Lab:
    lab.write("bflows.py", FLOWS)
    lab.base_env["NINELIVES_TOOLS"] = "bflows"
    lab.base_env["PYTHONDONTWRITEBYTECODE"] = "1"
    return lab


def _stopped(result: Result, *words: str) -> None:
    """Exit 5 and one error line holding ``words`` (after the run's progress lines)."""
    assert result.returncode == 5, result
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ninelives:")]
    assert len(errors) == 1, result.stderr
    assert errors[0].startswith("ninelives: error: stopped by "), errors[0]
    for word in words:
        assert word in errors[0], errors[0]


def _steps(lab: Lab, task: str) -> list[tuple[str, str]]:
    return [(s["tool"], s["status"]) for s in lab.cli("status", task, "--json").json()["steps"]]


def test_a_step_raising_a_base_exception_stops_the_run_in_one_line(flow_lab: Lab) -> None:
    # It escaped `run` as a traceback and exit 1, the code of "unknown task".
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "in_step").returncode == 0
    lab.write("halt-second", "")
    stopped = lab.cli("run", "t")
    _stopped(stopped, "Halt: halted in second", "recovered by the next run")
    assert _steps(lab, "t") == [("first", "done"), ("second", "running")]
    (lab.root / "halt-second").unlink()
    ran = lab.cli("run", "t")
    assert ran.returncode == 0, ran.stderr
    assert "recovered step(s) [1]" in ran.stderr + ran.stdout
    assert lab.cli("status", "t", "--json").json()["result"] == ["first", "second"]
    assert lab.cli("verify", "t").returncode == 0


def test_workflow_code_raising_a_base_exception_between_steps_is_one_line(
    flow_lab: Lab,
) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "between").returncode == 0
    lab.write("halt-between", "")
    _stopped(lab.cli("run", "t"), "by GeneratorExit, raised")
    assert _steps(lab, "t") == [("first", "done")]
    (lab.root / "halt-between").unlink()
    assert lab.cli("run", "t").returncode == 0
    assert lab.cli("verify", "t").returncode == 0


def test_a_plan_tool_raising_a_base_exception_is_one_line(flow_lab: Lab) -> None:
    lab = flow_lab
    lab.write_plan({"goal": "g", "steps": [{"tool": "halting", "input": {}}]}, "p.json")
    assert lab.cli("create", "p", "p.json").returncode == 0
    lab.write("halt-tool", "")
    _stopped(lab.cli("run", "p"), "Halt: halted in tool")
    assert _steps(lab, "p") == [("halting", "running")]
