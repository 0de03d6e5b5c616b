"""The Store contract for a workflow's steps (``append_step``, ``finish_task``'s
result), run against every backend: a real SQLite file and a real PostgreSQL
database."""

# ruff: noqa: F811  (the fixtures of test_store_contract are parameters here)
from __future__ import annotations

import pytest
from test_lineage import _sql
from test_store_contract import (  # noqa: F401  (fixtures)
    Opener,
    kinds,
    open_,
    snapshot,
    store,
    url,
)

from ninelives.durable import Workflow, prepare
from ninelives.errors import LeaseLost, PlanTampered, StoreError, TaskCancelled
from ninelives.models import StepStatus, TaskStatus
from ninelives.plan import plan_from_dict
from ninelives.store import Store
from ninelives.verify import check_task

FLOW = Workflow(name="flow", fn=lambda ctx, *args: None)


def _created(store: Store, task_id: str = "w1") -> None:
    store.create_task(task_id, prepare(task_id, FLOW, ["a"], {}))


def test_append_step_commits_the_new_step_running_in_one_transaction(store: Store) -> None:
    _created(store)
    run, task = store.begin_run("w1", "r1", start_first=True)
    assert task.steps == ()
    assert run.started is None
    attempt = store.append_step(run, 0, "read", '{"args":["a"],"kwargs":{}}', policy='{"x":1}')
    assert attempt == 1
    step = store.get_task("w1").steps[0]
    assert (step.idx, step.tool, step.status, step.attempts) == (0, "read", StepStatus.RUNNING, 1)
    assert step.input == {"args": ["a"], "kwargs": {}}
    assert step.policy == {"x": 1}
    assert kinds(store, "w1")[-2:] == ["step_appended", "step_started"]
    store.finish_step(run, 0, "read", '{"value":1}', last=False)
    store.finish_task(run, result='{"ok":true}')
    done = [e for e in store.events("w1") if e.kind == "task_done"]
    assert done[0].data == {"result": {"ok": True}}
    assert store.get_task("w1").status is TaskStatus.DONE
    assert check_task(store.get_task("w1"), store.events("w1")) == []
    store.end_run(run)


def test_append_step_refuses_a_gap_or_a_taken_index_and_writes_nothing(store: Store) -> None:
    _created(store)
    run, _ = store.begin_run("w1", "r1")
    store.append_step(run, 0, "read", "{}")
    store.finish_step(run, 0, "read", '{"value":1}', last=False)
    before = snapshot(store, "w1")
    for idx in (0, 2):
        with pytest.raises(StoreError):
            store.append_step(run, idx, "read", "{}")
    assert snapshot(store, "w1") == before
    store.end_run(run)


def test_append_step_is_fenced_and_cancel_aware(open_: Opener) -> None:
    store = open_()
    _created(store)
    old, _ = store.begin_run("w1", "r1")
    store.end_run(old)
    new, _ = store.begin_run("w1", "r2")
    before = snapshot(store, "w1")
    with pytest.raises(LeaseLost):
        store.append_step(old, 0, "read", "{}")
    assert snapshot(store, "w1") == before
    store.cancel_task("w1", "r3")
    with pytest.raises(TaskCancelled):
        store.append_step(new, 0, "read", "{}")
    assert store.get_task("w1").steps == ()
    store.end_run(new)


def test_the_claim_never_starts_a_workflow_step(store: Store) -> None:
    _created(store)
    run, _ = store.begin_run("w1", "r1")
    store.append_step(run, 0, "read", "{}")
    store.end_run(run)  # killed: the step is left running
    run, task = store.begin_run("w1", "r2", start_first=True)
    assert run.recovered == (0,)
    assert run.started is None
    assert task.steps[0].status is StepStatus.PENDING  # its code starts it, by name
    store.end_run(run)


def test_a_plan_whose_goal_reads_like_a_workflow_is_started_by_its_claim(store: Store) -> None:
    # Only a goal of the workflow form (`workflow:{"args":...`) makes a workflow's task.
    # SQL's LIKE ignores case on SQLite: "Workflow: ..." was once taken for a
    # workflow there, and its claim left the first step unstarted.
    plan = plan_from_dict(
        {"goal": "Workflow: tidy the notes", "steps": [{"tool": "fetch", "input": {}}]}
    )
    store.create_task("p1", plan)
    run, task = store.begin_run("p1", "r1", start_first=True)
    assert run.started == (0, 1)
    assert task.steps[0].status is StepStatus.RUNNING
    store.finish_step(run, 0, "fetch", "{}", last=True)
    store.end_run(run)
    assert store.get_task("p1").status is TaskStatus.DONE


def test_the_claim_starts_no_step_of_a_task_that_is_not_pending_or_running(store: Store) -> None:
    plan = plan_from_dict({"goal": "two", "steps": [{"tool": "a", "input": {}}] * 2})
    store.create_task("p1", plan)
    run, _ = store.begin_run("p1", "r1", start_first=True)
    assert store.record_error(run, 0, "boom", 1)  # the task fails; step 1 stays pending
    store.end_run(run)
    run, task = store.begin_run("p1", "r2", start_first=True)
    assert run.started is None
    assert task.status is TaskStatus.FAILED
    assert [s.status for s in store.get_task("p1").steps] == [
        StepStatus.FAILED,
        StepStatus.PENDING,
    ]
    store.end_run(run)


def test_an_edited_workflow_step_or_argument_is_refused(open_: Opener, url: str) -> None:
    store = open_()
    _created(store)
    run, _ = store.begin_run("w1", "r1")
    store.append_step(run, 0, "read", '{"args":[1]}', policy='{"on_unknown":"rerun"}')
    store.finish_step(run, 0, "read", '{"value":1}', last=False)
    store.end_run(run)
    store.end_run(store.begin_run("w1", "r2")[0])  # unedited: accepted
    store.close()
    _sql(url, "UPDATE steps SET policy = ? WHERE task_id = 'w1' AND idx = 0", ('{"x":2}',))
    with pytest.raises(PlanTampered):
        open_().begin_run("w1", "r3")
    _sql(
        url,
        "UPDATE steps SET policy = ? WHERE task_id = 'w1' AND idx = 0",
        ('{"on_unknown":"rerun"}',),
    )
    again = open_()
    again.end_run(again.begin_run("w1", "r4")[0])  # restored: accepted
    goal = prepare("w1", FLOW, ["b"], {}).goal
    _sql(url, "UPDATE tasks SET goal = ? WHERE id = 'w1'", (goal,))
    with pytest.raises(PlanTampered):
        open_().begin_run("w1", "r5")
