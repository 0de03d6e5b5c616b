"""The step duration histogram's bucket bounds: one list in Python, the same in each dialect."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ninelives.models import DURATION_BUCKETS, step_durations

SQL = Path(__file__).parents[2] / "src" / "ninelives" / "store" / "sql"


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_each_dialect_buckets_by_the_python_bounds(dialect: str) -> None:
    text = (SQL / f"{dialect}.sql").read_text()
    query = text.split("-- name: metric_durations", 1)[1].split("-- name:", 1)[0]
    found = re.findall(r"WHEN seconds <= ([\d.]+) THEN ([\d.]+)", query)
    assert [float(a) for a, _ in found] == list(DURATION_BUCKETS)
    assert all(a == b for a, b in found)


def test_rows_become_cumulative_series_with_both_outcomes() -> None:
    rows = [(0.01, "done", 2, 0.01), (1, "done", 1, 0.7), (None, "done", 1, 4000.0),
            (None, None, 6, None)]  # fmt: skip
    started, series = step_durations(rows)
    assert started == 6
    done, error = series
    assert (done.outcome, done.attempts, done.seconds) == ("done", 4, pytest.approx(4000.71))
    assert dict(done.buckets)[0.005] == 0
    assert dict(done.buckets)[0.01] == 2
    assert dict(done.buckets)[0.5] == 2
    assert dict(done.buckets)[1.0] == 3
    assert dict(done.buckets)[1800.0] == 3  # the fourth is only under +Inf
    assert (error.outcome, error.attempts, error.seconds) == ("error", 0, 0.0)
    assert all(n == 0 for _, n in error.buckets)
