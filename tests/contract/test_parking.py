"""The store's part in unknown outcomes and approvals, on every backend:
recovery by ``on_unknown`` inside the claim, ``park_step``, ``settle_step`` and
``decide_step``, each one fenced transaction with its journal events."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ninelives.errors import InputError, LeaseLost, StoreError, TaskBusy, UnknownTask
from ninelives.journal import invariant_violations
from ninelives.models import EventKind, Step, StepStatus, TaskStatus
from ninelives.plan import plan_from_dict
from ninelives.store import Decision, Store, is_postgres_url, open_store
from ninelives.verify import check_task

Opener = Callable[..., Store]
PLAN = plan_from_dict(
    {
        "goal": "pay, then ask",
        "steps": [
            {"tool": "fetch", "input": {"path": "a"}},
            {"tool": "approval", "input": {"prompt": "ok?"}},
            {"tool": "fetch", "input": {"path": "b"}},
        ],
    }
)


@pytest.fixture
def url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return str(tmp_path / "state.db")
    return str(request.getfixturevalue("pg_database"))


@pytest.fixture
def open_(url: str) -> Iterator[Opener]:
    opened: list[Store] = []

    def opener() -> Store:
        if is_postgres_url(url):
            from ninelives.store.postgres.store import PostgresStore

            store: Store = PostgresStore(url, lease=5.0)
        else:
            store = open_store(url)
        opened.append(store)
        return store

    yield opener
    for store in opened:
        store.close()


@pytest.fixture
def store(open_: Opener) -> Store:
    return open_()


def mode(name: str) -> Callable[[Step], str]:
    return lambda step: name


def kinds(store: Store, task_id: str) -> list[str]:
    return [e.kind for e in store.events(task_id)]


def snapshot(store: Store, task_id: str) -> tuple[object, ...]:
    task = store.get_task(task_id)
    return (
        task.status,
        task.lease_epoch,
        tuple((s.status, s.attempts, s.output) for s in task.steps),
        tuple((e.seq, e.kind, e.step_idx) for e in store.events(task_id)),
    )


def clean(store: Store, task_id: str) -> None:
    task, events = store.get_task(task_id), store.events(task_id)
    assert check_task(task, events) == []
    assert invariant_violations(events) == []


def _left_running(store: Store, task_id: str = "t") -> None:
    """Step 0 committed running by a run that then died (its hold released)."""
    store.create_task(task_id, PLAN, queue="q")
    run, _ = store.begin_run(task_id, "dead", start_first=True)
    assert run.started == (0, 1)
    store.end_run(run)


def test_refuse_parks_in_the_claim_transaction(store: Store) -> None:
    _left_running(store)
    run, task = store.begin_run("t", "next", start_first=True, on_unknown=mode("refuse"))
    assert task.status is TaskStatus.BLOCKED
    assert task.steps[0].status is StepStatus.BLOCKED
    assert run.recovered == (0,)
    assert run.started is None
    events = store.events("t")
    recovered, blocked = (e for e in events if e.kind in ("step_recovered", "step_blocked"))
    assert recovered.data == {"on_unknown": "refuse"}
    assert blocked.step_idx == 0
    assert "at most once" in blocked.data["reason"]
    store.end_run(run)
    assert store.claim_next("q", "worker") is None  # a blocked task is never claimed
    clean(store, "t")


def test_rerun_is_the_default(store: Store) -> None:
    _left_running(store)
    run, task = store.begin_run("t", "next", start_first=True, on_unknown=mode("rerun"))
    assert task.steps[0].status is StepStatus.RUNNING
    assert run.started == (0, 2)
    assert kinds(store, "t")[-3:] == ["step_recovered", "run_started", "step_started"]
    store.end_run(run)


def test_probe_leaves_the_step_running_until_its_answer(store: Store) -> None:
    _left_running(store)
    run, task = store.begin_run("t", "next", start_first=True, on_unknown=mode("probe"))
    assert task.steps[0].status is StepStatus.RUNNING
    assert run.started is None  # steps run in order: the probe comes first
    assert "step_recovered" not in kinds(store, "t")  # journaled with the answer
    store.settle_step(run, 0, output='{"found":true}')
    task = store.get_task("t")
    assert task.steps[0].status is StepStatus.DONE
    assert task.steps[0].output == {"found": True}
    assert kinds(store, "t")[-2:] == ["step_recovered", "step_reconciled"]
    with pytest.raises(StoreError):  # no longer running: nothing written
        store.settle_step(run, 0, output='{"again":true}')
    store.end_run(run)
    clean(store, "t")


def test_probe_not_done_runs_again_and_cannot_tell_blocks(store: Store) -> None:
    _left_running(store)
    run, _ = store.begin_run("t", "a", on_unknown=mode("probe"))
    store.settle_step(run, 0)
    assert store.get_task("t").steps[0].status is StepStatus.PENDING
    assert store.start_step(run, 0, "fetch") == 2
    store.end_run(run)
    run, _ = store.begin_run("t", "b", on_unknown=mode("probe"))
    store.settle_step(run, 0, block="the service does not answer")
    task = store.get_task("t")
    assert (task.status, task.steps[0].status) == (TaskStatus.BLOCKED, StepStatus.BLOCKED)
    assert store.events("t")[-1].data == {"reason": "the service does not answer"}
    store.end_run(run)
    clean(store, "t")


def test_park_waiting_then_approve_fences_the_old_runner(store: Store) -> None:
    store.create_task("t", PLAN, queue="q")
    run, _ = store.begin_run("t", "r", start_first=True)
    store.finish_step(run, 0, "fetch", '{"a":1}', last=False)
    store.park_step(run, 1, StepStatus.WAITING, {"prompt": "ok?"})
    task = store.get_task("t")
    assert (task.status, task.steps[1].status) == (TaskStatus.WAITING, StepStatus.WAITING)
    store.end_run(run)
    assert store.claim_next("q", "worker") is None  # a waiting task is never claimed
    approved = store.decide_step(
        "t", "person", 1,
        Decision(expect=StepStatus.WAITING, status=StepStatus.DONE,
                 kind=EventKind.STEP_APPROVED, data={}, output='{"approved":true}'),
    )  # fmt: skip
    assert approved.status is TaskStatus.PENDING
    assert approved.steps[1].output == {"approved": True}
    assert approved.lease_epoch == task.lease_epoch + 1
    before = snapshot(store, "t")
    with pytest.raises(LeaseLost):  # the runner from before the decision is fenced out
        store.start_step(run, 2, "fetch")
    assert snapshot(store, "t") == before
    claimed = store.claim_next("q", "worker")
    assert claimed is not None
    assert claimed[0].task_id == "t"
    store.end_run(claimed[0])
    clean(store, "t")


def test_park_is_fenced(open_: Opener) -> None:
    store = open_()
    store.create_task("t", PLAN)
    run, _ = store.begin_run("t", "r", start_first=True)
    store.abandon_run(run)  # a new epoch: this runner is out
    before = snapshot(store, "t")
    with pytest.raises(LeaseLost):
        store.park_step(run, 1, StepStatus.WAITING, {"prompt": "ok?"})
    with pytest.raises(LeaseLost):
        store.settle_step(run, 0, output="{}")
    assert snapshot(store, "t") == before
    store.end_run(run)


def test_reject_fails_the_task(store: Store) -> None:
    store.create_task("t", PLAN)
    run, _ = store.begin_run("t", "r", start_first=True)
    store.finish_step(run, 0, "fetch", "{}", last=False)
    store.park_step(run, 1, StepStatus.WAITING, {"prompt": "ok?"})
    store.end_run(run)
    task = store.decide_step(
        "t", "person", 1,
        Decision(expect=StepStatus.WAITING, status=StepStatus.FAILED,
                 kind=EventKind.STEP_REJECTED, data={"note": "no"}, reason="no"),
    )  # fmt: skip
    assert (task.status, task.steps[1].status) == (TaskStatus.FAILED, StepStatus.FAILED)
    assert store.events("t")[-1].data == {"reason": "no"}
    clean(store, "t")


def test_a_decision_on_the_wrong_state_changes_nothing(open_: Opener) -> None:
    store = open_()
    store.create_task("t", PLAN)
    resolve = Decision(expect=StepStatus.BLOCKED, status=StepStatus.PENDING,
                       kind=EventKind.STEP_RESOLVED, data={"outcome": "retry"})  # fmt: skip
    before = snapshot(store, "t")
    with pytest.raises(InputError):
        store.decide_step("t", "person", 0, resolve)
    with pytest.raises(UnknownTask):
        store.decide_step("nosuch", "person", 0, resolve)
    run, _ = store.begin_run("t", "r", start_first=True)
    store.end_run(run)
    holder, _ = store.begin_run("t", "holder", on_unknown=mode("refuse"))  # held, and blocked
    with pytest.raises(TaskBusy):  # a live runner holds it: decided once it lets go
        open_().decide_step("t", "person", 0, resolve)
    store.end_run(holder)
    assert store.decide_step("t", "person", 0, resolve).status is TaskStatus.PENDING
    with pytest.raises(InputError):  # decided already
        store.decide_step("t", "person", 0, resolve)
    assert snapshot(store, "t") != before
    clean(store, "t")
