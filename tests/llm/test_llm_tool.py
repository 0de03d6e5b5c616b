"""The ``llm`` tool through the installed CLI, against a loopback model server,
killed at each crash point of its step and resumed."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ninelives.testing import Lab
from ninelives.testing.fakellm import FakeModelServer, Turn, fake_model_server

pytestmark = pytest.mark.crash

SECRET = "sk-planted-secret-9876543210"
NOTES = "Alpha\nBeta\nGamma\nDelta\n"
PLAN = {
    "goal": "Ask a model about the notes",
    "steps": [
        {"tool": "fetch", "input": {"path": "input/notes.txt"}},
        {"tool": "llm", "input": {"prompt": "Summarize.", "from": [0], "system": "Be brief."}},
        {"tool": "write_artifact", "input": {"from": 1}},
    ],
}
ANSWER = "Three letters of the Greek alphabet."


def engine_env(engine: str, fake: FakeModelServer) -> dict[str, str]:
    url = fake.url + "/v1" if engine == "openai" else fake.url
    return {
        "NINELIVES_LLM": engine,
        "NINELIVES_LLM_URL": url,
        "NINELIVES_LLM_MODEL": "m1",
        "NINELIVES_LLM_API_KEY": SECRET,
    }


def setup(lab: Lab) -> None:
    lab.write("input/notes.txt", NOTES)
    lab.write_plan(PLAN)
    assert lab.cli("create", "t", "plan.json").returncode == 0


@pytest.mark.parametrize("engine", ["ollama", "openai"])
@pytest.mark.slow
def test_llm_step_output_and_request(lab: Lab, engine: str) -> None:
    setup(lab)
    with fake_model_server(Turn(text=ANSWER, input_tokens=40, output_tokens=8)) as fake:
        result = lab.cli("run", "t", **engine_env(engine, fake))
        assert result.returncode == 0, result.stderr
        [request] = fake.requests
    output = lab.snapshot("t").outputs[1]
    assert output["text"] == ANSWER
    assert (output["engine"], output["model"]) == (engine, "m1")
    assert output["usage"] == {"input_tokens": 40, "output_tokens": 8}
    assert output["ms"] >= 0
    messages = request.body["messages"]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1]["role"] == "user"
    assert messages[1]["content"] == f"Output of step 0:\n{NOTES}\n\nSummarize."
    assert (lab.artifacts_dir / "t-2.md").read_text() == ANSWER


@pytest.mark.parametrize(
    ("point", "requests"),
    [("before_effect", 1), ("after_effect", 2), ("after_commit", 1)],
)
@pytest.mark.slow
def test_a_committed_model_call_is_never_asked_again(lab: Lab, point: str, requests: int) -> None:
    """A call killed before its ``done`` commit is asked again (at-least-once:
    ``after_effect`` is the negative control that shows the kill lands after the
    request); one committed is never asked again."""
    setup(lab)
    with fake_model_server(Turn(text=ANSWER)) as fake:
        env = engine_env("openai", fake)
        killed = lab.cli("run", "t", AGENT_CRASH_AT=f"{point}:1", **env)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        resumed = lab.cli("run", "t", **env)
        assert resumed.returncode == 0, resumed.stderr
        assert fake.count("/chat/completions") == requests
    snapshot = lab.snapshot("t")
    assert snapshot.outputs[1]["text"] == ANSWER
    assert lab.artifacts() == {"t-2.md": ANSWER}
    assert lab.cli("verify", "t").returncode == 0


@pytest.mark.parametrize("fault", ["http500", "garbage", "die"])
@pytest.mark.slow
def test_a_failed_exchange_is_a_step_error_then_a_failed_task(lab: Lab, fault: str) -> None:
    setup(lab)
    with fake_model_server(fault) as fake:
        result = lab.cli("run", "t", AGENT_MAX_ATTEMPTS="2", **engine_env("openai", fake))
        assert fake.count() == 2
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [e for e in lab.snapshot("t").events if e["kind"] == "step_error"]
    assert len(errors) == 2
    assert all(e["error"].startswith("ToolError: openai at http://127.0.0.1:") for e in errors)
    assert lab.cli("verify", "t").returncode == 0


@pytest.mark.slow
def test_the_api_key_is_stored_and_printed_nowhere(lab: Lab) -> None:
    setup(lab)
    outputs = []
    with fake_model_server("http500", Turn(text=ANSWER)) as fake:
        env = engine_env("ollama", fake)
        for args in (("run", "t"), ("run", "t"), ("status", "t", "--outputs"), ("export", "t")):
            result = lab.cli(*args, **env)
            outputs += [result.stdout, result.stderr]
        assert fake.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    assert lab.snapshot("t").status["status"] == "done"
    assert not any(SECRET in text for text in outputs)
    if lab.sqlite_path is not None:
        for path in Path(lab.sqlite_path).parent.glob(Path(lab.sqlite_path).name + "*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path


def test_plan_checks_llm_input_at_create(lab: Lab) -> None:
    lab.write_plan({"steps": [{"tool": "llm", "input": {"prompt": ""}}]})
    result = lab.cli("create", "bad", "plan.json")
    assert result.returncode == 4
    assert "prompt" in result.stderr
    lab.write_plan({"steps": [{"tool": "llm", "input": {"prompt": "x", "engine": "gpt"}}]})
    assert lab.cli("create", "bad", "plan.json").returncode == 4
    lab.write_plan({"steps": [{"tool": "llm", "input": {"prompt": "x", "from": [0]}}]})
    assert lab.cli("create", "bad", "plan.json").returncode == 4
