"""``ninelives torture``: random SIGKILLs on fresh tasks of a plan, then the verdict.

The negative control runs a tool that is not idempotent (it appends, then
lingers before its commit): torture must report duplicates and exit 7.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ninelives
from ninelives.errors import StoreError
from ninelives.models import Event, Step, StepStatus, Task, TaskStatus
from ninelives.testing import Lab
from ninelives.torture import append_log_duplicates, lost_commits, reexecuted_effects, torture

pytestmark = pytest.mark.crash

COUNTS = re.compile(
    r"kills (\d+)  recoveries (\d+)  re-executed effects (\d+)  duplicates (\d+)  "
    r"lost commits (\d+)  violations (\d+)"
)


def _counts(stdout: str) -> dict[str, int]:
    match = COUNTS.search(stdout)
    assert match, stdout
    names = ("kills", "recoveries", "reexecuted", "duplicates", "lost", "violations")
    return dict(zip(names, map(int, match.groups()), strict=True))


@pytest.mark.slow
def test_guide_plan_survives_random_kills(sqlite_lab: Lab) -> None:
    sqlite_lab.guide_setup()
    result = sqlite_lab.cli("torture", "plan.json", "--kills", "12", "--seed", "11", "--dir", "t")
    assert result.returncode == 0, result
    assert "seed 11 (replay: ninelives torture plan.json --kills 12 --seed 11)" in result.stdout
    assert "torture: seed 11, 12 kill(s)" in result.stderr
    counts = _counts(result.stdout)
    assert counts["kills"] == 12
    assert counts["duplicates"] == counts["lost"] == counts["violations"] == 0
    # The kills reached the steps: some run left a step running for the next to recover.
    assert counts["recoveries"] >= 1, result.stdout
    assert counts["reexecuted"] == counts["recoveries"]
    # The scratch folder given with --dir is kept and verifies clean on its own.
    folder = sqlite_lab.root / "t"
    verify = sqlite_lab.cli(
        "--db",
        str(folder / "state.db"),
        "verify",
        "--all",
        "--artifacts",
        str(folder / "artifacts"),
    )
    assert verify.returncode == 0, verify
    names = sorted(p.name for p in (folder / "artifacts").iterdir())
    assert names == sorted(f"{t}-2.md" for t in _task_ids(sqlite_lab, folder)), names


def _task_ids(lab: Lab, folder: Path) -> list[str]:
    import sqlite3

    conn = sqlite3.connect(folder / "state.db")
    try:
        return [row[0] for row in conn.execute("SELECT id FROM tasks")]
    finally:
        conn.close()


@pytest.mark.slow
def test_parallel_workers(sqlite_lab: Lab) -> None:
    sqlite_lab.guide_setup()
    result = sqlite_lab.cli(
        "torture", "plan.json", "--kills", "6", "--workers", "2", "--seed", "5", "-q"
    )
    assert result.returncode == 0, result
    assert result.stderr == ""
    assert _counts(result.stdout)["kills"] == 6
    assert "--workers 2" in result.stdout
    assert "(removed: all clean)" in result.stdout


DUP_TOOL = '''
"""A tool that is not idempotent: it appends, then lingers before its commit."""
import hashlib, os, time

def dup(step_input, ctx, idem_key):
    text = ctx[step_input["from"]]["summary"].encode()
    folder = os.environ.get("AGENT_ARTIFACTS") or "artifacts"
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, idem_key + ".md")
    with open(path, "ab") as fh:
        fh.write(text)
    time.sleep(0.4)
    return {"path": path, "sha256": hashlib.sha256(text).hexdigest(), "bytes": len(text)}
'''


def _install_dup_tool(root: Path) -> str:
    """Register ``dup`` in the ``ninelives.tools`` group, as installing a package would."""
    site = root / "site"
    info = site / "dup_tool-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "dup_tool.py").write_text(textwrap.dedent(DUP_TOOL), encoding="utf-8")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dup-tool\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ninelives.tools]\ndup = dup_tool:dup\n")
    return str(site)


@pytest.mark.slow
def test_negative_control_duplicates_are_found(sqlite_lab: Lab) -> None:
    sqlite_lab.guide_setup()
    plan = {
        "goal": "append twice when killed",
        "steps": [
            {"tool": "fetch", "input": {"path": "input/notes.txt"}},
            {"tool": "summarize", "input": {"from": 0}},
            {"tool": "dup", "input": {"from": 1}},
        ],
    }
    sqlite_lab.write_plan(plan, "dup.json")
    site = _install_dup_tool(sqlite_lab.root)
    result = sqlite_lab.cli(
        "torture", "dup.json", "--kills", "10", "--seed", "3", "--dir", "t", "-q", PYTHONPATH=site
    )
    assert result.returncode == 7, result
    counts = _counts(result.stdout)
    assert counts["duplicates"] >= 1, result.stdout
    assert "artifact_content" in result.stdout
    assert "replay with --seed 3" in result.stderr
    assert f"folder {sqlite_lab.root / 't'}\n" in result.stdout  # kept for inspection


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("plan.json", "--kills", "-1"), 4),
        (("plan.json", "--workers", "0"), 4),
        (("plan.json", "--seed", "abc"), 4),
        (("plan.json", "--pause", "-1"), 4),
        (("missing.json",), 4),
        (("plan.json", "--dir", "."), 4),  # already holds state.db
        # Arguments go to a workflow: a plan given them would be tortured without.
        (("plan.json", "--args", "[1]", "--dir", "t"), 4),
    ],
)
def test_bad_input(sqlite_lab: Lab, args: tuple[str, ...], code: int) -> None:
    sqlite_lab.guide_setup()
    assert sqlite_lab.cli("create", "keep", "plan.json").returncode == 0
    before = sqlite_lab.fingerprint("keep")
    result = sqlite_lab.cli("torture", *args)
    assert result.returncode == code, result
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert sqlite_lab.fingerprint("keep") == before
    assert not (sqlite_lab.root / "t").exists()


def test_runs_that_cannot_start_are_one_line_and_exit_5(sqlite_lab: Lab) -> None:
    # Started under a name it cannot find itself by (an embedded or oddly launched
    # interpreter), Python has an empty sys.executable: torture cannot start the
    # runs it kills. One line and exit 5, the scratch folder holding no task.
    sqlite_lab.guide_setup()
    source = Path(ninelives.__file__).resolve().parents[1]
    argv = ["no-such-python", "-m", "ninelives", "torture", "plan.json", "--kills", "1"]
    proc = subprocess.run(
        [*argv, "--dir", "t", "-q"],
        executable=sys.executable,
        cwd=sqlite_lab.root,
        env=sqlite_lab.env({"PYTHONPATH": str(source)}),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 5, proc
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("ninelives: error: torture cannot start its runs"), lines[0]
    assert not (sqlite_lab.root / "t" / "state.db").exists()
    # The control: the interpreter named as usual starts them.
    assert sqlite_lab.cli("torture", "plan.json", "--kills", "0", "-q").returncode == 0


def test_a_variable_no_run_can_be_given_is_a_store_error(sqlite_lab: Lab) -> None:
    # The library's env= reaches every run; a NUL cannot be passed to a process.
    sqlite_lab.guide_setup()
    folder = sqlite_lab.root / "t"
    with pytest.raises(StoreError, match=r"torture cannot start its runs: .*null byte"):
        torture(sqlite_lab.root / "plan.json", kills=1, folder=str(folder), env={"X": "a\x00b"})
    assert not (folder / "state.db").exists()


# -- the counting rules ----------------------------------------------------------


def _task(statuses: list[StepStatus], outputs: list[dict[str, object] | None]) -> Task:
    steps = tuple(
        Step(task_id="x", idx=i, tool="write_artifact", input={}, status=s, output=o, attempts=1)
        for i, (s, o) in enumerate(zip(statuses, outputs, strict=True))
    )
    return Task(id="x", goal="", status=TaskStatus.RUNNING, created_at=0, updated_at=0, steps=steps)


def test_lost_commits_are_counted() -> None:
    seen = {0: {"a": 1}, 1: {"b": 2}}
    kept = _task([StepStatus.DONE, StepStatus.DONE], [{"a": 1}, {"b": 2}])
    assert lost_commits(seen, kept) == []
    lost = _task([StepStatus.DONE, StepStatus.PENDING], [{"a": 9}, None])
    assert lost_commits(seen, lost) == [
        "x: step 0 output changed after it was acknowledged",
        "x: step 1 was acknowledged done, now it is not",
    ]


def test_reexecuted_effects_are_attempts_beyond_the_first() -> None:
    def started(seq: int, step: int) -> Event:
        return Event(
            seq=seq, ts=0, task_id="x", run_id="r", kind="step_started", step_idx=step, data={}
        )

    assert reexecuted_effects([started(1, 0), started(2, 1), started(3, 1), started(4, 1)]) == 2


def test_append_log_duplicates(tmp_path: Path) -> None:
    log = tmp_path / "report.log"
    log.write_text("s\n---\ns\n---\n", encoding="utf-8")
    once = _task([StepStatus.DONE], [{"path": "artifacts/report.log", "deduplicated": False}])
    assert append_log_duplicates([once], str(tmp_path)) == [
        ("report.log: 2 entries for 1 done step(s)", 1)
    ]
    twice = [once, _task([StepStatus.DONE], [{"path": "x/report.log"}])]
    assert append_log_duplicates(twice, str(tmp_path)) == []


TRIPLE_TOOL = '''
"""Publishes its text three times in one attempt: two extra publications per task."""
import hashlib, os

def triple(step_input, ctx, idem_key):
    text = ctx[step_input["from"]]["summary"].encode()
    folder = os.environ.get("AGENT_ARTIFACTS") or "artifacts"
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, idem_key + ".md")
    with open(path, "ab") as fh:
        fh.write(text * 3)
    return {"path": path, "sha256": hashlib.sha256(text).hexdigest(), "bytes": len(text)}
'''


def test_each_extra_publication_counts_once(sqlite_lab: Lab) -> None:
    sqlite_lab.guide_setup()
    plan = {
        "goal": "publish three times",
        "steps": [
            {"tool": "fetch", "input": {"path": "input/notes.txt"}},
            {"tool": "summarize", "input": {"from": 0}},
            {"tool": "triple", "input": {"from": 1}},
        ],
    }
    sqlite_lab.write_plan(plan, "triple.json")
    site = sqlite_lab.root / "site"
    info = site / "triple_tool-0.1.dist-info"
    info.mkdir(parents=True)
    (site / "triple_tool.py").write_text(textwrap.dedent(TRIPLE_TOOL), encoding="utf-8")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: triple-tool\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ninelives.tools]\ntriple = triple_tool:triple\n")
    result = sqlite_lab.cli(
        "torture", "triple.json", "--kills", "0", "--seed", "1", "--dir", "t", "-q",
        PYTHONPATH=str(site),
    )  # fmt: skip
    assert result.returncode == 7, result
    files = sorted((sqlite_lab.root / "t" / "artifacts").iterdir())
    assert files, result.stdout
    # Every task's file holds its text three times: two extra publications each.
    assert _counts(result.stdout)["duplicates"] == 2 * len(files), result.stdout
    assert result.stdout.count("2 extra publication(s)") == len(files)


def test_append_log_extra_entries_count_once_each(tmp_path: Path) -> None:
    from ninelives.torture import count_duplicates

    (tmp_path / "report.log").write_text("s\n---\n" * 4, encoding="utf-8")
    once = _task([StepStatus.DONE], [{"path": "artifacts/report.log", "deduplicated": False}])
    assert count_duplicates([once], str(tmp_path)) == (
        3,
        ["report.log: 4 entries for 1 done step(s)"],
    )


CALIBRATION_FAILS = """
import ninelives
from ninelives.tools import tool


