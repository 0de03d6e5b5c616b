"""Large outputs out of the row (ninelives.blobs), on every backend: the row keeps
a reference, reads give the content checked by SHA-256, identical content is
stored once, a missing or changed blob is an error naming task and step, and
the housekeeping functions (references, sweep, check) see what is stored."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from test_store_contract import Opener, open_, url  # noqa: F401  (fixtures)

from ninelives import blobs
from ninelives.errors import BlobDamaged
from ninelives.housekeeping import doctor, gc
from ninelives.runtime import Runtime
from ninelives.settings import Settings
from ninelives.store import Store, is_postgres_url
from ninelives.tools import Registry, Tool
from ninelives.verify import verify_store

BIG = "x" * 5000  # over the tests' threshold of 1 KiB, far under the row's limits
THRESHOLD = 1024


def _tools(outputs: Mapping[str, Any]) -> Registry:
    """A tool ``emit`` that returns ``outputs[input["key"]]``."""

    def emit(step_input: Mapping[str, Any], ctx: Mapping[int, Any], idem_key: str) -> Any:
        return outputs[step_input["key"]]

    return Registry([Tool(name="emit", fn=emit)], entry_points=False)


OUTPUTS: dict[str, Any] = {
    "big": {"text": BIG},
    "small": {"text": "short"},
    # Outputs a reader could take for a reference or an escape: stored escaped.
    "ref_like": {"$blob": {"sha256": "0" * 64, "size": 3}},
    "raw_like": {"$raw": {"a": 1}},
    "big_ref_like": {"$blob": {"sha256": "1" * 64, "size": 1, "pad": BIG}},
}


def _run(store: Store, task_id: str, keys: list[str], threshold: int = THRESHOLD) -> Runtime:
    rt = Runtime(store, settings=Settings(blob_threshold=threshold), tools=_tools(OUTPUTS))
    plan = {"goal": "g", "steps": [{"tool": "emit", "input": {"key": k}} for k in keys]}
    rt.create(task_id, plan)
    rt.run(task_id)
    return rt


def _rows(store: Store, task_id: str) -> dict[int, str]:
    """``steps.output`` as stored, read around the store."""
    if is_postgres_url(store.url):
        import psycopg

        with psycopg.connect(store.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT idx, output FROM steps WHERE task_id = %s", (task_id,)
            ).fetchall()
    else:
        import sqlite3

        conn2 = sqlite3.connect(store.url)
        try:
            rows = conn2.execute(
                "SELECT idx, output FROM steps WHERE task_id = ?", (task_id,)
            ).fetchall()
        finally:
            conn2.close()
    return {int(i): str(o) for i, o in rows}


def _damage(store: Store, sha256: str, how: str) -> None:
    """Remove (``missing``) or change a stored blob, around the store: one byte
    appended (``corrupt``), or one bit of its middle byte flipped in place
    (``flipped``: the same size, still valid JSON, so only the SHA-256 can tell)."""
    if is_postgres_url(store.url):
        import psycopg

        with psycopg.connect(store.url, autocommit=True) as conn:
            if how == "missing":
                conn.execute("DELETE FROM blob_chunks WHERE sha256 = %s", (sha256,))
            elif how == "flipped":
                conn.execute(
                    "UPDATE blob_chunks SET data = set_byte(data, length(data) / 2, "
                    "get_byte(data, length(data) / 2) # 1) WHERE sha256 = %s AND n = 0",
                    (sha256,),
                )
            else:
                conn.execute(
                    "UPDATE blob_chunks SET data = data || '\\x00'::bytea "
                    "WHERE sha256 = %s AND n = 0",
                    (sha256,),
                )
        return
    path = os.path.join(store.url + ".blobs", sha256)
    if how == "missing":
        os.unlink(path)
    elif how == "flipped":
        os.chmod(path, 0o600)
        middle = os.path.getsize(path) // 2
        with open(path, "r+b") as fh:
            fh.seek(middle)
            byte = fh.read(1)
            fh.seek(middle)
            fh.write(bytes([byte[0] ^ 1]))
    else:
        os.chmod(path, 0o600)
        with open(path, "ab") as fh:
            fh.write(b"\0")


def test_a_large_output_is_a_reference_in_the_row_and_content_when_read(
    open_: Opener,  # noqa: F811
) -> None:
    store = open_()
    rt = _run(store, "t1", ["big", "small"])
    rows = _rows(store, "t1")
    ref = blobs.row_ref(rows[0])
    assert ref is not None, rows[0]
    encoded = json.dumps(OUTPUTS["big"], separators=(",", ":")).encode()
    assert ref.size == len(encoded)
    assert json.loads(rows[1]) == {"text": "short"}  # small outputs stay in the row
    task = store.get_task("t1")
    assert task.steps[0].output == {"text": BIG}
    assert task.steps[0].output_blob == {"sha256": ref.sha256, "size": ref.size}
    assert task.steps[1].output_blob is None
    finished = [e for e in rt.export("t1") if e.kind == "step_finished"]
    assert finished[0].data == {"tool": "emit", "blob": ref._asdict()}
    assert finished[1].data == {"tool": "emit"}
    assert verify_store(store, ["t1"]).ok
    assert [r.ref for r in blobs.references(store)] == [ref]
    assert blobs.check(store) == []


def test_identical_outputs_are_stored_once(open_: Opener) -> None:  # noqa: F811
    store = open_()
    _run(store, "t1", ["big", "big"])
    _run(store, "t2", ["big"])
    refs = {blobs.row_ref(text) for rows in (_rows(store, "t1"), _rows(store, "t2"))
            for text in rows.values()}  # fmt: skip
    assert len(refs) == 1
    assert None not in refs
    assert [sha for sha, _, _ in store.blobs.stored()] == [next(iter(refs)).sha256]  # type: ignore[union-attr]


def test_outputs_that_look_like_references_read_back_as_returned(
    open_: Opener,  # noqa: F811
) -> None:
    store = open_()
    _run(store, "t1", ["ref_like", "raw_like", "big_ref_like"])
    rows = _rows(store, "t1")
    assert blobs.row_ref(rows[0]) is None  # escaped, never a reference
    assert json.loads(rows[0]) == {"$raw": OUTPUTS["ref_like"]}
    task = store.get_task("t1")
    assert [s.output for s in task.steps] == [
        OUTPUTS["ref_like"],
        OUTPUTS["raw_like"],
        OUTPUTS["big_ref_like"],
    ]
    assert task.steps[2].output_blob is not None  # large: a blob holding the escaped text
    assert verify_store(store, ["t1"]).ok
    # Only the real blob is referenced: nothing that merely looked like one.
    assert [(r.step, r.whole) for r in blobs.references(store)] == [(2, True)]
    assert blobs.check(store) == []


@pytest.mark.parametrize("how", ["missing", "corrupt", "flipped"])
def test_a_damaged_blob_is_an_error_naming_task_and_step(
    open_: Opener,  # noqa: F811
    how: str,
) -> None:
    store = open_()
    _run(store, "t1", ["small", "big"])
    _run(store, "t2", ["small"])
    ref = blobs.row_ref(_rows(store, "t1")[1])
    assert ref is not None
    _damage(store, ref.sha256, how)
    if how == "flipped":  # the same size: a check of the size alone passes it
        assert {sha: size for sha, size, _ in store.blobs.stored()}[ref.sha256] == ref.size
    with pytest.raises(BlobDamaged) as caught:
        store.get_task("t1")
    assert caught.value.task_id == "t1"
    assert caught.value.step == 1
    assert "task 't1' step 1" in str(caught.value)
    assert ref.sha256 in str(caught.value)
    assert store.get_task("t2").steps[0].output == {"text": "short"}  # others unaffected
    report = verify_store(store, None)
    assert [(v.task_id, v.check) for v in report.violations] == [("t1", "blob")]
    problems = blobs.check(store)
    assert len(problems) == 1, problems
    assert "task 't1' step 1" in problems[0], problems


@pytest.mark.parametrize("how", ["missing", "corrupt", "flipped"])
def test_a_writer_of_content_whose_stored_copy_is_damaged_stores_it_again(
    open_: Opener,  # noqa: F811
    how: str,
) -> None:
    """A blob is named by its content. A writer finding that name stored but
    damaged (its chunks gone, a byte changed) stores its own bytes over it, as a
    damaged blob file is replaced: its task reads back, and so does the older
    one. PostgreSQL kept the damaged chunks and referred to them: every new task
    with that output was damaged too, and no run could repair it."""
    store = open_()
    _run(store, "t1", ["big"])
    ref = blobs.row_ref(_rows(store, "t1")[0])
    assert ref is not None
    _damage(store, ref.sha256, how)
    _run(store, "t2", ["big"])
    assert blobs.row_ref(_rows(store, "t2")[0]) == ref
    assert store.get_task("t2").steps[0].output == OUTPUTS["big"]
    assert store.get_task("t1").steps[0].output == OUTPUTS["big"]
    assert blobs.check(store) == []


def test_a_damaged_blob_stops_a_run_before_it_writes(open_: Opener) -> None:  # noqa: F811
    store = open_()
    rt = Runtime(store, settings=Settings(blob_threshold=THRESHOLD), tools=_tools(OUTPUTS))
    rt.create("t1", {"goal": "g", "steps": [{"tool": "emit", "input": {"key": k}}
                                            for k in ("big", "small")]})  # fmt: skip
    run, _ = store.begin_run("t1", "r1")
    store.start_step(run, 0, "emit")
    ref = store.blobs.put([json.dumps(OUTPUTS["big"], separators=(",", ":")).encode()])
    store.finish_step(run, 0, "emit", json.dumps(ref.as_json()), last=False)
    store.end_run(run)
    before = len(store.events("t1"))
    _damage(store, ref.sha256, "missing")
    with pytest.raises(BlobDamaged):
        rt.run("t1")
    assert len(store.events("t1")) == before  # nothing journaled: never a wrong value used


def test_sweep_removes_only_old_unreferenced_blobs(open_: Opener) -> None:  # noqa: F811
    store = open_()
    _run(store, "t1", ["big"])
    kept = blobs.row_ref(_rows(store, "t1")[0])
    assert kept is not None
    orphan = store.blobs.put([b"nobody refers to this"])
    # Within the grace time an unreferenced blob stays (its reference may be
    # about to commit); past it, it goes; a referenced one always stays.
    assert blobs.sweep(store, grace=3600) == []
    assert blobs.sweep(store, grace=0, now=time.time() + 1) == [orphan.sha256]
    assert [sha for sha, _, _ in store.blobs.stored()] == [kept.sha256]
    assert store.get_task("t1").steps[0].output == {"text": BIG}
    assert blobs.check(store) == []


def test_a_writer_finding_its_content_stored_refreshes_it_against_a_sweep(
    open_: Opener,  # noqa: F811
) -> None:
    store = open_()
    data = [b"stored before; written again just now"]
    first = store.blobs.put(data)
    stored_at = {sha: when for sha, _, when in store.blobs.stored()}[first.sha256]
    time.sleep(0.05)
    again = store.blobs.put(data)  # deduplicated: the same blob, touched
    assert again == first
    assert len(store.blobs.stored()) == 1
    touched = {sha: when for sha, _, when in store.blobs.stored()}[first.sha256]
    assert touched > stored_at
    assert blobs.sweep(store, grace=0, now=touched) == []  # not older than the touch


def test_nested_references_are_kept_and_checked(open_: Opener, tmp_path: Path) -> None:  # noqa: F811
    store = open_()
    inner = store.blobs.put([b"a large text"])
    outputs = {"nested": {"text": inner.as_json(), "chars": 12}}
    rt = Runtime(store, settings=Settings(), tools=_tools(outputs))
    rt.create("t1", {"goal": "g", "steps": [{"tool": "emit", "input": {"key": "nested"}}]})
    rt.run("t1")
    assert store.get_task("t1").steps[0].output == outputs["nested"]  # not resolved
    found = blobs.references(store)
    assert [(r.ref, r.whole) for r in found] == [(inner, False)]
    assert blobs.sweep(store, grace=0, now=time.time() + 1) == []
    _damage(store, inner.sha256, "missing")
    assert len(blobs.check(store)) == 1


def test_blob_chunks_are_bounded_and_read_back_whole(open_: Opener) -> None:  # noqa: F811
    store = open_()
    data = os.urandom(blobs.CHUNK * 2 + 17)
    ref = store.blobs.put(iter([data[:100], data[100:]]))
    assert ref.size == len(data)
    pieces = list(store.blobs.chunks(ref))
    assert b"".join(pieces) == data
    assert max(len(p) for p in pieces) <= blobs.CHUNK


def test_control_without_the_escape_an_output_reads_as_a_reference(
    open_: Opener,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The escape is what keeps a tool's output from being taken for a reference:
    without it, the output that looks like one reads back as a missing blob."""
    from ninelives import journal

    monkeypatch.setattr(journal, "needs_escape", lambda output: False)
    store = open_()
    with pytest.raises(BlobDamaged):
        _run(store, "t1", ["ref_like"])


