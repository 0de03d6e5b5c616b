"""Unknown outcomes, killed for real: each mode x each crash point x both stores.

A ``charge_*`` tool (tests/crash/effect_tools.py) counts its effect in a file
outside the process. The run is SIGKILLed at a crash point of the step, the
task is resumed (and moved on with ``resolve`` where it blocks), and the count
shows how many times the effect ran: ``rerun`` may run it twice after
``after_effect``, ``probe`` runs it once and reconciles, ``refuse`` at most once
and blocks. Every end state passes ``ninelives verify``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

TASK = "pay"
TOOLS = Path(__file__).with_name("effect_tools.py")
POINTS = ("before_effect", "after_effect", "after_commit")


def _setup(lab: Lab, tool: str, **policy: str) -> None:
    shutil.copy(TOOLS, lab.root / "effect_tools.py")
    lab.base_env["NINELIVES_TOOLS"] = "effect_tools"
    lab.write_plan({"goal": "pay once", "steps": [{"tool": tool, "input": {}, **policy}]})
    created = lab.cli("create", TASK, "plan.json")
    assert created.returncode == 0, created


def effects(lab: Lab) -> int:
    """How many times the effect ran, counted outside every process."""
    log = lab.root / "effects.log"
    return len(log.read_text(encoding="utf-8").splitlines()) if log.exists() else 0


def _killed_at(lab: Lab, point: str) -> None:
    killed = lab.cli("run", TASK, AGENT_CRASH_AT=f"{point}:0")
    assert killed.returncode == -9, f"{point} was not reached: {killed}"


def _verified(lab: Lab) -> dict[str, object]:
    verified = lab.cli("verify", TASK)
    assert verified.returncode == 0, verified
    status = lab.cli("status", TASK, "--json", "--outputs").json()
    assert isinstance(status, dict)
    return status


def kinds(lab: Lab) -> list[str]:
    return [e["kind"] for e in lab.cli("export", TASK).jsonl()]


#: (mode, point) -> effects after the resume.
RERUN = {"before_effect": 1, "after_effect": 2, "after_commit": 1}


@pytest.mark.parametrize("point", POINTS)
def test_rerun_runs_again(lab: Lab, point: str) -> None:
    """At least once: after ``after_effect`` the effect runs a second time."""
    _setup(lab, "charge_rerun")
    _killed_at(lab, point)
    resumed = lab.cli("run", TASK)
    assert resumed.returncode == 0, resumed
    assert effects(lab) == RERUN[point]
    assert _verified(lab)["status"] == "done"


@pytest.mark.parametrize("point", POINTS)
def test_probe_runs_once(lab: Lab, point: str) -> None:
    """The probe finds the effect by its key: exactly once at every point."""
    _setup(lab, "charge_probe")
    _killed_at(lab, point)
    resumed = lab.cli("run", TASK)
    assert resumed.returncode == 0, resumed
    assert effects(lab) == 1
    status = _verified(lab)
    assert status["status"] == "done"
    step = status["steps"][0]  # type: ignore[index]
    if point == "after_effect":
        assert step["output"] == {"charged": f"{TASK}-0", "reconciled": True}
        assert "step_reconciled" in kinds(lab)
    else:
        assert "step_reconciled" not in kinds(lab)


def test_probe_negative_control_duplicates(lab: Lab) -> None:
    """A probe that always answers "not done" reruns the effect: the probe is what
    keeps ``test_probe_runs_once`` at one."""
    _setup(lab, "charge_liar")
    _killed_at(lab, "after_effect")
    assert lab.cli("run", TASK).returncode == 0
    assert effects(lab) == 2
    _verified(lab)


@pytest.mark.parametrize("point", POINTS)
def test_refuse_blocks(lab: Lab, point: str) -> None:
    """At most once: a step found running blocks the task (exit 8) and is not run
    again; ``resolve`` moves it on (``--retry`` if the effect had not happened,
    ``--done`` if it had)."""
    _setup(lab, "charge_refuse")
    _killed_at(lab, point)
    ran = 0 if point == "before_effect" else 1
    resumed = lab.cli("run", TASK)
    if point == "after_commit":
        assert resumed.returncode == 0, resumed
        assert effects(lab) == 1
        return
    assert resumed.returncode == 8, resumed
    assert f"ninelives resolve {TASK} 0 --done JSON" in resumed.stderr
    assert effects(lab) == ran
    assert _verified(lab)["status"] == "blocked"
    events = len(kinds(lab))
    again = lab.cli("run", TASK)  # exits 8 at once, writing nothing
    assert again.returncode == 8, again
    assert len(kinds(lab)) == events
    if ran:
        decided = lab.cli("resolve", TASK, "0", "--done", '{"charged": "by hand"}')
    else:
        decided = lab.cli("resolve", TASK, "0", "--retry")
    assert decided.returncode == 0, decided
    finished = lab.cli("run", TASK)
    assert finished.returncode == 0, finished
    assert effects(lab) == 1
    status = _verified(lab)
    assert status["status"] == "done"
    if ran:
        assert status["steps"][0]["output"] == {"charged": "by hand"}  # type: ignore[index]


def test_plan_overrides_the_tools_mode(lab: Lab) -> None:
    """``on_unknown`` in the plan step wins over the tool's own mode."""
    _setup(lab, "charge_rerun", on_unknown="refuse")
    _killed_at(lab, "after_effect")
    assert lab.cli("run", TASK).returncode == 8
    assert effects(lab) == 1


