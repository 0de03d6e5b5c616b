"""The Store contract for retry and for the artifacts folder recorded at create,
run against every backend (the fixtures of test_store_contract)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_store_contract import (  # noqa: F401  (fixtures)
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

from ninelives.errors import InputError, LeaseLost, TaskBusy, UnknownTask
from ninelives.models import StepStatus, TaskStatus
from ninelives.store import Store, sql
from ninelives.verify import check_task


def _fail(store: Store, task_id: str = "t1", attempts: int = 3) -> None:  # noqa: F811
    """Create ``task_id`` (one fetch step) and fail it at the attempt limit."""
    store.create_task(task_id, OTHER)
    run, _ = store.begin_run(task_id, "r-fail")
    for _ in range(attempts):
        store.start_step(run, 0, "fetch")
        store.record_error(run, 0, "boom", attempts)
    store.end_run(run)
    assert store.get_task(task_id).status is TaskStatus.FAILED


def test_create_records_the_artifacts_folder(open_: Opener, tmp_path: Path) -> None:  # noqa: F811
    first = open_()
    folder = str(tmp_path / "out")
    assert first.create_task("t1", PLAN, artifacts=folder).artifacts == folder
    assert first.create_task("t2", PLAN).artifacts is None  # as older tasks: settings decide
    first.close()
    again = open_()
    assert again.get_task("t1").artifacts == folder
    assert again.get_task("t2").artifacts is None


def test_retry_puts_a_failed_task_and_its_step_back_to_pending(store: Store) -> None:  # noqa: F811
    _fail(store)
    epoch = store.get_task("t1").lease_epoch
    task = store.retry_task("t1", "r-retry")
    assert task.status is TaskStatus.PENDING
    assert [(s.status, s.attempts) for s in task.steps] == [(StepStatus.PENDING, 0)]
    assert task.lease_epoch == epoch + 1  # earlier runners are fenced out
    retried = store.events("t1")[-1]
    assert (retried.kind, retried.step_idx, retried.run_id) == ("task_retried", 0, "r-retry")
    assert retried.data == {"attempts": 3}
    assert check_task(task, store.events("t1")) == []
    # The step starts again from attempt 1, and the task can finish.
    run, _ = store.begin_run("t1", "r2")
    assert store.start_step(run, 0, "fetch") == 1
    store.finish_step(run, 0, "fetch", '{"text":"x"}', last=True)
    store.end_run(run)
    done = store.get_task("t1")
    assert done.status is TaskStatus.DONE
    assert check_task(done, store.events("t1")) == []


def test_retry_refuses_what_is_not_failed_and_changes_nothing(store: Store) -> None:  # noqa: F811
    store.create_task("pending", PLAN)
    before = snapshot(store, "pending")
    with pytest.raises(InputError, match="not failed"):
        store.retry_task("pending", "r")
    assert snapshot(store, "pending") == before
    _fail(store, "failed")
    before = snapshot(store, "failed")
    with pytest.raises(InputError, match=r"step 2 .* has not failed"):
        store.retry_task("failed", "r", step=2)
    assert snapshot(store, "failed") == before
    with pytest.raises(UnknownTask):
        store.retry_task("nope", "r")
    assert store.retry_task("failed", "r", step=0).status is TaskStatus.PENDING  # control


def test_retry_is_refused_at_once_while_a_runner_holds_the_task(open_: Opener) -> None:  # noqa: F811
    holder, other = open_(), open_()
    _fail(holder)
    run, task = holder.begin_run("t1", "r-holder")  # a live runner (it would stop: failed)
    assert task.status is TaskStatus.FAILED
    before = snapshot(other, "t1")
    with pytest.raises(TaskBusy):
        other.retry_task("t1", "r-retry")
    assert snapshot(other, "t1") == before
    holder.end_run(run)
    assert other.retry_task("t1", "r-retry").status is TaskStatus.PENDING


def test_a_runner_from_before_the_retry_is_fenced(
    open_: Opener,  # noqa: F811
    take_over: TakeOver,  # noqa: F811
) -> None:
    stale = open_(heartbeat=3600.0)
    stale.create_task("t1", OTHER)
    run, _ = stale.begin_run("t1", "r-stale")
    stale.start_step(run, 0, "fetch")
    assert stale.record_error(run, 0, "boom", 1) is True  # failed, but still held
    take_over(stale, run)  # its hold lapses (lock file gone, lease expired)
    other = open_()
    other.retry_task("t1", "r-retry")
    before = snapshot(other, "t1")
    with pytest.raises(LeaseLost):
        stale.start_step(run, 0, "fetch")
    assert snapshot(other, "t1") == before
    assert kinds(other, "t1")[-1] == "task_retried"


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_migration_versions_are_unique_and_match_across_dialects(dialect: str) -> None:
    versions = [number for number, _name, _path in sql.migrations(dialect)]
    assert len(versions) == len(set(versions)), f"two {dialect} migrations share a number"
    other = "postgres" if dialect == "sqlite" else "sqlite"
    assert [(n, name) for n, name, _ in sql.migrations(dialect)] == [
        (n, name) for n, name, _ in sql.migrations(other)
    ]
