"""What a model's reply may hold and still not harm the task: call arguments with
numbers JSON lacks, arguments nested too deeply, rows stored deep by older versions.
Each bad call becomes that call's error result, the turn commits, and every reader
still reads the task."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

from ninelives.testing import Lab
from ninelives.testing.fakellm import Turn, fake_model_server

pytestmark = pytest.mark.crash

ANSWER = "All done."
#: A tool that takes any object: only the runtime's own limits stand between a
#: model's arguments and the step's stored input.
TOOLS = """
from ninelives.tools import tool

@tool("echo", schema={"type": "object"})
def echo(step_input, ctx):
    return {"seen": True}
"""
PLAN: dict[str, Any] = {
    "goal": "Call the tool once",
    "steps": [{"tool": "fetch", "input": {"path": "input/notes.txt"}}],
    "agent": {"tools": ["fetch", "echo"], "max_turns": 4},
}


def setup(lab: Lab) -> None:
    lab.write("input/notes.txt", "Alpha\n")
    lab.write("labecho.py", TOOLS)
    lab.write_plan(PLAN)
    created = lab.cli("--tools", "labecho", "create", "t", "plan.json")
    assert created.returncode == 0, created.stderr


def env_for(url: str, engine: str) -> dict[str, str]:
    base = url + "/v1" if engine == "openai" else url
    return {"NINELIVES_LLM": engine, "NINELIVES_LLM_URL": base, "NINELIVES_LLM_MODEL": "m1"}


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


def run_one_call(lab: Lab, arguments: str, engine: str = "openai") -> tuple[Any, list[Any]]:
    """Run the task with a first reply calling ``echo`` with ``arguments`` (raw JSON
    text), then an answer; return the run and the tool messages of the second request."""
    with fake_model_server(
        Turn(calls=[("echo", arguments)]), Turn(text=ANSWER), by_turn=True
    ) as fake:
        ran = lab.cli("--tools", "labecho", "run", "t", **env_for(fake.url, engine))
        assert fake.count() == 2, ran.stderr  # one paid call per turn, none asked again
        second = fake.requests[1].body["messages"]
    return ran, [m for m in second if m["role"] == "tool"]


def readers_read(lab: Lab) -> None:
    for args in (("verify", "--all"), ("status", "t", "--json"), ("export", "t")):
        result = lab.cli(*args)
        assert result.returncode == 0, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
    report = lab.cli("report", "t", "-o", "report.html")
    assert report.returncode == 0, report.stderr


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
@pytest.mark.parametrize("engine", ["openai", "ollama"])
def test_a_number_json_lacks_is_that_calls_error(lab: Lab, number: str, engine: str) -> None:
    setup(lab)
    ran, results = run_one_call(lab, f'{{"n": {number}}}', engine)
    assert ran.returncode == 0, ran.stderr
    assert len(results) == 1
    assert results[0]["content"].startswith("error: arguments of 'echo' refused")
    assert "NaN, Infinity" in results[0]["content"]
    snapshot = lab.snapshot("t")
    turn = snapshot.outputs[1]
    assert turn["tool_calls"][0]["step"] is None
    assert turn["tool_calls"][0]["arguments"] == {}
    assert [s["tool"] for s in snapshot.status["steps"]] == ["fetch", "agent", "agent"]
    assert [s["attempts"] for s in snapshot.status["steps"]] == [1, 1, 1]
    readers_read(lab)


@pytest.mark.parametrize(
    ("arguments", "engine", "why"),
    [
        ('{"title": broken', "openai", "not valid JSON"),
        ('["a", "b"]', "openai", "not a JSON object"),
        ('"text"', "openai", "not a JSON object"),
        ('["a", "b"]', "ollama", "not a JSON object"),
    ],
)
def test_arguments_that_are_not_a_json_object_are_that_calls_error(
    lab: Lab, arguments: str, engine: str, why: str
) -> None:
    """The tool never runs on arguments the model did not give as an object: the
    model is told so, as for arguments that fail the tool's schema."""
    setup(lab)
    ran, results = run_one_call(lab, arguments, engine)
    assert ran.returncode == 0, ran.stderr
    assert results[0]["content"].startswith("error: arguments of 'echo' refused"), results
    assert why in results[0]["content"]
    steps = lab.snapshot("t").status["steps"]
    assert [s["tool"] for s in steps] == ["fetch", "agent", "agent"]
    readers_read(lab)


@pytest.mark.parametrize("levels", [29, 40, 982])
def test_arguments_nested_too_deeply_are_that_calls_error(lab: Lab, levels: int) -> None:
    """``{"x": [[...]]}`` nests ``levels`` + 1 levels: past 29 the call is refused
    (the turn's output, three levels up, then stays within 32), whether the
    decoder could read it (40) or not (982)."""
    setup(lab)
    ran, results = run_one_call(lab, f'{{"x": {deep(levels)}}}')
    assert ran.returncode == 0, ran.stderr
    assert results[0]["content"].startswith("error: arguments of 'echo' refused")
    assert "nest" in results[0]["content"]
    steps = lab.snapshot("t").status["steps"]
    assert [s["tool"] for s in steps] == ["fetch", "agent", "agent"]
    readers_read(lab)


