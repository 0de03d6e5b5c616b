"""A person in the loop: ``approval`` steps, with real processes on both stores.

The task parks ``waiting`` (``run`` exits 8 at once), survives the SIGKILL of
whatever was running, and goes on once ``ninelives approve`` is run from
another process; a worker fleet leaves a waiting task alone and finishes it
after the approval.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

TOOLS = Path(__file__).with_name("effect_tools.py")
PLAN = {
    "goal": "ship after review",
    "steps": [
        {"tool": "charge_rerun", "input": {}},
        {"tool": "approval", "input": {"prompt": "ship it?"}},
        {"tool": "charge_rerun", "input": {}},
    ],
}


def _setup(lab: Lab) -> None:
    shutil.copy(TOOLS, lab.root / "effect_tools.py")
    lab.base_env["NINELIVES_TOOLS"] = "effect_tools"
    lab.write_plan(PLAN)


def effects(lab: Lab) -> list[str]:
    log = lab.root / "effects.log"
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


def status(lab: Lab, task: str) -> dict[str, object]:
    found = lab.cli("status", task, "--json", "--outputs").json()
    assert isinstance(found, dict)
    return found


@pytest.mark.slow
def test_run_waits_then_approve_from_another_process(lab: Lab) -> None:
    _setup(lab)
    assert lab.cli("create", "t", "plan.json").returncode == 0
    waiting = lab.cli("run", "t")
    assert waiting.returncode == 8, waiting
    assert "ninelives approve t 1" in waiting.stderr
    assert "ship it?" in waiting.stderr
    assert status(lab, "t")["status"] == "waiting"
    assert effects(lab) == ["t-0"]
    journal = lab.cli("export", "t").stdout
    assert lab.cli("run", "t").returncode == 8  # at once, nothing written
    assert lab.cli("export", "t").stdout == journal
    assert lab.cli("verify", "t").returncode == 0
    approved = lab.cli("approve", "t", "1", "--note", "looks good")
    assert approved.returncode == 0, approved
    assert lab.cli("approve", "t", "1").returncode == 4  # decided already: nothing changes
    done = lab.cli("run", "t")
    assert done.returncode == 0, done
    found = status(lab, "t")
    assert found["status"] == "done"
    assert found["steps"][1]["output"] == {"approved": True, "note": "looks good"}  # type: ignore[index]
    assert effects(lab) == ["t-0", "t-2"]
    kinds = [e["kind"] for e in lab.cli("export", "t").jsonl()]
    assert kinds.count("step_waiting") == 1
    assert kinds.count("step_approved") == 1
    assert lab.cli("verify", "t").returncode == 0


def test_rejection_fails_the_task_with_the_note(lab: Lab) -> None:
    _setup(lab)
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 8
    rejected = lab.cli("approve", "t", "1", "--reject", "--note", "not this week")
    assert rejected.returncode == 0, rejected
    failed = lab.cli("run", "t")
    assert failed.returncode == 2, failed
    assert "not this week" in failed.stderr
    reasons = [e["reason"] for e in lab.cli("export", "t").jsonl() if e["kind"] == "task_failed"]
    assert reasons == ["not this week"]
    assert status(lab, "t")["steps"][1]["status"] == "failed"  # type: ignore[index]
    assert effects(lab) == ["t-0"]
    assert lab.cli("verify", "t").returncode == 0


def test_kill_during_the_decision_changes_nothing(lab: Lab) -> None:
    _setup(lab)
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t").returncode == 8
    journal = lab.cli("export", "t").stdout
    killed = lab.cli("approve", "t", "1", AGENT_CRASH_AT="decision_before_commit")
    assert killed.returncode == -9, killed
    assert lab.cli("export", "t").stdout == journal
    assert status(lab, "t")["status"] == "waiting"
    assert lab.cli("approve", "t", "1").returncode == 0
    assert lab.cli("run", "t").returncode == 0
    assert lab.cli("verify", "t").returncode == 0


def _wait_status(lab: Lab, task: str, wanted: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if status(lab, task)["status"] == wanted:
            return
        time.sleep(0.1)
    raise AssertionError(f"{task} did not become {wanted}: {status(lab, task)}")


@pytest.mark.slow
def test_worker_fleet_leaves_a_waiting_task_alone(lab: Lab) -> None:
    """Two workers: the plain task finishes, the approval task waits (never claimed
    again while waiting, even with a worker killed and replaced meanwhile) and
    is finished by the fleet once approved from another process."""
    _setup(lab)
    lab.write_plan(
        {"goal": "plain", "steps": [{"tool": "charge_rerun", "input": {}}]}, "plain.json"
    )
    assert lab.cli("create", "w", "plan.json", "--enqueue").returncode == 0
    assert lab.cli("create", "p", "plain.json", "--enqueue").returncode == 0
    first = lab.spawn("worker", "--poll", "0.1")
    second = lab.spawn("worker", "--poll", "0.1")
    _wait_status(lab, "w", "waiting")
    _wait_status(lab, "p", "done")
    assert lab.kill(first) == -9  # killed while the task waits
    runs = [e for e in lab.cli("export", "w").jsonl() if e["kind"] == "run_started"]
    time.sleep(1.0)  # ten polls of the live worker: it must not claim the waiting task
    again = [e for e in lab.cli("export", "w").jsonl() if e["kind"] == "run_started"]
    assert again == runs
    assert lab.cli("approve", "w", "1").returncode == 0
    third = lab.spawn("worker", "--poll", "0.1")
    _wait_status(lab, "w", "done")
    assert sorted(effects(lab)) == ["p-0", "w-0", "w-2"]
    for proc in (second, third):
        lab.kill(proc)
    assert lab.cli("verify", "--all").returncode == 0
