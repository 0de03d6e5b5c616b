"""A model's artifacts never meet another task's: the name a model gives is
published as ``<idem_key>+<name>`` (``+`` is in no task id), an older version's
``<idem_key>-<name>`` is still found on resume, and each task removes and flags
its own temporary files, in every form, and only its own."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from ninelives.testing import Lab
from ninelives.testing.fakellm import Turn, fake_model_server
from ninelives.testing.lab import GUIDE_PLAN

pytestmark = pytest.mark.crash

TEXT = "# Two\nThe second report."
ANSWER = "Published."


def agent_plan() -> dict[str, Any]:
    """A static step 0, the first turn at step 1, the call it asks for at step 2."""
    steps = [{"tool": "fetch", "input": {"path": "input/notes.txt"}}]
    return {"goal": "Publish", "steps": steps, "agent": {"tools": ["write_artifact"]}}


def script(name: str) -> tuple[Turn, Turn]:
    return Turn(calls=[("write_artifact", {"name": name, "text": TEXT})]), Turn(text=ANSWER)


def env_for(url: str, **extra: str) -> dict[str, str]:
    return {
        "NINELIVES_LLM": "openai",
        "NINELIVES_LLM_URL": url + "/v1",
        "NINELIVES_LLM_MODEL": "m1",
        **extra,
    }


def create(lab: Lab, task_id: str, plan: dict[str, Any]) -> None:
    lab.write("input/notes.txt", "Alpha\nBeta\nGamma\n")
    lab.write_plan(plan, f"{task_id}.json")
    created = lab.cli("create", task_id, f"{task_id}.json")
    assert created.returncode == 0, created.stderr


def temps(lab: Lab) -> list[str]:
    return sorted(n for n in lab.artifacts() if n.endswith(".tmp"))


def test_a_models_artifact_name_never_takes_another_tasks(lab: Lab) -> None:
    """``demo`` step 2 names its file ``2.md``: ``demo-2`` still publishes its own
    contract artifact ``demo-2-2.md``, and both tasks verify clean."""
    create(lab, "demo", agent_plan())
    create(lab, "demo-2", GUIDE_PLAN)
    with fake_model_server(*script("2.md"), by_turn=True) as fake:
        ran = lab.cli("run", "demo", **env_for(fake.url))
    assert ran.returncode == 0, ran.stderr
    other = lab.cli("run", "demo-2")
    assert other.returncode == 0, other.stderr
    published = lab.artifacts()
    assert published["demo-2+2.md"] == TEXT
    assert published["demo-2-2.md"] == "Alpha\nBeta\nGamma"
    assert sorted(published) == ["demo-2+2.md", "demo-2-2.md"]
    verified = lab.cli("verify", "--all", "--artifacts", "artifacts")
    assert verified.returncode == 0, verified.stdout
    status = lab.snapshot("demo")
    assert status.outputs[2]["path"].endswith("demo-2+2.md")


@pytest.mark.parametrize("same", [True, False])
def test_an_older_versions_artifact_is_found_on_resume(lab: Lab, same: bool) -> None:
    """A step that an older version started and published as ``t-2-report.md``
    before a kill: resumed, it is deduplicated there, not published a second
    time; a file of other content at that old name is not ours (not taken for it)."""
    create(lab, "t", agent_plan())
    with fake_model_server(*script("report.md"), by_turn=True) as fake:
        env = env_for(fake.url)
        killed = lab.cli("run", "t", AGENT_CRASH_AT="before_effect:2", **env)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        lab.write("artifacts/t-2-report.md", TEXT if same else "someone else's")
        resumed = lab.cli("run", "t", **env)
    assert resumed.returncode == 0, resumed.stderr
    output = lab.snapshot("t").outputs[2]
    if same:
        assert lab.artifacts() == {"t-2-report.md": TEXT}
        assert output["deduplicated"] is True
        assert output["path"].endswith("t-2-report.md")
    else:
        assert lab.artifacts() == {"t-2-report.md": "someone else's", "t-2+report.md": TEXT}
        assert output["deduplicated"] is False
    verified = lab.cli("verify", "t", "--artifacts", "artifacts")
    assert verified.returncode == 0, verified.stdout


def test_a_killed_model_write_leaves_a_temp_that_verify_flags_and_the_run_removes(
    lab: Lab,
) -> None:
    create(lab, "t", agent_plan())
    with fake_model_server(*script("report.md"), by_turn=True) as fake:
        env = env_for(fake.url)
        killed = lab.cli("run", "t", AGENT_CRASH_AT="artifact_before_link:2", **env)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        (temp,) = temps(lab)
        assert temp.startswith(".t-2+report.md.")
        flagged = lab.cli("verify", "t", "--artifacts", "artifacts")
        assert flagged.returncode == 7, flagged.stdout
        assert "stray_temp" in flagged.stdout
        assert temp in flagged.stdout
        resumed = lab.cli("run", "t", **env)
    assert resumed.returncode == 0, resumed.stderr
    assert temps(lab) == []
    assert lab.artifacts() == {"t-2+report.md": TEXT}
    assert lab.cli("verify", "t", "--artifacts", "artifacts").returncode == 0


def test_a_task_leaves_another_tasks_temp_files_alone(lab: Lab) -> None:
    """``r`` names its file ``3.md`` at step 2 and is killed before the link: the
    recovery of ``r-2`` (whose step 3 would publish ``r-2-3.md``) neither removes
    nor flags ``r``'s temporary file; ``r``'s own next run removes it."""
    create(lab, "r", agent_plan())
    create(lab, "r-2", GUIDE_PLAN)
    with fake_model_server(*script("3.md"), by_turn=True) as fake:
        env = env_for(fake.url)
        killed = lab.cli("run", "r", AGENT_CRASH_AT="artifact_before_link:2", **env)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        (temp,) = temps(lab)
        other = lab.cli("run", "r-2", AGENT_CRASH_AT="after_effect:1")
        assert other.returncode == -signal.SIGKILL, other.stderr
        recovered = lab.cli("run", "r-2")
        assert recovered.returncode == 0, recovered.stderr
        assert temps(lab) == [temp]
        assert lab.cli("verify", "r-2", "--artifacts", "artifacts").returncode == 0
        resumed = lab.cli("run", "r", **env)
    assert resumed.returncode == 0, resumed.stderr
    assert temps(lab) == []
    assert sorted(lab.artifacts()) == ["r-2+3.md", "r-2-2.md"]
    verified = lab.cli("verify", "--all", "--artifacts", "artifacts")
    assert verified.returncode == 0, verified.stdout