def test_arguments_at_the_limit_run(lab: Lab) -> None:
    """The positive control: 29 levels of arguments are a call that runs."""
    setup(lab)
    ran, results = run_one_call(lab, f'{{"x": {deep(28)}}}')
    assert ran.returncode == 0, ran.stderr
    assert json.loads(results[0]["content"]) == {"seen": True}
    steps = lab.snapshot("t").status["steps"]
    assert [s["tool"] for s in steps] == ["fetch", "agent", "echo", "agent"]
    readers_read(lab)


def test_a_reply_too_deep_to_decode_is_a_step_error(lab: Lab) -> None:
    """Ollama sends arguments inside the reply's own JSON: a reply too deep to
    decode is one step_error naming the engine, never a traceback."""
    setup(lab)
    script = (Turn(calls=[("echo", f'{{"x": {deep(5000)}}}')]), Turn(text=ANSWER))
    with fake_model_server(*script) as fake:
        ran = lab.cli("--tools", "labecho", "run", "t", **env_for(fake.url, "ollama"))
    assert ran.returncode == 0, ran.stderr
    assert "Traceback" not in ran.stderr
    errors = [e for e in lab.snapshot("t").events if e["kind"] == "step_error"]
    assert len(errors) == 1
    assert "nested too deeply" in errors[0]["error"]
    readers_read(lab)


def test_a_tool_output_nested_too_deeply_is_refused(lab: Lab) -> None:
    lab.write(
        "labdeep.py",
        "from ninelives.tools import tool\n\n"
        "@tool('deep')\n"
        "def deep(step_input, ctx):\n"
        "    value = []\n"
        "    for _ in range(40):\n"
        "        value = [value]\n"
        "    return {'x': value}\n",
    )
    lab.write_plan({"goal": "g", "steps": [{"tool": "deep", "input": {}}]})
    assert lab.cli("--tools", "labdeep", "create", "t", "plan.json").returncode == 0
    ran = lab.cli("--tools", "labdeep", "run", "t", AGENT_MAX_ATTEMPTS="1")
    assert ran.returncode == 2
    assert "nests more than 32 levels" in ran.stderr
    readers_read(lab)


def test_rows_stored_deep_by_an_older_version_are_damaged_not_a_traceback(
    sqlite_lab: Lab,
) -> None:
    """A step output and an event stored 5000 levels deep (as a version without the
    limit could): every reader names the task damaged in one line (exit 5, verify 7)."""
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 0
    assert lab.sqlite_path is not None
    with sqlite3.connect(lab.sqlite_path) as conn:
        conn.execute(
            "UPDATE steps SET output = ? WHERE task_id = 't' AND idx = 1",
            (f'{{"summary": {deep(5000)}}}',),
        )
    verify = lab.cli("verify", "--all")
    assert verify.returncode == 7, verify.stdout + verify.stderr
    assert "damaged" in verify.stdout
    assert "Traceback" not in verify.stderr
    for args in (("status", "t", "--json"), ("report", "t", "-o", "r.html")):
        result = lab.cli(*args)
        assert result.returncode == 5, (args, result.stderr)
        assert result.stderr.count("\n") == 1
        assert "is damaged" in result.stderr
        assert "nests more than" in result.stderr
    with sqlite3.connect(lab.sqlite_path) as conn:
        conn.execute(
            "UPDATE events SET data = ? WHERE task_id = 't' AND kind = 'task_done'",
            (f'{{"x": {deep(990)}}}',),
        )
    export = lab.cli("export", "t")
    assert export.returncode == 5, export.stderr
    assert "is damaged" in export.stderr
    assert "Traceback" not in export.stderr


@pytest.mark.parametrize("engine", ["openai", "ollama"])
def test_a_lone_surrogate_in_the_reply_is_stored_as_a_replacement(lab: Lab, engine: str) -> None:
    """Half an emoji (an escaped lone surrogate) in the reply's text, and in a call's
    name and id: no store can hold it, so the turn keeps U+FFFD in its place and
    commits; the paid call is asked once, not once per attempt."""
    setup(lab)
    half = "\ud83d"
    with fake_model_server(
        Turn(text=f"Thinking {half}", calls=[(f"echo{half}", "{}")]),
        Turn(text=f"{ANSWER} {half}"),
        by_turn=True,
    ) as fake:
        ran = lab.cli("--tools", "labecho", "run", "t", **env_for(fake.url, engine))
        assert fake.count() == 2, ran.stderr
    assert ran.returncode == 0, ran.stderr
    snapshot = lab.snapshot("t")
    assert snapshot.outputs[1]["text"] == "Thinking \ufffd"
    assert snapshot.outputs[1]["tool_calls"][0]["name"] == "echo\ufffd"
    assert snapshot.outputs[2]["text"] == f"{ANSWER} \ufffd"
    assert [s["attempts"] for s in snapshot.status["steps"]] == [1, 1, 1]
    readers_read(lab)