def test_a_sweep_deleting_a_blob_and_a_writer_finding_it_are_ordered(
    open_: Opener,  # noqa: F811
) -> None:
    """A sweep deletes a blob while another runner stores the same content: the
    writer waits for the sweep and then stores the blob afresh, so the reference
    it commits next never names a blob the sweep removed."""
    import threading

    sweeper, writer = open_(), open_()
    data = [b"the same content, twice"]
    ref = sweeper.blobs.put(data)
    stored: list[blobs.BlobRef] = []
    thread = threading.Thread(target=lambda: stored.append(writer.blobs.put(data)))
    if is_postgres_url(sweeper.url):
        import psycopg

        with psycopg.connect(sweeper.url) as conn:  # one transaction, like blob_delete's
            conn.execute("DELETE FROM blobs WHERE sha256 = %s", (ref.sha256,))
            conn.execute("DELETE FROM blob_chunks WHERE sha256 = %s", (ref.sha256,))
            thread.start()
            time.sleep(0.5)
            assert thread.is_alive()  # waiting on the row the sweep deletes
    else:
        folder_blobs = sweeper.blobs
        assert isinstance(folder_blobs, blobs.FolderBlobs)
        with folder_blobs._locked(exclusive=True):
            os.unlink(os.path.join(folder_blobs.folder, ref.sha256))
            thread.start()
            time.sleep(0.5)
            assert thread.is_alive()  # waiting for the sweep's lock
    thread.join(timeout=30)
    assert stored == [ref]
    assert writer.blobs.read(ref) == data[0]


