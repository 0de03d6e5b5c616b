"""ctx.chat and ctx.call_tool: a hand-written agent loop in a workflow, against a
scripted OpenAI-compatible server on loopback, killed at every crash point of
every step of a run with two tool calls and a final answer."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from ninelives.testing import Lab
from ninelives.testing.fakellm import FakeModelServer, Turn, fake_model_server

HERE = Path(__file__).resolve().parent
POINTS = ("before_effect", "after_effect", "after_commit")
STEPS = ("model", "tool:lookup_note", "write_artifact", "model")
REPORT = "# Notes\n- buy milk"
SCRIPT = (
    Turn(
        calls=[
            ("lookup_note", {"name": "a.txt"}),
            ("write_artifact", {"name": "report.md", "text": REPORT}),
        ]
    ),
    Turn(text="The report is written."),
)


@pytest.fixture
def server() -> Iterator[FakeModelServer]:
    with fake_model_server(*SCRIPT, by_turn=True) as fake:
        yield fake


def setup(lab: Lab, server: FakeModelServer) -> None:
    shutil.copy(HERE / "chat_notes.py", lab.root / "chat_notes.py")
    lab.write("input/a.txt", "buy milk\n")
    lab.base_env.update(
        NINELIVES_TOOLS="chat_notes",
        NINELIVES_LLM="openai",
        NINELIVES_LLM_URL=f"{server.url}/v1",
        NINELIVES_LLM_MODEL="scripted",
    )


def lookups(lab: Lab, task: str) -> int:
    path = lab.root / f"calls-{task}.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


def make(lab: Lab, task: str, workflow: str) -> None:
    made = lab.cli("create", task, "--workflow", workflow, "--args", '["Write up my notes"]')
    assert made.returncode == 0, made.stderr


@pytest.mark.crash
@pytest.mark.slow
@pytest.mark.parametrize("workflow", ["notes_agent", "notes_agent_async"])
def test_every_crash_point_of_every_step(lab: Lab, server: FakeModelServer, workflow: str) -> None:
    setup(lab, server)
    problems = {}
    for k, kind in enumerate(STEPS):
        for point in POINTS:
            task = f"t-{point}-{k}".replace("_", "-")
            asked = server.count()
            make(lab, task, workflow)
            killed = lab.cli(
                "run", task, AGENT_CRASH_AT=f"{point}:{k}", NOTES_LOG=f"calls-{task}.log"
            )
            resumed = lab.cli("run", task, NOTES_LOG=f"calls-{task}.log")
            extra = 1 if point == "after_effect" else 0
            found = []
            if killed.returncode != -9 or resumed.returncode != 0:
                found.append(f"exits {killed.returncode}, {resumed.returncode}: {resumed.stderr}")
            if server.count() - asked != 2 + (extra if kind == "model" else 0):
                found.append(f"{server.count() - asked} model requests")
            if lookups(lab, task) != 1 + (extra if kind == "tool:lookup_note" else 0):
                found.append(f"{lookups(lab, task)} lookups")
            reports = sorted(p.name for p in lab.artifacts_dir.glob(f"{task}-*"))
            if reports != [f"{task}-2+report.md"]:
                found.append(f"artifacts {reports}")
            status = lab.cli("status", task, "--json").json()
            if status.get("result") != "The report is written.":
                found.append(f"result {status.get('result')!r}")
            if status.get("model_calls") != 2 or status.get("tokens") != {
                "input_tokens": 22, "output_tokens": 14
            }:  # fmt: skip
                found.append(f"usage {status.get('model_calls')} {status.get('tokens')}")
            saved = sum(
                1
                for i, done in enumerate(STEPS)
                if done == "model" and (i < k or (i == k and point == "after_commit"))
            )
            if status.get("model_calls_saved") != saved:
                found.append(f"model_calls_saved {status.get('model_calls_saved')}")
            if lab.cli("verify", task).returncode != 0:
                found.append("verify")
            if found:
                problems[f"{point}:{k}"] = found
    assert problems == {}
    assert (lab.artifacts_dir / "t-after-effect-2-2+report.md").read_text() == REPORT


def test_calls_that_cannot_run_become_the_results_the_model_reads(sqlite_lab: Lab) -> None:
    script = (
        Turn(calls=[("nope", {}), ("lookup_note", {"wrong": 1}), ("agent", {})]),
        Turn(text="Understood."),
    )
    with fake_model_server(*script, by_turn=True) as fake:
        setup(sqlite_lab, fake)
        make(sqlite_lab, "bad-calls", "notes_agent")
        done = sqlite_lab.cli("run", "bad-calls")
        assert done.returncode == 0, done.stderr
        second = fake.requests[-1].body["messages"]
    results = [m["content"] for m in second if m["role"] == "tool"]
    assert results[0].startswith("error: unknown tool 'nope'")
    assert results[1].startswith("error: arguments of 'lookup_note' do not match its schema")
    assert results[2].startswith("error: unknown tool 'agent'")
    status = sqlite_lab.cli("status", "bad-calls", "--json").json()
    assert [s["tool"] for s in status["steps"]] == ["chat", "nope", "lookup_note", "call", "chat"]
    assert status["result"] == "Understood."
    assert lookups(sqlite_lab, "bad-calls") == 0


def test_the_stub_engine_runs_the_loop_with_no_server(sqlite_lab: Lab) -> None:
    shutil.copy(HERE / "chat_notes.py", sqlite_lab.root / "chat_notes.py")
    sqlite_lab.base_env["NINELIVES_TOOLS"] = "chat_notes"
    make(sqlite_lab, "stub", "notes_agent")
    done = sqlite_lab.cli("run", "stub")
    assert done.returncode == 0, done.stderr
    status = sqlite_lab.cli("status", "stub", "--json").json()
    assert [s["tool"] for s in status["steps"]] == ["chat", "write_artifact", "chat"]
    assert status["result"] == "Write up my notes"
    assert json.loads(json.dumps(sqlite_lab.artifacts())) == {
        "stub-1+report.md": "Write up my notes"
    }


@pytest.mark.parametrize(
    ("arguments", "why"),
    [
        ('{"name": NaN}', "NaN, Infinity"),
        ('{"name": 1e999}', "NaN, Infinity"),
        ('{"name": ' + "[" * 40 + "]" * 40 + "}", "nest"),
        ('{"name": ' + "[" * 982 + "]" * 982 + "}", "nest"),
    ],
)
def test_arguments_no_store_can_keep_are_that_calls_error(
    sqlite_lab: Lab, arguments: str, why: str
) -> None:
    """As in the plan agent: arguments with a number JSON lacks, or nested deeper
    than a step's input may be, are refused (not kept) and the model reads why."""
    script = (Turn(calls=[("lookup_note", arguments)]), Turn(text="Understood."))
    with fake_model_server(*script, by_turn=True) as fake:
        setup(sqlite_lab, fake)
        make(sqlite_lab, "odd-args", "notes_agent")
        done = sqlite_lab.cli("run", "odd-args")
        assert done.returncode == 0, done.stderr
        second = fake.requests[-1].body["messages"]
    results = [m["content"] for m in second if m["role"] == "tool"]
    assert len(results) == 1
    assert results[0].startswith("error: arguments of 'lookup_note' refused"), results
    assert why in results[0]
    status = sqlite_lab.cli("status", "odd-args", "--json").json()
    assert [s["tool"] for s in status["steps"]] == ["chat", "lookup_note", "chat"]
    assert status["steps"][0]["attempts"] == 1
    assert lookups(sqlite_lab, "odd-args") == 0
    assert sqlite_lab.cli("verify", "odd-args").returncode == 0


