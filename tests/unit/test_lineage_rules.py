"""The rules of cancel, fork and plan integrity (ninelives.lineage) and the
invariants verify checks for them (pure: records built by hand)."""

from __future__ import annotations

from typing import Any

import pytest

from ninelives import lineage
from ninelives.errors import InputError, PlanTampered
from ninelives.models import Event, Step, StepStatus, Task, TaskStatus
from ninelives.verify import check_task

STEPS = [("fetch", {"path": "a", "opts": {"x": 1, "y": 2}}, None), ("summarize", {"from": 0}, None)]


def _task(status: TaskStatus = TaskStatus.PENDING, **fields: Any) -> Task:
    steps = tuple(
        Step(task_id="t", idx=i, tool=tool, input=given, status=StepStatus.PENDING, output=None,
             attempts=0, policy=policy)
        for i, (tool, given, policy) in enumerate(STEPS)
    )  # fmt: skip
    task = Task(id="t", goal="g", status=status, created_at=0.0, updated_at=0.0, steps=steps)
    return task._replace(**{"plan_sha256": lineage.task_digest(task), **fields})


def _events(*rows: tuple[str, int | None, dict[str, Any]]) -> list[Event]:
    return [
        Event(seq=i, ts=float(i), task_id="t", run_id="r", kind=kind, step_idx=step, data=data)
        for i, (kind, step, data) in enumerate(rows, start=1)
    ]


def test_the_digest_is_canonical_and_covers_every_part_of_the_plan() -> None:
    base = lineage.plan_digest("g", STEPS)
    reordered = [("fetch", {"opts": {"y": 2, "x": 1}, "path": "a"}, None), STEPS[1]]
    assert lineage.plan_digest("g", reordered) == base  # key order is not content
    changed = [
        lineage.plan_digest("h", STEPS),
        lineage.plan_digest("g", [STEPS[1], STEPS[0]]),
        lineage.plan_digest("g", STEPS[:1]),
        lineage.plan_digest(
            "g", [("fetch", {"path": "b", "opts": {"x": 1, "y": 2}}, None), STEPS[1]]
        ),
        lineage.plan_digest("g", [(*STEPS[0][:2], {"on_unknown": "rerun"}), STEPS[1]]),
        lineage.plan_digest("g", [("llm", *STEPS[0][1:]), STEPS[1]]),
    ]
    assert len({base, *changed}) == len(changed) + 1
    assert lineage.plan_digest("g", [(*STEPS[0][:2], {}), STEPS[1]]) == base  # no policy


def test_appending_extends_the_chain_to_the_digest_of_the_whole_plan() -> None:
    first = lineage.plan_digest("g", STEPS[:1])
    extended = lineage.appended_digest(first, 1, [("summarize", '{"from": 0}')])
    assert extended == lineage.plan_digest("g", STEPS)
    assert lineage.appended_digest(None, 1, [("summarize", "{}")]) is None


def test_check_plan_names_the_task_and_passes_tasks_without_a_digest() -> None:
    lineage.check_plan(_task())
    lineage.check_plan(_task(plan_sha256=None, goal="edited"))
    with pytest.raises(PlanTampered, match="'t'") as caught:
        lineage.check_plan(_task(goal="edited"))
    assert caught.value.task_id == "t"


def test_cancel_allowed_by_status() -> None:
    for status in (TaskStatus.PENDING, TaskStatus.RUNNING, TaskStatus.FAILED,
                   TaskStatus.BLOCKED, TaskStatus.WAITING):  # fmt: skip
        assert lineage.cancel_allowed(_task(status))
    assert not lineage.cancel_allowed(_task(TaskStatus.CANCELLED))
    with pytest.raises(InputError, match="done"):
        lineage.cancel_allowed(_task(TaskStatus.DONE))


@pytest.mark.parametrize("reason", ["x" * 1001, "a\x00b", "lone \ud800"])
def test_a_reason_a_journal_cannot_keep_is_refused(reason: str) -> None:
    with pytest.raises(InputError):
        lineage.check_reason(reason)


def test_verify_accepts_a_fork_and_rejects_a_restarted_copied_step() -> None:
    done = _task()
    steps = (done.steps[0]._replace(status=StepStatus.DONE, output={"n": 0}), done.steps[1])
    fork = done._replace(steps=steps)
    events = _events(
        ("task_created", None, {"steps": 2}), ("task_forked", None, {"source": "s", "from": 1})
    )
    assert check_task(fork, events) == []
    restarted = [*events, *_events(("step_started", 0, {}))]
    restarted[-1] = restarted[-1]._replace(seq=3)
    assert "fork" in {v.check for v in check_task(fork, restarted)}
    late = _events(("task_created", None, {"steps": 2}), ("run_started", None, {}),
                   ("task_forked", None, {"from": 1}))  # fmt: skip
    assert "fork" in {v.check for v in check_task(fork, late)}


def test_verify_rejects_a_step_started_after_the_cancel() -> None:
    cancelled = _task(TaskStatus.CANCELLED)
    clean = _events(
        ("task_created", None, {"steps": 2}), ("task_cancelled", None, {"reason": None})
    )
    assert check_task(cancelled, clean) == []
    steps = (cancelled.steps[0]._replace(status=StepStatus.RUNNING, attempts=1), cancelled.steps[1])
    late = [*clean, *_events(("step_started", 0, {}))]
    late[-1] = late[-1]._replace(seq=3)
    found = {v.check for v in check_task(cancelled._replace(steps=steps), late)}
    assert found == {"cancel"}
    # A task the journal says is cancelled must be stored cancelled.
    assert "task_status" in {v.check for v in check_task(_task(TaskStatus.RUNNING), clean)}


def test_verify_names_an_edited_plan() -> None:
    edited = _task(goal="edited")
    found = check_task(edited, _events(("task_created", None, {"steps": 2})))
    assert [v.check for v in found] == ["plan_integrity"]