@tool("boom")
def boom(step_input, ctx, idem_key):
    raise RuntimeError("always")


@ninelives.workflow
def raises(ctx):
    raise ValueError("outside a step")
"""


@pytest.mark.parametrize(
    ("subject", "run_exit", "says"),
    [
        (("fail.json",), 2, "task 'calibration' failed: step 0 (boom) failed 1 times"),
        (("--workflow", "raises"), 12, "workflow 'raises' raised outside a step"),
    ],
    ids=["plan", "workflow"],
)
def test_a_run_that_fails_without_kills_is_one_clean_line_and_exit_2(
    sqlite_lab: Lab, subject: tuple[str, ...], run_exit: int, says: str
) -> None:
    # The run's own error line is quoted inside torture's: its prefix appeared twice.
    lab = sqlite_lab
    lab.write("failing_tools.py", CALIBRATION_FAILS)
    lab.write_plan({"goal": "g", "steps": [{"tool": "boom", "input": {}, "max_attempts": 1}]},
                   "fail.json")  # fmt: skip
    result = lab.cli("torture", *subject, "--kills", "1", "--dir", "scratch", "-q",
                     NINELIVES_TOOLS="failing_tools", NINELIVES_BACKOFF="0")  # fmt: skip
    assert result.returncode == 2, result.stderr  # as documented in exit-codes.md
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"ninelives: error: the task does not run cleanly even without kills (exit {run_exit}): "
    ), lines[0]
    assert lines[0].count("ninelives: error:") == 1, lines[0]
    assert says in lines[0]
