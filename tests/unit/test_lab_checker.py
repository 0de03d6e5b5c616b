"""The five-property checker itself: clean when the properties hold, and a
negative control per property showing it reports each way of breaking them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ninelives.testing import Snapshot, five_property_violations
from ninelives.testing.lab import GUIDE_PLAN, events_from_export

SUMMARY = "Line one\nLine two\nLine three"
OUTPUTS = {
    0: {"chars": 9, "sha256": "0" * 64, "text": "Line one\n"},
    1: {"summary": SUMMARY, "engine": "stub"},
    2: {"path": "artifacts/t-2.md", "deduplicated": True},
}
ARTIFACTS = {"t-2.md": SUMMARY}
TOOLS = ["fetch", "summarize", "write_artifact"]


def _event(seq: int, run: str, kind: str, step: int | None = None, **data: Any) -> dict[str, Any]:
    return {"seq": seq, "ts": 1000.0 + seq, "run": run, "kind": kind, "step": step, **data}


def _status(task: str, statuses: list[str], attempts: list[int]) -> dict[str, Any]:
    steps = [
        {
            "idx": i,
            "tool": TOOLS[i],
            "status": s,
            "attempts": a,
            "output": OUTPUTS[i] if s == "done" else None,
        }
        for i, (s, a) in enumerate(zip(statuses, attempts, strict=True))
    ]
    overall = "done" if all(s == "done" for s in statuses) else "running"
    return {"task": task, "goal": GUIDE_PLAN["goal"], "status": overall, "steps": steps}


def killed_at_after_effect_2() -> tuple[Snapshot, Snapshot]:
    """The journal of a run killed at ``after_effect:2`` and of its resume."""
    before_events = [
        _event(1, "c", "task_created", steps=3),
        _event(2, "r1", "run_started", recovered=[]),
        _event(3, "r1", "step_started", 0, attempt=1, tool="fetch"),
        _event(4, "r1", "step_finished", 0, tool="fetch"),
        _event(5, "r1", "step_started", 1, attempt=1, tool="summarize"),
        _event(6, "r1", "step_finished", 1, tool="summarize"),
        _event(7, "r1", "step_started", 2, attempt=1, tool="write_artifact"),
    ]
    after_events = [
        *before_events,
        _event(8, "r2", "step_recovered", 2),
        _event(9, "r2", "run_started", recovered=[2]),
        _event(10, "r2", "step_started", 2, attempt=2, tool="write_artifact"),
        _event(11, "r2", "step_finished", 2, tool="write_artifact"),
        _event(12, "r2", "task_done"),
    ]
    before = Snapshot(
        status=_status("t", ["done", "done", "running"], [1, 1, 1]), events=before_events
    )
    after = Snapshot(status=_status("t", ["done", "done", "done"], [1, 1, 2]), events=after_events)
    return before, after


def check(
    before: Snapshot | None,
    after: Snapshot,
    *,
    runs: int | None = 2,
    artifacts: dict[str, str] | None = None,
    plan: dict[str, Any] | None = None,
) -> list[str]:
    return five_property_violations(
        plan=plan or GUIDE_PLAN,
        before=before,
        after=after,
        runs=runs,
        artifacts=ARTIFACTS if artifacts is None else artifacts,
        expected_artifacts=ARTIFACTS,
    )


def _without(snapshot: Snapshot, kind: str) -> Snapshot:
    return Snapshot(
        status=snapshot.status, events=[e for e in snapshot.events if e["kind"] != kind]
    )


def test_a_clean_kill_and_resume_has_no_violation() -> None:
    before, after = killed_at_after_effect_2()
    assert check(before, after) == []
    assert check(None, after) == []
    assert check(before, after, runs=None) == []


def test_uninterrupted_run_has_no_violation() -> None:
    _, after = killed_at_after_effect_2()
    events = [
        _event(1, "c", "task_created", steps=3),
        _event(2, "r1", "run_started", recovered=[]),
        *[
            _event(3 + 2 * i + k, "r1", kind, i, tool=TOOLS[i])
            for i in range(3)
            for k, kind in enumerate(["step_started", "step_finished"])
        ],
        _event(9, "r1", "task_done"),
    ]
    assert check(None, Snapshot(status=after.status, events=events), runs=1) == []


# -- 1. state preserved ------------------------------------------------------


def test_changed_committed_output_is_reported() -> None:
    before, after = killed_at_after_effect_2()
    after.status["steps"][1]["output"] = {"summary": "recomputed", "engine": "stub"}
    assert any("step 1: committed output changed" in p for p in check(before, after))


def test_changed_plan_is_reported() -> None:
    before, after = killed_at_after_effect_2()
    plan = copy.deepcopy(GUIDE_PLAN)
    plan["steps"][1]["tool"] = "fetch"
    assert any("plan changed" in p for p in check(before, after, plan=plan))


def test_task_not_done_is_reported() -> None:
    before, after = killed_at_after_effect_2()
    after.status["status"] = "running"
    after.status["steps"][2].update(status="pending", output=None)
    problems = check(before, after)
    assert any("not done" in p for p in problems)
    assert any("steps [2] are not done" in p for p in problems)


def test_rewritten_journal_prefix_is_reported() -> None:
    before, after = killed_at_after_effect_2()
    after.events[3] = {**after.events[3], "kind": "step_error", "error": "rewritten"}
    assert any("changed or removed" in p for p in check(before, after))


# -- 2. resumed, not restarted --------------------------------------------------


def test_restarted_done_step_is_reported() -> None:
    before, after = killed_at_after_effect_2()
    after.events[9:9] = [
        _event(9, "r2", "step_started", 1, attempt=2, tool="summarize"),
        _event(9, "r2", "step_finished", 1, tool="summarize"),
    ]
    for n, e in enumerate(after.events, start=1):
        e["seq"] = n
    assert any("[1] were done before the kill but started again" in p for p in check(before, after))
    # The journal alone shows it too, with no snapshot from before the kill.
    assert any("step 1 started again at seq 10" in p for p in check(None, after))


# -- 3. explicit recovery ---------------------------------------------------


def test_missing_step_recovered_is_reported() -> None:
    before, after = killed_at_after_effect_2()
    problems = check(before, _without(after, "step_recovered"))
    assert any("steps left running [2] but recovered []" in p for p in problems)
    assert any("run r2: steps [2] were left running but it recovered []" in p for p in problems)
    assert any("step 2: started at seq" in p for p in problems)  # the invariant too


def test_missing_step_recovered_is_reported_without_a_before_snapshot() -> None:
    _, after = killed_at_after_effect_2()
    assert check(None, _without(after, "step_recovered")) != []


def test_run_started_that_does_not_list_its_recovery_is_reported() -> None:
    before, after = killed_at_after_effect_2()
    after.events[8] = {**after.events[8], "recovered": []}
    assert any("run_started lists [] but step_recovered" in p for p in check(before, after))


# -- 4. effects once ------------------------------------------------------------


@pytest.mark.parametrize(
    "artifacts",
    [
        {},
        {"t-2.md": SUMMARY + SUMMARY},
        {"t-2.md": SUMMARY, ".t-2.md.0123456789abcdef.tmp": SUMMARY},
        {"t-2.md": SUMMARY, "t-2 (copy).md": SUMMARY},
    ],
)
def test_missing_duplicated_or_leftover_artifacts_are_reported(artifacts: dict[str, str]) -> None:
    before, after = killed_at_after_effect_2()
    assert any(p.startswith("artifacts ") for p in check(before, after, artifacts=artifacts))


# -- 5. journal complete --------------------------------------------------------


def test_wrong_number_of_runs_is_reported() -> None:
    before, after = killed_at_after_effect_2()
    assert any("2 runs have a run_started, expected 3" in p for p in check(before, after, runs=3))


def test_a_run_without_run_started_is_reported() -> None:
    before, after = killed_at_after_effect_2()
    problems = check(before, _without(after, "run_started"), runs=None)
    assert any("without a run_started" in p for p in problems)


def test_a_run_with_two_run_started_is_reported() -> None:
    before, after = killed_at_after_effect_2()
    after.events.insert(10, _event(10, "r2", "run_started", recovered=[]))
    for n, e in enumerate(after.events, start=1):
        e["seq"] = n
    assert any("2 run_started events" in p for p in check(before, after))


def test_unbalanced_journal_is_reported() -> None:
    before, after = killed_at_after_effect_2()
    broken = Snapshot(
        status=after.status, events=[e for e in after.events if e["seq"] != 11]
    )  # step_finished of step 2 lost
    assert any("step_started but" in p for p in check(before, broken))


def test_seq_out_of_order_is_reported() -> None:
    _, after = killed_at_after_effect_2()
    after.events[-1] = {**after.events[-1], "seq": 3}
    assert any("seq order" in p for p in check(None, after))


def test_export_rows_round_trip_to_events() -> None:
    _, after = killed_at_after_effect_2()
    events = events_from_export("t", after.events)
    assert [e.seq for e in events] == list(range(1, 13))
    assert events[1].data == {"recovered": []}
    assert events[2].data == {"attempt": 1, "tool": "fetch"}
    assert events[0].task_id == "t"
    assert after.journal() == events
