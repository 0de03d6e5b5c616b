"""The journal invariant checker and canonical JSON (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from ninelives.journal import dumps, invariant_violations
from ninelives.models import Event


def _journal(*rows: tuple[str, str, int | None]) -> list[Event]:
    """Events from ``(run, kind, step)`` rows, numbered from seq 1."""
    return [
        Event(seq=i, ts=float(i), task_id="t", run_id=run, kind=kind, step_idx=step, data={})
        for i, (run, kind, step) in enumerate(rows, start=1)
    ]


CLEAN_WITH_RECOVERY = _journal(
    ("c", "task_created", None),
    ("r1", "run_started", None),
    ("r1", "step_started", 0),
    ("r1", "step_finished", 0),
    ("r1", "step_started", 1),  # killed here
    ("r2", "step_recovered", 1),
    ("r2", "run_started", None),
    ("r2", "step_started", 1),
    ("r2", "step_error", 1),
    ("r2", "step_started", 1),
    ("r2", "step_finished", 1),
    ("r2", "task_done", None),
)


def test_a_clean_journal_with_recovery_and_retry_has_no_violation() -> None:
    assert invariant_violations(CLEAN_WITH_RECOVERY) == []


def test_an_unfinished_task_may_have_an_open_step() -> None:
    # The count invariant is only required "once the task is done".
    assert invariant_violations(CLEAN_WITH_RECOVERY[:5]) == []


def test_missing_step_recovered_is_reported() -> None:
    broken = [e for e in CLEAN_WITH_RECOVERY if e.kind != "step_recovered"]
    problems = invariant_violations(broken)
    assert any("step 1: started at seq" in p for p in problems)
    assert any("step_started but" in p for p in problems)


def test_a_step_finished_twice_is_reported() -> None:
    rows = _journal(
        ("r", "run_started", None),
        ("r", "step_started", 0),
        ("r", "step_finished", 0),
        ("r", "step_finished", 0),
        ("r", "task_done", None),
    )
    problems = invariant_violations(rows)
    assert any("closes no start" in p for p in problems)
    assert any("1 step_started but 2" in p for p in problems)


def test_a_run_with_two_run_started_is_reported() -> None:
    rows = _journal(("r", "run_started", None), ("r", "run_started", None))
    assert invariant_violations(rows) == ["run r: 2 run_started events"]


def test_a_failed_task_is_held_to_the_count_invariant() -> None:
    rows = _journal(
        ("r", "run_started", None),
        ("r", "step_started", 0),
        ("r", "step_started", 1),
        ("r", "task_failed", 1),
    )
    assert any("2 step_started but 0" in p for p in invariant_violations(rows))


def test_unknown_kinds_are_ignored() -> None:
    rows = _journal(
        ("r", "run_started", None),
        ("r", "lease_renewed", None),
        ("r", "task_done", None),
    )
    assert invariant_violations(rows) == []


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"b": 1, "a": [1, 2]}, '{"a":[1,2],"b":1}'),
        ({"text": "héllo\n"}, '{"text":"héllo\\n"}'),
        ({}, "{}"),
    ],
)
def test_dumps_is_canonical(value: Any, text: str) -> None:
    assert dumps(value) == text
