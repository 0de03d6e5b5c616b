"""The Store contract for cancel, fork and plan integrity, run against every
backend (the fixtures of test_store_contract): a real SQLite file and a real
PostgreSQL database, hand edits made with each one's own driver."""

# ruff: noqa: F811  (the fixtures of test_store_contract are parameters here)
from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from test_store_contract import (  # noqa: F401  (fixtures)
    OTHER,
    PLAN,
    Opener,
    kinds,
    open_,
    snapshot,
    store,
    url,
)

from ninelives import lineage
from ninelives.errors import (
    InputError,
    LeaseLost,
    PlanTampered,
    TaskBusy,
    TaskCancelled,
    TaskExists,
    UnknownTask,
)
from ninelives.models import StepStatus, TaskStatus
from ninelives.plan import plan_from_dict
from ninelives.store import Store, is_postgres_url
from ninelives.verify import check_task

CAUTIOUS = plan_from_dict(
    {
        "goal": "policies are part of the plan",
        "defaults": {"max_attempts": 2},
        "steps": [
            {"tool": "fetch", "input": {"path": "a.txt"}, "on_unknown": "refuse"},
            {"tool": "summarize", "input": {"from": 0}},
        ],
    }
)


def _sql(url: str, statement: str, params: tuple[Any, ...] = ()) -> None:
    """A hand edit of the database, behind the store's back, with the backend's driver."""
    if is_postgres_url(url):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(statement.replace("?", "%s"), params)  # type: ignore[arg-type]
        return
    conn = sqlite3.connect(url)
    try:
        conn.execute(statement, params)
        conn.commit()
    finally:
        conn.close()


def _done(store: Store, task_id: str = "t1") -> None:
    """Create ``task_id`` with PLAN and run it to the end, each output naming its step."""
    store.create_task(task_id, PLAN)
    run, _ = store.begin_run(task_id, f"r-{task_id}")
    for idx, step in enumerate(PLAN.steps):
        store.start_step(run, idx, step.tool)
        store.finish_step(run, idx, step.tool, json.dumps({"n": idx}), last=idx == 2)
    store.end_run(run)


def _clean(store: Store, task_id: str) -> None:
    task = store.get_task(task_id)
    assert check_task(task, store.events(task_id)) == []


# -- cancel --------------------------------------------------------------------


def test_cancel_marks_the_task_and_journals_why(store: Store) -> None:
    store.create_task("t1", PLAN)
    task, changed = store.cancel_task("t1", "r-c", reason="wrong goal")
    assert changed
    assert task.status is TaskStatus.CANCELLED
    assert kinds(store, "t1") == ["task_created", "task_cancelled"]
    assert store.events("t1")[-1].data == {"reason": "wrong goal", "status": "pending"}
    before = snapshot(store, "t1")
    again, changed = store.cancel_task("t1", "r-c2", reason="twice")
    assert not changed
    assert again.status is TaskStatus.CANCELLED
    assert snapshot(store, "t1") == before  # idempotent: nothing journaled
    _clean(store, "t1")


def test_cancel_refuses_a_done_task_and_an_unknown_one(store: Store) -> None:
    _done(store)
    before = snapshot(store, "t1")
    with pytest.raises(InputError, match="is done"):
        store.cancel_task("t1", "r-c")
    assert snapshot(store, "t1") == before
    with pytest.raises(UnknownTask):
        store.cancel_task("nope", "r-c")


def test_a_failed_task_can_be_cancelled_and_is_not_retried(store: Store) -> None:
    store.create_task("t1", PLAN)
    run, _ = store.begin_run("t1", "r1")
    store.start_step(run, 0, "fetch")
    assert store.record_error(run, 0, "boom", 1)
    store.end_run(run)
    _task, changed = store.cancel_task("t1", "r-c")
    assert changed
    assert store.events("t1")[-1].data["status"] == "failed"
    with pytest.raises(InputError):
        store.retry_task("t1", "r-retry")
    _clean(store, "t1")


