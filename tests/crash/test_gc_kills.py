"""``ninelives gc`` SIGKILLed for real while it deletes, on SQLite and PostgreSQL:
every task is whole or gone (no step or event of a deleted task, no lock file
of one; its id recorded as removed exactly when it is gone), what it printed as
removed is gone, unfinished tasks are untouched, and ``verify --all`` and
``doctor`` are clean after every kill."""

from __future__ import annotations

import random
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import ninelives
from ninelives.settings import Settings
from ninelives.store import open_store
from ninelives.testing import Lab
from ninelives.testing.lab import GUIDE_PLAN

pytestmark = pytest.mark.crash

FINISHED = 60
BATCH = "6"


def _url(lab: Lab) -> str:
    return lab.db if lab.sqlite_path is None else str(lab.sqlite_path)


def _history(lab: Lab) -> None:
    """FINISHED done tasks (through the library, for speed) and one pending task."""
    lab.guide_setup()
    settings = Settings(artifacts=str(lab.root / "artifacts"), workspace=str(lab.root))
    with ninelives.open(_url(lab), settings=settings) as rt:
        for i in range(FINISHED):
            rt.create(f"done-{i:03d}", GUIDE_PLAN)
            rt.run(f"done-{i:03d}")
        rt.create("waiting", GUIDE_PLAN)
    if lab.sqlite_path is not None:
        # A lock file per task, as an earlier build leaves them (or macOS makes
        # them): gc must take each and remove it with its task.
        from ninelives.locking import lock_path

        for task_id in [f"done-{i:03d}" for i in range(FINISHED)] + ["waiting"]:
            Path(lock_path(str(lab.sqlite_path), task_id)).touch(0o600)


def _state(lab: Lab) -> dict[str, Any]:
    store: Any = open_store(_url(lab), readonly=True)
    try:
        ids = store.task_ids()
        return {
            "ids": set(ids),
            "dangling": store.dangling_rows(),
            "journals": {t: len(store.events(t)) for t in ids},
            "waiting": (store.get_task("waiting"), store.events("waiting")),
        }
    finally:
        store.close()


def _recorded(lab: Lab) -> set[str]:
    """The ids in ``removed_tasks`` (never to be used again), read around the store."""
    if lab.sqlite_path is not None:
        import sqlite3

        conn = sqlite3.connect(lab.sqlite_path)
        try:
            return {str(r[0]) for r in conn.execute("SELECT id FROM removed_tasks")}
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(lab.db, autocommit=True) as pg:
        return {str(r[0]) for r in pg.execute("SELECT id FROM removed_tasks")}


def _check(lab: Lab, before: dict[str, Any], printed: set[str]) -> dict[str, Any]:
    now = _state(lab)
    # Each task gone is recorded as removed in its deleting transaction; none left is.
    assert _recorded(lab) == before["ids"] - now["ids"]
    assert now["dangling"] == {}, now["dangling"]
    assert now["waiting"] == before["waiting"]  # the unfinished task is untouched
    assert not printed & now["ids"], "gc printed a task as removed that is still there"
    for task_id in now["ids"]:  # every task left is whole: its journal was not cut
        assert now["journals"][task_id] == before["journals"][task_id], task_id
    verified = lab.cli("verify", "--all")
    assert verified.returncode == 0, verified
    doctor = lab.cli("doctor")
    assert doctor.returncode == 0, doctor
    if lab.sqlite_path is not None:
        from ninelives.locking import TASK_LOCK_NAME, lock_folder, lock_path

        folder = Path(lock_folder(str(lab.sqlite_path)))
        known = {Path(lock_path(str(lab.sqlite_path), t)).name for t in now["ids"]}
        names = {p.name for p in folder.iterdir()} if folder.exists() else set()
        files = {n for n in names if re.fullmatch(TASK_LOCK_NAME, n)}  # not tasks.lock
        assert files <= known, "a lock file of a deleted task was left"
    return now


def _kill(proc: subprocess.Popen[str]) -> str:
    """SIGKILL ``proc`` (it must still be running) and return the rest of its stdout."""
    assert proc.poll() is None, "gc finished before the kill"
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return out


def _removed(stdout: str) -> set[str]:
    return {line.split()[1] for line in stdout.splitlines() if line.startswith("removed ")}


@pytest.mark.slow
def test_gc_killed_mid_batch_and_at_random_leaves_every_task_whole_or_gone(lab: Lab) -> None:
    _history(lab)
    before = _state(lab)
    assert len(before["ids"]) == FINISHED + 1
    # The pause sits inside each batch's transaction, after its deletes: a kill
    # there is a kill with a batch half-done.
    pause = {"NINELIVES_CRASH_PAUSE": "0.3"}
    rng = random.Random(11)
    counts = []

    # 1: killed inside the second batch, once the first one reported itself.
    proc = lab.spawn("gc", "--older-than", "0s", "--batch", BATCH, **pause)
    assert proc.stdout is not None
    first = [proc.stdout.readline() for _ in range(int(BATCH))]
    time.sleep(0.1)
    out = _kill(proc)
    printed = _removed("".join(first) + out)
    assert len(printed) == int(BATCH), printed  # the second batch was rolled back whole
    counts.append(len(_check(lab, before, printed)["ids"]))

    # 2-4: killed at random moments.
    for _ in range(3):
        proc = lab.spawn("gc", "--older-than", "0s", "--batch", BATCH, **pause)
        time.sleep(rng.uniform(0.2, 1.2))
        printed |= _removed(_kill(proc))
        counts.append(len(_check(lab, before, printed)["ids"]))

    # Then to the end.
    done = lab.cli("gc", "--older-than", "0s", "--batch", BATCH)
    assert done.returncode == 0, done
    final = _check(lab, before, printed | _removed(done.stdout))
    assert final["ids"] == {"waiting"}
    assert counts == sorted(counts, reverse=True)
    assert FINISHED + 1 > counts[0] > 1, counts  # the kills landed part-way through


def test_the_checks_see_a_dangling_journal(lab: Lab) -> None:
    """Negative control: a task deleted without its journal (what a gc that did
    not delete in one transaction could leave) is caught by the same checks."""
    _history(lab)
    before = _state(lab)
    if lab.sqlite_path is not None:
        import sqlite3

        conn = sqlite3.connect(lab.sqlite_path)
        conn.execute("DELETE FROM steps WHERE task_id = 'done-000'")
        conn.execute("DELETE FROM tasks WHERE id = 'done-000'")
        conn.execute("INSERT INTO removed_tasks VALUES ('done-000', 1.0)")
        conn.commit()
        conn.close()
    else:
        import psycopg

        with psycopg.connect(lab.db, autocommit=True) as conn:
            conn.execute("DELETE FROM steps WHERE task_id = 'done-000'")
            conn.execute("DELETE FROM tasks WHERE id = 'done-000'")
            conn.execute("INSERT INTO removed_tasks VALUES ('done-000', 1.0)")
    with pytest.raises(AssertionError, match="events"):
        _check(lab, before, set())
    doctor = lab.cli("doctor")
    assert doctor.returncode == 7
    assert "dangling" in doctor.stdout
    assert "ninelives doctor --fix" in doctor.stdout
    fixed = lab.cli("doctor", "--fix")
    assert fixed.returncode == 0, fixed
    _check(lab, before, set())
