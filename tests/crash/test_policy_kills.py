"""Step policies and resumable steps through the installed command, real processes
and real SIGKILLs, on SQLite and PostgreSQL: checkpointed progress across ten
kills, timeouts of a sleep and of a socket read, a backoff wait that outlives
its process, a permanent error, and sys.exit in a tool."""

from __future__ import annotations

import json
import random
import signal
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

TOOLS = """
import asyncio
import hashlib
import os
import signal
import socket
import sys
import time

from ninelives import PermanentError
from ninelives.tools import tool


@tool("chunks")
def chunks(step_input, ctx):
    # Processes chunks in order, logging each processing, checkpointing after each;
    # dies by SIGKILL after chunk KILL_AT is processed (before, or after, its checkpoint).
    progress = ctx.progress or {"next": 0, "digest": ""}
    start = progress["next"]
    kill_at = int(os.environ.get("KILL_AT", "-1"))
    after = os.environ.get("KILL_AFTER_CHECKPOINT") == "1"
    for i in range(progress["next"], step_input["n"]):
        with open(step_input["log"], "a", encoding="utf-8") as log:
            log.write(f"{ctx.attempt} {start} {i}\\n")
            log.flush()
            os.fsync(log.fileno())
        digest = hashlib.sha256(f"{progress['digest']}:{i}".encode()).hexdigest()
        if i == kill_at and not after:
            os.kill(os.getpid(), signal.SIGKILL)
        progress = {"next": i + 1, "digest": digest}
        ctx.checkpoint(progress)
        if i == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    return {"digest": progress["digest"], "resumed_from": (ctx.progress or {}).get("next")}


@tool("sleepy")
def sleepy(step_input, ctx):
    time.sleep(step_input["seconds"])
    return {"slept": True}


@tool("reader")
def reader(step_input, ctx):
    with socket.create_connection(("127.0.0.1", step_input["port"])) as conn:
        return {"got": conn.recv(10).decode()}


@tool("flaky")
def flaky(step_input, ctx):
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return {"attempt": ctx.attempt}


@tool("refused")
def refused(step_input, ctx):
    raise PermanentError("404: no such thing")


@tool("exits")
def exits(step_input, ctx):
    sys.exit(0)


@tool("cancelled")
def cancelled(step_input, ctx):
    # What a tool that runs async code gets when that code is cancelled.
    async def call():
        raise asyncio.CancelledError

    return asyncio.run(call())
"""


@pytest.fixture
def tools_lab(lab: Lab) -> Lab:
    lab.write("policytools.py", TOOLS)
    lab.base_env["NINELIVES_TOOLS"] = "policytools"
    return lab


def _plan(lab: Lab, name: str, steps: list[dict[str, object]], **defaults: object) -> str:
    plan: dict[str, object] = {"goal": name, "steps": steps}
    if defaults:
        plan["defaults"] = defaults
    lab.write_plan(plan, f"{name}.json")
    return f"{name}.json"


def _events(lab: Lab, task: str, kind: str) -> list[dict[str, Any]]:
    """The task's events of ``kind`` as exported, their data keys gathered under "data"."""
    found = []
    for event in lab.cli("export", task).jsonl():
        if event["kind"] == kind:
            data = {k: v for k, v in event.items() if k not in ("seq", "ts", "run", "kind", "step")}
            found.append({**event, "data": data})
    return found


