"""Power cuts at every write and sync of the guide's task, and at random, with controls.

Each cut rebuilds the folder from what was synced (or a torn part of the
rest), checks it with the normal stdlib store, and resumes to the end. The
controls remove one safety each and must make the same checks fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ninelives.testing.powerloss import (
    Controls,
    Cut,
    PowerLossReport,
    campaign,
    reference_ops,
    run_scenario,
    sweep,
)

#: Random cuts in the CI slice (bench/reliability.py runs 1,000).
CI_CUTS = 200


def _clean(report: PowerLossReport) -> None:
    assert report.problems == ()
    # Read back from every connection the store committed on (which the harness
    # opens with synchronous=NORMAL): the store's own settings made it FULL and WAL.
    assert report.settings == {(2, "wal")}
    assert (report.lost_commits, report.corrupt, report.broken_artifacts, report.duplicates) == (
        0,
        0,
        0,
        0,
    )


def test_the_task_touches_every_kind_of_durable_state(tmp_path: Path) -> None:
    ops = reference_ops(str(tmp_path / "ref"))
    kinds = {op.split()[0] for op in ops}
    files = {op.split()[1] for op in ops}
    assert {"write", "sync", "dirsync", "truncate", "delete", "mkdir", "link", "unlink"} <= kinds
    assert {"state.db", "state.db-wal", "state.db-journal"} <= files
    # The WAL's first sync also syncs its folder (SQLite's unix VFS does so).
    first_wal_sync = ops.index("sync state.db-wal")
    assert ops[first_wal_sync + 1] == "dirsync ."


@pytest.mark.slow
def test_a_cut_at_every_operation_loses_nothing_acknowledged(tmp_path: Path) -> None:
    ops = reference_ops(str(tmp_path / "ref"))
    syncs = sum(op.startswith(("sync", "dirsync")) for op in ops)
    report = sweep(torn_seeds=3)
    _clean(report)
    assert report.cuts == len(ops) + 3 * syncs
    assert report.torn_cuts == 3 * syncs
    # Some torn cuts kept nearly every pending write, so the commit in flight
    # (never acknowledged) survived: the check accepts that outcome too.
    assert report.inflight_kept > 0


@pytest.mark.slow
def test_random_cuts_one_to_three_in_a_row() -> None:
    report = campaign(CI_CUTS, seed=20240601)
    _clean(report)
    assert report.cuts >= CI_CUTS
    assert report.torn_cuts > CI_CUTS // 4
    assert report.scenarios < report.cuts  # some scenarios were cut more than once


def test_a_cut_in_recovery_then_again_in_the_resume(tmp_path: Path) -> None:
    ops = reference_ops(str(tmp_path / "ref"))
    mid_task = ops.index("mkdir artifacts")  # inside step 2
    result = run_scenario(
        str(tmp_path / "s"),
        [Cut(at=mid_task), Cut(at=3, torn=True, seed=7), Cut(at=12)],
    )
    assert result.problems == ()
    assert result.cuts == 3


# -- negative controls: each removes one safety; the same checks must fail ---------


@pytest.mark.slow
def test_control_synchronous_normal_loses_acknowledged_commits() -> None:
    # Set on the store's own connection once it is open: the setting really is
    # gone (read back), whatever text the store sends.
    report = sweep(controls=Controls(synchronous="NORMAL"), torn_seeds=0)
    assert report.settings == {(1, "wal")}
    assert report.lost_commits > 0
    assert any("lost acknowledged commit" in p for p in report.problems)
    assert any("synchronous=1" in p for p in report.problems)


@pytest.mark.slow
def test_sqlite_ignoring_its_own_folder_fsync_loses_nothing(tmp_path: Path) -> None:
    """SQLite fsyncs the folder when it creates the WAL but ignores a failure of
    that fsync. With that fsync lost at every cut, the store's own fsync of the
    folder at its first write must keep the new database's names."""
    controls = Controls(sqlite_dirsync_lost=True)
    _clean(sweep(controls=controls, torn_seeds=0))
    ops = reference_ops(str(tmp_path / "ref"), controls=controls)
    assert "dirsync ." in ops[: ops.index("sync state.db-wal")]  # the store's, before the commit


@pytest.mark.slow
def test_control_without_the_store_folder_fsync_a_new_database_goes_missing(
    tmp_path: Path,
) -> None:
    """The same fault, with the store's folder fsync doing nothing: a cut after
    the first commit of the new database loses the WAL's (and the database's)
    name, and with it an acknowledged commit."""
    controls = Controls(sqlite_dirsync_lost=True, drop_db_dirsync=True)
    ops = reference_ops(str(tmp_path / "ref"), controls=controls)
    # The WAL's header is synced, then the first commit's frames: cut just after.
    header, commit = [i for i, op in enumerate(ops) if op == "sync state.db-wal"][:2]
    assert "write state.db-wal" in ops[header:commit]
    result = run_scenario(str(tmp_path / "s"), [Cut(at=commit + 2)], controls=controls)
    assert result.lost_commits == 1, result.problems
    assert any("lost acknowledged commit" in p for p in result.problems)
    assert sweep(controls=controls, torn_seeds=0).lost_commits > 0


@pytest.mark.slow
def test_control_artifact_without_fsync_comes_back_partial() -> None:
    report = sweep(controls=Controls(drop_artifact_fsync=True), torn_seeds=0)
    assert report.broken_artifacts > 0
    assert any("artifact_content" in p and "holds 0 bytes" in p for p in report.problems)
    assert report.lost_commits == 0  # the database side is untouched


@pytest.mark.slow
def test_control_artifact_without_folder_fsync_goes_missing() -> None:
    report = sweep(controls=Controls(drop_artifact_dirsync=True), torn_seeds=0)
    assert any("artifact_missing" in p for p in report.problems)


@pytest.mark.slow
def test_control_artifact_folder_without_parent_fsync_goes_missing() -> None:
    # The behaviour before make_folder: os.makedirs alone. The folder's name was
    # never synced, so a cut after the `done` commit lost the published file.
    report = sweep(controls=Controls(plain_mkdir=True), torn_seeds=0)
    assert any("artifact_missing" in p for p in report.problems)


@pytest.mark.slow
def test_control_synchronous_off_corrupts_or_loses() -> None:
    report = sweep(controls=Controls(synchronous="OFF"), torn_seeds=5)
    assert report.lost_commits > 0
    assert report.corrupt > 0
    assert any("corrupt database" in p for p in report.problems)


@pytest.mark.parametrize("at", [1, 10, 31])
def test_cut_scenarios_replay_identically(tmp_path: Path, at: int) -> None:
    spec = [Cut(at=at, torn=True, seed=99), Cut(at=at + 20, torn=True, seed=5)]
    first = run_scenario(str(tmp_path / "a"), spec)
    second = run_scenario(str(tmp_path / "b"), spec)
    assert first.problems == second.problems == ()
    assert (first.cuts, first.inflight_kept) == (second.cuts, second.inflight_kept)
    # Temporary file names are random; everything else repeats.
    assert [_no_hex(op) for op in first.ops] == [_no_hex(op) for op in second.ops]


def _no_hex(op: str) -> str:
    return re.sub(r"[0-9a-f]{16}", "#", op)
