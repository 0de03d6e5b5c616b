"""Framework agents in a workflow, killed with SIGKILL at every crash point of
every step of a run with two tool calls and a final answer, and resumed:

after a ``before_effect`` or ``after_commit`` kill no model call and no tool
execution runs again; after an ``after_effect`` kill exactly the killed call
runs once more; the note (published by its key) lands once; the final output
is an uninterrupted run's; ``verify`` is clean. Sync and async workflows,
SQLite and PostgreSQL. The negative control: without the integration the same
kill repeats the model calls, and the same check notices.
"""

from __future__ import annotations

import pytest
from agent_kills import AGENT_STEPS, POINTS, baseline, kill_and_resume, ran, setup

from ninelives.testing import Lab

pytestmark = [pytest.mark.crash, pytest.mark.slow]

MODULES = ["pai_notes", "oai_notes"]
WORKFLOWS = ["notes_sync", "notes_async"]


@pytest.mark.parametrize("workflow", WORKFLOWS)
@pytest.mark.parametrize("module", MODULES)
def test_every_crash_point_of_every_step(lab: Lab, module: str, workflow: str) -> None:
    setup(lab, module)
    expected = baseline(lab, workflow)
    problems = {}
    for k in AGENT_STEPS:
        for point in POINTS:
            found = kill_and_resume(lab, workflow, point, k, expected)
            if found:
                problems[f"{point}:{k}"] = found
    assert problems == {}


@pytest.mark.parametrize("module", MODULES)
def test_without_the_integration_the_same_kill_repeats_model_calls(
    sqlite_lab: Lab, module: str
) -> None:
    setup(sqlite_lab, module)
    expected = baseline(sqlite_lab, "notes_sync")
    # The kill lands before the workflow's report step: step 4 after the
    # agent's four steps, step 0 when the agent makes none.
    assert kill_and_resume(sqlite_lab, "notes_sync", "before_effect", 4, expected) == []
    sqlite_lab.base_env["NOTES_DURABLE"] = "0"
    problems = kill_and_resume(sqlite_lab, "notes_sync", "before_effect", 0, expected)
    assert any(p.startswith("ran ") for p in problems), problems
    assert ran(sqlite_lab, "notes-sync-before-effect-0")["model"] == 4


@pytest.mark.parametrize("via", ["run_config", "provider"])
def test_a_model_the_run_config_gives_is_asked_once_across_kills(sqlite_lab: Lab, via: str) -> None:
    """The SDK's ``RunConfig(model=...)`` replaces every agent's model, and its
    ``model_provider`` resolves an agent's model name: the model a run gets so is
    durable as the agent's own, asked once across every kill."""
    setup(sqlite_lab, "oai_notes")
    sqlite_lab.base_env["NOTES_MODEL_VIA"] = via
    expected = baseline(sqlite_lab, "notes_sync")
    problems = {}
    for k in (0, 2):
        for point in POINTS:
            found = kill_and_resume(sqlite_lab, "notes_sync", point, k, expected)
            if found:
                problems[f"{point}:{k}"] = found
    assert problems == {}
