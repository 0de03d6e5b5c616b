"""The operations commands on workflow tasks, real processes: cancel, fork at
any step, gc then a reused id, doctor, report, verify and the web view."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

FLOWS = (Path(__file__).parent / "wflows.py").read_text(encoding="utf-8")
EXPECTED = {"ticket": "T", "summary": "ticket T", "note": "summary: ticket T"}


@pytest.fixture
def flow_lab(lab: Lab) -> Lab:
    lab.write("wflows.py", FLOWS)
    lab.base_env["NINELIVES_TOOLS"] = "wflows"
    return lab


def _halfway(lab: Lab, task: str) -> None:
    assert lab.cli("create", task, "--workflow", "triage", "--args", '["T"]').returncode == 0
    assert lab.cli("run", task, AGENT_CRASH_AT="after_commit:1").returncode == -9


def _calls(lab: Lab) -> list[str]:
    log = lab.root / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_cancelled_workflow_task_is_never_run_again(flow_lab: Lab) -> None:
    lab = flow_lab
    _halfway(lab, "t")
    assert lab.cli("cancel", "t", "--reason", "not needed").returncode == 0
    refused = lab.cli("run", "t")
    assert refused.returncode == 9
    assert not (lab.root / "outcome").exists()
    assert lab.cli("verify", "t").returncode == 0


@pytest.mark.parametrize("start", [0, 1])
def test_a_fork_reuses_the_outputs_before_its_step_and_runs_the_rest(
    flow_lab: Lab, start: int
) -> None:
    lab = flow_lab
    _halfway(lab, "t")
    forked = lab.cli("fork", "t", "f", "--from", str(start))
    assert forked.returncode == 0, forked.stderr
    steps = lab.cli("status", "f", "--json").json()["steps"]
    assert [(s["tool"], s["status"]) for s in steps] == [("read", "done"), ("summarize", "done")][
        :start
    ]
    done = lab.cli("run", "f")
    assert done.returncode == 0, done.stderr
    assert lab.cli("status", "f", "--json").json()["result"] == EXPECTED
    assert (lab.root / "outcome" / "f-2").read_text() == "summary: ticket T"
    assert _calls(lab).count("read T") == (2 if start == 0 else 1)
    assert lab.cli("verify", "f").returncode == 0


def test_a_cancelled_workflow_task_forks_past_its_last_step_and_its_code_carries_on(
    flow_lab: Lab,
) -> None:
    """A workflow task's steps are those its code reached, so `--from` one past the
    last is the fork that keeps every committed step: it was refused ("has steps
    0-1"), and after a cancel the only fork left ran a done step's effect again.
    A task cancelled before its first step forks from 0 (it said "no steps")."""
    lab = flow_lab
    _halfway(lab, "t")
    assert lab.cli("cancel", "t").returncode == 0
    forked = lab.cli("fork", "t", "f", "--from", "2")
    assert forked.returncode == 0, forked.stderr
    assert "2 step(s) copied done, 0 to run" in forked.stdout
    done = lab.cli("run", "f")
    assert done.returncode == 0, done.stderr
    assert lab.cli("status", "f", "--json").json()["result"] == EXPECTED
    assert _calls(lab).count("read T") == 1
    assert lab.cli("verify", "f").returncode == 0
    before = lab.fingerprint()
    refused = lab.cli("fork", "t", "g", "--from", "3")
    assert refused.returncode == 4, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "ninelives: error: --from 3: task 't' has steps 0-1; --from 2 keeps them all "
        "and runs the workflow on from there"
    ]
    assert lab.fingerprint() == before
    assert lab.cli("create", "e", "--workflow", "triage", "--args", '["T"]').returncode == 0
    assert lab.cli("cancel", "e").returncode == 0
    assert lab.cli("fork", "e", "e2", "--from", "0").returncode == 0
    assert lab.cli("run", "e2").returncode == 0
    assert lab.cli("status", "e2", "--json").json()["result"] == EXPECTED


def test_gc_then_a_reused_id_is_refused(flow_lab: Lab) -> None:
    """A new task under a removed id would reuse the old one's idempotency keys."""
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "triage", "--args", '["A"]').returncode == 0
    assert lab.cli("run", "t").returncode == 0
    gone = lab.cli("gc", "--older-than", "0s")
    assert gone.returncode == 0, gone.stderr
    assert lab.cli("status", "t").returncode == 1
    reused = lab.cli("create", "t", "--workflow", "triage", "--args", '["B"]')
    assert reused.returncode == 4
    assert "gc removed" in reused.stderr
    assert lab.cli("status", "t").returncode == 1  # nothing stored
    assert lab.cli("create", "u", "--workflow", "triage", "--args", '["B"]').returncode == 0
    assert lab.cli("run", "u").returncode == 0
    assert lab.cli("status", "u", "--json").json()["result"]["ticket"] == "B"
    assert lab.cli("doctor").returncode == 0


def test_report_doctor_verify_and_the_web_view_read_workflow_tasks(flow_lab: Lab) -> None:
    lab = flow_lab
    _halfway(lab, "t")
    assert lab.cli("run", "t").returncode == 0
    assert lab.cli("verify", "--all").returncode == 0
    assert lab.cli("doctor").returncode == 0
    report = lab.cli("report", "t", "-o", "t.html")
    assert report.returncode == 0, report.stderr
    page = (lab.root / "t.html").read_text()
    assert "summarize" in page
    proc = lab.spawn("ui", "--port", "0")
    try:
        assert proc.stdout is not None
        found = re.match(r"serving (http://127\.0\.0\.1:\d+/)", proc.stdout.readline())
        assert found
        with urllib.request.urlopen(found.group(1) + "task/t", timeout=30) as answer:
            assert answer.status == 200
            assert "summarize" in answer.read().decode()
    finally:
        proc.terminate()
        proc.wait(30)


# slowpoke's step waits for the test's ``release`` file (written after the cancel);
# dozing's sleep is long enough for a cancel on a loaded machine to land inside it.
@pytest.mark.parametrize(("flow", "seconds"), [("slowpoke", 60), ("dozing", 8)])
def test_a_cancel_during_a_step_or_a_sleep_stops_the_run_before_the_next_step(
    flow_lab: Lab, flow: str, seconds: int
) -> None:
    lab = flow_lab
    made = lab.cli("create", "t", "--workflow", flow, "--args", f"[{seconds}]")
    assert made.returncode == 0
    proc = lab.spawn("run", "t")
    lab.wait_for("t", "step_appended", 0)
    assert lab.cli("cancel", "t").returncode == 0
    (lab.root / "release").write_text("")
    assert proc.wait(timeout=60) == 9
    assert not (lab.root / "outcome").exists()  # the step after it never ran
    assert lab.cli("status", "t", "--json").json()["status"] == "cancelled"
    assert lab.cli("verify", "t").returncode == 0
