"""Built-in tools through the command: failing tools, fetch confinement and
write_artifact's refusal to follow, overwrite or duplicate."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from ninelives.testing import Lab, Result, five_property_violations
from ninelives.testing.lab import GUIDE_PLAN, SUMMARY_NOTES

SUMMARY = "Line one\nLine two\nLine three"
SECRET = "outside-secret-7f3a\nsecond line\nthird line\n"


def assert_failed(result: Result) -> None:
    """Exit 2 and the last stderr line is the one-line error (progress lines may precede)."""
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1].startswith("ninelives: error: ")


def kinds(lab: Lab, task_id: str) -> list[str]:
    return [e["kind"] for e in lab.cli("export", task_id).jsonl()]


def created(lab: Lab, plan: dict[str, object] | None = None, task_id: str = "t") -> None:
    lab.write("input/notes.txt", SUMMARY_NOTES)
    lab.write_plan(plan or GUIDE_PLAN)
    assert lab.cli("create", task_id, "plan.json").returncode == 0


# -- a tool that raises -------------------------------------------------------------

MISSING = {"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "input/missing.txt"}}]}


@pytest.mark.parametrize("attempts", [None, "1", "2"])
def test_tool_error_is_retried_up_to_the_limit_then_the_task_fails(
    lab: Lab, attempts: str | None
) -> None:
    created(lab, MISSING)
    env = {"AGENT_MAX_ATTEMPTS": attempts} if attempts else {}
    limit = int(attempts or 3)
    quiet = lab.cli("run", "t", "-q", **env)
    assert_failed(quiet)
    assert len(quiet.stderr.splitlines()) == 1  # -q: the error line only
    snap = lab.snapshot("t")
    assert snap.status["status"] == "failed"
    assert snap.status["steps"][0] | {"output": None} == {
        "idx": 0, "tool": "fetch", "status": "failed", "attempts": limit, "output": None,
    }  # fmt: skip
    journal = kinds(lab, "t")
    assert journal == [
        "task_created",
        "run_started",
        *["step_started", "step_error"] * limit,
        "task_failed",
    ]
    errors = [e for e in snap.events if e["kind"] == "step_error"]
    assert all("missing.txt" in e["error"] for e in errors)
    failed = [e for e in snap.events if e["kind"] == "task_failed"]
    assert failed[0]["step"] == 0
    assert failed[0]["reason"]


def test_a_failed_task_run_again_exits_2_without_running_a_step(lab: Lab) -> None:
    created(lab, MISSING)
    assert_failed(lab.cli("run", "t", AGENT_MAX_ATTEMPTS="2"))
    lab.write("input/missing.txt", "now it exists\n")  # even a fixed input does not revive it
    before = lab.snapshot("t")
    again = lab.cli("run", "t")
    assert_failed(again)
    after = lab.snapshot("t")
    assert after.status == before.status
    new = after.events[len(before.events) :]
    assert [e["kind"] for e in new] == ["run_started"]  # visible, but nothing ran
    assert after.events[: len(before.events)] == before.events


def test_failure_comes_from_the_obstacle_not_the_plan(lab: Lab) -> None:
    # The control of the failure cases: the same plan without the obstacle succeeds.
    plan = {
        "goal": "g",
        "steps": [
            {"tool": "fetch", "input": {"path": "input/notes.txt"}},
            {"tool": "summarize", "input": {"from": 0}},
            {"tool": "write_artifact", "input": {"from": 1}},
        ],
    }
    created(lab, plan)
    # A folder at the final name: never published over (a stale file there is
    # reported deduplicated, as the contract says).
    (lab.root / "artifacts" / "t-2.md").mkdir(parents=True)
    assert_failed(lab.cli("run", "t", AGENT_MAX_ATTEMPTS="1"))
    # A failed task stays failed; a new task with the obstacle gone succeeds.
    (lab.root / "artifacts" / "t-2.md").rmdir()
    assert lab.cli("create", "t2", "plan.json").returncode == 0
    assert lab.cli("run", "t2").returncode == 0
    assert lab.artifacts() == {"t2-2.md": SUMMARY}


# -- fetch confinement ----------------------------------------------------------------


def test_symlink_out_of_the_workspace_is_not_read(lab: Lab, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET, encoding="utf-8")
    created(lab)
    notes = lab.root / "input" / "notes.txt"
    notes.unlink()
    notes.symlink_to(outside)
    assert_failed(lab.cli("run", "t", AGENT_MAX_ATTEMPTS="2"))
    snap = lab.snapshot("t")
    assert snap.status["steps"][0]["status"] == "failed"
    assert all("outside the workspace" in e["error"] for e in snap.events if "error" in e)
    everything = lab.cli("status", "t", "--outputs").stdout + lab.cli("export", "t").stdout
    assert "outside-secret" not in everything
    assert lab.artifacts() == {}
    assert outside.read_text(encoding="utf-8") == SECRET


def test_relative_symlink_climbing_out_is_not_read(lab: Lab, tmp_path: Path) -> None:
    (tmp_path / "outside.txt").write_text(SECRET, encoding="utf-8")
    created(lab)
    notes = lab.root / "input" / "notes.txt"
    notes.unlink()
    notes.symlink_to("../../outside.txt")
    assert notes.read_text(encoding="utf-8") == SECRET  # the link does lead out
    assert_failed(lab.cli("run", "t", AGENT_MAX_ATTEMPTS="1"))
    assert "outside-secret" not in lab.cli("status", "t", "--outputs").stdout


def test_symlink_inside_the_workspace_and_a_copied_file_are_read(lab: Lab, tmp_path: Path) -> None:
    # The control: the same secret text, once inside the workspace, is read and
    # shows in the outputs, so the checks above would have seen a leak.
    created(lab)
    lab.write("data/real.txt", SECRET)
    notes = lab.root / "input" / "notes.txt"
    notes.unlink()
    notes.symlink_to(lab.root / "data" / "real.txt")
    assert lab.cli("run", "t").returncode == 0
    assert "outside-secret" in lab.cli("status", "t", "--outputs").stdout
    assert lab.artifacts() == {"t-2.md": SECRET.strip()}


# -- write_artifact safety -------------------------------------------------------------


def test_planted_symlink_at_the_artifact_name_is_never_followed(lab: Lab, tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("do not touch\n", encoding="utf-8")
    created(lab)
    (lab.root / "artifacts").mkdir()
    link = lab.root / "artifacts" / "t-2.md"
    link.symlink_to(target)
    assert_failed(lab.cli("run", "t", AGENT_MAX_ATTEMPTS="2"))
    assert target.read_text(encoding="utf-8") == "do not touch\n"
    assert os.readlink(link) == str(target)
    assert lab.artifacts() == {"t-2.md": f"symlink -> {target}"}  # no temp file left either
    steps = lab.snapshot("t").status["steps"]
    assert [s["status"] for s in steps] == ["done", "done", "failed"]
    assert steps[1]["output"] == {"engine": "stub", "summary": SUMMARY}  # kept as committed


def test_dangling_symlink_at_the_artifact_name_creates_nothing(lab: Lab, tmp_path: Path) -> None:
    target = tmp_path / "would-be-created.md"
    created(lab)
    (lab.root / "artifacts").mkdir()
    (lab.root / "artifacts" / "t-2.md").symlink_to(target)
    assert_failed(lab.cli("run", "t", AGENT_MAX_ATTEMPTS="1"))
    assert not target.exists()
    assert set(lab.artifacts()) == {"t-2.md"}


def test_existing_artifact_with_the_same_content_is_deduplicated(lab: Lab) -> None:
    created(lab)
    lab.write("artifacts/t-2.md", SUMMARY)
    inode = (lab.root / "artifacts" / "t-2.md").stat().st_ino
    assert lab.cli("run", "t").returncode == 0
    snap = lab.snapshot("t")
    output = snap.outputs[2]
    assert output["deduplicated"] is True
    assert output["path"] == os.path.join("artifacts", "t-2.md")
    assert (lab.root / "artifacts" / "t-2.md").stat().st_ino == inode
    assert (
        five_property_violations(
            plan=GUIDE_PLAN,
            after=snap,
            runs=1,
            artifacts=lab.artifacts(),
            expected_artifacts={"t-2.md": SUMMARY},
        )
        == []
    )


def test_existing_artifact_with_other_content_is_kept_and_deduplicated(lab: Lab) -> None:
    # The contract: a final name that already exists is reported deduplicated and
    # nothing new is published; the file there is never overwritten.
    created(lab)
    lab.write("artifacts/t-2.md", "someone else's report")
    assert lab.cli("run", "t").returncode == 0
    assert lab.artifacts() == {"t-2.md": "someone else's report"}
    output = lab.snapshot("t").outputs[2]
    assert output["deduplicated"] is True
    assert output["differs"] is True
    assert output["bytes"] == len("someone else's report")
    assert "step_error" not in kinds(lab, "t")


def test_fresh_artifact_is_not_deduplicated(lab: Lab) -> None:
    # The control of the deduplication case: without a file there, it publishes.
    created(lab)
    assert lab.cli("run", "t").returncode == 0
    assert lab.snapshot("t").outputs[2]["deduplicated"] is False
    assert lab.artifacts() == {"t-2.md": SUMMARY}


TEMP = re.compile(r"\.(?P<task>.+)-(?P<step>\d+)\.md\.[0-9a-f]{16}\.tmp")


@pytest.mark.crash
def test_orphan_temp_files_of_the_task_are_removed_others_left_alone(lab: Lab) -> None:
    created(lab, task_id="a")
    assert lab.cli("create", "b", "plan.json").returncode == 0
    # Both runs die after writing their temp file, before linking it.
    for task_id in ("a", "b"):
        killed = lab.cli("run", task_id, AGENT_CRASH_AT="artifact_before_link:2")
        assert killed.returncode == -9, killed
    temps = {name: m["task"] for name in lab.artifacts() if (m := TEMP.fullmatch(name))}
    assert sorted(temps.values()) == ["a", "b"], lab.artifacts()
    assert set(lab.artifacts()) == set(temps)  # nothing published yet
    lab.write("artifacts/.a-2.md.not-hex-at-all.tmp", "not ours to delete")
    assert lab.cli("run", "a").returncode == 0
    left = lab.artifacts()
    b_temp = next(n for n, t in temps.items() if t == "b")
    assert left == {
        "a-2.md": SUMMARY,
        b_temp: SUMMARY,
        ".a-2.md.not-hex-at-all.tmp": "not ours to delete",
    }
    assert lab.cli("run", "b").returncode == 0
    assert lab.artifacts() == {
        "a-2.md": SUMMARY,
        "b-2.md": SUMMARY,
        ".a-2.md.not-hex-at-all.tmp": "not ours to delete",
    }
    for task_id in ("a", "b"):
        snap = lab.snapshot(task_id)
        assert snap.outputs[2]["deduplicated"] is False  # the temp file was never linked
        assert (
            five_property_violations(
                plan=GUIDE_PLAN,
                after=snap,
                runs=2,
                artifacts={k: v for k, v in lab.artifacts().items() if k == f"{task_id}-2.md"},
                expected_artifacts={f"{task_id}-2.md": SUMMARY},
            )
            == []
        )