def test_a_runner_finds_the_cancel_at_its_next_step_and_writes_nothing(
    open_: Opener,
) -> None:
    runner, other = open_(), open_()
    runner.create_task("t1", PLAN)
    run, _ = runner.begin_run("t1", "r1")
    runner.start_step(run, 0, "fetch")
    runner.finish_step(run, 0, "fetch", '{"n":0}', last=False)
    other.cancel_task("t1", "r-c", reason="stop")
    before = snapshot(other, "t1")
    with pytest.raises(TaskCancelled):  # not LeaseLost: the cancel kept the epoch
        runner.start_step(run, 1, "summarize")
    with pytest.raises(TaskCancelled):
        runner.finish_task(run)
    assert snapshot(other, "t1") == before
    runner.end_run(run)
    with pytest.raises(TaskCancelled):  # and a later run stops at once
        other.begin_run("t1", "r2")
    assert snapshot(other, "t1") == before
    _clean(other, "t1")


def test_the_step_in_flight_commits_its_output_and_the_task_stays_cancelled(
    open_: Opener,
) -> None:
    runner, other = open_(), open_()
    runner.create_task("t1", PLAN)
    run, _ = runner.begin_run("t1", "r1")
    for idx in (0, 1):
        runner.start_step(run, idx, PLAN.steps[idx].tool)
        if idx == 0:
            runner.finish_step(run, 0, "fetch", '{"n":0}', last=False)
    other.cancel_task("t1", "r-c")
    with pytest.raises(TaskCancelled):
        runner.finish_step(run, 1, "summarize", '{"n":1}', last=False)
    task = other.get_task("t1")
    assert task.status is TaskStatus.CANCELLED
    assert task.steps[1].status is StepStatus.DONE
    assert task.steps[1].output == {"n": 1}
    assert kinds(other, "t1")[-2:] == ["task_cancelled", "step_finished"]
    runner.end_run(run)
    _clean(other, "t1")


def test_a_last_step_finishing_after_the_cancel_does_not_make_the_task_done(
    open_: Opener,
) -> None:
    runner, other = open_(), open_()
    runner.create_task("t1", PLAN)
    run, _ = runner.begin_run("t1", "r1")
    for idx in (0, 1, 2):
        runner.start_step(run, idx, PLAN.steps[idx].tool)
        if idx < 2:
            runner.finish_step(run, idx, PLAN.steps[idx].tool, "{}", last=False)
    other.cancel_task("t1", "r-c")
    with pytest.raises(TaskCancelled):
        runner.finish_step(run, 2, "write_artifact", '{"n":2}', last=True)
    assert other.get_task("t1").status is TaskStatus.CANCELLED
    assert "task_done" not in kinds(other, "t1")
    runner.end_run(run)
    _clean(other, "t1")


def test_an_attempt_failing_after_the_cancel_is_journaled_and_fails_nothing(
    open_: Opener,
) -> None:
    runner, other = open_(), open_()
    runner.create_task("t1", PLAN)
    run, _ = runner.begin_run("t1", "r1")
    runner.start_step(run, 0, "fetch")
    other.cancel_task("t1", "r-c")
    with pytest.raises(TaskCancelled):
        runner.record_error(run, 0, "boom", 1)  # the last attempt: it would fail the task
    task = other.get_task("t1")
    assert task.status is TaskStatus.CANCELLED
    assert task.steps[0].status is StepStatus.PENDING
    assert kinds(other, "t1")[-1] == "step_error"
    runner.end_run(run)
    _clean(other, "t1")


def test_a_taken_over_runner_still_reads_lease_lost_after_a_cancel(
    open_: Opener,
) -> None:
    """Cancel is told apart from a takeover by the epoch: a runner fenced out by
    a new epoch gets LeaseLost even when the task was cancelled too."""
    holder, other = open_(), open_()
    holder.create_task("t1", PLAN)
    run, _ = holder.begin_run("t1", "r1")
    holder.abandon_run(run)  # a new epoch, as a takeover makes
    other.cancel_task("t1", "r-c")
    with pytest.raises(LeaseLost) as caught:
        holder.start_step(run, 0, "fetch")
    assert not isinstance(caught.value, TaskCancelled)
    holder.end_run(run)


