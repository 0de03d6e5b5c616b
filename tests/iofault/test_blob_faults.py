"""Every fsync of a real ``run`` that stores each output as a blob, failed in turn
with EIO and ENOSPC under strace: the blob's temporary file and its folder
included, each failure stops the runner at once (exit 6), never retried, and
the next ``run`` finishes the task exactly once with every blob sound."""

from __future__ import annotations

import re

import pytest

from ninelives.testing.iofault import strace_path, sweep

pytestmark = [pytest.mark.slow, pytest.mark.linux]


def test_every_fsync_of_a_blob_run_fails_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    strace_path()  # fails (never skips) with an install hint when strace is missing
    monkeypatch.setenv("NINELIVES_BLOB_THRESHOLD", "0")  # every run of the sweep
    report = sweep(syscalls=("fsync",))
    assert report.problems == []
    targets = [o.target for o in report.outcomes]
    # Each step's blob (a temporary file) and the blob folder after each link,
    # with both errors: the faults reached every blob write.
    blob_temps = [t for t in targets if re.fullmatch(r"\.t-\d\.[0-9a-f]{16}\.tmp", t)]
    assert len(blob_temps) == 3 * 2, targets
    assert targets.count("state.db.blobs") == 3 * 2, targets
    assert report.exit_codes() == {6: len(report.outcomes)}
