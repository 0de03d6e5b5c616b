"""The library and the command agree: the database (``NINELIVES_DB``), the folder a
task publishes to (recorded at create), and ``Runtime.submit`` (create or resume)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ninelives.testing import Lab
from ninelives.testing.lab import SUMMARY_NOTES
from ninelives.tools.builtin import stub_summary

CREATE_AND_RUN = """
import os, sys
import ninelives
from ninelives.settings import Settings

settings = Settings.from_env()._replace(artifacts="out")
with ninelives.open(sys.argv[1], settings=settings) as rt:
    rt.submit("t", "plan.json")
    print(rt.run("t").status.value)
"""


def _db(lab: Lab) -> str:
    """The lab's database as any working directory can name it."""
    return str(lab.sqlite_path) if lab.sqlite_path is not None else lab.db


def _python(
    lab: Lab, code: str, *args: str, cwd: Path | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=cwd or lab.root,
        env=lab.env(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_library_task_resumed_by_the_command_publishes_where_it_began(lab: Lab) -> None:
    """Created and killed through the library (artifacts in out/), resumed by the
    command from another folder without AGENT_ARTIFACTS: the resumed step finds the
    copy the killed attempt published, instead of publishing a second one."""
    lab.guide_setup()
    killed = _python(lab, CREATE_AND_RUN, _db(lab), AGENT_CRASH_AT="after_effect:2")
    assert killed.returncode == -9, killed.stderr
    published = lab.root / "out" / "t-2.md"
    assert published.is_file()
    elsewhere = lab.root / "elsewhere"
    elsewhere.mkdir()
    resumed = subprocess.run(
        [*lab.command, "--db", _db(lab), "run", "t"],
        cwd=elsewhere, env=lab.env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    output = lab.snapshot("t").outputs[2]
    assert output["deduplicated"] is True
    assert Path(output["path"]).resolve() == published.resolve()
    assert sorted(p.name for p in published.parent.iterdir()) == ["t-2.md"]
    assert not (elsewhere / "artifacts").exists()
    assert not (lab.root / "artifacts").exists()
    assert lab.cli("verify", "t", "--artifacts", "out").returncode == 0


def test_a_run_given_another_artifacts_folder_is_refused(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0  # records <lab>/artifacts
    # Once a step has started, the folder is the task's (before, a run's folder is
    # adopted, as the guide reads AGENT_ARTIFACTS at run time).
    assert lab.cli("run", "t", AGENT_CRASH_AT="after_commit:0").returncode == -9
    if lab.sqlite_path is not None:  # the kill left a WAL: settle it into the file first
        conn = sqlite3.connect(lab.sqlite_path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
    before = lab.fingerprint("t")
    refused = lab.cli("run", "t", AGENT_ARTIFACTS="other")
    assert refused.returncode == 4
    assert "recorded at create" in refused.stderr
    assert refused.stderr.count("\n") == 1
    assert lab.fingerprint("t") == before
    same = lab.cli("run", "t", AGENT_ARTIFACTS=str(lab.root / "artifacts"))  # the same folder
    assert same.returncode == 0, same.stderr
    assert sorted(lab.artifacts()) == ["t-2.md"]


def test_ninelives_open_reads_ninelives_db(lab: Lab) -> None:
    lab.guide_setup()
    code = """
    import ninelives
    with ninelives.open() as rt:
        rt.create("t", "../plan.json")
    """
    sub = lab.root / "sub"
    sub.mkdir()
    (sub / "input").symlink_to(lab.root / "input")
    made = _python(lab, code, cwd=sub, NINELIVES_DB=_db(lab))
    assert made.returncode == 0, made.stderr
    assert not (sub / "state.db").exists()
    assert lab.cli("status", "t").json()["status"] == "pending"


SUBMIT = """
import sys
import ninelives
with ninelives.open(sys.argv[1]) as rt:
    task = rt.submit("t", sys.argv[2])
    print("submitted", task.status.value)
    print(rt.run("t").status.value)
"""


def test_submit_creates_then_resumes_and_refuses_another_plan(lab: Lab) -> None:
    lab.guide_setup()
    killed = _python(lab, SUBMIT, _db(lab), "plan.json", AGENT_CRASH_AT="after_commit:1")
    assert killed.returncode == -9
    resumed = _python(lab, SUBMIT, _db(lab), "plan.json")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split() == ["submitted", "running", "done"]
    again = _python(lab, SUBMIT, _db(lab), "plan.json")  # a finished task is returned as is
    assert again.stdout.split() == ["submitted", "done", "done"]
    lab.write_plan(
        {"goal": "another", "steps": [{"tool": "fetch", "input": {"path": "x"}}]}, "b.json"
    )
    before = lab.fingerprint("t")
    other = _python(lab, SUBMIT, _db(lab), "b.json")
    assert other.returncode == 1
    assert "PlanMismatch: task 't' already exists with a different plan" in other.stderr
    assert lab.fingerprint("t") == before
    assert lab.snapshot("t").status["steps"][1]["attempts"] == 1  # nothing re-ran


AGENT_PLAN = {
    "goal": "Summarize the notes into a report",
    "steps": [{"tool": "fetch", "input": {"path": "input/notes.txt"}}],
    "agent": {"tools": ["write_artifact"], "max_turns": 4},
}


def test_submit_again_after_an_agent_appended_steps_resumes_it(lab: Lab) -> None:
    # The plan's own steps were compared with every stored one: once a turn had
    # appended its calls, the documented submit-then-run after a restart raised
    # PlanMismatch on every start, and the agent task could not be resumed.
    lab.guide_setup()
    lab.write_plan(AGENT_PLAN, "agent.json")
    killed = _python(lab, SUBMIT, _db(lab), "agent.json", AGENT_CRASH_AT="after_commit:2")
    assert killed.returncode == -9
    assert len(lab.cli("status", "t", "--json").json()["steps"]) > 2  # a turn appended
    resumed = _python(lab, SUBMIT, _db(lab), "agent.json")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.split() == ["submitted", "running", "done"]


def test_submit_of_the_same_steps_under_another_policy_is_another_plan(lab: Lab) -> None:
    # Policies were not compared: a plan changed to on_unknown "refuse" (at most
    # once) was answered with the stored task, which still reruns the effect.
    lab.guide_setup()
    assert _python(lab, SUBMIT, _db(lab), "plan.json").returncode == 0
    plan = json.loads((lab.root / "plan.json").read_text())
    plan["defaults"] = {"on_unknown": "refuse"}
    lab.write_plan(plan, "refuse.json")
    before = lab.fingerprint("t")
    other = _python(lab, SUBMIT, _db(lab), "refuse.json")
    assert other.returncode == 1
    assert "PlanMismatch: task 't' already exists with a different plan" in other.stderr
    assert lab.fingerprint("t") == before


def test_a_worker_given_another_folder_publishes_where_the_task_began(lab: Lab) -> None:
    """A worker cannot refuse a task it has claimed: it says so and publishes to the
    folder recorded at create, never silently to the one it was given."""
    lab.guide_setup()
    assert lab.cli("submit", "t", "plan.json").returncode == 0
    worker = lab.cli("worker", "--drain", "--poll", "0.1", AGENT_ARTIFACTS="other")
    assert worker.returncode == 0, worker.stderr
    assert f"WARNING: publishing to {lab.root / 'artifacts'}" in worker.stderr
    assert sorted(lab.artifacts()) == ["t-2.md"]
    assert not (lab.root / "other").exists()


@pytest.mark.slow
def test_a_project_moved_or_copied_whole_publishes_beside_its_own_database(
    sqlite_lab: Lab, tmp_path: Path
) -> None:
    """The folder recorded at create lies beside the database: after the project
    folder is moved (or copied), a resumed task publishes into its new place,
    never into (or recreating) the old one."""
    sqlite_lab.guide_setup()
    assert sqlite_lab.cli("create", "t", "plan.json").returncode == 0
    assert sqlite_lab.cli("run", "t", AGENT_CRASH_AT="after_commit:0").returncode == -9
    moved = Lab(sqlite_lab.root.rename(tmp_path / "moved"))
    copy = Lab(shutil.copytree(moved.root, tmp_path / "copy"))
    for project in (moved, copy):
        resumed = project.cli("run", "t")
        assert resumed.returncode == 0, resumed.stderr
        assert project.artifacts() == {"t-2.md": stub_summary(SUMMARY_NOTES)}
        assert project.cli("verify", "t").returncode == 0
    assert not sqlite_lab.root.exists()


def test_an_artifacts_folder_outside_the_project_stays_where_it_was(
    sqlite_lab: Lab, tmp_path: Path
) -> None:
    """A folder outside the database's own is recorded as it is: moving the
    project does not move where its tasks publish."""
    shared = tmp_path / "shared"
    sqlite_lab.guide_setup()
    made = sqlite_lab.cli("create", "t", "plan.json", AGENT_ARTIFACTS=str(shared))
    assert made.returncode == 0, made.stderr
    moved = Lab(sqlite_lab.root.rename(tmp_path / "moved"))
    resumed = moved.cli("run", "t")
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(p.name for p in shared.iterdir()) == ["t-2.md"]
    assert not (moved.root / "artifacts").exists()


@pytest.mark.slow
def test_a_folder_named_through_a_symlinked_project_still_moves_with_it(
    sqlite_lab: Lab, tmp_path: Path
) -> None:
    """``AGENT_ARTIFACTS=$PWD/out`` in a project reached through a symlinked folder
    names a folder inside the database's own: it is recorded relative to it, so
    a project moved after a kill publishes beside its database, never a second
    copy in a recreated old place; the same name keeps being accepted."""
    link = tmp_path / "link"
    link.symlink_to(sqlite_lab.root)
    named = str(link / "out")
    sqlite_lab.guide_setup()
    assert sqlite_lab.cli("create", "t", "plan.json", AGENT_ARTIFACTS=named).returncode == 0
    killed = sqlite_lab.cli("run", "t", AGENT_ARTIFACTS=named, AGENT_CRASH_AT="after_effect:2")
    assert killed.returncode == -9
    moved = Lab(sqlite_lab.root.rename(tmp_path / "moved"), base_env={"AGENT_ARTIFACTS": "out"})
    resumed = moved.cli("run", "t")
    assert resumed.returncode == 0, resumed.stderr
    assert moved.artifacts() == {"t-2.md": stub_summary(SUMMARY_NOTES)}
    assert not sqlite_lab.root.exists()
    assert moved.cli("verify", "t", "--artifacts", "out").returncode == 0
    # Before the move, the symlinked name was the same folder: still accepted.
    again = Lab(tmp_path / "again")
    again.guide_setup()
    (tmp_path / "link2").symlink_to(again.root)
    named = str(tmp_path / "link2" / "out")
    assert again.cli("create", "u", "plan.json", AGENT_ARTIFACTS=named).returncode == 0
    ran = again.cli("run", "u", AGENT_ARTIFACTS=named)
    assert ran.returncode == 0, ran.stderr
    assert "WARNING" not in ran.stderr
    assert sorted(p.name for p in (again.root / "out").iterdir()) == ["u-2.md"]


def _closed_runtime_refuses(db: str, *, readonly: bool) -> None:
    import ninelives
    from ninelives.errors import StoreError

    rt = ninelives.open(db, readonly=readonly)
    assert rt.status("t").status.value == "pending"
    rt.close()
    for call in (lambda: rt.status("t"), lambda: rt.export("t"), lambda: rt.run("t")):
        with pytest.raises(StoreError, match="closed"):
            call()
    rt.close()  # closing again is harmless


def test_a_closed_runtime_says_so_with_a_store_error(lab: Lab) -> None:
    # PostgreSQL's made a new session, never closed again.
    lab.guide_setup()
    assert lab.cli("create", "t", "plan.json").returncode == 0
    _closed_runtime_refuses(_db(lab), readonly=False)


def test_a_closed_read_only_runtime_says_so_with_a_store_error(sqlite_lab: Lab) -> None:
    # It raised a bare AssertionError from inside its reader.
    sqlite_lab.guide_setup()
    assert sqlite_lab.cli("create", "t", "plan.json").returncode == 0
    _closed_runtime_refuses(_db(sqlite_lab), readonly=True)
