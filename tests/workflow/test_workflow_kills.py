"""A user's workflow killed by real SIGKILL at every crash point of every step,
through the command line and the library, sync and async, on SQLite and
PostgreSQL: each effect lands once in outcome, the result is an uninterrupted
run's, and the journal verifies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

FLOWS = (Path(__file__).parent / "wflows.py").read_text(encoding="utf-8")
POINTS = [f"{p}:{k}" for k in range(3) for p in ("before_effect", "after_effect", "after_commit")]
EXPECTED = {"ticket": "T-1", "summary": "ticket T-1", "note": "summary: ticket T-1"}


@pytest.fixture
def flow_lab(lab: Lab) -> Lab:
    lab.write("wflows.py", FLOWS)
    lab.base_env["NINELIVES_TOOLS"] = "wflows"
    return lab


def outcomes(lab: Lab) -> dict[str, str]:
    folder = lab.root / "outcome"
    if not folder.exists():
        return {}
    return {p.name: p.read_text() for p in folder.iterdir() if not p.name.startswith(".")}


def calls(lab: Lab) -> list[str]:
    log = lab.root / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("flow", ["triage", "atriage"])
def test_every_crash_point_of_every_step_lands_each_effect_once(flow_lab: Lab, flow: str) -> None:
    lab = flow_lab
    for n, point in enumerate([*POINTS, "before_task_done"]):
        task = f"{flow}-{n}"
        made = lab.cli("create", task, "--workflow", flow, "--args", '["T-1"]')
        assert made.returncode == 0, made.stderr
        killed = lab.cli("run", task, AGENT_CRASH_AT=point)
        assert killed.returncode == -9, (point, killed.stderr)
        resumed = lab.cli("run", task)
        assert resumed.returncode == 0, (point, resumed.stderr)
        status = lab.cli("status", task, "--json").json()
        assert status["status"] == "done", point
        assert status["result"] == EXPECTED, point
        post = "apost" if flow == "atriage" else "post"
        assert [s["tool"] for s in status["steps"]] == ["read", "summarize", post]
        key = f"{task}-2"
        assert outcomes(lab)[key] == "summary: ticket T-1", point
        verified = lab.cli("verify", task)
        assert verified.returncode == 0, (point, verified.stdout)
        if point.startswith("after_effect:"):
            idx = int(point.split(":")[1])
            events = lab.cli("export", task).jsonl()
            recovered = [e["step"] for e in events if e["kind"] == "step_recovered"]
            assert recovered == [idx], point  # the step left running was recovered
    # One outcome per task, each under its own task's key.
    assert sorted(outcomes(lab)) == sorted(f"{flow}-{n}-2" for n in range(len(POINTS) + 1))


def test_a_done_step_is_answered_from_the_journal_and_not_called_again(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "t", "--workflow", "triage", "--args", '["T-1"]').returncode == 0
    assert lab.cli("run", "t", AGENT_CRASH_AT="after_commit:1").returncode == -9
    assert calls(lab) == ["read T-1"]
    assert lab.cli("run", "t").returncode == 0
    assert calls(lab) == ["read T-1", "post t-2"]  # read (step 0) was not called again


LIBRARY = """
import sys
import ninelives
import wflows

with ninelives.open(sys.argv[1]) as rt:
    rt.submit("lib", wflows.triage, "T-1")
    rt.run("lib")
    print(json.dumps(rt.result("lib")))
"""


@pytest.mark.parametrize("point", ["before_effect:2", "after_effect:2", "after_effect:0"])
def test_the_library_resumes_a_killed_workflow(flow_lab: Lab, point: str) -> None:
    import subprocess
    import sys

    lab = flow_lab
    lab.write("lib.py", "import json\n" + LIBRARY)

    def drive(**env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "lib.py", lab.db], cwd=lab.root, env=lab.env(env),
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    assert drive(AGENT_CRASH_AT=point).returncode == -9
    done = drive()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == EXPECTED
    assert outcomes(lab) == {"lib-2": "summary: ticket T-1"}
    assert lab.cli("verify", "lib").returncode == 0


def test_a_probed_step_killed_after_its_effect_is_not_called_again(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "p", "--workflow", "probed", "--args", '["T"]').returncode == 0
    assert lab.cli("run", "p", AGENT_CRASH_AT="after_effect:1").returncode == -9
    done = lab.cli("run", "p")
    assert done.returncode == 0, done.stderr
    assert calls(lab) == ["read T", "post p-1"]  # the probe found the effect: no second call
    kinds = [e["kind"] for e in lab.cli("export", "p").jsonl()]
    assert "step_reconciled" in kinds
    assert lab.cli("status", "p", "--json").json()["result"] == {
        "note": "probed: ticket T\nsecond line"
    }
    assert lab.cli("verify", "p").returncode == 0


def test_negative_control_a_step_without_its_running_commit_is_called_twice(
    flow_lab: Lab,
) -> None:
    """The running commit before the effect is what lets the probe spare the call:
    with it skipped (test-only) the killed step leaves no trace and runs again."""
    lab = flow_lab
    switch = {"NINELIVES_TEST_SKIP_RUNNING_COMMIT": "unsafe-test-only:" + lab.db}
    assert lab.cli("create", "p", "--workflow", "probed", "--args", '["T"]').returncode == 0
    assert lab.cli("run", "p", AGENT_CRASH_AT="after_effect:1", **switch).returncode == -9
    assert lab.cli("run", "p", **switch).returncode == 0
    assert calls(lab) == ["read T", "post p-1", "post p-1"]  # the duplicate the check notices


@pytest.mark.parametrize("point", ["blob_before_reference:0", "after_effect:0", "after_commit:0"])
def test_a_large_output_is_a_blob_and_survives_a_kill(flow_lab: Lab, point: str) -> None:
    lab = flow_lab
    env = {"NINELIVES_BLOB_THRESHOLD": "1024"}
    assert lab.cli("create", "b", "--workflow", "blobby", "--args", "[100000]").returncode == 0
    assert lab.cli("run", "b", AGENT_CRASH_AT=point, **env).returncode == -9
    done = lab.cli("run", "b", **env)
    assert done.returncode == 0, done.stderr
    status = lab.cli("status", "b", "--json", "--outputs").json()
    assert status["result"] == {"len": 100000, "note": "len 100000"}
    assert "output_blob" in status["steps"][0]
    assert outcomes(lab) == {"b-1": "len 100000"}
    assert lab.cli("verify", "b").returncode == 0


def test_hostile_workflows_end_with_one_line_and_verify(flow_lab: Lab) -> None:
    lab = flow_lab
    assert lab.cli("create", "r", "--workflow", "recurse", "--args", "[0]").returncode == 0
    stopped = lab.cli("run", "r")
    assert stopped.returncode == 12  # recursion without end: stopped, not a traceback
    assert "Traceback" not in stopped.stderr
    assert "RecursionError" in stopped.stderr.splitlines()[-1]
    assert lab.cli("create", "t", "--workflow", "threaded").returncode == 0
    assert lab.cli("run", "t").returncode == 0
    result = lab.cli("status", "t", "--json").json()
    assert result["result"] == {
        "errors": ["ctx.step was called from another thread: call steps from the workflow"]
    }
    assert result["steps"] == []  # the thread's call wrote nothing
    assert lab.cli("verify", "--all").returncode == 0
