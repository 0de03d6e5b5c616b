"""``--tools`` and ``NINELIVES_TOOLS``: tools declared in a module reach ``create``,
``run`` and ``worker`` processes, through the installed command."""

from __future__ import annotations

from pathlib import Path

from errorlines import one_line
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
    # Its register() raises, or cannot take the registry.
    lab.write("failing_tools.py", "def register(registry):\n    raise RuntimeError('no db')\n")
    lab.write("wrong_tools.py", "def register():\n    pass\n")
    before = lab.fingerprint()
    for spec in (
        "no_such_module", "broken_tools", "not a module", "a..b", "failing_tools", "wrong_tools",
    ):  # fmt: skip
        result = lab.cli("--tools", spec, "create", "t", "plan.json")
        assert result.returncode == 4, (spec, result.stderr)
        assert result.stderr.startswith("ninelives: error: "), result.stderr
        assert result.stderr.count("\n") == 1
        assert "Traceback" not in result.stderr
    assert lab.fingerprint() == before


FINE = (
    "def fine(step_input, ctx, idem_key):\n    return {'ok': True}\n"
    "def known(step_input, ctx):\n    return {'step': ctx.step}\n"
)
GONE = "def gone(step_input, ctx, idem_key):\n    return {}\n"


def _install(root: Path, entry_points: str, module: str) -> str:
    """A package of tools in the ``ninelives.tools`` group, as installing one would
    leave it: its module and its ``.dist-info``, in a folder for ``PYTHONPATH``."""
    site = root / "site"
    info = site / "lab_plugin-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "lab_plugin.py").write_text(module, encoding="utf-8")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[ninelives.tools]\n{entry_points}\n")
    return str(site)


def test_an_entry_point_that_cannot_load_is_bad_input(lab: Lab) -> None:
    # An installed package whose tool is misnamed or whose module fails on
    # import: the plan that needs the tool is refused (exit 4, one line naming
    # the tool), as a --tools module that cannot load is; no traceback.
    lab.guide_setup()
    site = _install(
        lab.root,
        "renamed = lab_plugin:gone\nbroken = lab_broken:tool\nfine = lab_plugin:fine\n"
        "exiting = lab_exiting:tool\nknown = lab_plugin:known",
        FINE,
    )
    (Path(site) / "lab_broken.py").write_text("raise RuntimeError('half-written')\n")
    (Path(site) / "lab_exiting.py").write_text("import sys\nsys.exit(0)\n")
    before = lab.fingerprint()
    for name in ("renamed", "broken", "exiting"):
        lab.write_plan({"goal": "g", "steps": [{"tool": name, "input": {}}]}, f"{name}.json")
        result = lab.cli("create", "t", f"{name}.json", PYTHONPATH=site)
        assert result.returncode == 4, (name, result.stderr)
        assert "Traceback" not in result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"ninelives: error: tool {name!r}, whose entry point")
        (lab.root / f"{name}.json").unlink()
    assert lab.fingerprint() == before
    # A stored task that needs it (the package broke after create) is refused
    # before its claim, by run and by a worker alike.
    lab.write_plan({"goal": "g", "steps": [{"tool": "renamed", "input": {}}]}, "later.json")
    lab.write("site/lab_plugin.py", GONE)
    assert lab.cli("submit", "later", "later.json", PYTHONPATH=site).returncode == 0
    lab.write("site/lab_plugin.py", FINE)
    ran = lab.cli("run", "later", PYTHONPATH=site)
    assert (ran.returncode, ran.stderr.count("\n")) == (4, 1), ran.stderr
    assert "step 0 needs tool 'renamed', whose entry point" in ran.stderr
    drained = lab.cli("worker", "--drain", "--poll", "0.1", PYTHONPATH=site)
    assert drained.returncode == 11, drained.stderr
    assert lab.cli("status", "later").json()["status"] == "pending"
    # The control: the package's other tools load and run, in either form
    # (one of (input, ctx) was called with three arguments before).
    steps = [{"tool": "fine", "input": {}}, {"tool": "known", "input": {}}]
    lab.write_plan({"goal": "g", "steps": steps}, "fine.json")
    assert lab.cli("create", "t", "fine.json", PYTHONPATH=site).returncode == 0
    assert lab.cli("run", "t", PYTHONPATH=site).returncode == 0
    assert lab.snapshot("t").outputs == {0: {"ok": True}, 1: {"step": 1}}


SHAPES = """
from ninelives.tools import tool

@tool("pair")
def pair(step_input, ctx):
    return {"pair": (1, 2), "more": Later(mark=[1])}

@tool("look")
def look(step_input, ctx):
    seen = ctx.outputs[0]
    return {"types": [type(seen["pair"]).__name__, type(seen["more"]).__name__], "seen": seen}

@tool("mimic")
def mimic(step_input, ctx):
    return {"$raw": {"x": 1}}

@tool("peek")
def peek(step_input, ctx):
    return {"seen": ctx.outputs[2]}

class Later(dict):
    pass
"""


