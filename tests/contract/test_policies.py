"""The Store contract for step policies and progress, on every backend: the
backoff wait committed with its ``step_error`` (``not_before``), permanent
errors, and ``checkpoint`` (fenced, journaled ``step_progress``)."""

from __future__ import annotations

import time

import pytest
from test_store_contract import (  # noqa: F401  (fixtures)
    NEVER,
    OTHER,
    PLAN,
    Opener,
    TakeOver,
    kinds,
    open_,
    snapshot,
    store,
    take_over,
    url,
)

from ninelives.errors import LeaseLost, StoreError
from ninelives.models import StepStatus, TaskStatus
from ninelives.plan import plan_from_dict
from ninelives.store import StepNotDue, Store
from ninelives.verify import check_task

QUEUED = plan_from_dict(
    {"goal": "queued", "steps": [{"tool": "fetch", "input": {"path": "q"}, "max_attempts": 5}]}
)


def test_a_step_error_with_a_delay_commits_the_wait_and_journals_the_decision(
    store: Store,  # noqa: F811
) -> None:
    store.create_task("t1", OTHER)
    run, _ = store.begin_run("t1", "r1")
    assert store.start_step(run, 0, "fetch") == 1
    before = time.time()
    assert store.record_error(run, 0, "boom", 3, delay=30.0, detail={"timeout": 2}) is False
    step = store.get_task("t1").steps[0]
    assert step.status is StepStatus.PENDING
    assert step.not_before is not None
    error = store.events("t1")[-1]
    assert error.kind == "step_error"
    assert error.data == {
        "error": "boom", "attempt": 1, "timeout": 2, "retry_at": step.not_before, "delay": 30.0,
    }  # fmt: skip
    # The store's clock: the wait starts at the commit (a second of slack for PostgreSQL's).
    assert before - 1 <= step.not_before - 30.0 <= time.time() + 1
    # Not started before then: refused with the time left, nothing written.
    held = snapshot(store, "t1")
    with pytest.raises(StepNotDue) as refused:
        store.start_step(run, 0, "fetch")
    assert 28 < refused.value.wait <= 30.0
    assert snapshot(store, "t1") == held
    store.end_run(run)


def test_a_resumed_run_does_not_start_a_step_before_it_is_due(store: Store) -> None:  # noqa: F811
    store.create_task("t1", OTHER)
    run, _ = store.begin_run("t1", "r1", start_first=True)
    assert run.started == (0, 1)
    store.record_error(run, 0, "boom", 3, delay=0.5)
    store.end_run(run)
    # The claim that would start the first pending step leaves it waiting ...
    again, task = store.begin_run("t1", "r2", start_first=True)
    assert again.started is None
    assert task.steps[0].status is StepStatus.PENDING
    with pytest.raises(StepNotDue):
        store.start_step(again, 0, "fetch")
    # ... and once due it starts, which clears the wait.
    time.sleep(0.6)
    assert store.start_step(again, 0, "fetch") == 2
    assert store.get_task("t1").steps[0].not_before is None
    store.finish_step(again, 0, "fetch", '{"text":"x"}', last=True)
    store.end_run(again)
    task = store.get_task("t1")
    assert task.status is TaskStatus.DONE
    assert check_task(task, store.events("t1")) == []


def test_a_worker_does_not_claim_a_task_until_its_step_is_due(store: Store) -> None:  # noqa: F811
    store.create_task("waits", QUEUED, queue="q")
    store.create_task("ready", QUEUED, queue="q")
    claimed = store.claim_next("q", "w1")
    assert claimed is not None
    assert claimed[0].task_id == "waits"
    run = claimed[0]
    store.start_step(run, 0, "fetch")
    store.record_error(run, 0, "boom", 5, delay=0.8)
    store.end_run(run)
    # The older task waits: the claim passes it over for the ready one ...
    other = store.claim_next("q", "w2")
    assert other is not None
    assert other[0].task_id == "ready"
    store.end_run(other[0])
    assert store.unfinished("q") == 2  # ... without counting it as finished (drain waits)
    # ... and takes it once due: a wait never starves it.
    deadline = time.monotonic() + 10
    found = None
    while found is None and time.monotonic() < deadline:
        found = store.claim_next("q", "w3", skip=["ready"])
        time.sleep(0.05)
    assert found is not None
    assert found[0].task_id == "waits"
    assert store.start_step(found[0], 0, "fetch") == 2
    store.end_run(found[0])


