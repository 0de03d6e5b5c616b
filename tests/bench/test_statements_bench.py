"""``bench/statements.py`` at a tiny size: the trace counts every statement of a task.

The minimal design's count is known by hand (create: BEGIN, the task, 3 steps, one
event, COMMIT; each step: two transactions of BEGIN, UPDATE, event, COMMIT; the last
one also marks the task done): 7 + 3 x 8 + 1 = 32, 7 commits, 18 that move rows. A
count that misses a connection or a statement kind would not give it.

ninelives' counts are capped at what they are today, so that a statement added to the
hot path is seen (and given its reason) rather than slipping in.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "statements.py"
#: (all, data, commits) per 3-step task, at most.
CAPS = {"ninelives": (35, 21, 7), "ninelives-workflow": (50, 32, 9)}


def test_the_statement_count_is_exact_for_the_minimal_design(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--tasks", "3", "--json"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = {r["system"]: r for r in json.loads(proc.stdout)}
    assert set(results) == {"minimal", "ninelives", "ninelives-workflow"}
    assert results["minimal"]["statements_per_task"] == 32
    assert results["minimal"]["commits_per_task"] == 7
    assert results["minimal"]["data_per_task"] == 18
    for system in ("ninelives", "ninelives-workflow"):
        counted = results[system]
        # Every statement shape is listed, and they add up to the total.
        assert sum(per for _, per in counted["top"]) == counted["statements_per_task"]
        # A task cannot be durable with fewer commits than the design's floor.
        assert counted["commits_per_task"] >= 7
        found = (
            counted["statements_per_task"],
            counted["data_per_task"],
            counted["commits_per_task"],
        )
        assert all(f <= cap for f, cap in zip(found, CAPS[system], strict=True)), found


def test_a_named_query_is_counted_under_its_statement_not_its_comment() -> None:
    # Every query loaded from a .sql resource starts with comment lines: they
    # were once skipped as a whole, and with them most of ninelives' statements.
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import statements
    finally:
        sys.path.remove(str(SCRIPT.parent))
    assert statements.shape("-- why\n-- more\nSELECT 1 FROM t WHERE id = 'x'") == (
        "SELECT ? FROM t WHERE id = ?"
    )