def test_refuse_negative_control(lab: Lab) -> None:
    """The same tool and kill without the override reruns the effect."""
    _setup(lab, "charge_rerun")
    _killed_at(lab, "after_effect")
    assert lab.cli("run", TASK).returncode == 0
    assert effects(lab) == 2


@pytest.mark.slow
def test_probe_that_cannot_tell_blocks(lab: Lab) -> None:
    _setup(lab, "charge_probe")
    _killed_at(lab, "after_effect")
    (lab.root / "probe-unsure").write_text("1")
    blocked = lab.cli("run", TASK)
    assert blocked.returncode == 8, blocked
    assert "does not answer" in blocked.stderr
    assert effects(lab) == 1
    reasons = [e.get("reason", "") for e in lab.cli("export", TASK).jsonl()
               if e["kind"] == "step_blocked"]  # fmt: skip
    assert len(reasons) == 1
    assert "does not answer" in reasons[0]
    assert _verified(lab)["status"] == "blocked"
    (lab.root / "probe-unsure").unlink()
    assert (
        lab.cli("resolve", TASK, "0", "--done", '{"charged": "seen on the statement"}').returncode
        == 0
    )
    assert lab.cli("run", TASK).returncode == 0
    assert effects(lab) == 1
    _verified(lab)


@pytest.mark.parametrize("point", ["probe_answered", "settle_before_commit"])
@pytest.mark.slow
def test_kill_between_probe_and_commit(lab: Lab, point: str) -> None:
    """Killed after the probe answered (or inside its commit): nothing is
    written, the step is still running, and the next run probes again."""
    _setup(lab, "charge_probe")
    _killed_at(lab, "after_effect")
    before = lab.cli("export", TASK).jsonl()
    _killed_at(lab, point)
    status = lab.cli("status", TASK, "--json").json()
    assert status["steps"][0]["status"] == "running"
    after = lab.cli("export", TASK).jsonl()
    # Only the killed run's run_started was committed (by its claim).
    assert [e["kind"] for e in after[len(before) :]] == ["run_started"]
    assert lab.cli("run", TASK).returncode == 0
    assert effects(lab) == 1
    assert kinds(lab).count("step_reconciled") == 1
    _verified(lab)


