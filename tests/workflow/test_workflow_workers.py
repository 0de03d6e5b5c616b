"""Workflow tasks run by workers: killed at random while several slots work
(group commit on SQLite, leases on PostgreSQL), then drained; a worker that
does not have the workflow's module passes its task over (cannot_run),
writing nothing; two workers share one queue of workflow tasks."""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path

import pytest

from ninelives.testing import Lab

pytestmark = [pytest.mark.crash, pytest.mark.slow]

FLOWS = (Path(__file__).parent / "wflows.py").read_text(encoding="utf-8")
TASKS = 8


def _setup(lab: Lab) -> None:
    lab.write("wflows.py", FLOWS)
    lab.base_env["NINELIVES_TOOLS"] = "wflows"
    for i in range(TASKS):
        flow = "atriage" if i % 2 else "triage"
        made = lab.cli("create", f"t{i}", "--workflow", flow, "--args", f'["T{i}"]', "--enqueue")
        assert made.returncode == 0, made.stderr


def _calls(lab: Lab) -> Counter[str]:
    log = lab.root / "calls.log"
    return Counter(log.read_text().splitlines()) if log.exists() else Counter()


def _worker(backend: str, *extra: str) -> list[str]:
    group = ["--group-commit"] if backend == "sqlite" else []
    return ["worker", "--concurrency", "4", "--poll", "0.05", *group, *extra]


def _check(lab: Lab) -> None:
    calls = _calls(lab)
    outcome = lab.root / "outcome"
    for i in range(TASKS):
        status = lab.cli("status", f"t{i}", "--json").json()
        assert status["status"] == "done", status
        assert status["result"]["note"] == f"summary: ticket T{i}"
        assert (outcome / f"t{i}-2").read_text() == f"summary: ticket T{i}"
        started = Counter(
            e["step"] for e in lab.cli("export", f"t{i}").jsonl() if e["kind"] == "step_started"
        )
        # At least once, and never more often than its journal started it.
        assert 1 <= calls[f"post t{i}-2"] <= started[2], (i, calls, started)
    assert sorted(p.name for p in outcome.iterdir()) == sorted(f"t{i}-2" for i in range(TASKS))
    verified = lab.cli("verify", "--all")
    assert verified.returncode == 0, verified.stdout


def test_workers_killed_at_random_run_each_workflow_effect_once(lab: Lab, backend: str) -> None:
    _setup(lab)
    rng = random.Random(19)
    for _ in range(4):
        proc = lab.spawn(*_worker(backend), NINELIVES_CRASH_PAUSE="0.02", NINELIVES_LEASE="1")
        time.sleep(rng.uniform(0.3, 1.2))
        if proc.poll() is not None:
            break
        assert lab.kill(proc) == -9
    drained = lab.cli(*_worker(backend, "--drain"), NINELIVES_LEASE="1", timeout=180)
    assert drained.returncode == 0, drained.stderr
    _check(lab)


def test_two_workers_share_a_queue_of_workflow_tasks(lab: Lab, backend: str) -> None:
    _setup(lab)
    first = lab.spawn(*_worker(backend, "--drain"), NINELIVES_CRASH_PAUSE="0.01")
    second = lab.spawn(*_worker(backend, "--drain"), NINELIVES_CRASH_PAUSE="0.01")
    assert first.wait(timeout=180) == 0
    assert second.wait(timeout=180) == 0
    _check(lab)


def test_a_worker_without_the_workflow_passes_its_task_over(lab: Lab) -> None:
    _setup(lab)
    before = lab.fingerprint(*(f"t{i}" for i in range(TASKS)))
    drained = lab.cli("worker", "--drain", "--poll", "0.05", NINELIVES_TOOLS="")
    assert drained.returncode == 11, drained.stderr
    assert "action=cannot_run" in drained.stderr
    assert "unknown workflow 'triage'" in drained.stderr
    after = lab.fingerprint(*(f"t{i}" for i in range(TASKS)))
    after["files"] = {k: v for k, v in after["files"].items() if ".locks" not in k}
    assert after == before  # the database as it was (a lock file is not a write)
