"""Power cuts with group commit on: the guide's task written through a
:class:`~ninelives.store.sqlite.group.GroupCommitter` (savepoints inside one
transaction, the COMMIT by the committer) loses no acknowledged commit.

The harness counts a write as acknowledged where its caller sees it: when the
store's write returns, not when some connection's COMMIT returns (a grouped
write's COMMIT runs on the committer's connection)."""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from ninelives.store.sqlite.group import GroupCommitter
from ninelives.testing.powerloss import (
    Controls,
    Cut,
    PowerLossReport,
    campaign,
    run_scenario,
    sweep,
)

GROUP = Controls(group_commit=True)


def _clean(report: PowerLossReport) -> None:
    assert report.problems == ()
    assert report.settings == {(2, "wal")}
    counts = (report.lost_commits, report.corrupt, report.broken_artifacts, report.duplicates)
    assert counts == (0, 0, 0, 0)


@pytest.mark.slow
def test_a_cut_at_every_operation_with_group_commit_loses_nothing_acknowledged() -> None:
    report = sweep(controls=GROUP, torn_seeds=1)
    _clean(report)
    assert report.cuts > 50


@pytest.mark.slow
def test_random_cuts_with_group_commit_lose_nothing_acknowledged() -> None:
    report = campaign(60, seed=13, controls=GROUP)
    _clean(report)
    assert report.cuts >= 60


@pytest.mark.slow
def test_control_group_commit_with_synchronous_normal_loses_acknowledged_commits() -> None:
    """The checks bite with group commit on: the committing connection without
    ``synchronous=FULL`` loses commits its callers were told about."""
    report = sweep(controls=Controls(group_commit=True, synchronous="NORMAL"), torn_seeds=0)
    assert report.lost_commits > 0
    assert any("lost acknowledged commit" in p for p in report.problems)


def test_the_run_writes_through_the_group_committer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scenarios above test group commit only if the run's writes go through it."""
    grouped = []
    write = GroupCommitter.write

    def counted(self: GroupCommitter) -> AbstractContextManager[sqlite3.Connection]:
        grouped.append(1)
        return write(self)

    monkeypatch.setattr(GroupCommitter, "write", counted)
    result = run_scenario(str(tmp_path / "s"), [Cut(at=10**6)], controls=GROUP)
    assert result.problems == ()
    assert len(grouped) >= 6  # the claim, then start and finish of each of 3 steps


@pytest.mark.slow
def test_control_writes_released_before_their_commit_lose_acknowledged_commits() -> None:
    """The harness counts a write acknowledged where its caller sees it: a
    committer that releases each write before the COMMIT holding it (its
    test-only switch) shows as lost acknowledged commits, though every COMMIT
    that returned is on disk."""
    report = sweep(controls=Controls(group_commit=True, group_early_release=True), torn_seeds=0)
    assert report.lost_commits > 0
    assert any("lost acknowledged commit" in p for p in report.problems)
