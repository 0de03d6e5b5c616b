"""``bench/workflow_step.py`` at a tiny size: both kinds of task run to the end and the
ratios are printed (timings are the benchmark's business, never asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "workflow_step.py"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_the_workflow_step_benchmark_runs(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--tasks", "6", "--rounds", "2", "--json", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["tasks"] == 6
    assert result["problems"] == []
    for kind in ("plan_step_ms", "workflow_step_ms"):
        assert result[kind]["run"] > 0
        assert result[kind]["create_run"] > result[kind]["run"]
    ratio = result["ratio"]["run"]
    assert ratio == pytest.approx(result["workflow_step_ms"]["run"] / result["plan_step_ms"]["run"])
    assert list(tmp_path.iterdir()) == []  # the databases were in a temporary folder
    text = _run(tmp_path, "--tasks", "2", "--rounds", "1")
    assert text.returncode == 0, text.stderr
    assert "workflow / plan step (run only):" in text.stdout
    assert "(aim <= 1.2x)" in text.stdout


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    proc = _run(tmp_path, "--tasks", "0")
    assert proc.returncode == 2
    assert "must be at least 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_check_catches_an_unfinished_task(tmp_path: Path) -> None:
    """Negative control: a task of either kind not run to the end is reported."""
    import importlib.util

    import ninelives

    spec = importlib.util.spec_from_file_location("workflow_step", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.time_ninelives(tmp_path, 1, 0)
    bench.time_workflow(tmp_path, 1, 0)
    assert bench.check(tmp_path, 1) == []
    with ninelives.open(str(tmp_path / "state.db"), tools=bench.stub_tools()) as rt:
        rt.create("t1", bench.step_overhead_plan())
    with ninelives.open(str(tmp_path / "wf.db")) as rt:
        rt.create("w1", bench.stub_report)
    assert bench.check(tmp_path, 2) == [
        "state.db t1: pending, 0 steps",
        "wf.db w1: pending, 0 steps",
    ]
