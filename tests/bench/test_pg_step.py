"""bench/pg_step.py runs at a tiny size on PostgreSQL (timings live in
bench/RESULTS.md, not here: this proves the script works and prints its ratios)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pgcluster import PgServer

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.postgres


def test_the_postgres_step_benchmark_runs_at_a_tiny_size(
    pg_server: PgServer, tmp_path: Path
) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pg_step.py"), "--tasks", "4", "--rounds", "2",
         "--pg", pg_server.admin_url],
        capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    ratios = re.findall(r"ms\s+(\d+\.\d+)x$", result.stdout, re.MULTILINE)
    assert len(ratios) == 3, result.stdout  # transitions, run only, create + run
    assert all(float(r) > 0 for r in ratios), result.stdout
    assert "two raw PostgreSQL commits" in result.stdout
    assert list(tmp_path.iterdir()) == []  # the artifacts went to a temporary folder
