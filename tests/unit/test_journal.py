"""The journal invariant checker, canonical JSON and reading stored rows (pure)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from ninelives.errors import DamagedTask
from ninelives.journal import dumps, invariant_violations
from ninelives.models import Event, Step, StepStatus, Task, load_json


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


@pytest.mark.parametrize(
    "text",
    [
        '{"a":[1,2],"b":"é"}', '" x"', "1", "-2.5e3", "null", "NaN", "-Infinity",
        ' {"a":1}', '{"a":1}\n', '{"a":1} x', '{"a":1}{"b":2}', "", " ", "{", "[1,]",
        '{"a":1,"a":2}', '"\\ud800"',
    ],
)  # fmt: skip
def test_a_stored_json_text_reads_as_json_loads_reads_it(text: str) -> None:
    # load_json takes the decoder's scanner at once for the usual stored text;
    # padded, trailing or broken text must come out as json.loads makes it.
    def read(decode: Callable[[str], Any]) -> str:
        try:
            return repr(("value", decode(text)))  # repr: NaN is not equal to itself
        except ValueError as exc:
            return repr(("error", str(exc)))

    assert read(load_json) == read(json.loads)


def test_a_stored_status_this_version_does_not_know_makes_the_row_damaged() -> None:
    step = (0, "echo", "{}", "bogus", None, 0, None, None, None)
    with pytest.raises(DamagedTask, match="step 0: 'bogus' is not a valid StepStatus"):
        Step.from_row("t", step)
    with pytest.raises(DamagedTask, match="task: 'gone' is not a valid TaskStatus"):
        Task.from_row(("t", "g", "gone", 1.0, 1.0, 0, None), ())
    assert Step.from_row("t", (*step[:3], "done", *step[4:])).status is StepStatus.DONE