def test_workers_never_claim_a_cancelled_task(open_: Opener) -> None:
    store = open_()
    store.create_task("t1", PLAN, queue="q")
    store.create_task("t2", PLAN, queue="q")
    store.cancel_task("t1", "r-c")
    claimed = store.claim_next("q", "w1")
    assert claimed is not None
    assert claimed[0].task_id == "t2"
    store.end_run(claimed[0])
    assert store.unfinished("q") == 1


def test_negative_control_a_fence_blind_to_cancel_lets_the_runner_start_a_step(
    open_: Opener, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the fence's ``status <> 'cancelled'`` removed (the fence before
    cancel existed), the runner starts its next step on a cancelled task and
    even writes its status back to running: the fence is what stops it."""
    from ninelives.store.postgres import base as postgres_session
    from ninelives.store.sqlite import base as sqlite

    queries = sqlite.Q if backend == "sqlite" else postgres_session.Q
    # SQLite reads the fence of a step inside a run; PostgreSQL's step transitions
    # are one statement that starts with the fence as "fenced".
    for name in ("fence", "fence_read", "fenced"):
        if name in queries:
            blind = queries[name].replace(" AND status <> 'cancelled'", "")
            assert blind != queries[name]
            monkeypatch.setitem(queries, name, blind)
    runner, other = open_(), open_()
    runner.create_task("t1", PLAN)
    run, _ = runner.begin_run("t1", "r1")
    other.cancel_task("t1", "r-c")
    runner.start_step(run, 0, "fetch")  # no refusal
    assert kinds(other, "t1")[-1] == "step_started"
    assert other.get_task("t1").status is TaskStatus.RUNNING
    runner.end_run(run)


# -- fork ----------------------------------------------------------------------


@pytest.mark.parametrize("start", [0, 1, 2])
def test_fork_copies_the_steps_before_start_done(store: Store, start: int) -> None:
    _done(store)
    before = snapshot(store, "t1")
    fork = store.fork_task("t1", "f1", start, "r-f", artifacts="/tmp/x")
    assert snapshot(store, "t1") == before  # the source is not changed
    assert [s.status for s in fork.steps] == [
        StepStatus.DONE if i < start else StepStatus.PENDING for i in range(3)
    ]
    assert [s.output for s in fork.steps] == [{"n": i} if i < start else None for i in range(3)]
    assert all(s.attempts == 0 for s in fork.steps)
    assert [(s.tool, s.input) for s in fork.steps] == [(s.tool, s.input) for s in PLAN.steps]
    assert fork.status is TaskStatus.PENDING
    assert fork.artifacts == "/tmp/x"  # the source recorded none: the given folder
    events = store.events("f1")
    assert [e.kind for e in events] == ["task_created", "task_forked"]
    assert events[1].data == {"source": "t1", "from": start}
    assert fork.plan_sha256 == lineage.task_digest(fork)
    _clean(store, "f1")
    # It runs from ``start`` on, under its own id (its own idempotency keys).
    run, _task = store.begin_run("f1", "r-run", start_first=True)
    assert run.started == (start, 1)
    for idx in range(start, 3):
        if idx > start:
            store.start_step(run, idx, PLAN.steps[idx].tool)
        store.finish_step(run, idx, PLAN.steps[idx].tool, '{"f":1}', last=idx == 2)
    store.end_run(run)
    assert store.get_task("f1").status is TaskStatus.DONE
    _clean(store, "f1")


def test_fork_keeps_the_source_artifacts_folder(open_: Opener) -> None:
    store = open_()
    store.create_task("t1", PLAN, artifacts="/srv/reports")
    fork = store.fork_task("t1", "f1", 0, "r-f", artifacts="/elsewhere", queue="q")
    assert fork.artifacts == "/srv/reports"
    claimed = store.claim_next("q", "w")
    assert claimed is not None
    assert claimed[0].task_id == "f1"
    store.end_run(claimed[0])


def test_fork_refusals_change_nothing(store: Store) -> None:
    _done(store)
    store.create_task("half", PLAN)
    before = (snapshot(store, "t1"), snapshot(store, "half"), store.task_ids())
    with pytest.raises(TaskExists):
        store.fork_task("t1", "HALF", 0, "r")  # ids are unique regardless of case
    with pytest.raises(InputError, match="steps 0-2"):
        store.fork_task("t1", "f1", 3, "r")
    with pytest.raises(InputError, match="step 0 before it is not done"):
        store.fork_task("half", "f1", 1, "r")
    with pytest.raises(UnknownTask):
        store.fork_task("nope", "f1", 0, "r")
    assert (snapshot(store, "t1"), snapshot(store, "half"), store.task_ids()) == before


def test_a_running_task_can_be_forked_from_its_done_steps(open_: Opener) -> None:
    runner, other = open_(), open_()
    runner.create_task("t1", PLAN)
    run, _ = runner.begin_run("t1", "r1")
    runner.start_step(run, 0, "fetch")
    runner.finish_step(run, 0, "fetch", '{"n":0}', last=False)
    runner.start_step(run, 1, "summarize")
    fork = other.fork_task("t1", "f1", 1, "r-f")
    assert fork.steps[0].output == {"n": 0}
    with pytest.raises(InputError):  # step 1 is still running
        other.fork_task("t1", "f2", 2, "r-f")
    runner.finish_step(run, 1, "summarize", '{"n":1}', last=False)  # the source goes on
    runner.end_run(run)


def test_fork_leaves_out_what_turns_from_start_on_appended(store: Store) -> None:
    """An agent's turn at step 1 appended steps 2 and 3 (a call and the next
    turn): forking from step 1 drops them, since turn 1 runs again and appends
    anew; forking from step 2 keeps them."""
    plan = plan_from_dict(
        {
            "goal": "agent",
            "steps": [
                {"tool": "fetch", "input": {"path": "a"}},
                {"tool": "summarize", "input": {"from": 0}},
            ],
        }
    )
    store.create_task("t1", plan)
    run, _ = store.begin_run("t1", "r1")
    store.start_step(run, 0, "fetch")
    store.finish_step(run, 0, "fetch", '{"n":0}', last=False)
    store.start_step(run, 1, "summarize")
    appended = [("fetch", '{"path":"b"}'), ("summarize", '{"from":2}')]
    store.finish_step(run, 1, "summarize", '{"n":1}', last=False, append=appended)
    store.end_run(run)
    task = store.get_task("t1")
    assert len(task.steps) == 4
    assert task.plan_sha256 == lineage.task_digest(task)  # the chain covers appended steps
    assert len(store.fork_task("t1", "from1", 1, "r").steps) == 2
    kept = store.fork_task("t1", "from2", 2, "r")
    assert [s.input for s in kept.steps[2:]] == [{"path": "b"}, {"from": 2}]
    for task_id in ("t1", "from1", "from2"):
        _clean(store, task_id)


# -- plan integrity --------------------------------------------------------------


def test_create_stores_the_plan_digest(store: Store) -> None:
    task = store.create_task("t1", CAUTIOUS)
    assert task.plan_sha256 == lineage.task_digest(task)
    assert task.plan_sha256 == lineage.plan_digest(
        CAUTIOUS.goal, ((s.tool, s.input, s.policy) for s in CAUTIOUS.steps)
    )


@pytest.mark.parametrize(
    ("statement", "params"),
    [
        (
            "UPDATE steps SET input = ? WHERE task_id = 't1' AND idx = 0",
            ('{"path":"/etc/passwd"}',),
        ),
        ("UPDATE steps SET tool = 'summarize' WHERE task_id = 't1' AND idx = 0", ()),
        (
            "UPDATE steps SET policy = ? WHERE task_id = 't1' AND idx = 0",
            ('{"on_unknown":"rerun"}',),
        ),
        ("UPDATE tasks SET goal = 'another' WHERE id = 't1'", ()),
        ("DELETE FROM steps WHERE task_id = 't1' AND idx = 1", ()),
    ],
    ids=["input", "tool", "policy", "goal", "deleted"],
)
def test_a_plan_edited_by_hand_is_refused_before_any_write(
    open_: Opener,
    url: str,
    statement: str,
    params: tuple[Any, ...],
) -> None:
    store = open_()
    store.create_task("t1", CAUTIOUS, queue="q")
    _sql(url, statement, params)
    before = snapshot(store, "t1")
    with pytest.raises(PlanTampered, match="'t1'") as caught:
        store.begin_run("t1", "r1", start_first=True)
    assert caught.value.task_id == "t1"
    with pytest.raises(PlanTampered):
        store.claim_next("q", "w1")
    with pytest.raises(PlanTampered):
        store.fork_task("t1", "f1", 0, "r")
    assert snapshot(store, "t1") == before
    found = [v.check for v in check_task(store.get_task("t1"), store.events("t1"))]
    assert "plan_integrity" in found
    # Other tasks are not affected.
    store.create_task("t2", CAUTIOUS)
    run, _ = store.begin_run("t2", "r2")
    store.end_run(run)


def test_an_edited_appended_step_is_refused_too(open_: Opener, url: str) -> None:
    store = open_()
    store.create_task("t1", OTHER)
    run, _ = store.begin_run("t1", "r1")
    store.start_step(run, 0, "fetch")
    store.finish_step(run, 0, "fetch", "{}", last=False, append=[("fetch", '{"path":"b"}')])
    store.end_run(run)
    store.end_run(store.begin_run("t1", "r2")[0])  # unedited: accepted
    store.close()
    _sql(url, "UPDATE steps SET input = ? WHERE task_id = 't1' AND idx = 1", ('{"path":"c"}',))
    with pytest.raises(PlanTampered):
        open_().begin_run("t1", "r3")


def test_a_task_without_a_digest_is_not_checked(open_: Opener, url: str) -> None:
    store = open_()
    store.create_task("t1", PLAN)
    _sql(url, "UPDATE tasks SET plan_sha256 = NULL WHERE id = 't1'")
    _sql(url, "UPDATE steps SET input = ? WHERE task_id = 't1' AND idx = 0", ('{"path":"x"}',))
    run, task = store.begin_run("t1", "r1")  # older versions' tasks run as before
    assert task.plan_sha256 is None
    store.end_run(run)


def test_negative_control_without_the_check_an_edited_plan_runs(
    open_: Opener,
    url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check is what refuses: with it switched off the edited input is claimed."""
    monkeypatch.setattr(lineage, "check_plan", lambda task: None)
    store = open_()
    store.create_task("t1", PLAN)
    _sql(url, "UPDATE steps SET input = ? WHERE task_id = 't1' AND idx = 0", ('{"path":"x"}',))
    run, task = store.begin_run("t1", "r1", start_first=True)
    assert task.steps[0].input == {"path": "x"}
    assert run.started == (0, 1)
    store.end_run(run)


def test_step_started_records_the_versions(store: Store) -> None:
    from ninelives import __version__

    store.create_task("t1", PLAN)
    run, _ = store.begin_run("t1", "r1", start_first=True, tool_version={"fetch": "7"}.get)
    store.finish_step(run, 0, "fetch", "{}", last=False)
    store.start_step(run, 1, "summarize", tool_version="2.1")
    store.end_run(run)
    started = [e.data for e in store.events("t1") if e.kind == "step_started"]
    assert started == [
        {"tool": "fetch", "attempt": 1, "ninelives": __version__, "tool_version": "7"},
        {"tool": "summarize", "attempt": 1, "ninelives": __version__, "tool_version": "2.1"},
    ]


def test_cancel_of_a_running_task_does_not_wait_for_its_holder(
    open_: Opener,
) -> None:
    holder, other = open_(), open_()
    holder.create_task("t1", PLAN)
    run, _ = holder.begin_run("t1", "r1")
    with pytest.raises(TaskBusy):  # a run is refused while the holder lives ...
        other.begin_run("t1", "r2")
    task, changed = other.cancel_task("t1", "r-c")  # ... a cancel is not
    assert changed
    assert task.status is TaskStatus.CANCELLED
    holder.end_run(run)