@pytest.mark.slow
def test_resolve_refuses_bad_input(lab: Lab) -> None:
    """Bad JSON, a non-object, a step not blocked: exit 4, one line, nothing changed."""
    _setup(lab, "charge_refuse")
    _killed_at(lab, "after_effect")
    assert lab.cli("run", TASK).returncode == 8
    before = lab.cli("export", TASK).stdout
    twice = '{"charged": true, "charged": false}'  # which one did the person mean?
    for done in ("{not json", "[1, 2]", "NaN", twice):
        bad = lab.cli("resolve", TASK, "0", "--done", done)
        assert bad.returncode == 4, bad
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    wrong = lab.cli("resolve", TASK, "1", "--retry")
    assert wrong.returncode == 4, wrong
    assert lab.cli("resolve", "nosuch", "0", "--retry").returncode == 1
    assert lab.cli("approve", TASK, "0").returncode == 4  # blocked, not waiting
    assert lab.cli("export", TASK).stdout == before
    assert json.loads(lab.cli("status", TASK, "--json").stdout)["status"] == "blocked"


def test_a_plan_asking_probe_of_a_tool_without_one_is_refused(lab: Lab) -> None:
    shutil.copy(TOOLS, lab.root / "effect_tools.py")
    lab.base_env["NINELIVES_TOOLS"] = "effect_tools"
    lab.write_plan({"goal": "g", "steps": [{"tool": "charge_refuse", "input": {},
                                            "on_unknown": "probe"}]})  # fmt: skip
    refused = lab.cli("create", TASK, "plan.json")
    assert refused.returncode == 4, refused
    assert "has none" in refused.stderr
    assert lab.cli("status", TASK).returncode == 1  # nothing stored


ASYNC_PROBE = """
from ninelives import tool


async def aprobe(ctx):
    return {"charged": ctx.idem_key}


@tool("charge", on_unknown="probe", probe=PROBE)
def charge(input, ctx):
    with open("effects.log", "a") as log:
        log.write("charged\\n")
    return {"charged": True}
"""


@pytest.mark.parametrize("probe", ["aprobe", "lambda ctx: aprobe(ctx)"])
def test_a_probe_that_is_async_never_passes_for_an_answer(lab: Lab, probe: str) -> None:
    """A probe is asked outside any event loop: an ``async def`` one never ran, its
    coroutine was taken for its answer (the step blocked for "the tool returned
    coroutine") and Python's "never awaited" warning reached stderr. Declared so it
    is refused with its module (exit 4); one that hands back an awaitable cannot tell."""
    lab.write("aprobe_tools.py", ASYNC_PROBE.replace("PROBE", probe))
    lab.base_env["NINELIVES_TOOLS"] = "aprobe_tools"
    lab.write_plan({"goal": "pay once", "steps": [{"tool": "charge", "input": {}}]})
    created = lab.cli("create", TASK, "plan.json")
    if probe == "aprobe":
        assert created.returncode == 4, created.stderr
        assert "async def" in created.stderr
        assert lab.cli("status", TASK).returncode == 1  # nothing stored
        return
    assert created.returncode == 0, created.stderr
    _killed_at(lab, "after_effect")
    blocked = lab.cli("run", TASK)
    assert blocked.returncode == 8, blocked.stderr
    assert "RuntimeWarning" not in blocked.stderr
    assert "the probe returned an awaitable" in blocked.stderr
    assert effects(lab) == 1
    assert _verified(lab)["status"] == "blocked"


METHOD_PROBE = """
from ninelives import tool


class Ledger:
    def probe(self, ctx):
        with open("effects.log") as log:
            return {"charged": ctx.idem_key, "reconciled": True} if log.read() else None


@tool("charge", on_unknown="probe", probe=Ledger().probe)
def charge(input, ctx):
    with open("effects.log", "a") as log:
        log.write("charged\\n")
    return {"charged": ctx.idem_key}
"""


