"""The power-loss file layer on its own: the durability rules it applies, and the
sqlite3-shaped connection over apsw that the store runs on in the harness."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path
from typing import cast

import pytest

from ninelives.errors import TaskExists
from ninelives.runtime import Runtime
from ninelives.settings import Settings
from ninelives.store.sqlite.store import SQLiteStore
from ninelives.testing.apswconn import EMPTY, ApswConnection, CommitTracker
from ninelives.testing.disklayer import (
    SECTOR,
    DiskModel,
    EffectsOS,
    FileNode,
    PowerCut,
    Trigger,
    recording_vfs,
)
from ninelives.testing.lab import GUIDE_PLAN


def _model(tmp_path: Path) -> tuple[DiskModel, EffectsOS, Trigger]:
    (tmp_path / "kept.txt").write_text("from before")
    model = DiskModel.scan(str(tmp_path))
    trigger = Trigger()
    return model, EffectsOS(model, trigger), trigger


def _write_file(proxy: EffectsOS, path: str, data: bytes, *, sync: bool) -> None:
    fd = proxy.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        proxy.write(fd, data)
        if sync:
            proxy.fsync(fd)
    finally:
        proxy.close(fd)


def _sync_dir(proxy: EffectsOS, folder: str) -> None:
    fd = proxy.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        proxy.fsync(fd)
    finally:
        proxy.close(fd)


def test_bytes_need_a_file_fsync_and_names_need_a_folder_fsync(tmp_path: Path) -> None:
    model, proxy, _ = _model(tmp_path)
    _write_file(proxy, str(tmp_path / "a"), b"synced", sync=True)
    _write_file(proxy, str(tmp_path / "b"), b"unsynced", sync=False)
    assert model.survivors() == {"kept.txt": b"from before"}  # no name is durable yet
    _sync_dir(proxy, str(tmp_path))
    assert model.survivors() == {"a": b"synced", "b": b"", "kept.txt": b"from before"}


def test_an_unlink_without_folder_fsync_comes_back(tmp_path: Path) -> None:
    model, proxy, _ = _model(tmp_path)
    proxy.unlink(str(tmp_path / "kept.txt"))
    assert not (tmp_path / "kept.txt").exists()
    model.rebuild(model.survivors())
    assert (tmp_path / "kept.txt").read_text() == "from before"


def test_a_link_shares_the_inode_and_a_new_folder_needs_its_parent_synced(
    tmp_path: Path,
) -> None:
    model, proxy, _ = _model(tmp_path)
    proxy.makedirs(str(tmp_path / "out"), exist_ok=True)
    tmp = str(tmp_path / "out" / ".x.tmp")
    _write_file(proxy, tmp, b"whole text", sync=True)
    proxy.link(tmp, str(tmp_path / "out" / "x"))
    proxy.unlink(tmp)
    _sync_dir(proxy, str(tmp_path / "out"))
    assert "out" not in model.survivors()  # the folder's own name was never synced
    _sync_dir(proxy, str(tmp_path))
    assert model.survivors()["out/x"] == b"whole text"
    assert "out/.x.tmp" not in model.survivors()


def test_torn_writes_land_in_whole_sectors(tmp_path: Path) -> None:
    model = DiskModel.scan(str(tmp_path))
    node = model.create(str(tmp_path / "f"), b"")
    DiskModel.sync(node)
    DiskModel.sync_dir(model.tree)
    old = b"o" * (4 * SECTOR)
    DiskModel.write(node, 0, old)
    DiskModel.sync(node)
    DiskModel.write(node, 0, b"n" * (4 * SECTOR))
    seen = set()
    for seed in range(60):
        data = model.survivors(random.Random(seed))["f"]
        assert len(data) == 4 * SECTOR
        sectors = [data[i : i + SECTOR] for i in range(0, len(data), SECTOR)]
        assert all(s in (b"o" * SECTOR, b"n" * SECTOR) for s in sectors)
        seen.add(tuple(s[:1] for s in sectors))
    assert len(seen) > 4  # old, new and mixed sector patterns all occur


def test_the_trigger_cuts_before_the_chosen_operation(tmp_path: Path) -> None:
    model = DiskModel.scan(str(tmp_path))
    trigger = Trigger(cut_at=2)
    proxy = EffectsOS(model, trigger)
    fd = proxy.open(str(tmp_path / "f"), os.O_WRONLY | os.O_CREAT, 0o644)
    proxy.write(fd, b"first")
    with pytest.raises(PowerCut):
        proxy.fsync(fd)
    proxy.close(fd)
    assert trigger.dead
    assert trigger.ops == ["write f", "sync f"]
    node = model.lookup(str(tmp_path / "f"))
    assert isinstance(node, FileNode)
    assert node.durable == b""  # the sync never happened
    with pytest.raises(PowerCut):
        proxy.unlink(str(tmp_path / "f"))


def test_the_apsw_connection_serves_the_store_and_maps_errors(tmp_path: Path) -> None:
    (tmp_path / "input").mkdir()
    (tmp_path / "input" / "notes.txt").write_text("a\nb\nc\n")
    vfs = recording_vfs()
    model, trigger = DiskModel.scan(str(tmp_path)), Trigger()
    vfs.model, vfs.trigger = model, trigger
    tracker = CommitTracker(EMPTY)

    def connect(path: str, **kw: object) -> sqlite3.Connection:
        conn = ApswConnection(path, vfs=vfs.NAME, trigger=trigger, tracker=tracker)
        return cast(sqlite3.Connection, conn)

    settings = Settings(artifacts=str(tmp_path / "artifacts"), workspace=str(tmp_path))
    try:
        store = SQLiteStore(str(tmp_path / "state.db"), connect=connect)
        with Runtime(store, settings=settings) as rt:
            rt.create("t", GUIDE_PLAN)
            with pytest.raises(TaskExists):  # a UNIQUE violation -> sqlite3.IntegrityError
                rt.create("t", GUIDE_PLAN)
            commits = tracker.commits
            assert rt.run("t").status.value == "done"
            # `running` and `done` per step; the first `running` commits together with
            # the recovery and run_started.
            assert tracker.commits == commits + 2 * 3
            assert ("t", 0, "fetch") in {r[:3] for r in tracker.committed.rows("steps")}
    finally:
        vfs.model, vfs.trigger = None, Trigger()
    assert any(op.startswith("sync state.db-wal") for op in trigger.ops)
    with sqlite3.connect(tmp_path / "state.db") as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