def _age(store: Store, sha256: str, seconds: float) -> None:
    """Make a stored blob look last written ``seconds`` ago, around the store."""
    if is_postgres_url(store.url):
        import psycopg

        with psycopg.connect(store.url, autocommit=True) as conn:
            conn.execute(
                "UPDATE blobs SET created_at = created_at - %s WHERE sha256 = %s",
                (seconds, sha256),
            )
        return
    path = os.path.join(store.url + ".blobs", sha256)
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_gc_removes_an_old_unreferenced_blob_and_keeps_the_rest(open_: Opener) -> None:  # noqa: F811
    """gc's blob sweep: a 3-hour-old blob nobody refers to goes (a dry run only
    names it); a fresh one stays (its reference may be about to commit); a
    referenced one stays however old."""
    store = open_()
    _run(store, "t1", ["big"])
    kept = blobs.row_ref(_rows(store, "t1")[0])
    assert kept is not None
    old = store.blobs.put([b"nobody refers to this"])
    fresh = store.blobs.put([b"nor to this, yet"])
    _age(store, old.sha256, 3 * 3600)
    _age(store, kept.sha256, 3 * 3600)
    dry = gc(store, older_than=30 * 86400, dry_run=True)
    assert dry.blobs == [old.sha256]
    assert len(store.blobs.stored()) == 3
    report = gc(store, older_than=30 * 86400)
    assert report.blobs == [old.sha256]
    assert sorted(sha for sha, _, _ in store.blobs.stored()) == sorted([kept.sha256, fresh.sha256])
    assert store.get_task("t1").steps[0].output == {"text": BIG}