@pytest.mark.slow
def test_checkpointed_chunks_survive_ten_kills_and_none_is_processed_twice(
    tools_lab: Lab,
) -> None:
    lab = tools_lab
    steps = [{"tool": "chunks", "input": {"n": 50, "log": "killed.log"}}]
    assert lab.cli("create", "killed", _plan(lab, "killed", steps)).returncode == 0
    steps = [{"tool": "chunks", "input": {"n": 50, "log": "clean.log"}}]
    assert lab.cli("create", "clean", _plan(lab, "clean", steps)).returncode == 0
    assert lab.cli("run", "clean").returncode == 0

    rng = random.Random()
    kills = sorted(rng.sample(range(50), 10))
    env = {"NINELIVES_MAX_RECOVERIES": "20"}
    for n, chunk in enumerate(kills):
        after = rng.random() < 0.5
        killed = lab.cli(
            "run", "killed", KILL_AT=str(chunk), KILL_AFTER_CHECKPOINT="1" if after else "0", **env
        )
        assert killed.returncode == -9, (n, chunk, killed.stderr)
    resumed = lab.cli("run", "killed", **env)
    assert resumed.returncode == 0, resumed.stderr

    # The output equals an uninterrupted run's.
    clean = lab.snapshot("clean").outputs[0]
    done = lab.snapshot("killed").outputs[0]
    assert done["digest"] == clean["digest"]
    # Each attempt started from the last committed progress, and nothing that
    # was checkpointed was processed again: a chunk is processed twice only
    # when the kill came between its processing and its checkpoint.
    text = (lab.root / "killed.log").read_text()
    lines = [tuple(map(int, line.split())) for line in text.splitlines()]
    processed = [i for _, _, i in lines]
    committed = [e["data"]["progress"]["next"] for e in _events(lab, "killed", "step_progress")]
    assert committed == list(range(1, 51))  # every chunk checkpointed once, in order
    assert lab.cli("status", "killed", "--json").json()["steps"][0]["progress"]["next"] == 50
    starts = {attempt: start for attempt, start, _ in lines}
    # A last kill after chunk 49's checkpoint leaves the final attempt nothing to
    # process: it logs no line (and starts at 50).
    finished_before_last_attempt = kills[-1] == 49 and after
    assert len(starts) == (10 if finished_before_last_attempt else 11)
    last = 0  # the progress committed before each attempt is where it started
    for event in lab.cli("export", "killed").jsonl():
        if event["kind"] == "step_progress":
            last = event["progress"]["next"]
        elif event["kind"] == "step_started":
            assert starts.get(event["attempt"], 50) == last, event
    twice = sorted({i for i in processed if processed.count(i) > 1})
    assert set(twice) <= set(kills)
    assert sorted(set(processed)) == list(range(50))
    assert len(processed) == 50 + len(twice)
    assert lab.cli("verify", "killed", **env).returncode == 0


@pytest.mark.slow
def test_a_tool_stuck_in_sleep_is_interrupted_at_its_timeout(tools_lab: Lab) -> None:
    lab = tools_lab
    steps = [{"tool": "sleepy", "input": {"seconds": 120}, "timeout": 1}]
    assert lab.cli("create", "t", _plan(lab, "t", steps, max_attempts=2)).returncode == 0
    began = time.monotonic()
    ran = lab.cli("run", "t", timeout=60)
    assert ran.returncode == 2, ran.stderr
    assert time.monotonic() - began < 30
    errors = _events(lab, "t", "step_error")
    assert [e["data"]["error"] for e in errors] == ["timeout after 1s"] * 2
    assert errors[0]["data"]["timeout"] == 1
    assert errors[1]["data"]["why"] == "attempt_limit"
    started = [e["ts"] for e in _events(lab, "t", "step_started")]
    assert all(e["ts"] - s >= 1 for e, s in zip(errors, started, strict=True))
    assert lab.cli("verify", "t").returncode == 0


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A real server on 127.0.0.1 that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_tool_stuck_in_a_socket_read_is_interrupted_at_its_timeout(
    tools_lab: Lab, silent_server: int
) -> None:
    lab = tools_lab
    steps = [{"tool": "reader", "input": {"port": silent_server}, "timeout": 1.5}]
    assert lab.cli("create", "t", _plan(lab, "t", steps, max_attempts=1)).returncode == 0
    began = time.monotonic()
    ran = lab.cli("run", "t", timeout=60)
    assert ran.returncode == 2, ran.stderr
    assert time.monotonic() - began < 30
    (error,) = _events(lab, "t", "step_error")
    assert error["data"]["error"] == "timeout after 1.5s"
    (failed,) = _events(lab, "t", "task_failed")
    assert failed["data"]["why"] == "attempt_limit"