def test_a_later_step_reads_an_output_as_committed_killed_in_between_or_not(lab: Lab) -> None:
    # The next step of the same run got what the tool returned (a tuple, a dict
    # subclass), a resumed run what was committed (a list, a dict): code that
    # worked after a kill failed without one, or the other way round. And an
    # output that looks like a stored escape ({"$raw": ...}) reached the next
    # step of the same run escaped once more ({"$raw": {"$raw": ...}}).
    lab.write("shapes.py", SHAPES)
    steps = [{"tool": name, "input": {}} for name in ("pair", "look", "mimic", "peek")]
    lab.write_plan({"goal": "g", "steps": steps}, "shapes.json")
    tools = {"NINELIVES_TOOLS": "shapes"}
    for task in ("whole", "killed0", "killed2"):
        assert lab.cli("create", task, "shapes.json", **tools).returncode == 0
    assert lab.cli("run", "whole", **tools).returncode == 0
    for task in ("killed0", "killed2"):
        crash = {"AGENT_CRASH_AT": f"after_commit:{task[-1]}"}
        assert lab.cli("run", task, **crash, **tools).returncode == -9
        assert lab.cli("run", task, **tools).returncode == 0
    whole = lab.snapshot("whole").outputs
    assert whole[1]["types"] == ["list", "dict"]
    assert whole[3] == {"seen": {"$raw": {"x": 1}}}
    assert whole == lab.snapshot("killed0").outputs == lab.snapshot("killed2").outputs


EXITS = {
    "exit_zero": "import sys\nsys.exit(0)\n",
    "exit_three": "import sys\nsys.exit(3)\n",
    "exit_text": "import sys\nsys.exit('leaving')\n",
    "exit_in_register": "import sys\n\ndef register(registry):\n    sys.exit(0)\n",
    # A BaseException that is not an Exception (a custom one, GeneratorExit) was
    # "stopped by ..., raised by code this command ran", exit 5, as if a step had
    # run: it is that module failing to load, as sys.exit there is.
    "base_at_import": "class Stop(BaseException):\n    pass\n\nraise Stop('at import')\n",
    "base_in_register": (
        "class Stop(BaseException):\n    pass\n\n"
        "def register(registry):\n    raise Stop('in register')\n"
    ),
    "generator_exit": "raise GeneratorExit\n",
}
FLOW = "import ninelives\n\n@ninelives.workflow('w')\ndef w(ctx):\n    return ctx.step('s', int)\n"


def test_a_module_that_exits_or_raises_a_base_exception_as_it_loads_is_bad_input(lab: Lab) -> None:
    # A module that ends the process as it loads (a script's `sys.exit(main())`
    # at the bottom, a command-line helper imported by it): the command ended
    # silently with that code, so `create` and `run` said 0 ("done") having done
    # nothing, and 3 read as another process running the task.
    lab.guide_setup()
    lab.write("flows.py", FLOW)
    for name, text in EXITS.items():
        lab.write(f"{name}.py", text)
    assert lab.cli("--tools", "flows", "create", "w", "--workflow", "w").returncode == 0
    before = lab.fingerprint()
    for name in EXITS:
        tools = {"NINELIVES_TOOLS": f"flows,{name}"}
        for args in (
            ("create", "t", "--workflow", "w"), ("run", "w"), ("replay-check", "--all"),
            ("worker", "--drain", "--poll", "0.1"),
        ):  # fmt: skip
            one_line(lab.cli(*args, **tools), 4, f"cannot load tools from module {name!r}")
    assert lab.fingerprint() == before
    # The control: the workflow's own module alone loads and runs it.
    ran = lab.cli("run", "w", NINELIVES_TOOLS="flows")
    assert ran.returncode == 0, ran.stderr


def test_a_keyboard_interrupt_as_a_module_loads_stays_an_interruption(lab: Lab) -> None:
    # Unlike the other BaseExceptions (above), a KeyboardInterrupt stays exit 130:
    # a Ctrl-C while a slow module loads raises it there too, and cannot be told
    # from one the module raised.
    lab.guide_setup()
    lab.write("flows.py", FLOW)
    lab.write("interrupting.py", "raise KeyboardInterrupt\n")
    assert lab.cli("--tools", "flows", "create", "w", "--workflow", "w").returncode == 0
    before = lab.fingerprint()
    stopped = lab.cli("run", "w", NINELIVES_TOOLS="flows,interrupting")
    assert (stopped.returncode, stopped.stderr) == (130, "ninelives: interrupted\n")
    assert lab.fingerprint() == before
    ran = lab.cli("run", "w", NINELIVES_TOOLS="flows")
    assert ran.returncode == 0, ran.stderr


def test_an_entry_point_that_raises_a_base_exception_is_bad_input(lab: Lab) -> None:
    lab.guide_setup()
    site = _install(lab.root, "stopping = lab_stopping:tool", FINE)
    (Path(site) / "lab_stopping.py").write_text(EXITS["base_at_import"])
    lab.write_plan({"goal": "g", "steps": [{"tool": "stopping", "input": {}}]}, "stop.json")
    before = lab.fingerprint()
    refused = lab.cli("create", "t", "stop.json", PYTHONPATH=site)
    one_line(refused, 4, "tool 'stopping', whose entry point", "Stop: at import")
    assert lab.fingerprint() == before