@pytest.mark.parametrize(
    ("variables", "why"),
    [
        ({"NINELIVES_LLM": "gpt"}, "unknown model engine 'gpt'"),
        ({"NINELIVES_LLM_MODEL": ""}, "set NINELIVES_LLM_MODEL"),
        ({"NINELIVES_LLM_URL": "ftp://127.0.0.1/v1"}, "must be an http(s) URL"),
    ],
)
def test_a_misconfigured_engine_is_refused_before_the_model_step(
    sqlite_lab: Lab, server: FakeModelServer, variables: dict[str, str], why: str
) -> None:
    """As a plan's model step: exit 4 in one line, the step not started, the task not
    failed; a committed reply is still read back, and the fixed run goes on."""
    lab = sqlite_lab
    setup(lab, server)
    make(lab, "t", "notes_agent")
    killed = lab.cli("run", "t", AGENT_CRASH_AT="after_commit:0")
    assert killed.returncode == -9, killed.stderr
    refused = lab.cli("run", "t", **variables)
    assert refused.returncode == 4, refused.stderr
    assert "Traceback" not in refused.stderr, refused.stderr
    [line] = [s for s in refused.stderr.splitlines() if s.startswith("ninelives: error:")]
    assert why in line, line
    snapshot = lab.snapshot("t")
    assert [(s["tool"], s["status"]) for s in snapshot.status["steps"]] == [
        ("chat", "done"), ("lookup_note", "done"), ("write_artifact", "done")
    ]  # fmt: skip
    assert [e for e in snapshot.events if e["kind"] == "step_error"] == []
    done = lab.cli("run", "t")
    assert done.returncode == 0, done.stderr
    assert server.count() == 2  # one paid call per turn, none asked again