@pytest.mark.slow
def test_a_backoff_wait_survives_a_kill(tools_lab: Lab) -> None:
    lab = tools_lab
    steps = [{"tool": "flaky", "input": {}, "backoff": {"base": 4, "cap": 4}}]
    assert lab.cli("create", "t", _plan(lab, "t", steps)).returncode == 0
    env = {"NINELIVES_BACKOFF": "0.5"}  # the suite turns waits off; this test needs them
    runner = lab.spawn("run", "t", **env)
    lab.wait_for("t", "step_error", 0)
    assert lab.kill(runner) == -9  # killed in the middle of its wait
    waiting = lab.cli("status", "t", "--json").json()["steps"][0]
    (announced,) = _events(lab, "t", "step_error")
    assert waiting["not_before"] == announced["data"]["retry_at"]
    resumed = lab.cli("run", "t", **env)
    assert resumed.returncode == 0, resumed.stderr
    (error,) = _events(lab, "t", "step_error")
    data = error["data"]
    assert 2 <= data["delay"] <= 4  # equal jitter: half to all of min(cap, base)
    assert data["retry_at"] == pytest.approx(error["ts"] + data["delay"], abs=0.05)
    second = _events(lab, "t", "step_started")[1]
    assert second["ts"] >= data["retry_at"]  # the restart did not retry early
    assert lab.snapshot("t").outputs[0] == {"attempt": 2}
    assert lab.cli("verify", "t").returncode == 0


@pytest.mark.slow
def test_a_worker_leaves_a_waiting_task_and_takes_it_when_due(tools_lab: Lab) -> None:
    lab = tools_lab
    steps = [{"tool": "flaky", "input": {}, "backoff": {"base": 3, "cap": 3}}]
    assert lab.cli("submit", "t", _plan(lab, "t", steps)).returncode == 0
    env = {"NINELIVES_BACKOFF": "0.5"}
    worker = lab.cli("worker", "--drain", "--poll", "0.2", timeout=60, **env)
    assert worker.returncode == 0, worker.stderr
    (error,) = _events(lab, "t", "step_error")
    second = _events(lab, "t", "step_started")[1]
    assert second["ts"] >= error["data"]["retry_at"]
    assert lab.cli("status", "t").json()["status"] == "done"


def test_a_permanent_error_fails_the_task_at_once(tools_lab: Lab) -> None:
    lab = tools_lab
    steps = [{"tool": "refused", "input": {}}]
    assert lab.cli("create", "t", _plan(lab, "t", steps, max_attempts=5)).returncode == 0
    ran = lab.cli("run", "t")
    assert ran.returncode == 2
    assert "permanent error" in ran.stderr
    (error,) = _events(lab, "t", "step_error")
    assert error["data"] == {
        "error": "PermanentError: 404: no such thing", "attempt": 1, "final": True,
        "why": "permanent",
    }  # fmt: skip
    (failed,) = _events(lab, "t", "task_failed")
    assert failed["data"]["why"] == "permanent"
    status = lab.cli("status", "t").json()
    assert status["steps"][0]["attempts"] == 1
    assert lab.cli("verify", "t").returncode == 0


def test_sys_exit_in_a_tool_is_a_step_error_not_the_exit_code(tools_lab: Lab) -> None:
    """sys.exit(0) in a tool made run exit 0, a done task's code, leaving the step
    running and saying nothing."""
    lab = tools_lab
    steps = [{"tool": "exits", "input": {}}]
    assert lab.cli("create", "t", _plan(lab, "t", steps, max_attempts=2)).returncode == 0
    ran = lab.cli("run", "t")
    assert ran.returncode == 2, ran.stderr
    assert [e["data"]["error"] for e in _events(lab, "t", "step_error")] == ["SystemExit: 0"] * 2
    assert lab.cli("status", "t").json()["status"] == "failed"
    assert lab.cli("verify", "t").returncode == 0


