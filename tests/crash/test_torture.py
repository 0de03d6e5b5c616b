"""Random kills: a long plan killed at random moments many times in a row, then resumed."""

from __future__ import annotations

import random
import signal
import time
from typing import Any

import pytest

from ninelives.testing import Lab, five_property_violations

pytestmark = [pytest.mark.crash, pytest.mark.slow]

TASK = "torture"
KILLS = 30  # at most; the loop stops once a run finished the task
SEED = 20240607
STEP_DELAY = "0.05"

#: Input files and their stub summaries, worked out by hand.
NOTES = {
    "a": (
        "Alpha one\n\nAlpha two\n  Alpha three  \nAlpha four\n",
        "Alpha one\nAlpha two\nAlpha three",
    ),
    "b": ("Beta one\nBeta two\n\n\nBeta three\nBeta four\n", "Beta one\nBeta two\nBeta three"),
    "c": ("\n  Gamma one\nGamma two\nGamma three\n", "Gamma one\nGamma two\nGamma three"),
    "d": ("Delta one\r\nDelta two\r\n\r\nDelta three\r\n", "Delta one\nDelta two\nDelta three"),
}


def _step(tool: str, **step_input: Any) -> dict[str, Any]:
    return {"tool": tool, "input": step_input}


def _block(base: int, first: str, second: str) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Twelve steps over two notes, and the artifacts they must publish."""
    steps = [
        _step("fetch", path=f"input/{first}.txt"),  # +0
        _step("summarize", **{"from": base}),  # +1
        _step("write_artifact", **{"from": base + 1}),  # +2
        _step("fetch", path=f"input/{second}.txt"),  # +3
        _step("summarize", **{"from": base + 3}),  # +4
        _step("write_artifact", **{"from": base + 4}),  # +5
        _step("summarize", **{"from": base + 1}),  # +6: a summary of a summary
        _step("write_artifact", **{"from": base + 6}),  # +7
        _step("write_artifact", **{"from": base}),  # +8: the whole text
        _step("write_artifact", **{"from": base + 3}),  # +9
        _step("summarize", **{"from": base + 4}),  # +10
        _step("write_artifact", **{"from": base + 10}),  # +11
    ]
    texts = {
        2: NOTES[first][1],
        5: NOTES[second][1],
        7: NOTES[first][1],
        8: NOTES[first][0],
        9: NOTES[second][0],
        11: NOTES[second][1],
    }
    return steps, {f"{TASK}-{base + k}.md": text for k, text in texts.items()}


_first, _first_expected = _block(0, "a", "b")
_second, _second_expected = _block(12, "c", "d")
PLAN: dict[str, Any] = {"goal": "Summarize four notes into reports", "steps": _first + _second}
EXPECTED = {**_first_expected, **_second_expected}


def test_random_kills_then_resume(lab: Lab) -> None:
    rng = random.Random(SEED)
    # The same step may be killed many times in a row here, on purpose: the
    # recovery limit that ends a step which kills its process every time must
    # not end this test (torture raises it the same way).
    lab.base_env["NINELIVES_MAX_RECOVERIES"] = "1000"
    for name, (text, _) in NOTES.items():
        lab.write(f"input/{name}.txt", text)
    lab.write_plan(PLAN)
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    # How long a command takes to start here (interpreter, imports, connection):
    # kills are aimed past it, so that most land inside steps on any backend.
    started = time.monotonic()
    assert lab.cli("status", TASK).returncode == 0
    aim = time.monotonic() - started

    seen: list[dict[str, Any]] = []  # the status with outputs after each kill
    landed = mid_step = 0
    previous = lab.cli("status", TASK).json()["steps"]
    for _ in range(KILLS):
        runner = lab.spawn("run", TASK, AGENT_STEP_DELAY=STEP_DELAY)
        time.sleep(aim * 0.8 + rng.uniform(0, 0.15))
        code = Lab.kill(runner)
        assert code in (0, -signal.SIGKILL), runner.stderr
        status = lab.cli("status", TASK, "--outputs").json()
        if code == -signal.SIGKILL:
            landed += 1
            mid_step += any(s["status"] == "running" for s in status["steps"])
        steps = [{k: s[k] for k in ("idx", "status", "attempts")} for s in status["steps"]]
        if steps == previous:
            # `run` takes longer to reach its first step than `status` to answer
            # (a loaded machine, a lease, a slow connection): aim later, or
            # every kill lands before the first step starts.
            aim += 0.1
        previous = steps
        seen.append(status)
        if status["status"] == "done":
            break
    before = lab.snapshot(TASK)

    resumed = lab.cli("run", TASK)
    assert resumed.returncode == 0, resumed.stderr
    after = lab.snapshot(TASK)
    artifacts = lab.artifacts()
    # Exactly one artifact per write step, with exactly the expected text.
    assert artifacts == EXPECTED
    # The five properties; over the whole journal too, so across every kill a
    # step that finished never started again and each run recovered exactly
    # the steps the previous one left running.
    problems = five_property_violations(
        plan=PLAN,
        before=before,
        after=after,
        runs=None,  # a process killed before its first commit leaves no run_started
        artifacts=artifacts,
        expected_artifacts=EXPECTED,
    )
    assert problems == []
    # Every output committed at any kill is still the same at the end.
    for status in seen:
        for step in status["steps"]:
            if step["status"] == "done":
                assert after.outputs[step["idx"]] == step["output"], step["idx"]
    # The kills really were many and really did land inside steps.
    assert landed >= 8, (landed, len(seen))
    assert mid_step >= 5, (mid_step, landed)
    recovered = [e for e in after.events if e["kind"] == "step_recovered"]
    assert len(recovered) >= 5
