"""``--tools`` and ``NINELIVES_TOOLS``: tools declared in a module reach ``create``,
``run`` and ``worker`` processes, through the installed command."""

from __future__ import annotations

from ninelives.testing import Lab
from ninelives.testing.lab import GUIDE_PLAN

DECLARED = """
from ninelives.tools import tool

@tool("shout")
def shout(step_input, ctx, idem_key):
    return {"text": ctx[step_input["from"]]["summary"].upper()}
"""
REGISTERED = """
def register(registry):
    registry.register("whisper", lambda step_input, ctx, idem_key: {"text": "psst"})
"""
PLAN = {
    "goal": "shout the summary",
    "steps": [*GUIDE_PLAN["steps"][:2], {"tool": "shout", "input": {"from": 1}}],
}


def test_a_declared_tool_is_unknown_until_its_module_is_named(lab: Lab) -> None:
    lab.guide_setup()
    lab.write("labtools.py", DECLARED)
    lab.write_plan(PLAN, "shout.json")
    before = lab.fingerprint()
    unknown = lab.cli("create", "t", "shout.json")
    assert unknown.returncode == 4
    assert "unknown tool 'shout'" in unknown.stderr
    assert lab.fingerprint() == before
    assert lab.cli("--tools", "labtools", "create", "t", "shout.json").returncode == 0
    # The runner needs the module too; the variable does what the flag does.
    ran = lab.cli("run", "t", NINELIVES_TOOLS="labtools")
    assert ran.returncode == 0, ran.stderr
    assert lab.snapshot("t").outputs[2]["text"] == lab.snapshot("t").outputs[1]["summary"].upper()


def test_workers_load_the_named_modules(lab: Lab) -> None:
    lab.guide_setup()
    lab.write("labtools.py", DECLARED)
    lab.write_plan(PLAN, "shout.json")
    assert lab.cli("submit", "t", "shout.json", "--tools", "labtools").returncode == 0
    worker = lab.cli("worker", "--drain", "--tools", "labtools", "--poll", "0.1")
    assert worker.returncode == 0, worker.stderr
    assert lab.cli("status", "t").json()["status"] == "done"


def test_a_register_function_and_several_modules(lab: Lab) -> None:
    lab.guide_setup()
    lab.write("labtools.py", DECLARED)
    lab.write("more_tools.py", REGISTERED)
    plan = {"goal": "two", "steps": [*PLAN["steps"], {"tool": "whisper", "input": {}}]}
    lab.write_plan(plan, "two.json")
    tools = {"NINELIVES_TOOLS": "labtools, more_tools"}
    assert lab.cli("create", "t", "two.json", **tools).returncode == 0
    assert lab.cli("run", "t", **tools).returncode == 0
    assert lab.snapshot("t").outputs[3] == {"text": "psst"}


def test_a_module_that_cannot_load_is_bad_input(lab: Lab) -> None:
    lab.guide_setup()
    lab.write("broken_tools.py", "raise RuntimeError('half-written')\n")
    before = lab.fingerprint()
    for spec in ("no_such_module", "broken_tools", "not a module", "a..b"):
        result = lab.cli("--tools", spec, "create", "t", "plan.json")
        assert result.returncode == 4, (spec, result.stderr)
        assert result.stderr.startswith("ninelives: error: "), result.stderr
        assert result.stderr.count("\n") == 1
        assert "Traceback" not in result.stderr
    assert lab.fingerprint() == before