@pytest.mark.parametrize("how", ["missing", "corrupt", "flipped"])
def test_doctor_reports_damaged_and_orphaned_blobs_and_fixes_only_orphans(
    open_: Opener,  # noqa: F811
    how: str,
    tmp_path: Path,
) -> None:
    store = open_()
    _run(store, "t1", ["small", "big"])
    assert doctor(store, artifacts=str(tmp_path)) == ([], [])  # a sound store: no finding
    ref = blobs.row_ref(_rows(store, "t1")[1])
    assert ref is not None
    orphan = store.blobs.put([b"left by a crash"])
    _age(store, orphan.sha256, 3 * 3600)
    _damage(store, ref.sha256, how)
    found, _ = doctor(store, artifacts=str(tmp_path))
    assert sorted((f.kind, f.subject) for f in found) == [
        ("blob", "t1 step 1"),
        ("blob_orphan", orphan.sha256),
    ]
    damaged = next(f for f in found if f.kind == "blob")
    assert ref.sha256[:12] in damaged.detail
    assert not damaged.fixable  # only a backup restores it
    left, fixed = doctor(store, artifacts=str(tmp_path), fix=True)
    assert [f.kind for f in fixed] == ["blob_orphan"]
    assert [(f.kind, f.subject) for f in left] == [("blob", "t1 step 1")]
    assert orphan.sha256 not in {sha for sha, _, _ in store.blobs.stored()}
