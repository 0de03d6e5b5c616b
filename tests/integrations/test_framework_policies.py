"""A framework tool's step policy, through the CLI.

``timeout``: both frameworks run a sync tool function in a thread, which no
timeout can stop. An attempt that overruns is journaled and the run exits 5, as
a worker's slot does: the abandoned attempt dies with the process, so its
effect never lands after the step is retried (or after the task failed); the
next run retries the call.

``on_unknown: refuse``: a call killed after its effect blocks the task; the
output a person gives with ``resolve --done`` is the call's result, which the
model reads."""

from __future__ import annotations

import time

import pytest
from agent_kills import create, ran, result, run, setup

from ninelives.testing import Lab

pytestmark = [pytest.mark.crash]

MODULES = ["pai_notes", "oai_notes"]


@pytest.mark.parametrize("workflow", ["notes_sync", "notes_async"])
@pytest.mark.parametrize("module", MODULES)
def test_a_tool_call_over_its_timeout_never_lands_after_its_retry(
    sqlite_lab: Lab, module: str, workflow: str
) -> None:
    lab = sqlite_lab
    setup(lab, module)
    create(lab, "t", workflow)
    slow = run(lab, "t", NOTES_SLOW="2", NOTES_TIMEOUT="0.5")
    time.sleep(2.5)  # what the abandoned attempt needs to land, had it lived on
    assert ran(lab, "t")["tool:post_note"] == 1, slow.stderr
    assert sorted(p.name for p in (lab.root / "notes").glob("*")) == [], slow.stderr
    assert slow.returncode == 5, slow.stderr
    assert "Traceback" not in slow.stderr, slow.stderr
    assert "overran its 0.5s timeout" in slow.stderr, slow.stderr
    done = run(lab, "t", NOTES_TIMEOUT="0.5")
    assert done.returncode == 0, done.stderr
    assert ran(lab, "t")["tool:post_note"] == 2
    assert [p.name for p in (lab.root / "notes").glob("*")] == ["t-2.txt"]
    verified = lab.cli("verify", "t")
    assert verified.returncode == 0, verified.stdout + verified.stderr


@pytest.mark.parametrize("module", MODULES)
def test_a_blocked_call_resolved_by_a_person_is_the_result_the_model_reads(
    sqlite_lab: Lab, module: str
) -> None:
    lab = sqlite_lab
    setup(lab, module)
    lab.base_env["NOTES_REFUSE"] = "1"
    create(lab, "t", "notes_sync")
    assert run(lab, "t", AGENT_CRASH_AT="after_effect:2").returncode == -9
    blocked = run(lab, "t")
    assert blocked.returncode == 8, blocked.stderr
    resolved = lab.cli("resolve", "t", "2", "--done", '{"posted": "by hand"}')
    assert resolved.returncode == 0, resolved.stderr
    done = run(lab, "t")
    assert done.returncode == 0, done.stderr
    assert "by hand" in result(lab, "t")
    assert ran(lab, "t")["tool:post_note"] == 1  # the killed call; never run again
    verified = lab.cli("verify", "t")
    assert verified.returncode == 0, verified.stdout + verified.stderr