def test_a_probe_that_is_a_method_is_asked_with_the_context(lab: Lab) -> None:
    """A bound method ``probe(self, ctx)`` was called as ``probe(input, ctx)`` (its
    ``self`` counted), so it could never tell and the step blocked (exit 8)."""
    lab.write("mprobe_tools.py", METHOD_PROBE)
    lab.base_env["NINELIVES_TOOLS"] = "mprobe_tools"
    lab.write_plan({"goal": "pay once", "steps": [{"tool": "charge", "input": {}}]})
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    _killed_at(lab, "after_effect")
    resumed = lab.cli("run", TASK)
    assert resumed.returncode == 0, resumed.stderr
    assert effects(lab) == 1
    step = _verified(lab)["steps"][0]  # type: ignore[index]
    assert step["output"] == {"charged": f"{TASK}-0", "reconciled": True}


def test_a_worker_parks_a_refused_step_and_goes_on(lab: Lab) -> None:
    """A worker that finds a step of unknown outcome with ``refuse`` parks the task,
    logs it and goes on (``--drain`` ends: nothing left it may run); once resolved,
    the next worker finishes it without running the effect again."""
    shutil.copy(TOOLS, lab.root / "effect_tools.py")
    lab.base_env["NINELIVES_TOOLS"] = "effect_tools"
    lab.write_plan({"goal": "pay once", "steps": [{"tool": "charge_refuse", "input": {}}]})
    assert lab.cli("create", TASK, "plan.json", "--enqueue").returncode == 0
    _killed_at(lab, "after_effect")
    drained = lab.cli("worker", "--drain", "--poll", "0.1")
    assert drained.returncode == 0, drained
    assert "action=parked" in drained.stderr
    assert lab.cli("status", TASK, "--json").json()["status"] == "blocked"
    assert lab.cli("resolve", TASK, "0", "--done", '{"charged": "by hand"}').returncode == 0
    finished = lab.cli("worker", "--drain", "--poll", "0.1")
    assert finished.returncode == 0, finished
    assert effects(lab) == 1
    assert _verified(lab)["status"] == "done"


@pytest.mark.slow
def test_a_cancel_while_the_probe_asks_stops_the_run_with_9(lab: Lab) -> None:
    """A cancel that lands while a recovered step's probe is asking: the run's
    commit of the answer finds the task cancelled and ends with exit 9 and the
    cancel's line (it was exit 3, "taken over by another runner"); the step
    stays as the cancel found it and nothing else is journaled after it."""
    _setup(lab, "charge_slow_probe")
    _killed_at(lab, "after_effect")
    runner = lab.spawn("run", TASK)
    deadline = time.monotonic() + 30
    while not (lab.root / "probing").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lab.cli("cancel", TASK, "--reason", "not needed").returncode == 0
    (lab.root / "probe-go").write_text("1", encoding="utf-8")
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 9, err
    assert err.strip().splitlines()[-1].startswith(f"ninelives: error: task {TASK!r} was cancelled")
    status = lab.cli("status", TASK, "--json").json()
    assert status["status"] == "cancelled"
    assert kinds(lab)[-1] == "task_cancelled"
    assert effects(lab) == 1
    assert lab.cli("verify", TASK).returncode == 0
    again = lab.cli("run", TASK)
    assert again.returncode == 9, again


