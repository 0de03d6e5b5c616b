"""Power cuts with every output stored as a blob (``state.db.blobs/``): no
committed reference to a missing or partial blob, at any operation, torn or not.
Controls: a blob stored without its fsync, or without its folder's, is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from ninelives.testing.powerloss import Controls, reference_ops, sweep

ALL_BLOBS = Controls(blob_threshold=0)


def test_every_output_goes_through_the_blob_folder(tmp_path: Path) -> None:
    ops = reference_ops(str(tmp_path / "ref"), controls=ALL_BLOBS)
    blob_ops = [op for op in ops if "state.db.blobs" in op]
    kinds = {op.split()[0] for op in blob_ops}
    assert {"mkdir", "write", "sync", "link", "unlink", "dirsync"} <= kinds, blob_ops
    # Each blob is durable (file and folder synced) before the done commit that
    # refers to it: its last folder sync comes before the next WAL write.
    last_dirsync = max(i for i, op in enumerate(ops) if op == "dirsync state.db.blobs")
    assert any(op.startswith("write state.db-wal") for op in ops[last_dirsync:])


@pytest.mark.slow
def test_a_cut_at_every_operation_leaves_no_reference_to_a_missing_blob() -> None:
    report = sweep(controls=ALL_BLOBS, torn_seeds=2)
    assert report.problems == ()
    assert (report.lost_commits, report.corrupt, report.broken_artifacts) == (0, 0, 0)
    assert report.cuts > 100


@pytest.mark.slow
def test_control_a_blob_without_fsync_comes_back_damaged() -> None:
    report = sweep(controls=Controls(blob_threshold=0, drop_blob_fsync=True), torn_seeds=0)
    assert report.broken_artifacts > 0, report.problems
    assert any("blob:" in p and "SHA-256 is not the reference's" in p for p in report.problems)
    assert report.lost_commits == 0


@pytest.mark.slow
def test_control_a_blob_without_folder_fsync_goes_missing() -> None:
    report = sweep(controls=Controls(blob_threshold=0, drop_blob_dirsync=True), torn_seeds=0)
    assert any("blob:" in p and "is missing" in p for p in report.problems), report.problems