def test_a_permanent_error_fails_the_task_at_once(store: Store) -> None:  # noqa: F811
    store.create_task("t1", OTHER)
    run, _ = store.begin_run("t1", "r1")
    store.start_step(run, 0, "fetch")
    assert store.record_error(run, 0, "PermanentError: 404", 10, delay=5, permanent=True)
    task = store.get_task("t1")
    assert task.status is TaskStatus.FAILED
    assert task.steps[0].status is StepStatus.FAILED
    assert task.steps[0].not_before is None
    error, failed = store.events("t1")[-2:]
    assert error.data == {
        "error": "PermanentError: 404", "attempt": 1, "final": True, "why": "permanent",
    }  # fmt: skip
    assert failed.kind == "task_failed"
    assert failed.data["why"] == "permanent"
    assert "permanent error on attempt 1" in failed.data["reason"]
    store.end_run(run)
    assert check_task(task, store.events("t1")) == []


def test_the_attempt_limit_is_journaled_as_the_reason(store: Store) -> None:  # noqa: F811
    store.create_task("t1", OTHER)
    run, _ = store.begin_run("t1", "r1")
    store.start_step(run, 0, "fetch")
    assert store.record_error(run, 0, "boom", 1, delay=5) is True
    error, failed = store.events("t1")[-2:]
    assert (error.data["final"], error.data["why"]) == (True, "attempt_limit")
    assert "retry_at" not in error.data
    assert failed.data["why"] == "attempt_limit"
    store.end_run(run)


def test_checkpoint_commits_progress_with_its_event(store: Store) -> None:  # noqa: F811
    store.create_task("t1", OTHER)
    run, _ = store.begin_run("t1", "r1")
    store.start_step(run, 0, "fetch")
    store.checkpoint(run, 0, '{"done":3}')
    store.checkpoint(run, 0, '{"done":7}')
    assert store.get_task("t1").steps[0].progress == {"done": 7}
    progress = [e for e in store.events("t1") if e.kind == "step_progress"]
    assert [(e.step_idx, e.data, e.run_id) for e in progress] == [
        (0, {"progress": {"done": 3}}, "r1"),
        (0, {"progress": {"done": 7}}, "r1"),
    ]
    # The next attempt, after an error, still finds it; so does a retried task.
    store.record_error(run, 0, "boom", 1)
    store.end_run(run)
    assert store.get_task("t1").status is TaskStatus.FAILED
    assert store.retry_task("t1", "r-retry").steps[0].progress == {"done": 7}
    task = store.get_task("t1")
    assert check_task(task, store.events("t1")) == []


def test_checkpoint_of_a_step_that_is_not_running_writes_nothing(store: Store) -> None:  # noqa: F811
    store.create_task("t1", OTHER)
    run, _ = store.begin_run("t1", "r1")
    held = snapshot(store, "t1")
    with pytest.raises(StoreError, match="not running"):
        store.checkpoint(run, 0, '{"done":1}')
    assert snapshot(store, "t1") == held
    assert store.get_task("t1").steps[0].progress is None
    store.end_run(run)


def test_a_runner_that_lost_the_task_cannot_checkpoint(
    open_: Opener,  # noqa: F811
    take_over: TakeOver,  # noqa: F811
) -> None:
    zombie = open_(heartbeat=NEVER)
    zombie.create_task("t1", PLAN)
    stale, _ = zombie.begin_run("t1", "zombie")
    zombie.start_step(stale, 0, "fetch")
    zombie.checkpoint(stale, 0, '{"chunk":1}')
    take_over(zombie, stale)
    winner = open_()
    run, task = winner.begin_run("t1", "winner")
    assert task.steps[0].progress == {"chunk": 1}  # the recovered step resumes from it
    winner.start_step(run, 0, "fetch")
    before = snapshot(winner, "t1")
    with pytest.raises(LeaseLost):
        zombie.checkpoint(stale, 0, '{"chunk":99}')
    assert snapshot(winner, "t1") == before
    assert winner.get_task("t1").steps[0].progress == {"chunk": 1}
    zombie.end_run(stale)
    winner.end_run(run)
    assert "step_progress" in kinds(winner, "t1")


def test_negative_control_without_fencing_a_stale_checkpoint_lands(
    open_: Opener,  # noqa: F811
    take_over: TakeOver,  # noqa: F811
    url: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The takeover above with the test-only switch thrown: the zombie's progress
    overwrites the winner's step. Fencing is what stops it."""
    monkeypatch.setenv("NINELIVES_TEST_DISABLE_FENCING", "unsafe-test-only:" + url)
    zombie = open_(heartbeat=NEVER)
    zombie.create_task("t1", PLAN)
    stale, _ = zombie.begin_run("t1", "zombie")
    zombie.start_step(stale, 0, "fetch")
    take_over(zombie, stale)
    winner = open_()
    run, _ = winner.begin_run("t1", "winner")
    winner.start_step(run, 0, "fetch")
    zombie.checkpoint(stale, 0, '{"chunk":99}')
    assert winner.get_task("t1").steps[0].progress == {"chunk": 99}
    winner.end_run(run)
