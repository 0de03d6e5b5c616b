"""Large outputs through the command line, on SQLite and PostgreSQL: a real SIGKILL
in the middle of a blob's publish, then a resume; ``status --outputs`` shows the
content and ``export`` the reference; a missing blob is exit 5, one line; a
large ``fetch`` streams into the blob store with bounded memory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ninelives.testing import Lab
from ninelives.testing.lab import GUIDE_PLAN
from unprivileged import UserLab

pytestmark = pytest.mark.crash

TASK = "t"
LINE = ("0123456789" * 10 + "\n").encode()


def _big_file(lab: Lab, size: int, name: str = "input/notes.txt") -> Path:
    path = lab.root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    block = LINE * 10_000
    with open(path, "wb") as fh:
        written = 0
        while written < size:
            fh.write(block)
            written += len(block)
    return path


def _blob_folder(lab: Lab) -> Path | None:
    db = lab.sqlite_path
    return None if db is None else Path(str(db) + ".blobs")


def _writing(lab: Lab, conn: object) -> bool:
    """True while a run is inside a blob's publish (not yet durable)."""
    folder = _blob_folder(lab)
    if folder is not None:
        return folder.is_dir() and any(
            n.startswith(f".{TASK}-0.") and (folder / n).stat().st_size > 0
            for n in os.listdir(folder)
        )
    row = conn.execute(  # type: ignore[attr-defined]
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%%INSERT INTO blob_chunks%%' "
        "AND pid <> pg_backend_pid()"
    ).fetchone()
    return bool(row and row[0])


def _stored_blobs(lab: Lab) -> list[str]:
    folder = _blob_folder(lab)
    if folder is not None:
        return sorted(os.listdir(folder)) if folder.is_dir() else []
    import psycopg

    with psycopg.connect(lab.db, autocommit=True) as conn:
        blobs = [str(r[0]) for r in conn.execute("SELECT sha256 FROM blobs")]
        chunks = conn.execute("SELECT count(DISTINCT sha256) FROM blob_chunks").fetchone()
    assert chunks is not None
    assert chunks[0] == len(blobs)  # no chunk without its blob row (none of a killed writer)
    return sorted(blobs)


@pytest.mark.slow
def test_a_kill_in_the_middle_of_a_blob_publish_then_resume(lab: Lab) -> None:
    lab.write_plan(GUIDE_PLAN)
    source = _big_file(lab, 96 << 20)  # over fetch's in-memory limit: streamed to a blob
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    conn = None
    if lab.sqlite_path is None:
        import psycopg

        conn = psycopg.connect(lab.db, autocommit=True)
    try:
        proc = lab.spawn("run", TASK)
        deadline = time.monotonic() + 60
        while not _writing(lab, conn):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the blob publish was never seen in progress"
            time.sleep(0.002)
        assert lab.kill(proc) == -9
    finally:
        if conn is not None:
            conn.close()
    assert [n for n in _stored_blobs(lab) if not n.startswith(".")] == []  # nothing published
    killed = lab.snapshot(TASK)
    assert killed.steps_with("running") == {0}

    resumed = lab.cli("run", TASK)
    assert resumed.returncode == 0, resumed
    after = lab.snapshot(TASK)
    fetched = after.outputs[0]
    assert fetched["bytes"] == source.stat().st_size
    assert fetched["text"] == {"$blob": {"sha256": fetched["sha256"], "size": fetched["bytes"]}}
    assert _stored_blobs(lab) == [fetched["sha256"]]  # the killed run's temporary file is gone
    assert after.outputs[1]["summary"] == "\n".join([LINE.decode().strip()] * 3)
    assert lab.cli("verify", TASK, "--artifacts", "artifacts").returncode == 0
    recovered = [e for e in after.events if e["kind"] == "step_recovered"]
    assert [e["step"] for e in recovered] == [0]


def _blob_temps(lab: Lab) -> list[Path]:
    folder = _blob_folder(lab)
    assert folder is not None
    return sorted(p for p in folder.iterdir() if p.name.startswith(".")) if folder.is_dir() else []