@pytest.mark.slow
def test_a_probe_that_finds_nothing_counts_toward_the_recovery_limit(lab: Lab) -> None:
    """A step whose process dies every time it runs fails its task at
    ``NINELIVES_MAX_RECOVERIES`` under ``probe`` as under ``rerun``: the probe's
    "did not happen" is a recovery to run it again. It was run again forever,
    and ``verify`` (which counts every ``step_recovered``) reported it."""
    _setup(lab, "charge_probe")
    lab.base_env["NINELIVES_MAX_RECOVERIES"] = "1"
    _killed_at(lab, "before_effect")
    _killed_at(lab, "before_effect")  # recovery 1: the probe finds nothing, it runs again
    failed = lab.cli("run", TASK, AGENT_CRASH_AT="before_effect:0")  # recovery 2: past it
    assert failed.returncode == 2, failed
    assert "NINELIVES_MAX_RECOVERIES" in failed.stderr.strip().splitlines()[-1]
    status = _verified(lab)
    assert status["status"] == "failed"
    assert [s["status"] for s in status["steps"]] == ["failed"]  # type: ignore[index]
    assert kinds(lab)[-2:] == ["step_recovered", "task_failed"]
    assert effects(lab) == 0
    assert lab.cli("run", TASK).returncode == 2
    assert lab.cli("retry", TASK).returncode == 0
    assert lab.cli("run", TASK).returncode == 0
    assert effects(lab) == 1


@pytest.mark.slow
def test_a_probe_that_kills_its_process_fails_its_task_past_the_recovery_limit(lab: Lab) -> None:
    """A probe whose process dies whenever it is asked (out of memory, a crash)
    stops at ``NINELIVES_MAX_RECOVERIES``: each claim that found the step running
    counts, though a probe's recovery is journaled only with its answer. It was
    asked again forever, every run killed. The claim past the limit asks no more
    (the probe is asked once past it, as a probe that answers may settle the step)."""
    _setup(lab, "charge_fatal_probe")
    lab.base_env["NINELIVES_MAX_RECOVERIES"] = "1"
    _killed_at(lab, "before_effect")
    for _ in range(2):  # found running; asking its probe kills the run
        asked = lab.cli("run", TASK)
        assert asked.returncode == -9, asked
    failed = lab.cli("run", TASK)  # found running a third time: the probe is not asked
    assert failed.returncode == 2, failed
    last = failed.stderr.strip().splitlines()[-1]
    assert "found running after its process died 3 times" in last
    assert "NINELIVES_MAX_RECOVERIES" in last
    status = _verified(lab)
    assert status["status"] == "failed"
    assert [s["status"] for s in status["steps"]] == ["failed"]  # type: ignore[index]
    assert kinds(lab)[-3:] == ["step_recovered", "run_started", "task_failed"]
    assert effects(lab) == 0
    assert lab.cli("retry", TASK).returncode == 0
    assert lab.cli("run", TASK).returncode == 0
    assert effects(lab) == 1


@pytest.mark.slow
def test_verify_agrees_with_a_person_running_a_step_again_past_the_recovery_limit(
    lab: Lab,
) -> None:
    """The recovery limit stops the runner from running a step again by itself;
    ``retry`` (after the limit failed the task) and ``resolve --retry`` (a
    ``refuse`` step) are a person's decision to run it again. ``verify`` counted
    every ``step_recovered`` and called those runs a violation."""
    lab.base_env["NINELIVES_MAX_RECOVERIES"] = "1"
    _setup(lab, "charge_rerun")
    for _ in range(2):
        _killed_at(lab, "before_effect")
    assert lab.cli("run", TASK).returncode == 2  # recovered twice: past the limit
    assert lab.cli("retry", TASK).returncode == 0
    _killed_at(lab, "before_effect")
    assert lab.cli("run", TASK).returncode == 2  # the runner still does not run it again
    assert _verified(lab)["status"] == "failed"
    assert effects(lab) == 0


@pytest.mark.slow
def test_verify_agrees_with_resolve_retry_of_a_refused_step_past_the_recovery_limit(
    lab: Lab,
) -> None:
    lab.base_env["NINELIVES_MAX_RECOVERIES"] = "1"
    _setup(lab, "charge_refuse")
    for _ in range(3):
        _killed_at(lab, "before_effect")
        assert lab.cli("run", TASK).returncode == 8  # blocked: the runner runs nothing
        assert lab.cli("resolve", TASK, "0", "--retry").returncode == 0
    assert lab.cli("run", TASK).returncode == 0
    assert effects(lab) == 1
    assert _verified(lab)["status"] == "done"
