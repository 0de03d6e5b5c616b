"""``ninelives cancel``, ``fork`` and plan integrity through the installed
command: real processes, a real cancel from another process while a step
sleeps, real workers, and hand edits of the real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import pytest

from ninelives.store import is_postgres_url
from ninelives.testing import Lab

#: A tool that logs each call to calls.log (so a test counts the tool runs), sleeps
#: as its input asks, and declares a version.
TICK = """
import time
from ninelives.tools import tool

@tool("tick", version="2")
def tick(step_input, ctx):
    with open("calls.log", "a", encoding="utf-8") as log:
        log.write(f"{ctx.task_id} {ctx.step}\\n")
    time.sleep(step_input.get("sleep", 0))
    return {"text": f"{ctx.task_id}:{ctx.step}"}
"""
TICKS = {
    "goal": "three steps, the last one publishes",
    "steps": [
        {"tool": "tick", "input": {"n": 0}},
        {"tool": "tick", "input": {"n": 1}},
        {"tool": "write_artifact", "input": {"from": 1}},
    ],
}
TOOLS = {"NINELIVES_TOOLS": "ticktools"}


def _calls(lab: Lab) -> list[str]:
    path = lab.root / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


def _kinds(lab: Lab, task_id: str) -> list[tuple[str, Any]]:
    return [(e["kind"], e["step"]) for e in lab.cli("export", task_id).jsonl()]


def _edit(lab: Lab, statement: str, *params: Any) -> None:
    """Change the database behind ninelives' back, with the backend's own driver."""
    if is_postgres_url(lab.db):
        import psycopg

        with psycopg.connect(lab.db, autocommit=True) as conn:
            conn.execute(statement.replace("?", "%s"), params)  # type: ignore[arg-type]
        return
    assert lab.sqlite_path is not None
    conn = sqlite3.connect(lab.sqlite_path)
    try:
        conn.execute(statement, params)
        conn.commit()
    finally:
        conn.close()


@pytest.mark.slow
def test_cancel_from_another_process_stops_the_runner_before_its_next_step(lab: Lab) -> None:
    lab.write("ticktools.py", TICK)
    lab.write_plan({"goal": "slow", "steps": [{"tool": "tick", "input": {"sleep": 2}}] * 3})
    assert lab.cli("create", "t", "plan.json", **TOOLS).returncode == 0
    runner = lab.spawn("run", "t", **TOOLS)
    lab.wait_for("t", "step_started", 0)
    cancelled = lab.cli("cancel", "t", "--reason", "wrong input")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "cancelled" in cancelled.stdout
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 9, err
    assert err.strip().splitlines()[-1].startswith("ninelives: error: task 't' was cancelled")
    assert _calls(lab) == ["t 0"]  # no further step started
    status = lab.cli("status", "t", "--json").json()
    assert status["status"] == "cancelled"
    # The step in flight had its effect: its output is committed, truthfully.
    assert [s["status"] for s in status["steps"]] == ["done", "pending", "pending"]
    kinds = _kinds(lab, "t")
    at = kinds.index(("task_cancelled", None))
    assert ("step_started", 1) not in kinds
    assert kinds[at + 1 :] == [("step_finished", 0)]
    exported = lab.cli("export", "t").jsonl()
    assert exported[at]["reason"] == "wrong input"
    assert exported[at]["status"] == "running"
    assert lab.cli("verify", "t").returncode == 0
    # A later run exits 9 at once and writes nothing; cancelling again changes nothing.
    before = lab.fingerprint("t")
    again = lab.cli("run", "t", **TOOLS)
    assert again.returncode == 9
    assert again.stderr.count("\n") == 1
    assert lab.cli("cancel", "t").stdout == "task 't' was already cancelled\n"
    assert lab.fingerprint("t") == before
    assert _calls(lab) == ["t 0"]


def _stored(lab: Lab) -> dict[str, Any]:
    """The fingerprint of task t but SQLite's shared-memory index (``-shm``), in
    which a read takes a read mark while another process has the database open."""
    found = lab.fingerprint("t")
    found["files"].pop("state.db-shm", None)
    return found


@pytest.mark.slow
def test_a_later_run_of_a_cancelled_task_is_9_while_its_runner_holds_it(lab: Lab) -> None:
    """A runner inside a slow step holds the task until its next commit finds the
    cancel. Meanwhile a later ``run`` is exit 9 at once, writing nothing, as for
    any cancelled task (it was exit 3 on SQLite, "being run by another process",
    for as long as the runner held it)."""
    lab.write("ticktools.py", TICK)
    lab.write_plan({"goal": "slow", "steps": [{"tool": "tick", "input": {"sleep": 60}}]})
    assert lab.cli("create", "t", "plan.json", **TOOLS).returncode == 0
    runner = lab.spawn("run", "t", **TOOLS)
    lab.wait_for("t", "step_started", 0)
    assert lab.cli("cancel", "t").returncode == 0
    before = _stored(lab)
    again = lab.cli("run", "t", **TOOLS)
    assert again.returncode == 9, again
    assert again.stderr.startswith("ninelives: error: task 't' was cancelled"), again.stderr
    assert again.stderr.count("\n") == 1
    assert _stored(lab) == before
    # retry does not apply to a cancelled task (exit 4), whoever still holds it.
    refused = lab.cli("retry", "t")
    assert refused.returncode == 4, refused
    assert "is cancelled" in refused.stderr
    assert _stored(lab) == before
    assert runner.poll() is None  # still in its step: what answered was the cancel, not its end
    runner.kill()
    runner.communicate(timeout=30)


@pytest.mark.slow
def test_a_cancel_ends_a_runners_backoff_wait(lab: Lab) -> None:
    """A runner asleep in a minute's backoff stops with 9 soon after a cancel (the
    wait asks every 0.5 s), writing nothing; a later run is 9 too."""
    lab.write_plan({
        "goal": "fails, then waits a minute",
        "defaults": {"backoff": {"base": 60, "cap": 60}},
        "steps": [{"tool": "fetch", "input": {"path": "input/missing.txt"}}],
    })  # fmt: skip
    assert lab.cli("create", "t", "plan.json").returncode == 0
    runner = lab.spawn("run", "t", NINELIVES_BACKOFF="0.5")
    lab.wait_for("t", "step_error", 0)
    assert lab.cli("cancel", "t").returncode == 0
    # The task as the commands show it (its process's last close checkpoints the
    # WAL into the file, which moves its bytes, not its rows).
    before = [lab.cli(*args).stdout for args in (("status", "t", "--outputs"), ("export", "t"))]
    _, err = runner.communicate(timeout=30)  # long before the minute is over
    assert runner.returncode == 9, err
    assert lab.cli("run", "t").returncode == 9
    after = [lab.cli(*args).stdout for args in (("status", "t", "--outputs"), ("export", "t"))]
    assert after == before


def test_a_worker_releases_a_cancelled_task_and_goes_on(lab: Lab) -> None:
    lab.write("ticktools.py", TICK)
    lab.write_plan({"goal": "slow", "steps": [{"tool": "tick", "input": {"sleep": 2}}] * 3})
    lab.write_plan({"goal": "quick", "steps": [{"tool": "tick", "input": {}}] * 2}, "quick.json")
    assert lab.cli("submit", "slow", "plan.json", **TOOLS).returncode == 0
    time.sleep(0.01)  # created later: claimed after "slow"
    assert lab.cli("submit", "quick", "quick.json", **TOOLS).returncode == 0
    worker = lab.spawn("worker", "--drain", "--poll", "0.1", **TOOLS)
    lab.wait_for("slow", "step_started", 0)
    assert lab.cli("cancel", "slow").returncode == 0
    _, err = worker.communicate(timeout=120)
    assert worker.returncode == 0, err  # the worker does not exit 9: it goes on
    assert "action=cancelled task=slow" in err
    assert lab.cli("status", "quick", "--json").json()["status"] == "done"
    assert lab.cli("status", "slow", "--json").json()["status"] == "cancelled"
    assert _calls(lab) == ["slow 0", "quick 0", "quick 1"]
    assert lab.cli("verify", "--all").returncode == 0


def test_fork_from_each_step_reuses_the_outputs_before_it(lab: Lab) -> None:
    lab.write("ticktools.py", TICK)
    lab.write_plan(TICKS)
    assert lab.cli("create", "src", "plan.json", **TOOLS).returncode == 0
    assert lab.cli("run", "src", **TOOLS).returncode == 0
    assert _calls(lab) == ["src 0", "src 1"]
    source = lab.fingerprint("src")
    for start in (0, 1, 2):
        fork = f"fork{start}"
        forked = lab.cli("fork", "src", fork, "--from", str(start))
        assert forked.returncode == 0, forked.stderr
        assert f"{start} step(s) copied done" in forked.stdout
        before = len(_calls(lab))
        ran = lab.cli("run", fork, **TOOLS)
        assert ran.returncode == 0, ran.stderr
        # No tool runs for the steps before --from: their outputs are reused.
        assert _calls(lab)[before:] == [f"{fork} {i}" for i in range(start, 2)]
        started = [e for e in lab.cli("export", fork).jsonl() if e["kind"] == "step_started"]
        assert [e["step"] for e in started] == list(range(start, 3))
        assert all(e["tool_version"] == "2" for e in started if e["tool"] == "tick")
        forked_event = lab.cli("export", fork).jsonl()[1]
        assert (forked_event["kind"], forked_event["source"], forked_event["from"]) == (
            "task_forked", "src", start,
        )  # fmt: skip
        # The fork's artifact has its own key: a file of its own beside the source's.
        text = "src:1" if start == 2 else f"{fork}:1"
        assert lab.artifacts()[f"{fork}-2.md"] == text
    assert lab.artifacts()["src-2.md"] == "src:1"
    assert lab.cli("verify", "--all", "--artifacts", "artifacts").returncode == 0
    assert lab.fingerprint("src")["tasks"] == source["tasks"]  # the source is untouched


def test_fork_and_cancel_refuse_bad_input_with_one_line_and_change_nothing(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    before = lab.fingerprint("t")
    cases = [
        (("cancel", "nope"), 1),
        (("fork", "nope", "f", "--from", "0"), 1),
        (("fork", "t", "../x", "--from", "0"), 4),
        (("fork", "t", "T", "--from", "0"), 4),  # exists, regardless of case
        (("fork", "t", "f", "--from", "x"), 4),
        (("fork", "t", "f", "--from", "-1"), 4),
        (("fork", "t", "f", "--from", "1"), 4),  # step 0 is not done
        (("fork", "t", "f"), 4),
        (("cancel", "t", "--reason", "x" * 1001), 4),
    ]
    for args, code in cases:
        result = lab.cli(*args)
        assert result.returncode == code, (args, result.stderr)
        assert result.stderr.count("\n") == 1, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert lab.fingerprint("t") == before
    assert lab.cli("run", "t").returncode == 0
    done = lab.cli("cancel", "t")
    assert done.returncode == 4
    assert "is done" in done.stderr


def test_a_plan_edited_by_hand_is_refused_by_run_and_verify(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("create", "other", "plan.json").returncode == 0
    _edit(
        lab, "UPDATE steps SET input = ? WHERE task_id = 't' AND idx = 0", '{"path":"/etc/hosts"}'
    )
    before = lab.fingerprint("t")
    refused = lab.cli("run", "t")
    assert refused.returncode == 5, refused.stderr
    assert refused.stderr.count("\n") == 1
    assert "task 't' was changed after it was created" in refused.stderr
    assert lab.fingerprint("t") == before  # nothing written, no effect
    assert not lab.artifacts()
    verified = lab.cli("verify", "--all")
    assert verified.returncode == 5
    assert "t: plan_integrity:" in verified.stdout
    assert "'t'" in verified.stderr
    assert lab.cli("run", "other").returncode == 0  # other tasks are not affected


def test_fork_of_an_agent_task_runs_its_turn_again(lab: Lab) -> None:
    """Forking from a model turn drops the steps that turn appended: the fork asks
    the model again, and its reply appends them anew (the stub engine here)."""
    lab.write("input/notes.txt", "Alpha ships on Monday.\nBeta needs a review.\n")
    lab.write_plan(
        {
            "goal": "Write a short report on the notes in input/",
            "steps": [{"tool": "fetch", "input": {"path": "input/notes.txt"}}],
            "agent": {"tools": ["fetch", "write_artifact"], "max_turns": 8},
        }
    )
    assert lab.cli("create", "report", "plan.json").returncode == 0
    assert lab.cli("run", "report").returncode == 0
    source = lab.cli("status", "report", "--json").json()
    assert [s["tool"] for s in source["steps"]] == ["fetch", "agent", "write_artifact", "agent"]
    forked = lab.cli("fork", "report", "again", "--from", "1")
    assert forked.returncode == 0, forked.stderr
    assert "1 step(s) copied done, 1 to run" in forked.stdout  # the turn's calls are left out
    assert lab.cli("run", "again").returncode == 0
    again = lab.cli("status", "again", "--json").json()
    assert [s["tool"] for s in again["steps"]] == ["fetch", "agent", "write_artifact", "agent"]
    assert again["status"] == "done"
    assert sorted(lab.artifacts()) == ["again-2+report.md", "report-2+report.md"]
    # The appended steps extended each task's plan digest: both still verify.
    assert lab.cli("verify", "--all", "--artifacts", "artifacts").returncode == 0


def test_a_database_from_before_the_digest_is_read_and_then_run(sqlite_lab: Lab) -> None:
    """Schema 5 (no plan_sha256, no policies): read-only commands read it as it is;
    the first run migrates it, and its task, with no digest, runs unchecked."""
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "old", "plan.json").returncode == 0
    assert lab.sqlite_path is not None
    conn = sqlite3.connect(lab.sqlite_path)
    try:
        for table, column in (("tasks", "plan_sha256"), ("steps", "policy"),
                              ("steps", "progress"), ("steps", "not_before")):  # fmt: skip
            conn.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        conn.execute("PRAGMA user_version = 5")
        conn.commit()
    finally:
        conn.close()
    before = lab.fingerprint()
    status = lab.cli("status", "old", "--json")
    assert status.returncode == 0, status.stderr
    assert status.json()["status"] == "pending"
    assert lab.cli("verify", "old").returncode == 0
    assert lab.fingerprint() == before  # reading never migrates
    assert lab.cli("run", "old").returncode == 0
    assert lab.cli("verify", "old").returncode == 0