def _streaming(lab: Lab) -> subprocess.Popen[str]:
    """A run of the guide's plan over a 96 MiB file, caught streaming it into the
    blob store, and left stopped (SIGSTOP) there. Each look is taken while the run
    is stopped: a run looked at while running could finish its temporary file
    between the look and the caller's next step (seen on a quiet machine)."""
    lab.write_plan(GUIDE_PLAN)
    _big_file(lab, 96 << 20)
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    proc = lab.spawn("run", TASK)
    deadline = time.monotonic() + 60
    while True:
        os.kill(proc.pid, signal.SIGSTOP)
        os.waitpid(proc.pid, os.WUNTRACED)  # returns once it has really stopped
        if _writing(lab, None):
            return proc
        os.kill(proc.pid, signal.SIGCONT)
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the blob publish was never seen in progress"
        time.sleep(0.002)


@pytest.mark.parametrize("cleaner", [("gc", "--older-than", "30d"), ("doctor", "--fix")])
def test_gc_and_doctor_remove_the_temporary_file_of_a_run_killed_mid_stream(
    sqlite_lab: Lab, cleaner: tuple[str, ...]
) -> None:
    """A real SIGKILL while a large fetch streams into the blob store leaves its
    temporary file; doctor names it at once (its writer's lock is free), and gc
    or doctor --fix removes it, without waiting for the task to be run again."""
    lab = sqlite_lab
    assert lab.kill(_streaming(lab)) == -9
    [temp] = _blob_temps(lab)
    assert temp.stat().st_size > 0
    found = lab.cli("doctor", "--json")
    assert found.returncode == 7, found
    [finding] = [f for f in found.json()["findings"] if f["kind"] == "blob_temp"]
    assert finding["subject"] == str(temp)
    assert "ninelives doctor --fix" in finding["fix"]
    cleaned = lab.cli(*cleaner)
    # doctor --fix still names the killed task, which only a run resumes.
    assert cleaned.returncode == (7 if cleaner[0] == "doctor" else 0), cleaned
    assert temp.name in cleaned.stdout, cleaned.stdout
    assert _blob_temps(lab) == []
    assert lab.cli("run", TASK).returncode == 0  # the task itself was left alone
    assert lab.cli("verify", TASK).returncode == 0
    assert lab.cli("doctor").returncode == 0


def test_control_a_live_writers_temporary_file_is_never_removed(sqlite_lab: Lab) -> None:
    """The same moment with the writer alive (stopped, its file made to look
    hours old): doctor does not name it, and neither doctor --fix nor gc removes
    it; the run then finishes as if nothing happened."""
    lab = sqlite_lab
    proc = _streaming(lab)  # stopped
    try:
        [temp] = _blob_temps(lab)
        size = temp.stat().st_size
        hours_ago = time.time() - 3 * 3600
        os.utime(temp, (hours_ago, hours_ago))
        found = lab.cli("doctor", "--json")
        assert found.returncode == 0, found  # a live run, a sound database
        for command in (("doctor", "--fix"), ("gc", "--older-than", "0s")):
            assert lab.cli(*command).returncode == 0
        assert _blob_temps(lab) == [temp]
        assert temp.stat().st_size == size
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    proc.communicate(timeout=300)
    assert proc.returncode == 0
    assert _blob_temps(lab) == []
    assert lab.cli("verify", TASK, "--artifacts", "artifacts").returncode == 0


def finished_blob(lab: Lab, step: int) -> object:
    """The ``blob`` of step ``step``'s ``step_finished``, as ``export`` shows it."""
    events = lab.cli("export", TASK).jsonl()
    return next(e["blob"] for e in events if e["kind"] == "step_finished" and e["step"] == step)


