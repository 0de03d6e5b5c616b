"""A plan's ``defaults`` reach every turn of its agent and every step the turns
append: ``on_unknown`` of a model-called effect killed after it ran, a turn's
``timeout`` and ``max_attempts``, and the appended policies under the plan's digest."""

from __future__ import annotations

import signal
import sqlite3
from typing import Any

import pytest

from ninelives.testing import Lab
from ninelives.testing.fakellm import Turn, fake_model_server

pytestmark = pytest.mark.crash

#: A mail is a line in mails.txt, outside every ninelives process: once written it
#: stays written, whatever happens to the process that wrote it.
TOOLS = """
from ninelives.tools import tool

@tool("send_mail", schema={"type": "object", "properties": {"to": {"type": "string"}},
                           "required": ["to"], "additionalProperties": False})
def send_mail(step_input, ctx):
    with open("mails.txt", "a", encoding="utf-8") as mails:
        mails.write(f"{ctx.idem_key} {step_input['to']}\\n")
    return {"sent": True}

@tool("flaky", schema={"type": "object"})
def flaky(step_input, ctx):
    raise RuntimeError("the service is down")
"""
ANSWER = "Mail sent."
SCRIPT = (Turn(calls=[("send_mail", {"to": "ops@example.org"})]), Turn(text=ANSWER))


def setup(lab: Lab, defaults: dict[str, Any] | None, tools: list[str] | None = None) -> None:
    lab.write("labmail.py", TOOLS)
    plan: dict[str, Any] = {
        "goal": "Tell ops",
        "agent": {"tools": tools or ["send_mail"], "max_turns": 3},
    }
    if defaults is not None:
        plan["defaults"] = defaults
    lab.write_plan(plan)
    created = lab.cli("--tools", "labmail", "create", "t", "plan.json")
    assert created.returncode == 0, created.stderr


def env_for(url: str, **extra: str) -> dict[str, str]:
    return {
        "NINELIVES_LLM": "openai",
        "NINELIVES_LLM_URL": url + "/v1",
        "NINELIVES_LLM_MODEL": "m1",
        **extra,
    }


def mails(lab: Lab) -> list[str]:
    path = lab.root / "mails.txt"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def test_defaults_refuse_a_model_called_effect_killed_after_it_ran(lab: Lab) -> None:
    """Killed after the mail went out and before its ``done`` commit: with the
    plan's ``on_unknown: refuse`` the call is blocked, not sent again; a person says
    it happened and the agent goes on to its answer. One mail, verify clean."""
    setup(lab, {"on_unknown": "refuse"})
    with fake_model_server(*SCRIPT, by_turn=True) as fake:
        env = env_for(fake.url)
        killed = lab.cli("--tools", "labmail", "run", "t", AGENT_CRASH_AT="after_effect:1", **env)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        assert mails(lab) == ["t-1 ops@example.org"]
        blocked = lab.cli("--tools", "labmail", "run", "t", **env)
        assert blocked.returncode == 8, blocked.stderr
        assert "ninelives resolve t 1" in blocked.stderr
        assert mails(lab) == ["t-1 ops@example.org"]
        resolved = lab.cli("resolve", "t", "1", "--done", '{"sent": true}')
        assert resolved.returncode == 0, resolved.stderr
        done = lab.cli("--tools", "labmail", "run", "t", **env)
        assert done.returncode == 0, done.stderr
    assert mails(lab) == ["t-1 ops@example.org"]
    snapshot = lab.snapshot("t")
    assert snapshot.status["status"] == "done"
    assert snapshot.outputs[2]["text"] == ANSWER
    verified = lab.cli("verify", "t")
    assert verified.returncode == 0, verified.stdout


def test_without_defaults_the_killed_call_runs_again(lab: Lab) -> None:
    """The negative control: the same kill with the tool's own ``rerun`` sends the
    mail twice, so the kill above lands after the effect."""
    setup(lab, None)
    with fake_model_server(*SCRIPT, by_turn=True) as fake:
        env = env_for(fake.url)
        killed = lab.cli("--tools", "labmail", "run", "t", AGENT_CRASH_AT="after_effect:1", **env)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        resumed = lab.cli("--tools", "labmail", "run", "t", **env)
        assert resumed.returncode == 0, resumed.stderr
    assert mails(lab) == ["t-1 ops@example.org", "t-1 ops@example.org"]


def test_defaults_bound_a_turn_by_timeout_and_max_attempts(lab: Lab) -> None:
    """A model that never answers: the plan's ``timeout`` interrupts each turn
    (not NINELIVES_LLM_TIMEOUT's 60 s) and its ``max_attempts`` ends the task."""
    setup(lab, {"timeout": 1, "max_attempts": 2, "backoff": False})
    with fake_model_server("hang", hang_seconds=5) as fake:
        ran = lab.cli(
            "--tools", "labmail", "run", "t", **env_for(fake.url, NINELIVES_LLM_TIMEOUT="60")
        )
        asked = fake.count()
    assert ran.returncode == 2, ran.stderr
    assert asked == 2
    errors = [e for e in lab.snapshot("t").events if e["kind"] == "step_error"]
    assert [e["error"] for e in errors] == ["timeout after 1s", "timeout after 1s"]
    assert lab.cli("verify", "t").returncode == 0


def test_defaults_bound_the_attempts_of_an_appended_call(lab: Lab) -> None:
    setup(lab, {"max_attempts": 1}, tools=["flaky"])
    with fake_model_server(Turn(calls=[("flaky", {})]), Turn(text=ANSWER), by_turn=True) as fake:
        ran = lab.cli("--tools", "labmail", "run", "t", **env_for(fake.url))
    assert ran.returncode == 2, ran.stderr
    errors = [e for e in lab.snapshot("t").events if e["kind"] == "step_error"]
    assert [(e["step"], e["attempt"], e.get("why")) for e in errors] == [(1, 1, "attempt_limit")]
    assert lab.cli("verify", "t").returncode == 0


def test_the_plan_digest_covers_the_policy_of_appended_steps(sqlite_lab: Lab) -> None:
    """A hand edit turning an appended call's ``refuse`` back into the tool's own
    ``rerun`` is caught like an edited input: verify names ``plan_integrity``."""
    lab = sqlite_lab
    setup(lab, {"on_unknown": "refuse"})
    with fake_model_server(*SCRIPT, by_turn=True) as fake:
        ran = lab.cli("--tools", "labmail", "run", "t", **env_for(fake.url))
    assert ran.returncode == 0, ran.stderr
    assert lab.cli("verify", "t").returncode == 0
    assert lab.sqlite_path is not None
    with sqlite3.connect(lab.sqlite_path) as conn:
        (policy,) = conn.execute(
            "SELECT policy FROM steps WHERE task_id = 't' AND idx = 1"
        ).fetchone()
        assert policy == '{"on_unknown":"refuse"}'
        conn.execute("UPDATE steps SET policy = NULL WHERE task_id = 't' AND idx = 1")
    verified = lab.cli("verify", "t")
    assert verified.returncode == 5  # the documented code of a plan changed since create
    assert "plan_integrity" in verified.stdout


def test_defaults_probe_needs_a_probe_on_every_agent_tool(lab: Lab) -> None:
    lab.write("labmail.py", TOOLS)
    lab.write_plan({"goal": "g", "defaults": {"on_unknown": "probe"},
                    "agent": {"tools": ["send_mail"]}})  # fmt: skip
    created = lab.cli("--tools", "labmail", "create", "t", "plan.json")
    assert created.returncode == 4
    assert "agent tool 'send_mail'" in created.stderr
    assert lab.cli("status", "t").returncode == 1
