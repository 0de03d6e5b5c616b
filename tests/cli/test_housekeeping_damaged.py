"""``gc`` and ``doctor`` beside one task whose stored rows cannot be read, and
beside entries of the blob folder that are not blobs or cannot be removed.

The blob sweep reads every output that mentions ``"$blob"``. One damaged row
(nested past any reader, or text that is not UTF-8, as an older version or a
hand edit could store) is that one task's problem: gc still removes what it
should and sweeps the blobs nobody refers to, doctor still reports, and the
blob a sound task refers to is kept. A folder named like a blob is left
alone; a blob that cannot be removed (a folder this user cannot write) is one
line and exit 5. Each ran into a traceback (or an exit 5 for the whole
database) before.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from pathlib import Path

import pytest

from ninelives.testing import Lab
from unprivileged import UserLab

BIG = "x" * 200_000  # over the 64 KiB blob threshold the runs are given: out of row
THRESHOLD = {"NINELIVES_BLOB_THRESHOLD": "65536"}
DEEP = '{"$blob": 1, "x": ' + "[" * 5000 + "]" * 5000 + "}"


def _blob_folder(lab: Lab) -> Path:
    return lab.root / "state.db.blobs"


def _setup(lab: Lab, damage: str) -> tuple[str, str]:
    """Task ``big`` (its output a blob), task ``t`` whose row is then damaged with
    ``damage`` (an SQL expression), and an orphan blob written two hours ago.
    Returns the hashes of the referenced blob and of the orphan."""
    lab.write("input/big.txt", BIG)
    lab.write_plan({"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "input/big.txt"}}]})
    for task_id in ("big", "t"):
        assert lab.cli("create", task_id, "plan.json").returncode == 0
        assert lab.cli("run", task_id, "-q", **THRESHOLD).returncode == 0
    kept = [p.name for p in _blob_folder(lab).iterdir() if not p.name.startswith(".")]
    assert len(kept) == 1, kept
    orphan_body = b"nobody refers to me"
    orphan = hashlib.sha256(orphan_body).hexdigest()
    path = _blob_folder(lab) / orphan
    path.write_bytes(orphan_body)
    old = time.time() - 7200
    os.utime(path, (old, old))
    conn = sqlite3.connect(lab.root / "state.db")
    try:
        conn.execute(f"UPDATE steps SET output = {damage} WHERE task_id = 't'")
        conn.commit()
    finally:
        conn.close()
    return kept[0], orphan


DAMAGE = {
    "nested 5000 deep": f"'{DEEP}'",
    "not UTF-8": "CAST(X'7b2224626c6f62223a2022fffe227d' AS TEXT)",  # {"$blob": "\xff\xfe"}
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_gc_and_doctor_sweep_past_a_damaged_row(sqlite_lab: Lab, case: str) -> None:
    lab = sqlite_lab
    kept, orphan = _setup(lab, DAMAGE[case])
    doctor = lab.cli("doctor", "--json")
    assert "Traceback" not in doctor.stderr, doctor.stderr
    assert doctor.returncode == 7, doctor
    assert [f["subject"] for f in doctor.json()["findings"] if f["kind"] == "blob_orphan"] == [
        orphan
    ]
    gc = lab.cli("gc", "--older-than", "30d", "--json")
    assert "Traceback" not in gc.stderr, gc.stderr
    assert gc.returncode == 0, gc
    assert gc.json()["blobs"] == [orphan]
    assert sorted(p.name for p in _blob_folder(lab).iterdir()) == [kept]
    # The sound task still reads its blob; the damaged one is that task alone.
    assert lab.cli("status", "big", "--outputs").returncode == 0
    assert lab.cli("status", "t").returncode == 5


def test_a_folder_named_like_a_blob_is_left_and_the_sweep_goes_on(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    kept, orphan = _setup(lab, "output")  # no damage: the rows stay as they are
    planted = "ab" * 32
    (_blob_folder(lab) / planted).mkdir()
    old = time.time() - 7200
    os.utime(_blob_folder(lab) / planted, (old, old))
    for args in (["doctor", "--fix"], ["gc", "--older-than", "30d"]):
        result = lab.cli(*args)
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode == 0, result
    assert sorted(p.name for p in _blob_folder(lab).iterdir()) == sorted([kept, planted])
    assert orphan  # removed by doctor --fix above, the folder beside it left alone


def test_a_blob_that_cannot_be_removed_is_one_line_exit_5(tmp_path: Path) -> None:
    lab = UserLab(tmp_path / "lab", db="state.db")
    kept, orphan = _setup(lab, "output")
    folder = _blob_folder(lab)
    folder.chmod(0o500)
    try:
        result = lab.cli("gc", "--older-than", "30d")
    finally:
        folder.chmod(0o700)
    assert result.returncode == 5, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("ninelives: error: cannot remove blob "), lines
    assert orphan in lines[0]
    assert sorted(p.name for p in folder.iterdir()) == sorted([kept, orphan])


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_a_blob_folder_that_is_not_a_folder_is_one_line_exit_5(sqlite_lab: Lab, kind: str) -> None:
    lab = sqlite_lab
    _setup(lab, "output")
    folder = _blob_folder(lab)
    for entry in folder.iterdir():
        entry.unlink()
    folder.rmdir()
    if kind == "file":
        folder.write_text("not a folder")
    else:
        os.mkfifo(folder)
    before = lab.fingerprint()
    for args in (
        ["doctor"],
        ["gc", "--older-than", "30d"],
        ["gc", "--older-than", "0s", "--dry-run"],
    ):
        result = lab.cli(*args, timeout=60)
        assert result.returncode == 5, result
        lines = result.stderr.splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith("ninelives: error: blob folder "), lines
        assert str(folder) in lines[0], lines
    assert lab.fingerprint() == before


def test_a_folder_named_like_a_temporary_file_is_not_reported(sqlite_lab: Lab) -> None:
    # ninelives makes its temporary files as regular files only: a folder with
    # such a name is not its to judge (doctor --fix cannot remove it, so doctor
    # reported it, exit 7, forever).
    lab = sqlite_lab
    _setup(lab, "output")
    old = time.time() - 7200
    planted = [
        lab.root / "artifacts" / ".keep.0123456789abcdef.tmp",
        _blob_folder(lab) / ".big-0.0123456789abcdef.tmp",
    ]
    for path in planted:
        path.mkdir(parents=True)
        os.utime(path, (old, old))
    for args in (["doctor", "--fix", "--json"], ["doctor", "--json"]):
        result = lab.cli(*args)
        assert "Traceback" not in result.stderr, result.stderr
        kinds = {f["kind"] for f in result.json()["findings"]}
        assert not kinds & {"temp", "blob_temp"}, result.stdout
    gc = lab.cli("gc", "--older-than", "30d", "--json")
    assert gc.returncode == 0, gc
    assert gc.json()["temps"] == []
    assert all(path.is_dir() for path in planted)


def test_a_symlinked_blob_folder_is_never_swept(sqlite_lab: Lab, tmp_path: Path) -> None:
    # A run refuses to store blobs through a symlinked blob folder (they go
    # beside the database, never elsewhere); gc and doctor --fix removed files
    # through it all the same, in whatever folder it points to.
    lab = sqlite_lab
    kept, orphan = _setup(lab, "output")
    elsewhere = tmp_path / "elsewhere"
    _blob_folder(lab).rename(elsewhere)
    _blob_folder(lab).symlink_to(elsewhere)
    for args in (["gc", "--older-than", "30d"], ["doctor", "--fix"]):
        result = lab.cli(*args)
        assert result.returncode == 5, result
        lines = result.stderr.splitlines()
        assert len(lines) == 1, lines
        assert "is a symlink" in lines[0], lines
    assert sorted(p.name for p in elsewhere.iterdir()) == sorted([kept, orphan])
    assert lab.cli("status", "big", "--outputs").returncode == 0  # reading it still works


@pytest.mark.parametrize(
    ("statement", "fails", "finding"),
    [
        ("ALTER TABLE steps DROP COLUMN policy", ("run", "t"), "steps lacks its column policy"),
        ("DROP TABLE removed_tasks", ("create", "u", "plan.json"), "removed_tasks is missing"),
    ],
)
def test_doctor_names_a_column_or_table_a_hand_edit_dropped(
    sqlite_lab: Lab, statement: str, fails: tuple[str, ...], finding: str
) -> None:
    """quick_check passes a file whose schema lost a column or a table (a hand
    edit), while commands fail with "no such column": doctor said "no findings"."""
    lab = sqlite_lab
    lab.write_plan({"goal": "g", "steps": [{"tool": "approval", "input": {"prompt": "ok?"}}]})
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("doctor").returncode == 0  # control: the same file, not edited
    conn = sqlite3.connect(lab.root / "state.db")
    try:
        conn.execute(statement)
        conn.commit()
    finally:
        conn.close()
    assert lab.cli(*fails).returncode == 5
    found = lab.cli("doctor")
    assert found.returncode == 7, found.stderr
    assert f"integrity: state.db: table {finding} (fix: " in found.stdout, found.stdout