def test_asyncios_cancel_in_a_tool_is_a_step_error_not_a_traceback(tools_lab: Lab) -> None:
    """A tool whose async code was cancelled raised CancelledError out of run: a
    traceback, exit 1, the step left running for the next run to recover."""
    lab = tools_lab
    steps = [{"tool": "cancelled", "input": {}}]
    assert lab.cli("create", "t", _plan(lab, "t", steps, max_attempts=2)).returncode == 0
    ran = lab.cli("run", "t")
    assert ran.returncode == 2, ran.stderr
    assert "Traceback" not in ran.stderr
    assert [e["data"]["error"] for e in _events(lab, "t", "step_error")] == ["CancelledError: "] * 2
    assert lab.cli("status", "t").json()["status"] == "failed"
    assert lab.cli("verify", "t").returncode == 0


def test_a_worker_ends_a_tool_that_overruns_in_its_thread(tools_lab: Lab) -> None:
    """No signal interrupts a slot's thread: the timeout is journaled and the
    worker process exits (5), so the stuck attempt cannot land afterwards."""
    lab = tools_lab
    steps = [{"tool": "sleepy", "input": {"seconds": 120}, "timeout": 1}]
    assert lab.cli("submit", "t", _plan(lab, "t", steps, max_attempts=2)).returncode == 0
    began = time.monotonic()
    worker = lab.cli("worker", "--poll", "0.2", timeout=60)
    assert worker.returncode == 5, worker.stderr
    assert time.monotonic() - began < 30
    (error,) = _events(lab, "t", "step_error")
    assert error["data"]["error"] == "timeout after 1s"
    status = lab.cli("status", "t").json()
    assert status["steps"][0]["status"] == "pending"
    assert json.dumps(status)  # readable, and verify agrees with the journal
    assert lab.cli("verify", "t").returncode == 0


def test_a_worker_whose_overrunning_tool_was_cancelled_says_what_it_journaled(
    tools_lab: Lab,
) -> None:
    """A cancel that lands while a slot's tool hangs: at the timeout the worker
    journals the attempt's ``step_error`` (what a runner owes after a cancel)
    and exits 5. It said "could not journal the timeout", which it had."""
    lab = tools_lab
    steps = [{"tool": "sleepy", "input": {"seconds": 120}, "timeout": 2}]
    assert lab.cli("submit", "t", _plan(lab, "t", steps, max_attempts=2)).returncode == 0
    worker = lab.spawn("worker", "--poll", "0.2")
    lab.wait_for("t", "step_started", 0)
    assert lab.cli("cancel", "t").returncode == 0
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 5, err
    assert "could not journal" not in err, err
    (error,) = _events(lab, "t", "step_error")
    assert error["data"]["error"] == "timeout after 2s"
    assert lab.cli("status", "t").json()["status"] == "cancelled"
    assert lab.cli("verify", "t").returncode == 0


def test_a_cancel_ends_a_slots_backoff_wait_at_once(tools_lab: Lab) -> None:
    """A slot sleeps through a backoff no longer than ``--poll`` itself. A cancel
    that lands meanwhile releases the task then, not when the wait is over (up to
    an hour with ``--poll 3600``): the one slot goes on with the next task, and the
    cancelled step is never attempted again."""
    lab = tools_lab
    steps = [{"tool": "flaky", "input": {}, "backoff": {"base": 60, "cap": 60}}]
    assert lab.cli("submit", "t", _plan(lab, "t", steps)).returncode == 0
    quick = [{"tool": "sleepy", "input": {"seconds": 0}}]
    worker = lab.spawn(
        "worker", "--concurrency", "1", "--group-commit", "--poll", "120",
        NINELIVES_BACKOFF="0.5",
    )  # fmt: skip
    lab.wait_for("t", "step_error", 0)  # the slot now sleeps 30-60 s in its wait
    assert lab.cli("submit", "u", _plan(lab, "u", quick)).returncode == 0
    assert lab.cli("cancel", "t").returncode == 0
    lab.wait_for("u", "task_done", timeout=10)
    assert lab.kill(worker, signal.SIGTERM) == 0
    assert len(_events(lab, "t", "step_started")) == 1
    assert lab.cli("status", "t").json()["status"] == "cancelled"
    assert lab.cli("verify", "--all").returncode == 0