def test_status_shows_the_content_and_export_the_reference(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    ran = lab.cli("run", TASK, NINELIVES_BLOB_THRESHOLD="0")  # every output a blob
    assert ran.returncode == 0, ran
    status = lab.cli("status", TASK, "--outputs", "--json").json()
    assert status["steps"][1]["output"]["summary"] == "Line one\nLine two\nLine three"
    assert status["steps"][1]["output_blob"] == finished_blob(lab, 1)
    finished = [e for e in lab.cli("export", TASK).jsonl() if e["kind"] == "step_finished"]
    assert [set(e["blob"]) for e in finished] == [{"sha256", "size"}] * 3
    assert "summary" not in json.dumps(finished)  # the journal holds references only
    assert len(_stored_blobs(lab)) == 3
    assert lab.cli("verify", TASK).returncode == 0


def test_a_missing_blob_is_exit_5_naming_task_and_step_and_changes_nothing(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    killed = lab.cli("run", TASK, AGENT_CRASH_AT="after_commit:1", NINELIVES_BLOB_THRESHOLD="0")
    assert killed.returncode == -9
    summary_blob = lab.snapshot(TASK).events[-1]  # step 1's step_finished, just committed
    assert summary_blob["kind"] == "step_finished"
    sha256 = summary_blob["blob"]["sha256"]
    folder = _blob_folder(lab)
    if folder is not None:
        (folder / sha256).unlink()
    else:
        import psycopg

        with psycopg.connect(lab.db, autocommit=True) as conn:
            conn.execute("DELETE FROM blob_chunks WHERE sha256 = %s", (sha256,))
    if lab.sqlite_path is not None:
        # The killed run left its WAL: fold it in now, as any clean close does,
        # so that the comparison below sees changes, not a checkpoint.
        import sqlite3

        conn = sqlite3.connect(lab.sqlite_path)
        conn.execute("SELECT count(*) FROM tasks").fetchone()
        conn.close()
    before = lab.fingerprint(TASK)
    for command in (("status", TASK, "--outputs"), ("run", TASK)):
        result = lab.cli(*command)
        assert result.returncode == 5, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert "task 't' step 1" in lines[0]
        assert sha256 in lines[0]
        assert "Traceback" not in result.stderr
    assert lab.cli("export", TASK).returncode == 0  # the journal shows the reference still
    assert lab.fingerprint(TASK) == before


_MEASURE = """
import resource, subprocess, sys
code = subprocess.run(sys.argv[1:], capture_output=True).returncode
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def _peak_rss(lab: Lab, *args: str) -> tuple[int, int]:
    """Exit code and peak RSS (KiB) of one command, measured by a fresh parent."""
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, *lab.argv(args)],
        cwd=lab.root, env=lab.env(), capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    return int(out[0]), int(out[1])


def test_a_large_fetch_streams_with_bounded_memory(lab: Lab) -> None:
    lab.write_plan({"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "big.txt"}}]})
    size = 96 << 20
    _big_file(lab, size, "big.txt")
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    code, peak = _peak_rss(lab, "run", TASK)
    assert code == 0
    # Held in memory, the text alone would be 96 MiB (its JSON as much again).
    assert peak < 64 * 1024, f"peak RSS {peak} KiB"
    if lab.sqlite_path is not None:
        assert lab.sqlite_path.stat().st_size < 1 << 20  # the database stays small
    status_code, status_peak = _peak_rss(lab, "status", TASK, "--outputs")
    assert status_code == 0
    assert status_peak < 64 * 1024


def test_control_an_in_memory_fetch_shows_in_the_measure(sqlite_lab: Lab) -> None:
    """The measure sees memory: 24 MiB fetched the old way (under the in-memory
    limit, text in the output) peaks far higher than 96 MiB streamed."""
    lab = sqlite_lab
    lab.write_plan({"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "mid.txt"}}]})
    _big_file(lab, 24 << 20, "mid.txt")
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    code, peak = _peak_rss(lab, "run", TASK)
    assert code == 0
    assert peak > 64 * 1024, f"peak RSS {peak} KiB"


def test_a_bad_threshold_is_bad_input_and_changes_nothing(lab: Lab) -> None:
    lab.guide_setup()
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    before = lab.fingerprint(TASK)
    for value in ("-1", "64k", "nan"):
        result = lab.cli("run", TASK, NINELIVES_BLOB_THRESHOLD=value)
        assert result.returncode == 4, result
        assert result.stderr.startswith("ninelives: error: NINELIVES_BLOB_THRESHOLD"), result
        assert len(result.stderr.strip().splitlines()) == 1
    assert lab.fingerprint(TASK) == before
    assert lab.cli("run", TASK, NINELIVES_BLOB_THRESHOLD="65536").returncode == 0  # control


def _refused_before_the_claim(lab: Lab, words: str) -> None:
    """Seven runs with blobs on, each refused in one line (exit 5) naming ``words``,
    the task left as it was. Refused before the claim, as a missing tool is: no
    attempt, no recovery, no event, so refusals past NINELIVES_MAX_RECOVERIES never
    fail the task, and no step's effect runs for an output that could not be kept."""
    before = lab.fingerprint(TASK)
    for _ in range(7):
        result = lab.cli("run", TASK, NINELIVES_BLOB_THRESHOLD="0")
        assert result.returncode == 5, result
        assert words in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert lab.fingerprint(TASK) == before


def test_a_blob_folder_that_is_a_symlink_is_refused(sqlite_lab: Lab, tmp_path: Path) -> None:
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert lab.sqlite_path is not None
    Path(str(lab.sqlite_path) + ".blobs").symlink_to(elsewhere)
    _refused_before_the_claim(lab, "is a symlink")
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    Path(str(lab.sqlite_path) + ".blobs").unlink()
    assert lab.cli("run", TASK, NINELIVES_BLOB_THRESHOLD="0").returncode == 0  # control


@pytest.mark.parametrize("kind", ["file", "fifo", "read-only folder"])
def test_a_blob_folder_no_blob_can_be_written_in_is_refused_before_the_claim(
    tmp_path: Path, kind: str
) -> None:
    # Found when the blob was stored, after the step's tool ran: the step stayed
    # running, and every run counted a recovery and ran the effect again.
    lab = UserLab(tmp_path / "lab")  # a mode binds it even when the tests run as root
    lab.guide_setup()
    assert lab.cli("create", TASK, "plan.json").returncode == 0
    assert lab.sqlite_path is not None
    folder = Path(str(lab.sqlite_path) + ".blobs")
    if kind == "file":
        folder.write_text("")
    elif kind == "fifo":
        os.mkfifo(folder)
    else:
        folder.mkdir(mode=0o500)
    _refused_before_the_claim(lab, "refusing to store there")
    assert not (lab.root / "artifacts").exists()  # the effect never ran
    if kind == "read-only folder":
        folder.chmod(0o700)
    else:
        folder.unlink(missing_ok=True)
    assert lab.cli("run", TASK, NINELIVES_BLOB_THRESHOLD="0").returncode == 0  # control


def test_a_worker_leaves_a_task_whose_blob_folder_is_a_symlink(
    sqlite_lab: Lab, tmp_path: Path
) -> None:
    # A worker refused after the tool ran, recovered the step and ran it again, six
    # times in one process, then failed the task at the recovery limit.
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("submit", TASK, "plan.json").returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert lab.sqlite_path is not None
    Path(str(lab.sqlite_path) + ".blobs").symlink_to(elsewhere)

    def stored() -> tuple[str, str]:  # a worker may write its own rows: the task's
        return lab.cli("status", TASK, "--outputs").stdout, lab.cli("export", TASK).stdout

    before = stored()
    drain = lab.cli("worker", "--drain", "--poll", "0.05", NINELIVES_BLOB_THRESHOLD="0")
    assert drain.returncode == 11, drain
    assert "Traceback" not in drain.stderr
    last = drain.stderr.splitlines()[-1]
    assert "drained except 1 task(s)" in last, last
    assert "is a symlink" in last, last
    assert stored() == before
    assert list(elsewhere.iterdir()) == []
    Path(str(lab.sqlite_path) + ".blobs").unlink()
    control = lab.cli("worker", "--drain", "--poll", "0.05", NINELIVES_BLOB_THRESHOLD="0")
    assert control.returncode == 0, control
    assert lab.cli("status", TASK, "--json").json()["status"] == "done"


@pytest.mark.slow
def test_torture_with_every_output_a_blob(sqlite_lab: Lab) -> None:
    """Random outside SIGKILLs (torture pauses at every crash point, the blob's
    included) of runs that store every output as a blob: each task verified."""
    lab = sqlite_lab
    lab.guide_setup()
    result = lab.cli(
        "torture", "plan.json", "--kills", "12", "--seed", "5", "-q", "--dir", "scratch",
        NINELIVES_BLOB_THRESHOLD="0", timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result
    assert "duplicates 0  lost commits 0  violations 0" in result.stdout, result.stdout
    blobs = [p for p in (lab.root / "scratch").glob("*.blobs/*") if not p.name.startswith(".")]
    assert len(blobs) >= 3  # the outputs did go out of the row
