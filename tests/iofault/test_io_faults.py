"""Each fsync, fdatasync, write and pwrite64 of a real ``run``, failed in turn with
EIO and ENOSPC under strace; then a real full disk on a small tmpfs.

Every faulted run must stop cleanly (exit 0, 5 or 6, one error line), never
report a step done whose commit failed, never write another transaction after
a failed database write or sync, and leave a database the next ``run``
finishes exactly once.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ninelives.testing.iofault import (
    FaultReport,
    full_disk,
    strace_path,
    sweep,
)

pytestmark = [pytest.mark.slow, pytest.mark.linux]

BROKEN = Path(__file__).with_name("broken_runner.py")


@pytest.fixture(scope="module", autouse=True)
def _needs_strace() -> None:
    strace_path()  # fails (never skips) with an install hint when strace is missing


def _injected_everywhere(report: FaultReport) -> None:
    assert report.faults == 2 * sum(report.counts.values())
    assert report.problems == []


def test_every_fsync_fails_in_turn() -> None:
    # The folder fsync before the first commit, the artifact folder's parent,
    # the artifact's temporary file and the artifact folder: each failure stops
    # the runner with exit 6, and none is retried in the same process.
    report = sweep(syscalls=("fsync",))
    assert report.counts["fsync"] == 4
    _injected_everywhere(report)
    assert report.exit_codes() == {6: 8}
    assert [o.exit_code for o in report.outcomes if o.target.endswith(".tmp")] == [6, 6]


def test_control_a_runner_that_retries_a_failed_artifact_fsync_is_caught() -> None:
    """Fail-stop removed (an effect's failed fsync made an ordinary tool error):
    the run retries the step, reports it done and exits 0. The sweep must call
    that a problem; with fail-stop (above) the same fault ends the run with 6."""
    report = sweep(
        syscalls=("fsync",), errors=("EIO",), runner=[sys.executable, str(BROKEN), "effect-retry"]
    )
    [artifact] = [o for o in report.outcomes if o.target.endswith(".tmp")]
    assert artifact.exit_code == 0
    assert any("did not stop the run" in p for p in artifact.problems), artifact.problems


def test_every_fdatasync_fails_in_turn() -> None:
    report = sweep(syscalls=("fdatasync",))
    assert report.counts["fdatasync"] >= 8  # WAL header, 6 commits (2 per step), checkpoint
    _injected_everywhere(report)
    commits = [o for o in report.outcomes if o.target == "state.db-wal" and o.exit_code == 6]
    # The WAL header's sync and each commit's (two per step): each failed once per error.
    assert len(commits) >= 2 * 7


def test_every_write_fails_in_turn() -> None:
    report = sweep(syscalls=("write", "pwrite64"))
    assert report.counts["pwrite64"] > 50
    _injected_everywhere(report)
    assert {0, 6} <= set(report.exit_codes())


@pytest.mark.parametrize(
    ("mode", "finding"),
    [
        ("retry", "a transaction was written after the failed database write or sync"),
        ("ignore", "reported done, not stored"),
    ],
)
def test_control_a_runner_that_retries_or_ignores_a_failed_commit_is_caught(
    mode: str, finding: str
) -> None:
    report = sweep(
        syscalls=("fdatasync",),
        errors=("EIO",),
        runner=[sys.executable, str(BROKEN), mode],
    )
    assert any(finding in p for p in report.problems), report.problems


def test_a_real_full_disk(tmp_path: Path) -> None:
    outcomes = full_disk(str(tmp_path))
    assert [p for o in outcomes for p in o.problems] == []
    codes = {code for o in outcomes for code in o.exit_codes}
    assert 6 in codes
    messages = [m for o in outcomes for m in o.messages]
    assert any("disk is full" in m for m in messages)  # a commit hit the full disk
    assert any("publishing" in m and "No space left" in m for m in messages)  # the artifact
    leftover = next(o for o in outcomes if o.name == "leftover-temp")
    assert leftover.exit_codes[0] != 0


# -- the worker: fail-stop exactly like run ---------------------------------------


def test_a_worker_stops_at_every_failed_fsync_like_run() -> None:
    # The artifact's temporary file fsync among them: a worker that logged the
    # error and claimed again re-published 1 ms later and exited 0.
    report = sweep(syscalls=("fsync",), errors=("EIO",), command="worker")
    assert report.counts["fsync"] >= 4
    _worker_clean(report)
    assert report.exit_codes() == {6: report.faults}


def test_a_worker_stops_at_every_failed_fdatasync_like_run() -> None:
    # A failed WAL sync: the same connection must not write another frame.
    report = sweep(syscalls=("fdatasync",), errors=("EIO",), command="worker")
    _worker_clean(report)
    commits = [o for o in report.outcomes if o.target == "state.db-wal" and o.exit_code == 6]
    # The WAL header's sync and each commit's: the claim with the first step's
    # start, then two per step (a checkpoint's sync at exit may fail quietly).
    assert len(commits) >= 7, [(str(o.case), o.target, o.exit_code) for o in report.outcomes]


def _worker_clean(report: FaultReport) -> None:
    assert report.faults == sum(report.counts.values())
    assert report.problems == []
