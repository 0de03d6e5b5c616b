"""The hard-kill suite of the contract: the installed command as a real process,
killed with a real SIGKILL, then resumed; each case checks the five properties."""

from __future__ import annotations

import signal
import time

import pytest

from ninelives.testing import Lab, Snapshot, five_property_violations
from ninelives.testing.lab import GUIDE_PLAN

pytestmark = pytest.mark.crash

TASK = "demo"
SUMMARY = "Line one\nLine two\nLine three"  # the stub summary of SUMMARY_NOTES, by hand
EXPECTED = {f"{TASK}-2.md": SUMMARY}
KILLED = -signal.SIGKILL


def created(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", TASK, "plan.json").returncode == 0


def violations(lab: Lab, after: Snapshot, before: Snapshot | None, runs: int) -> list[str]:
    return five_property_violations(
        plan=GUIDE_PLAN,
        before=before,
        after=after,
        runs=runs,
        artifacts=lab.artifacts(),
        expected_artifacts=EXPECTED,
    )


def test_baseline(lab: Lab) -> None:
    created(lab)
    result = lab.cli("run", TASK)
    assert result.returncode == 0, result.stderr
    after = lab.snapshot(TASK)
    assert violations(lab, after, None, runs=1) == []
    assert [s["attempts"] for s in after.status["steps"]] == [1, 1, 1]
    assert after.outputs[1] == {"summary": SUMMARY, "engine": "stub"}
    assert after.outputs[2]["deduplicated"] is False


@pytest.mark.parametrize("step", [0, 1, 2])
@pytest.mark.parametrize("point", ["before_effect", "after_effect", "after_commit"])
def test_crash_point_then_resume(lab: Lab, point: str, step: int) -> None:
    created(lab)
    killed = lab.cli("run", TASK, AGENT_CRASH_AT=f"{point}:{step}")
    assert killed.returncode == KILLED, killed.stderr
    before = lab.snapshot(TASK)

    # The kill landed exactly where it was aimed.
    if point == "after_commit":
        assert before.steps_with("done") == set(range(step + 1))
        assert before.steps_with("running") == set()
    else:
        assert before.steps_with("done") == set(range(step))
        assert before.steps_with("running") == {step}
    assert before.steps_with("pending") == set(range(step + 1, 3))
    published = point == "after_commit" or (point == "after_effect" and step == 2)
    assert lab.artifacts() == (EXPECTED if step == 2 and published else {})

    resumed = lab.cli("run", TASK)
    assert resumed.returncode == 0, resumed.stderr
    after = lab.snapshot(TASK)
    assert violations(lab, after, before, runs=2) == []

    attempts = [s["attempts"] for s in after.status["steps"]]
    interrupted = point != "after_commit"
    assert attempts == [2 if interrupted and i == step else 1 for i in range(3)]
    # Only the step whose effect had already happened finds its artifact there.
    assert after.outputs[2]["deduplicated"] is (point == "after_effect" and step == 2)


@pytest.mark.fsync_on
@pytest.mark.slow
def test_sigkill_from_outside_while_step_1_sleeps(lab: Lab) -> None:
    created(lab)
    runner = lab.spawn("run", TASK, AGENT_STEP_DELAY="2")
    lab.wait_for(TASK, "step_started", step=1)
    assert Lab.kill(runner) == KILLED
    before = lab.snapshot(TASK)
    assert before.steps_with("done") == {0}
    assert before.steps_with("running") == {1}
    assert lab.artifacts() == {}

    resumed = lab.cli("run", TASK)
    assert resumed.returncode == 0, resumed.stderr
    after = lab.snapshot(TASK)
    assert violations(lab, after, before, runs=2) == []
    assert [s["attempts"] for s in after.status["steps"]] == [1, 2, 1]


@pytest.mark.fsync_on
@pytest.mark.slow
def test_second_runner_is_refused_with_exit_3_at_once(lab: Lab) -> None:
    created(lab)
    first = lab.spawn("run", TASK, AGENT_STEP_DELAY="1")
    lab.wait_for(TASK, "step_started", step=0)
    started = time.monotonic()
    second = lab.cli("run", TASK)
    elapsed = time.monotonic() - started
    assert first.poll() is None, "the first runner ended before the second tried"
    assert second.returncode == 3, second
    assert elapsed < 2.5  # at once: it does not wait for the first runner's lock
    lines = second.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("ninelives: error: ")

    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    after = lab.snapshot(TASK)
    # The refused runner left no trace: one run_started, from the first runner.
    assert violations(lab, after, None, runs=1) == []

    # The control: once the first runner is gone, the same command is not refused.
    again = lab.cli("run", TASK)
    assert again.returncode == 0, again.stderr
    assert violations(lab, lab.snapshot(TASK), after, runs=2) == []


def test_negative_control_unsafe_effect_duplicates(lab: Lab) -> None:
    """Without the idempotent effect, the same kill and resume publish twice: the
    kills reach the dangerous window, and the checker sees the duplicate."""
    created(lab)
    unsafe = {"AGENT_UNSAFE_EFFECTS": "1"}
    killed = lab.cli("run", TASK, AGENT_CRASH_AT="after_effect:2", **unsafe)
    assert killed.returncode == KILLED
    before = lab.snapshot(TASK)
    assert lab.artifacts() == {"report.log": SUMMARY + "\n---\n"}

    resumed = lab.cli("run", TASK, **unsafe)
    assert resumed.returncode == 0, resumed.stderr
    after = lab.snapshot(TASK)
    report = lab.artifacts()["report.log"]
    assert report == (SUMMARY + "\n---\n") * 2
    assert report.count(SUMMARY) == 2

    problems = five_property_violations(
        plan=GUIDE_PLAN,
        before=before,
        after=after,
        runs=2,
        artifacts=lab.artifacts(),
        expected_artifacts={"report.log": SUMMARY + "\n---\n"},
    )
    # Everything else held: the only violation is the duplicated effect.
    assert len(problems) == 1, problems
    assert problems[0].startswith("artifacts "), problems


def test_unsafe_effect_without_a_kill_writes_once(lab: Lab) -> None:
    # The control of the negative control: the duplicate comes from the kill.
    created(lab)
    assert lab.cli("run", TASK, AGENT_UNSAFE_EFFECTS="1").returncode == 0
    assert lab.artifacts() == {"report.log": SUMMARY + "\n---\n"}
