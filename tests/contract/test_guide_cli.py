"""Clauses of the restart-lab contract that the guide's users exercise from the
command line: each test runs the installed command as a real process on a real
SQLite file in a fresh folder, and reads the result with the guide's own SQL."""

from __future__ import annotations

import json
import sqlite3

from ninelives.testing import Lab
from ninelives.testing.lab import GUIDE_PLAN

TASK = "demo"
SUMMARY = "Line one\nLine two\nLine three"


def created(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", TASK, "plan.json").returncode == 0


def guide_rows(lab: Lab, sql: str, *args: object) -> list[tuple[object, ...]]:
    """``sql`` as a guide user runs it, on a connection of their own."""
    path = lab.sqlite_path
    assert path is not None
    with sqlite3.connect(path) as conn:
        return conn.execute(sql, args).fetchall()


def test_write_artifact_over_an_existing_final_name_reports_deduplicated(
    sqlite_lab: Lab,
) -> None:
    """Contract: "If the final name already exists the step reports
    "deduplicated": true and publishes nothing new" -- whatever that file holds
    (a report kept from an earlier database, notes edited since): the run ends
    done (exit 0), the file there is left as it is."""
    lab = sqlite_lab
    created(lab)
    lab.write("artifacts/demo-2.md", "the report of an earlier database")

    result = lab.cli("run", TASK)

    assert result.returncode == 0, result.stderr
    assert lab.artifacts() == {"demo-2.md": "the report of an earlier database"}
    ((status, attempts, output),) = guide_rows(
        lab, "SELECT status, attempts, output FROM steps WHERE task_id=? AND idx=2", TASK
    )
    assert (status, attempts) == ("done", 1)
    assert json.loads(str(output))["deduplicated"] is True
    assert guide_rows(lab, "SELECT status FROM tasks WHERE id=?", TASK) == [("done",)]
    kinds = [k for (k,) in guide_rows(lab, "SELECT kind FROM events ORDER BY seq")]
    assert "step_error" not in kinds
    assert kinds[-1] == "task_done"


def test_write_artifact_with_the_same_text_there_is_deduplicated_too(sqlite_lab: Lab) -> None:
    # The control: the same text at the final name was deduplicated before the fix too.
    lab = sqlite_lab
    created(lab)
    lab.write("artifacts/demo-2.md", SUMMARY)
    assert lab.cli("run", TASK).returncode == 0
    assert lab.snapshot(TASK).outputs[2]["deduplicated"] is True
    assert lab.artifacts() == {"demo-2.md": SUMMARY}
    assert GUIDE_PLAN["steps"][2]["tool"] == "write_artifact"


def test_agent_artifacts_given_to_run_only_is_where_the_task_publishes(sqlite_lab: Lab) -> None:
    """The guide reads ``AGENT_ARTIFACTS`` when ``write_artifact`` runs, so its users
    set it on ``run`` (and on the resume after a kill), not on ``create``."""
    lab = sqlite_lab
    created(lab)  # no AGENT_ARTIFACTS here

    killed = lab.cli("run", TASK, AGENT_ARTIFACTS="out", AGENT_CRASH_AT="after_effect:2")
    assert killed.returncode == -9, killed.stderr
    resumed = lab.cli("run", TASK, AGENT_ARTIFACTS="out")

    assert resumed.returncode == 0, resumed.stderr
    assert not (lab.root / "artifacts").exists()
    assert [p.name for p in (lab.root / "out").iterdir()] == ["demo-2.md"]
    assert (lab.root / "out" / "demo-2.md").read_text(encoding="utf-8") == SUMMARY
    rows = guide_rows(lab, "SELECT status, attempts FROM steps WHERE task_id=? ORDER BY idx", TASK)
    assert rows == [("done", 1), ("done", 1), ("done", 2)]
    output = json.loads(
        str(guide_rows(lab, "SELECT output FROM steps WHERE task_id=? AND idx=2", TASK)[0][0])
    )
    assert output["deduplicated"] is True  # published once, by the killed attempt


def test_another_artifacts_folder_after_a_step_started_is_still_refused(sqlite_lab: Lab) -> None:
    # The control: once a step has run, the folder is the task's; a run given
    # another one could publish a second copy, so it is refused (exit 4).
    lab = sqlite_lab
    created(lab)
    killed = lab.cli("run", TASK, AGENT_ARTIFACTS="out", AGENT_CRASH_AT="after_commit:0")
    assert killed.returncode == -9
    refused = lab.cli("run", TASK, AGENT_ARTIFACTS="elsewhere")
    assert refused.returncode == 4, refused.stderr
    assert lab.cli("run", TASK).returncode == 0  # unset: the folder of the task
    assert [p.name for p in (lab.root / "out").iterdir()] == ["demo-2.md"]
    assert not (lab.root / "elsewhere").exists()


def test_a_done_task_run_again_is_exit_0_whatever_artifacts_folder_it_is_given(
    sqlite_lab: Lab,
) -> None:
    """Contract: ``run`` is exit 0 "also when it was already done" (and 2 for a failed
    task): a run that has nothing to run publishes nothing, wherever it was told to."""
    lab = sqlite_lab
    created(lab)
    assert lab.cli("run", TASK).returncode == 0
    lab.write_plan({"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "missing"}}]})
    assert lab.cli("create", "broken", "plan.json").returncode == 0
    assert lab.cli("run", "broken", AGENT_MAX_ATTEMPTS="1").returncode == 2

    again = lab.cli("run", TASK, AGENT_ARTIFACTS="elsewhere")
    failed = lab.cli("run", "broken", AGENT_ARTIFACTS="elsewhere")

    assert again.returncode == 0, again.stderr
    assert failed.returncode == 2, failed.stderr
    assert not (lab.root / "elsewhere").exists()
    assert lab.artifacts() == {"demo-2.md": SUMMARY}
    kinds = [k for (k,) in guide_rows(lab, "SELECT kind FROM events WHERE task_id=?", TASK)]
    assert kinds.count("run_started") == 2  # the second process is visible, as the guide's


def test_a_large_committed_output_is_in_the_steps_row(sqlite_lab: Lab) -> None:
    """Contract: ``steps.output`` is the step's output as JSON, set when done, and
    "the database still has ... every committed step output": a guide user reads
    ``fetch``'s text of notes of some 150 KB back with their own SQL."""
    lab = sqlite_lab
    notes = "".join(f"note {i}: {'words ' * 12}\n" for i in range(2000))
    lab.guide_setup(notes)
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    assert lab.cli("run", TASK).returncode == 0

    ((output,),) = guide_rows(lab, "SELECT output FROM steps WHERE task_id=? AND idx=0", TASK)
    fetched = json.loads(str(output))
    assert fetched["text"] == notes
    assert fetched["chars"] == len(notes)


def test_outputs_leave_the_row_only_when_asked(sqlite_lab: Lab) -> None:
    # The control: NINELIVES_BLOB_THRESHOLD (an extension) still moves them out.
    lab = sqlite_lab
    lab.guide_setup("".join(f"note {i}: {'words ' * 12}\n" for i in range(2000)))
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    assert lab.cli("run", TASK, NINELIVES_BLOB_THRESHOLD="65536").returncode == 0
    ((output,),) = guide_rows(lab, "SELECT output FROM steps WHERE task_id=? AND idx=0", TASK)
    assert "$blob" in json.loads(str(output))
