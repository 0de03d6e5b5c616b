"""``ninelives retry`` and the wait between attempts, through the installed command."""

from __future__ import annotations

import socket

from ninelives.testing import Lab

PLAN = {"goal": "read a file", "steps": [{"tool": "fetch", "input": {"path": "notes.txt"}}]}


def _failed(lab: Lab, task_id: str = "t") -> None:
    lab.write_plan(PLAN)
    assert lab.cli("create", task_id, "plan.json").returncode == 0
    ran = lab.cli("run", task_id)
    assert ran.returncode == 2, ran.stderr
    assert "ninelives retry" in lab.cli("run", task_id).stderr  # says what moves it on


def test_retry_moves_a_failed_task_back_and_it_finishes(lab: Lab) -> None:
    _failed(lab)
    retried = lab.cli("retry", "t")
    assert retried.returncode == 0, retried.stderr
    assert "pending again" in retried.stdout
    status = lab.cli("status", "t").json()
    assert status["status"] == "pending"
    assert status["steps"] == [{"idx": 0, "tool": "fetch", "status": "pending", "attempts": 0}]
    assert lab.cli("export", "t").jsonl()[-1]["kind"] == "task_retried"
    lab.write("notes.txt", "now it exists\n")
    assert lab.cli("run", "t").returncode == 0
    assert lab.cli("status", "t").json()["steps"][0]["attempts"] == 1
    assert lab.cli("verify", "t").returncode == 0


def test_retry_refuses_a_task_that_has_not_failed(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    before = lab.fingerprint("t")
    refused = lab.cli("retry", "t")
    assert refused.returncode == 4
    assert refused.stderr == (
        "ninelives: error: task 't' is pending, not failed: only a failed task is retried\n"
    )
    assert lab.fingerprint("t") == before
    assert lab.cli("retry", "nope").returncode == 1


def test_retry_step_guard_names_the_failed_step(lab: Lab) -> None:
    _failed(lab)
    before = lab.fingerprint("t")
    wrong = lab.cli("retry", "t", "--step", "3")
    assert wrong.returncode == 4
    assert "step 0 has" in wrong.stderr
    assert lab.fingerprint("t") == before
    assert lab.cli("retry", "t", "--step", "0").returncode == 0


def test_retry_is_refused_with_3_while_a_live_runner_holds_the_task(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    runner = lab.spawn("run", "t", AGENT_STEP_DELAY="60")
    lab.wait_for("t", "step_started", 0)
    busy = lab.cli("retry", "t")
    assert busy.returncode == 3, busy.stderr
    assert busy.stderr.count("\n") == 1
    assert lab.kill(runner) == -9


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_attempts_of_a_failing_step_wait_longer_each_time(sqlite_lab: Lab) -> None:
    """A refused Ollama connection: the three attempts are spaced by the backoff
    (with equal jitter, 0.1-0.2 s, then 0.2-0.4 s), not thrown away within a
    millisecond; each wait is the one its step_error announced."""
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    env = {
        "AGENT_LLM": "ollama",
        "OLLAMA_URL": f"http://127.0.0.1:{_closed_port()}",
        "NINELIVES_BACKOFF": "0.2",
    }
    ran = lab.cli("run", "t", **env)
    assert ran.returncode == 2
    events = lab.cli("export", "t").jsonl()
    errors = [e["ts"] for e in events if e["kind"] == "step_error"]
    starts = [e["ts"] for e in events if e["kind"] == "step_started" and e["step"] == 1]
    assert len(errors) == len(starts) == 3
    waits = [starts[1] - errors[0], starts[2] - errors[1]]
    assert waits[0] >= 0.1
    assert waits[1] >= 0.2
    announced = [e for e in events if e["kind"] == "step_error"]
    assert 0.1 <= announced[0]["delay"] <= 0.2
    assert 0.2 <= announced[1]["delay"] <= 0.4
    assert starts[1] >= announced[0]["retry_at"]
    assert starts[2] >= announced[1]["retry_at"]


def test_a_bad_backoff_value_is_bad_input(lab: Lab) -> None:
    lab.guide_setup()
    for value in ("soon", "-1", "nan", "31"):
        result = lab.cli("create", "t", "plan.json", NINELIVES_BACKOFF=value)
        assert result.returncode == 4, value
        assert result.stderr.startswith("ninelives: error: NINELIVES_BACKOFF"), result.stderr
    assert lab.cli("create", "t", "plan.json", NINELIVES_BACKOFF="0").returncode == 0
