"""Unknown outcomes and approvals without I/O: tool declarations, plan checks,
the mode a step gets, the message a parked task gives, and the invariants that
``verify`` learned (each with the journal it must refuse)."""

from __future__ import annotations

from typing import Any

import pytest

from ninelives.errors import PlanError, TaskBlocked, TaskWaiting
from ninelives.models import Event, Step, StepStatus, Task, TaskStatus
from ninelives.parking import make_approval, mode_of, parked
from ninelives.plan import plan_from_dict, validate
from ninelives.tools import Registry, Tool, ToolContext, tool
from ninelives.verify import check_task


def _noop(step_input: Any, ctx: Any, key: str) -> dict[str, Any]:
    return {}


def _probe(ctx: ToolContext) -> dict[str, Any] | None:
    return None


def test_the_decorator_checks_the_mode() -> None:
    with pytest.raises(PlanError, match="one of rerun, probe, refuse"):
        tool("x", on_unknown="maybe")(_noop)
    with pytest.raises(PlanError, match="needs a probe"):
        tool("x", on_unknown="probe")(_noop)


def test_a_plan_asking_probe_needs_a_tool_with_one() -> None:
    tools = Registry([Tool(name="plain", fn=_noop),
                      Tool(name="probed", fn=_noop, on_unknown="probe", probe=_probe)],
                     entry_points=False)  # fmt: skip
    asked = {"goal": "g", "steps": [{"tool": "plain", "input": {}, "on_unknown": "probe"}]}
    with pytest.raises(PlanError, match="has none"):
        validate(plan_from_dict(asked), tools.lookup)
    asked["steps"][0]["tool"] = "probed"  # type: ignore[index]
    validate(plan_from_dict(asked), tools.lookup)
    defaults = {"goal": "g", "defaults": {"on_unknown": "probe"},
                "steps": [{"tool": "plain", "input": {}}]}  # fmt: skip
    with pytest.raises(PlanError, match="has none"):
        validate(plan_from_dict(defaults), tools.lookup)


def _step(tool: str = "t", policy: dict[str, Any] | None = None, **kw: Any) -> Step:
    fields: dict[str, Any] = {"task_id": "x", "idx": 0, "tool": tool, "input": {},
                              "status": StepStatus.PENDING, "output": None, "attempts": 0,
                              "policy": policy}  # fmt: skip
    fields.update(kw)
    return Step(**fields)


def test_the_plan_overrides_the_tool() -> None:
    refusing = Tool(name="t", fn=_noop, on_unknown="refuse")
    assert mode_of(_step(), refusing) == "refuse"
    assert mode_of(_step(policy={"on_unknown": "rerun"}), refusing) == "rerun"
    assert mode_of(_step(policy={"max_attempts": 2}), Tool(name="t", fn=_noop)) == "rerun"


def test_approval_needs_a_prompt() -> None:
    approval = make_approval()
    assert approval.validate is not None
    for bad in ({}, {"prompt": ""}, {"prompt": 3}):
        with pytest.raises(PlanError, match="prompt"):
            approval.validate(bad)
    approval.validate({"prompt": "ok?"})


def _task(status: TaskStatus, *steps: Step) -> Task:
    return Task(id="x", goal="g", status=status, created_at=0.0, updated_at=0.0, steps=steps)


def test_the_parked_message_names_the_command() -> None:
    blocked = parked(_task(TaskStatus.BLOCKED, _step(status=StepStatus.BLOCKED)), "why")
    assert isinstance(blocked, TaskBlocked)
    assert "ninelives resolve x 0 --done JSON" in str(blocked)
    assert "ninelives resolve x 0 --retry" in str(blocked)
    waiting = parked(_task(TaskStatus.WAITING, _step(tool="approval", status=StepStatus.WAITING,
                                                     input={"prompt": "ship?"})))  # fmt: skip
    assert isinstance(waiting, TaskWaiting)
    assert "ship?" in str(waiting)
    assert "ninelives approve x 0" in str(waiting)


# -- verify: the new events' invariants, each with a journal it must refuse ---------


