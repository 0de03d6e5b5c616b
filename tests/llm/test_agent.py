"""Agents through the installed CLI against a loopback model server: the loop, the
kill matrix over every step it makes, and each way a model can misbehave."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest

from ninelives.testing import Lab
from ninelives.testing.fakellm import FakeModelServer, Turn, fake_model_server

pytestmark = pytest.mark.crash

NOTES = "Alpha\nBeta\nGamma\n"
MORE = "Delta\nEpsilon\n"
REPORT = "# Report\nAlpha to Epsilon."
ANSWER = "Published the report."
PLAN: dict[str, Any] = {
    "goal": "Write a short report on the notes in input/",
    "steps": [{"tool": "fetch", "input": {"path": "input/notes.txt"}}],
    "agent": {
        "tools": ["fetch", "write_artifact"],
        "max_turns": 5,
        "system": "You are a careful analyst.",
    },
}
#: Two tool calls over three turns: steps 1, 3 and 5 are turns, 2 and 4 the calls.
SCRIPT = (
    Turn(calls=[("fetch", {"path": "input/more.txt"})]),
    Turn(calls=[("write_artifact", {"name": "report.md", "text": REPORT})]),
    Turn(text=ANSWER),
)
TURN_STEPS = {1: 0, 3: 1, 5: 2}


def env_for(fake: FakeModelServer, **extra: str) -> dict[str, str]:
    return {
        "NINELIVES_LLM": "openai",
        "NINELIVES_LLM_URL": fake.url + "/v1",
        "NINELIVES_LLM_MODEL": "m1",
        **extra,
    }


def setup(lab: Lab, plan: dict[str, Any] = PLAN) -> None:
    lab.write("input/notes.txt", NOTES)
    lab.write("input/more.txt", MORE)
    lab.write_plan(plan)
    created = lab.cli("create", "t", "plan.json")
    assert created.returncode == 0, created.stderr


@pytest.mark.slow
def test_agent_loop_runs_every_decision_as_a_step(lab: Lab) -> None:
    setup(lab)
    with fake_model_server(*SCRIPT, by_turn=True) as fake:
        result = lab.cli("run", "t", **env_for(fake))
        assert result.returncode == 0, result.stderr
        assert fake.turns() == [0, 1, 2]
        first, second, third = (r.body["messages"] for r in fake.requests)
        tools = [t["function"]["name"] for t in fake.requests[0].body["tools"]]
    assert tools == ["fetch", "write_artifact"]
    assert first[0] == {"role": "system", "content": "You are a careful analyst."}
    assert first[1]["content"].startswith(PLAN["goal"])
    assert NOTES in first[1]["content"]
    assert second[2]["tool_calls"][0]["function"]["name"] == "fetch"
    assert second[3]["role"] == "tool"
    assert json.loads(second[3]["content"])["text"] == MORE
    assert third[5]["role"] == "tool"
    assert "t-4+report.md" in third[5]["content"]
    snapshot = lab.snapshot("t")
    assert [s["tool"] for s in snapshot.status["steps"]] == [
        "fetch", "agent", "fetch", "agent", "write_artifact", "agent",
    ]  # fmt: skip
    assert snapshot.status["status"] == "done"
    assert snapshot.outputs[5]["text"] == ANSWER
    appended = [e for e in snapshot.events if e["kind"] == "step_appended"]
    assert [(e["step"], e["by"], e["tool"]) for e in appended] == [
        (2, 1, "fetch"), (3, 1, "agent"), (4, 3, "write_artifact"), (5, 3, "agent"),
    ]  # fmt: skip
    assert lab.artifacts() == {"t-4+report.md": REPORT}
    assert lab.cli("verify", "t", "--artifacts", "artifacts").returncode == 0
    status = lab.cli("status", "t", "--json").json()
    assert status["model_calls"] == 3
    assert status["tokens"] == {"input_tokens": 33, "output_tokens": 21}
    assert status["model_calls_saved"] == 0


@pytest.mark.parametrize("step", range(6))
@pytest.mark.parametrize("point", ["before_effect", "after_effect", "after_commit"])
@pytest.mark.slow
def test_agent_kill_matrix(lab: Lab, point: str, step: int) -> None:
    """Killed at each crash point of each step (static, turn, appended call) and
    resumed: every committed turn is asked once, the effect lands once, the answer
    is stored and verify is clean. A turn killed at ``after_effect`` is asked twice:
    the negative control showing the kill lands after the request."""
    setup(lab)
    with fake_model_server(*SCRIPT, by_turn=True) as fake:
        killed = lab.cli("run", "t", AGENT_CRASH_AT=f"{point}:{step}", **env_for(fake))
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        resumed = lab.cli("run", "t", **env_for(fake))
        assert resumed.returncode == 0, resumed.stderr
        turns = fake.turns()
    expected = [0, 1, 2]
    if point == "after_effect" and step in TURN_STEPS:
        expected.insert(TURN_STEPS[step], TURN_STEPS[step])
    assert turns == expected
    snapshot = lab.snapshot("t")
    assert snapshot.status["status"] == "done"
    assert snapshot.outputs[5]["text"] == ANSWER
    assert lab.artifacts() == {"t-4+report.md": REPORT}
    verified = lab.cli("verify", "t", "--artifacts", "artifacts")
    assert verified.returncode == 0, verified.stdout
    status = lab.cli("status", "t", "--json").json()
    committed_before_kill = sum(
        1 for s in TURN_STEPS if s < step or (s == step and point == "after_commit")
    )
    # Killed after the last turn's commit, the task was done: the next run resumed
    # nothing and so saved nothing.
    done_before_kill = (point, step) == ("after_commit", max(TURN_STEPS))
    assert status["model_calls_saved"] == (0 if done_before_kill else committed_before_kill)


def test_bad_calls_become_results_the_model_reads(lab: Lab) -> None:
    setup(lab)
    script = (
        Turn(
            calls=[
                ("delete_everything", {}),
                ("write_artifact", {"name": "../escape.md", "text": "x"}),
                ("fetch", {"path": "/etc/passwd"}),
            ]
        ),
        Turn(text=ANSWER),
    )
    with fake_model_server(*script, by_turn=True) as fake:
        result = lab.cli("run", "t", **env_for(fake))
        assert result.returncode == 0, result.stderr
        replies = [m for m in fake.requests[1].body["messages"] if m["role"] == "tool"]
    assert len(replies) == 3
    assert "unknown tool 'delete_everything'" in replies[0]["content"]
    assert "write_artifact" in replies[1]["content"]
    assert "fetch" in replies[2]["content"]
    assert all(r["content"].startswith("error: ") for r in replies)
    snapshot = lab.snapshot("t")
    assert [s["tool"] for s in snapshot.status["steps"]] == ["fetch", "agent", "agent"]
    assert lab.artifacts() == {}


def test_max_turns_ends_a_runaway_loop(lab: Lab) -> None:
    plan = {**PLAN, "agent": {**PLAN["agent"], "max_turns": 3}}
    setup(lab, plan)
    with fake_model_server(Turn(calls=[("fetch", {"path": "input/more.txt"})])) as fake:
        result = lab.cli("run", "t", **env_for(fake))
        assert fake.count() == 3
    assert result.returncode == 2
    assert "max_turns" in result.stderr
    snapshot = lab.snapshot("t")
    failed = [e for e in snapshot.events if e["kind"] == "task_failed"]
    assert len(failed) == 1
    assert "3 turns" in failed[0]["reason"]
    assert lab.cli("verify", "t").returncode == 0


def test_max_calls_ends_a_runaway_loop(lab: Lab) -> None:
    plan = {**PLAN, "agent": {**PLAN["agent"], "max_calls": 2}}
    setup(lab, plan)
    call = ("fetch", {"path": "input/more.txt"})
    with fake_model_server(Turn(calls=[call, call, call])) as fake:
        result = lab.cli("run", "t", **env_for(fake))
        assert fake.count() == 1
    assert result.returncode == 2
    assert "max_calls" in result.stderr


@pytest.mark.parametrize("fault", ["hang", "http500"])
def test_a_failing_model_server_fails_the_turn_not_the_journal(lab: Lab, fault: str) -> None:
    setup(lab)
    with fake_model_server(fault, hang_seconds=3) as fake:
        env = env_for(fake, NINELIVES_LLM_TIMEOUT="0.5", AGENT_MAX_ATTEMPTS="2")
        result = lab.cli("run", "t", **env)
        assert fake.count() == 2
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert lab.snapshot("t").outputs[0]["text"] == NOTES  # the static step is kept
    assert lab.cli("verify", "t").returncode == 0


def test_the_stub_engine_runs_an_agent_offline(lab: Lab) -> None:
    setup(lab)
    result = lab.cli("run", "t")
    assert result.returncode == 0, result.stderr
    snapshot = lab.snapshot("t")
    assert [s["tool"] for s in snapshot.status["steps"]] == [
        "fetch",
        "agent",
        "write_artifact",
        "agent",
    ]
    assert lab.artifacts() == {"t-2+report.md": f"{PLAN['goal']}\nOutput of step 0:\nAlpha"}


def test_model_calls_saved_counts_only_runs_that_resumed(lab: Lab) -> None:
    """A run on a finished task repeats nothing and so saves nothing: only the
    run that resumed after the kill counts the turn committed before it."""
    setup(lab)
    killed = lab.cli("run", "t", AGENT_CRASH_AT="after_commit:1")  # the first turn committed
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    for _ in range(2):  # the resume, then a run that finds the task done
        result = lab.cli("run", "t")
        assert result.returncode == 0, result.stderr
        assert lab.cli("status", "t", "--json").json()["model_calls_saved"] == 1
    lab.cli("create", "u", "plan.json")
    for _ in range(2):  # never killed: nothing was ever saved
        assert lab.cli("run", "u").returncode == 0
    status = lab.cli("status", "u", "--json").json()
    assert (status["status"], status["model_calls"], status["model_calls_saved"]) == ("done", 2, 0)


@pytest.mark.parametrize(
    ("agent", "message"),
    [
        ({"tools": ["summarize"]}, "declares no input schema"),
        ({"tools": ["nope"]}, "unknown tool"),
        ({"tools": ["fetch"], "max_turns": 0}, "max_turns"),
        ({"tools": ["fetch"], "colour": "red"}, "unknown keys"),
        ({"tools": ["fetch"], "engine": "gpt"}, "engine"),
    ],
)
def test_bad_agent_sections_are_refused_at_create(
    lab: Lab, agent: dict[str, Any], message: str
) -> None:
    lab.write_plan({"goal": "g", "agent": agent})
    result = lab.cli("create", "t", "plan.json")
    assert result.returncode == 4
    assert message in result.stderr
    assert lab.cli("status", "t").returncode == 1


def test_a_tool_the_agent_may_call_missing_here_refuses_the_run(lab: Lab) -> None:
    """The agent's tools are resolved before the claim too: a host without one of them
    writes nothing (exit 4) instead of burning the turn's attempts."""
    import ninelives
    from ninelives.settings import Settings
    from ninelives.tools import Tool
    from ninelives.tools.builtin import default_registry

    tools = default_registry(Settings())
    tools.add(Tool(name="ticket", fn=lambda i, c, k: {}, schema={"type": "object"}))
    plan = {**PLAN, "agent": {"tools": ["fetch", "ticket"]}}
    lab.write("input/notes.txt", NOTES)
    db = lab.db if lab.sqlite_path is None else str(lab.sqlite_path)
    with ninelives.open(db, settings=Settings(artifacts=str(lab.artifacts_dir)), tools=tools) as rt:
        rt.create("t", plan)
    before = lab.fingerprint("t")
    ran = lab.cli("run", "t")
    assert ran.returncode == 4, ran.stderr
    assert "unknown tool 'ticket'" in ran.stderr
    assert lab.fingerprint("t") == before
