"""bench/scale.py runs, at a tiny size, on SQLite and PostgreSQL (timings live in
the benchmark, not here: this proves the script works and its gc removes what
it should)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pgcluster import PgServer

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.postgres


def test_the_scale_benchmark_runs_at_a_tiny_size(pg_server: PgServer, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "scale.py"), "--tasks", "300", "--events", "3000",
         "--gc", "40", "--rounds", "2", "--pg", pg_server.admin_url],
        capture_output=True, text=True, timeout=600, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.endswith("x |")]
    assert len(rows) == 14, result.stdout  # 7 operations x 2 stores
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] in ("SQLite", "PostgreSQL"), row
        assert cells[4].endswith("x"), row
        assert float(cells[4].rstrip("x")) > 0, row
    assert "300 finished tasks and 3,000 journal events" in result.stdout
    assert list(tmp_path.iterdir()) == []  # every database was PostgreSQL's or a temporary one