def _events(*rows: tuple[str, int | None, dict[str, Any]]) -> list[Event]:
    """A journal of ``rows``; each ``run_started`` begins a run of its own."""
    head = [Event(seq=1, ts=0.0, task_id="x", run_id="c", kind="task_created", step_idx=None,
                  data={"steps": 1})]  # fmt: skip
    runs = 0
    for seq, (kind, step, data) in enumerate(rows, start=2):
        runs += kind == "run_started"
        head.append(Event(seq=seq, ts=0.0, task_id="x", run_id=f"r{runs}", kind=kind,
                          step_idx=step, data=data))  # fmt: skip
    return head


def _checks(task: Task, events: list[Event]) -> set[str]:
    return {v.check for v in check_task(task, events)}


STARTED = ("step_started", 0, {"attempt": 1, "tool": "t"})
RUN = ("run_started", None, {"recovered": []})


def test_reconciled_after_its_probe_is_clean_and_without_it_is_not() -> None:
    done = _task(TaskStatus.DONE, _step(status=StepStatus.DONE, output={"a": 1}, attempts=1))
    good = _events(RUN, STARTED, ("run_started", None, {"recovered": [0]}),
                   ("step_recovered", 0, {"on_unknown": "probe"}), ("step_reconciled", 0, {}),
                   ("task_done", None, {}))  # fmt: skip
    assert check_task(done, good) == []
    forged = _events(RUN, STARTED, ("step_recovered", 0, {}), ("step_reconciled", 0, {}),
                     ("task_done", None, {}))  # fmt: skip
    assert "reconciled" in _checks(done, forged)


def test_a_resolution_needs_a_block_and_a_block_a_reason() -> None:
    pending = _task(TaskStatus.PENDING, _step(status=StepStatus.PENDING, attempts=1))
    good = _events(RUN, STARTED, ("run_started", None, {"recovered": [0]}),
                   ("step_recovered", 0, {"on_unknown": "refuse"}),
                   ("step_blocked", 0, {"reason": "unknown"}),
                   ("step_resolved", 0, {"outcome": "retry"}))  # fmt: skip
    assert check_task(pending, good) == []
    unblocked = _events(RUN, STARTED, ("step_recovered", 0, {}),
                        ("step_resolved", 0, {"outcome": "retry"}))  # fmt: skip
    assert "decided" in _checks(pending, unblocked)
    silent = _events(RUN, STARTED, ("step_recovered", 0, {"on_unknown": "refuse"}),
                     ("step_blocked", 0, {}))  # fmt: skip
    blocked = _task(TaskStatus.BLOCKED, _step(status=StepStatus.BLOCKED, attempts=1))
    assert "blocked" in _checks(blocked, silent)


def test_statuses_follow_parking_and_decisions() -> None:
    waiting_events = _events(RUN, ("step_waiting", 0, {"prompt": "ok?"}))
    waiting = _task(TaskStatus.WAITING, _step(status=StepStatus.WAITING))
    assert check_task(waiting, waiting_events) == []
    # A task left running where its journal says waiting (or the step) is caught.
    assert "task_status" in _checks(_task(TaskStatus.RUNNING, waiting.steps[0]), waiting_events)
    assert "step_status" in _checks(_task(TaskStatus.WAITING, _step()), waiting_events)
    rejected = _task(TaskStatus.FAILED, _step(status=StepStatus.FAILED))
    good = [
        *waiting_events[:],
        *_events(("step_rejected", 0, {"note": "no"}), ("task_failed", 0, {"reason": "no"}))[1:],
    ]
    good = [e._replace(seq=i) for i, e in enumerate(good, start=1)]
    assert check_task(rejected, good) == []
    unfailed = [e for e in good if e.kind != "task_failed"]
    assert "rejected" in _checks(rejected, unfailed)


def test_a_step_done_twice_by_any_means_is_caught() -> None:
    done = _task(TaskStatus.DONE, _step(status=StepStatus.DONE, output={}, attempts=1))
    twice = _events(RUN, STARTED, ("step_finished", 0, {"tool": "t"}),
                    ("step_resolved", 0, {"outcome": "done"}), ("task_done", None, {}))  # fmt: skip
    assert "finished_twice" in _checks(done, twice)
