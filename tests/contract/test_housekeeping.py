"""The Store contract for housekeeping (``ls``, ``gc``, ``doctor``), run against
every backend (the fixtures of test_store_contract)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from test_store_contract import (  # noqa: F401  (fixtures)
    LEASE,
    NEVER,
    OTHER,
    PLAN,
    Opener,
    open_,
    snapshot,
    store,
    url,
)

from ninelives.errors import TaskIdRemoved, UnknownTask
from ninelives.housekeeping import FINISHED, doctor, gc
from ninelives.journal import dumps
from ninelives.store import Store


def _done(store: Store, task_id: str, *, queue: str | None = None) -> None:  # noqa: F811
    """Create ``task_id`` (the three-step plan) and run it to ``done`` through the store."""
    store.create_task(task_id, PLAN, queue=queue)
    run, _ = store.begin_run(task_id, f"r-{task_id}")
    for step in PLAN.steps[:2]:
        idx = PLAN.steps.index(step)
        store.start_step(run, idx, step.tool)
        store.finish_step(run, idx, step.tool, dumps({"n": idx}), last=False)
    store.start_step(run, 2, "write_artifact")
    store.finish_step(run, 2, "write_artifact", dumps({"n": 2}), last=True)
    store.end_run(run)


def _failed(store: Store, task_id: str) -> None:  # noqa: F811
    store.create_task(task_id, OTHER)
    run, _ = store.begin_run(task_id, f"r-{task_id}")
    store.start_step(run, 0, "fetch")
    store.record_error(run, 0, "boom", 1)
    store.end_run(run)


def _three(store: Store) -> None:  # noqa: F811
    """t1 done, t2 pending in queue q, t3 failed: created in that order."""
    _done(store, "t1")
    store.create_task("t2", PLAN, queue="q")
    _failed(store, "t3")


def test_ls_lists_the_newest_first_with_progress(store: Store) -> None:  # noqa: F811
    _three(store)
    listed = store.list_tasks()  # type: ignore[attr-defined]
    assert [t.id for t in listed] == ["t3", "t2", "t1"]
    t3, t2, t1 = listed
    assert (t1.status, t1.steps_done, t1.steps_total, t1.attempts, t1.last_event) == (
        "done", 3, 3, 3, "task_done",
    )  # fmt: skip
    assert (t2.status, t2.queue, t2.steps_done, t2.attempts, t2.last_event) == (
        "pending", "q", 0, 0, "task_created",
    )  # fmt: skip
    assert (t3.status, t3.steps_done, t3.steps_total, t3.last_event) == (
        "failed",
        0,
        1,
        "task_failed",
    )
    assert t1.last_ts == pytest.approx(store.events("t1")[-1].ts)
    assert t1.goal == "three steps"


def test_ls_filters_and_limits(store: Store) -> None:  # noqa: F811
    _three(store)
    ls = store.list_tasks  # type: ignore[attr-defined]
    assert [t.id for t in ls(limit=2)] == ["t3", "t2"]
    assert [t.id for t in ls(statuses=["done", "failed"])] == ["t3", "t1"]
    assert [t.id for t in ls(statuses=["done", "failed"], limit=1)] == ["t3"]
    assert [t.id for t in ls(queue="q")] == ["t2"]
    assert [t.id for t in ls(statuses=["pending"], queue="q")] == ["t2"]
    assert [t.id for t in ls(statuses=["done"], queue="q")] == []
    assert ls(queue="nope") == []


def test_gc_deletes_finished_tasks_with_their_steps_and_journal(store: Store) -> None:  # noqa: F811
    _three(store)
    pending = snapshot(store, "t2")
    report = gc(store, older_than=0)
    assert sorted(report.removed) == [("t1", "done"), ("t3", "failed")]
    assert (report.steps, report.events) == (4, 9 + 5)
    for gone in ("t1", "t3"):
        with pytest.raises(UnknownTask):
            store.get_task(gone)
        assert store.events(gone) == []
    assert snapshot(store, "t2") == pending  # an unfinished task is never touched
    assert store.dangling_rows() == {}  # type: ignore[attr-defined]
    # A removed id is never used again (its idempotency keys may name its
    # effects), in any case, by create or fork; another id is free.
    for task_id in ("t1", "T1"):
        with pytest.raises(TaskIdRemoved, match="was used by a task that gc removed"):
            store.create_task(task_id, PLAN)
    with pytest.raises(TaskIdRemoved):
        store.fork_task("t2", "t3", 0, "r-fork")
    assert store.task_ids() == ["t2"]
    assert store.events("t3") == []
    _done(store, "t4")


def test_the_library_refuses_a_removed_id_saying_when(store: Store) -> None:  # noqa: F811
    """Runtime.create and Runtime.submit (which returns a stored task of the same
    plan) refuse an id gc removed, with when; nothing is stored."""
    from ninelives.runtime import Runtime

    rt = Runtime(store)
    plan = {"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "x"}}]}
    rt.create("demo", plan)
    rt.cancel("demo")
    assert gc(store, older_than=0).removed == [("demo", "cancelled")]
    for call in (rt.create, rt.submit):
        with pytest.raises(TaskIdRemoved) as caught:
            call("demo", plan)
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(caught.value.removed_at))
        assert f"at {when}" in str(caught.value)
    assert store.task_ids() == []


def test_gc_honours_age_statuses_and_dry_run(store: Store) -> None:  # noqa: F811
    _three(store)
    assert gc(store, older_than=3600).removed == []  # all changed moments ago
    dry = gc(store, older_than=0, dry_run=True)
    assert sorted(dry.removed) == [("t1", "done"), ("t3", "failed")]
    assert store.get_task("t1")
    assert store.get_task("t3")
    assert gc(store, older_than=0, statuses=["failed"]).removed == [("t3", "failed")]
    assert store.get_task("t1").status.value == "done"


def test_gc_works_in_bounded_batches(store: Store) -> None:  # noqa: F811
    for i in range(7):
        _done(store, f"t{i}")
    report = gc(store, older_than=0, batch=3)
    assert report.batches == 3
    assert len(report.removed) == 7
    assert store.task_ids() == []


def test_gc_leaves_a_task_a_live_runner_holds(open_: Opener) -> None:  # noqa: F811
    store = open_()  # noqa: F811
    _done(store, "t1")
    holder = open_(heartbeat=NEVER)
    run, _ = holder.begin_run("t1", "r-holder")  # a run of a done task, still ending
    report = gc(store, older_than=0)
    assert report.removed == []
    assert report.skipped == 1
    assert store.get_task("t1").status.value == "done"
    holder.end_run(run)
    assert gc(store, older_than=0).removed == [("t1", "done")]


def test_gc_checks_again_inside_its_transaction(store: Store) -> None:  # noqa: F811
    _failed(store, "t3")
    before = time.time() + 1
    [(task_id, _)] = store.gc_candidates(  # type: ignore[attr-defined]
        "failed", before, after=(float("-inf"), ""), limit=10
    )
    store.retry_task("t3", "r-retry")  # back to pending between the read and the delete
    deleted = store.delete_tasks([task_id], FINISHED, before)  # type: ignore[attr-defined]
    assert deleted.tasks == ()
    assert store.get_task("t3").status.value == "pending"


def test_doctor_is_clean_then_finds_a_running_task_nobody_holds(
    open_: Opener,  # noqa: F811
    tmp_path: Path,
) -> None:
    store = open_()  # noqa: F811
    _three(store)
    assert doctor(store, artifacts=str(tmp_path)) == ([], [])
    dead = open_()
    run, _ = dead.begin_run("t2", "r-dead")
    dead.start_step(run, 0, "fetch")
    dead.close()  # its hold ends with it; the step stays running
    findings, _ = doctor(store, artifacts=str(tmp_path))
    assert [(f.kind, f.subject, f.fix) for f in findings] == [("running", "t2", "ninelives run t2")]


def test_doctor_finds_and_frees_a_dead_workers_lease(
    open_: Opener,  # noqa: F811
    backend: str,
    tmp_path: Path,
) -> None:
    store = open_()  # noqa: F811
    _done(store, "t1")
    stalled = open_(heartbeat=NEVER)
    run, _ = stalled.begin_run("t1", "r-stalled")
    time.sleep(LEASE * 1.5)
    findings, _ = doctor(store, artifacts=str(tmp_path))
    if backend == "sqlite":  # the kernel lock is the claim: no lease can lapse
        assert store.expired_leases() == []  # type: ignore[attr-defined]
        assert findings == []
        return
    assert [(f.kind, f.subject, f.fixable) for f in findings] == [("lease", "t1", True)]
    remaining, fixed = doctor(store, artifacts=str(tmp_path), fix=True)
    assert remaining == []
    assert [f.kind for f in fixed] == ["lease"]
    assert store.get_task("t1").lease_epoch == run.epoch + 1  # the stalled holder is fenced out
