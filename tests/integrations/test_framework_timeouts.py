"""A framework tool's step ``timeout``, through the CLI: both frameworks run a
sync tool function in a thread, which no timeout can stop. An attempt that
overruns is journaled and the run exits 5, as a worker's slot does: the
abandoned attempt dies with the process, so its effect never lands after the
step is retried (or after the task failed); the next run retries the call."""

from __future__ import annotations

import time

import pytest
from agent_kills import create, ran, run, setup

from ninelives.testing import Lab

pytestmark = [pytest.mark.crash]


@pytest.mark.parametrize("workflow", ["notes_sync", "notes_async"])
@pytest.mark.parametrize("module", ["pai_notes", "oai_notes"])
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
