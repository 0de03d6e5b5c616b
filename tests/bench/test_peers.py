"""``bench/peers.py`` at a tiny N: every installed system completes every task correctly.

Timings are never asserted (the machine is shared); what is checked is that the
comparison measures what it claims: each system ran every task's three steps
and published one artifact per task with the right content, and the syscall
counts of the minimal reference are exactly its commits and fsyncs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "bench" / "peers.py"
#: What needs nothing beyond ninelives: always run, never left out.
REQUIRED = {"minimal", "ninelives", "ninelives-workflow", "ninelives-cli", "raw"}


def _peers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("peers", PEERS)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PEERS), *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        check=False,
    )


@pytest.mark.slow
def test_every_installed_system_completes_every_task(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--tasks", "4", "--rounds", "1", "--cli-tasks", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    systems = result["systems"]
    assert set(systems) >= REQUIRED
    # make test installs the bench extra: there, every peer must have run.
    if os.environ.get("NINELIVES_FORBID_SKIPS"):
        assert result["left_out"] == []
    assert set(systems) | set(result["left_out"]) == set(_peers().SYSTEMS)
    for name, row in systems.items():
        assert row["ok"], (name, row["problems"])
        assert row["tasks"] == (2 if name == "ninelives-cli" else 4)
        assert row["tasks_per_s"] > 0
        assert row["cpu_ms_per_task"] > 0
        # Equal durability where it is set; DBOS's default is its rollback journal.
        assert row["journal_mode"] == ("delete" if name == "dbos-default" else "wal"), name
    assert set(result["ninelives_vs"]) >= {"minimal"}
    # The workflow row beside the plan row and the peers' own workflows, same run.
    assert set(result["workflow_vs"]) == {"ninelives"} | (
        set(systems) & set(_peers().WORKFLOW_PEERS)
    )
    if shutil.which("strace"):
        # 7 commits a task (create, then running and done of 3 steps) and the
        # artifact's file and folder fsyncs: the counts are of the tasks alone.
        counts = systems["minimal"]["syscalls_per_task"]
        assert counts["fdatasync"] == 7.0
        assert counts["fsync"] == 2.0
        # The workflow publishes through the same tool code: the same 2 fsyncs a task.
        assert systems["ninelives-workflow"]["syscalls_per_task"]["fsync"] == 2.0
        assert systems["raw"]["syscalls_per_task"]["fdatasync"] == 6.0
        assert all(row["syscalls_per_task"] is not None for row in systems.values())


@pytest.mark.slow
def test_the_table_parses(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--tasks", "2", "--rounds", "2", "--systems", "minimal,ninelives,raw")
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[:4] == ["system", "journal", "tasks/s", "CPU ms/task"]
    assert header[-1] == "checked"
    rows = {}
    assert set(lines[1].replace("|", "").split()) <= {"---", "---:"}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] == "ninelives vs":
            break
        assert len(cells) == len(header), line
        rows[cells[0]] = cells
    assert set(rows) == {"minimal", "ninelives", "raw"}
    for cells in rows.values():
        assert cells[1] == "wal"
        assert all(float(cells[i]) > 0 for i in (2, 3, 4))
        assert cells[-1] == "ok"
    assert rows["raw"][5] == "1.00x"


def test_the_check_catches_a_wrong_run(tmp_path: Path) -> None:
    """Negative control: a missing, a wrong or a half-published artifact is reported."""
    peers = _peers()
    folder = tmp_path / "artifacts"
    folder.mkdir()
    (folder / "t0.md").write_text(peers.peertools.SUMMARY)
    (folder / "t1.md").write_text(peers.peertools.SUMMARY)
    assert peers.check_artifacts(tmp_path, "minimal", 2) == []
    assert peers.check_artifacts(tmp_path, "minimal", 3) == ["2 artifacts for 3 tasks"]
    (folder / "t1.md").write_text("Line one\n")
    (folder / ".t2.md.0123.tmp").write_text("")
    problems = peers.check_artifacts(tmp_path, "minimal", 2)
    assert problems == [
        "temporary files left: ['.t2.md.0123.tmp']",
        "artifacts with the wrong content: ['t1.md']",
    ]


def test_strace_summary_is_read(tmp_path: Path) -> None:
    summary = tmp_path / "s.txt"
    summary.write_text(
        "% time     seconds  usecs/call     calls    errors syscall\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        " 61.00    0.010000         100       100           fdatasync\n"
        " 30.00    0.005000          50        21         1 fsync\n"
        "  9.00    0.001000           1       700           pwrite64\n"
        "------ ----------- ----------- --------- --------- ----------------\n"
        "100.00    0.016000                   821         1 total\n"
    )
    assert _peers().parse_strace(summary) == {
        "fdatasync": 100,
        "fsync": 21,
        "pwrite64": 700,
        "write": 0,
    }


def test_an_unknown_system_is_refused(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--systems", "minimal,nope")
    assert proc.returncode == 2
    assert "unknown system(s) ['nope']" in proc.stderr
    assert "Traceback" not in proc.stderr
