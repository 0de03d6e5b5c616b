"""An agent stopped by ``max_turns`` or ``max_calls`` has a way on, the one ``run``
names: ``retry`` grants its budget again from where it stopped, journaled and
verify-clean, and no committed model call is asked again."""

from __future__ import annotations

from typing import Any

import pytest

from ninelives.testing import Lab
from ninelives.testing.fakellm import Turn, fake_model_server

pytestmark = pytest.mark.crash

FETCH = ("fetch", {"path": "input/notes.txt"})
ANSWER = "Enough."


def setup(lab: Lab, **limits: int) -> None:
    lab.write("input/notes.txt", "Alpha\n")
    plan: dict[str, Any] = {"goal": "Read", "agent": {"tools": ["fetch"], **limits}}
    lab.write_plan(plan)
    assert lab.cli("create", "t", "plan.json").returncode == 0


def env_for(url: str) -> dict[str, str]:
    return {"NINELIVES_LLM": "openai", "NINELIVES_LLM_URL": url + "/v1", "NINELIVES_LLM_MODEL": "m"}


@pytest.mark.parametrize(
    ("limits", "script", "limit"),
    [
        (
            {"max_turns": 2},
            (Turn(calls=[FETCH]), Turn(calls=[FETCH]), Turn(text=ANSWER)),
            "max_turns",
        ),
        ({"max_calls": 1}, (Turn(calls=[FETCH, FETCH]), Turn(text=ANSWER)), "max_calls"),
    ],
)
def test_retry_grants_a_stopped_agent_a_new_budget(
    lab: Lab, limits: dict[str, int], script: tuple[Turn, ...], limit: str
) -> None:
    setup(lab, **limits)
    with fake_model_server(*script, by_turn=True) as fake:
        env = env_for(fake.url)
        stopped = lab.cli("run", "t", **env)
        assert stopped.returncode == 2, stopped.stderr
        assert limit in stopped.stderr
        again = lab.cli("run", "t", **env)
        assert again.returncode == 2
        assert "ninelives retry t" in again.stderr
        assert lab.cli("verify", "t").returncode == 0
        retried = lab.cli("retry", "t")
        assert retried.returncode == 0, retried.stderr
        assert lab.cli("verify", "t").returncode == 0
        done = lab.cli("run", "t", **env)
        assert done.returncode == 0, done.stderr
        turns = fake.turns()
    assert turns == list(range(len(script)))  # the reply that hit the limit is not asked again
    snapshot = lab.snapshot("t")
    assert snapshot.status["status"] == "done"
    last = snapshot.status["steps"][-1]
    assert snapshot.outputs[last["idx"]]["text"] == ANSWER
    retries = [e for e in snapshot.events if e["kind"] == "task_retried"]
    assert len(retries) == 1
    assert retries[0]["step"] is None
    verified = lab.cli("verify", "t")
    assert verified.returncode == 0, verified.stdout
    assert lab.cli("retry", "t").returncode == 4  # done: nothing to retry


def test_retry_of_a_failed_turn_still_retries_the_turn(lab: Lab) -> None:
    """A turn that failed its attempts (the model server down) is a failed step:
    retried as before, asked again."""
    setup(lab)
    with fake_model_server("http500") as fake:
        failed = lab.cli("run", "t", AGENT_MAX_ATTEMPTS="1", **env_for(fake.url))
    assert failed.returncode == 2
    with fake_model_server(Turn(text=ANSWER)) as fake:
        assert lab.cli("retry", "t").returncode == 0
        done = lab.cli("run", "t", **env_for(fake.url))
        assert done.returncode == 0, done.stderr
    assert lab.cli("verify", "t").returncode == 0
