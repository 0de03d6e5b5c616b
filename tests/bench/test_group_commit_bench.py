"""bench/group_commit.py runs at a tiny size on SQLite (timings live in the
benchmark, not here: this proves the script works)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_group_commit_benchmark_runs_at_a_tiny_size(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "group_commit.py"), "--tasks", "8",
         "--repeat", "1", "--slots", "1,16", "--no-postgres"],
        capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| sqlite |")]
    assert len(rows) == 2, result.stdout
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures) == {
        "sqlite/1/plain", "sqlite/1/group", "sqlite/16/plain", "sqlite/16/group",
        "aim_16_group_vs_1",
    }  # fmt: skip
    assert all(value > 0 for value in figures.values())
