"""Paths and names a new user's shell can hand the command, met where they
reach the database: each is one line on stderr, a documented exit code, no
traceback, and the stored state exactly as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from errorlines import one_line
from ninelives.testing import Lab, Result

#: A folder named in Latin-1 on a UTF-8 system: ``café`` as the bytes
#: ``caf\xe9``, which Python hands over as a lone surrogate.
LATIN1 = os.fsdecode(b"caf\xe9")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def seeded(sqlite_lab: Lab) -> Lab:
    """Task ``keep`` done and task ``todo`` pending, in ``state.db``."""
    sqlite_lab.guide_setup()
    assert sqlite_lab.cli("create", "keep", "plan.json").returncode == 0
    assert sqlite_lab.cli("run", "keep", "-q").returncode == 0
    assert sqlite_lab.cli("create", "todo", "plan.json").returncode == 0
    return sqlite_lab


def test_an_artifacts_folder_not_named_in_utf8_is_exit_4(seeded: Lab) -> None:
    # The folder is stored as text with the task; its name cannot be encoded
    # as UTF-8, so create, submit and a run adopting it raised UnicodeEncodeError
    # from the driver: a traceback and exit 1, the code of "unknown task".
    folder = str(seeded.root / LATIN1)
    before = digest(seeded.root / "state.db")
    for args in (
        ("create", "new", "plan.json"),
        ("submit", "new", "plan.json"),
        ("run", "todo"),
    ):
        one_line(seeded.cli(*args, AGENT_ARTIFACTS=folder), 4, "AGENT_ARTIFACTS", "UTF-8")
        assert digest(seeded.root / "state.db") == before, args
    assert not os.path.exists(folder)
    # Control: the same folder named in UTF-8 is taken.
    assert seeded.cli("create", "new", "plan.json", AGENT_ARTIFACTS="café").returncode == 0


@pytest.mark.parametrize("kind", ["symlink to /dev/null", "folder"])
def test_a_shared_lock_file_that_is_not_a_file_is_named_by_run_and_doctor(
    seeded: Lab, kind: str
) -> None:
    # tasks.lock holds every task's lock. A symlink there (even to /dev/null)
    # or a folder made every run fail with "cannot lock task 'todo': Too many
    # levels of symbolic links" (or "Is a directory"), which named no file,
    # while doctor said "no findings" and exited 0.
    locks = seeded.root / "state.db.locks"
    locks.mkdir(mode=0o700, exist_ok=True)
    lock = locks / "tasks.lock"
    lock.unlink(missing_ok=True)
    if kind == "folder":
        lock.mkdir()
    else:
        lock.symlink_to("/dev/null")
    null = os.stat("/dev/null")
    before = digest(seeded.root / "state.db")
    one_line(seeded.cli("run", "todo"), 5, str(lock), "remove it")
    doctor = seeded.cli("doctor")
    assert doctor.returncode == 7, doctor
    assert f"lock: {lock}: a symlink or a folder" in doctor.stdout, doctor.stdout
    assert seeded.cli("doctor", "--fix").returncode == 7  # a person removes it, not doctor
    assert lock.is_symlink() or lock.is_dir()
    assert digest(seeded.root / "state.db") == before
    after = os.stat("/dev/null")
    assert (after.st_mode, after.st_rdev, after.st_ino) == (null.st_mode, null.st_rdev, null.st_ino)
    # Control: removed, it is made again and the run goes on.
    if kind == "folder":
        lock.rmdir()
    else:
        lock.unlink()
    assert seeded.cli("run", "todo", "-q").returncode == 0
    assert seeded.cli("doctor").returncode == 0


def test_a_blob_lock_that_is_a_symlink_is_refused_before_the_claim(seeded: Lab) -> None:
    # With NINELIVES_BLOB_THRESHOLD set, a blobs.lock symlink was found only
    # when the first output was stored, after the step's tool ran: the step
    # was left running, every run again recovered it and ran its effect again,
    # and the sixth failed the task, no process ever killed.
    locks = seeded.root / "state.db.locks"
    locks.mkdir(mode=0o700, exist_ok=True)
    lock = locks / "blobs.lock"
    lock.unlink(missing_ok=True)
    lock.symlink_to("/dev/null")
    before = digest(seeded.root / "state.db")
    for _ in range(2):
        one_line(seeded.cli("run", "todo", NINELIVES_BLOB_THRESHOLD="0"), 5, str(lock))
    assert digest(seeded.root / "state.db") == before
    assert lock.is_symlink()
    # Control: without it the same run stores its outputs as blobs.
    lock.unlink()
    assert seeded.cli("run", "todo", "-q", NINELIVES_BLOB_THRESHOLD="0").returncode == 0


def test_a_database_folder_that_is_a_file_is_named_as_one(seeded: Lab) -> None:
    # `--db state.db/x.db`: it said "database folder does not exist: state.db",
    # of a file that ls shows there.
    before = digest(seeded.root / "state.db")
    for args in (("create", "new", "plan.json"), ("submit", "new", "plan.json")):
        one_line(seeded.cli("--db", "state.db/x.db", *args), 5, "is a file, not a folder")
    one_line(seeded.cli("--db", "none/x.db", "create", "new", "plan.json"), 5, "does not exist")
    assert digest(seeded.root / "state.db") == before


def test_an_abbreviated_global_option_takes_its_value_as_argparse_does(sqlite_lab: Lab) -> None:
    # argparse takes `--d` for `--db` and `--to` for `--tools`; the command
    # line declared only the sub-parser of the first word that names a command,
    # and that was the option's value: `--d status run t` (a database file named
    # "status") said "invalid choice: 'run' (choose from 'status')".
    lab = sqlite_lab
    lab.guide_setup()

    def cli(*args: str) -> Result:
        proc = subprocess.run(
            [*lab.command, *args], cwd=lab.root, env=lab.env(), capture_output=True,
            text=True, timeout=120, check=False,
        )  # fmt: skip
        return Result(args=args, returncode=proc.returncode, stdout=proc.stdout,
                      stderr=proc.stderr)  # fmt: skip

    assert cli("--d", "status", "create", "t", "plan.json").returncode == 0
    assert (lab.root / "status").is_file()
    done = cli("--d", "status", "run", "t", "-q")
    assert done.returncode == 0, done
    one_line(
        cli("--to", "ls", "--d", "status", "run", "t"), 4, "cannot load tools from module 'ls'"
    )
    listed = cli("--d", "status", "ls", "--json")
    assert listed.returncode == 0, listed
    assert [row["task"] for row in listed.jsonl()] == ["t"]


@pytest.mark.parametrize(
    "env",
    [
        {"NINELIVES_LLM": "bogus"},
        {"NINELIVES_LLM": "openai"},  # no model named
        {"NINELIVES_LLM": "ollama", "NINELIVES_LLM_URL": "ftp://127.0.0.1"},
    ],
)
def test_a_model_engine_misconfigured_here_is_refused_before_the_claim(
    sqlite_lab: Lab, env: dict[str, str]
) -> None:
    # As a tool missing on this host is: each attempt was a step_error (the
    # config is read when the step runs), so a typo in a variable failed the
    # task (exit 2, 'ninelives retry' needed), as if the model had failed it.
    lab = sqlite_lab
    lab.write_plan({"goal": "g", "steps": [{"tool": "llm", "input": {"prompt": "hi"}}]})
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("submit", "q", "plan.json").returncode == 0
    before = digest(lab.root / "state.db")
    one_line(lab.cli("run", "t", NINELIVES_BACKOFF="0", **env), 4, "step 0", "nothing written")
    drained = lab.cli("worker", "--drain", "-q", NINELIVES_BACKOFF="0", **env)
    assert drained.returncode == 11, drained
    assert digest(lab.root / "state.db") == before
    # Control: configured (the stub engine by default), the same task runs.
    assert lab.cli("run", "t", "-q").returncode == 0


def test_an_empty_or_dash_plan_file_says_what_to_give(sqlite_lab: Lab) -> None:
    # `create t "$PLAN"` with PLAN unset said "plan file not found: ", naming
    # nothing; `create t -` said "plan file not found: -", with no word of how
    # a plan on standard input is given.
    lab = sqlite_lab
    lab.guide_setup()
    files = lab.files()
    one_line(lab.cli("create", "t", ""), 4, "PLAN_FILE is empty")
    one_line(lab.cli("create", "t", "-"), 4, "/dev/stdin")
    assert lab.files() == files  # no database made


def test_a_fork_copying_a_missing_blob_names_its_source(seeded: Lab) -> None:
    # The fork copies step 0's blob reference and reads its own new row back;
    # the blob it lacks was named as "task 'copy' step 0 ... cannot be run or
    # shown", of a task the rolled-back fork never stored ("unknown task").
    assert seeded.cli("create", "big", "plan.json").returncode == 0
    assert seeded.cli("run", "big", "-q", NINELIVES_BLOB_THRESHOLD="0").returncode == 0
    conn = sqlite3.connect(seeded.root / "state.db")
    try:
        row = conn.execute("SELECT output FROM steps WHERE task_id = 'big' AND idx = 0").fetchone()
    finally:
        conn.close()
    blob = seeded.root / "state.db.blobs" / json.loads(row[0])["$blob"]["sha256"]
    blob.rename(seeded.root / "kept-blob")
    before = digest(seeded.root / "state.db")
    one_line(seeded.cli("fork", "big", "copy", "--from", "1"), 5, "task 'big' step 0", "blob")
    assert digest(seeded.root / "state.db") == before
    assert seeded.cli("status", "copy").returncode == 1
    (seeded.root / "kept-blob").rename(blob)  # restored, the same fork goes through
    assert seeded.cli("fork", "big", "copy", "--from", "1").returncode == 0


def _edit_inputs(lab: Lab, task_id: str) -> None:
    conn = sqlite3.connect(lab.root / "state.db")
    try:
        conn.execute('UPDATE steps SET input = \'{"path": "x"}\' WHERE task_id = ?', (task_id,))
        conn.commit()
    finally:
        conn.close()


def test_retry_and_approve_refuse_an_edited_plan_as_run_does(sqlite_lab: Lab) -> None:
    # Both moved the edited task on and said "'ninelives run t' resumes it",
    # while that run refused it (exit 5): the task was left pending, or its
    # approval journaled, for a plan nothing would run.
    lab = sqlite_lab
    missing = {"tool": "fetch", "input": {"path": "no-such-file"}, "max_attempts": 1}
    lab.write_plan({"goal": "g", "steps": [missing]}, "fails.json")
    lab.write_plan({"goal": "g", "steps": [{"tool": "approval", "input": {"prompt": "ok?"}}]})
    assert lab.cli("create", "f", "fails.json").returncode == 0
    assert lab.cli("run", "f", "-q").returncode == 2
    assert lab.cli("create", "w", "plan.json").returncode == 0
    assert lab.cli("run", "w", "-q").returncode == 8
    for task_id in ("f", "w"):
        _edit_inputs(lab, task_id)
    before = digest(lab.root / "state.db")
    one_line(lab.cli("retry", "f"), 5, "task 'f' was changed after it was created")
    one_line(lab.cli("approve", "w", "0"), 5, "task 'w' was changed after it was created")
    one_line(lab.cli("approve", "w", "0", "--reject"), 5, "task 'w' was changed")
    assert digest(lab.root / "state.db") == before
    # A task not in the state asked for is still told so first (exit 4).
    one_line(lab.cli("retry", "w"), 4, "not failed")


def _blocked(lab: Lab) -> None:
    """Task ``t``: its one step (``on_unknown: refuse``) killed after its effect,
    then blocked by the next run, for ``resolve`` to decide."""
    lab.guide_setup()
    fetch = {"tool": "fetch", "input": {"path": "input/notes.txt"}, "on_unknown": "refuse"}
    lab.write_plan({"goal": "g", "steps": [fetch]})
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t", AGENT_CRASH_AT="after_effect:0").returncode == -9
    assert lab.cli("run", "t", "-q").returncode == 8


def test_resolve_done_that_is_not_an_object_names_what_was_given(sqlite_lab: Lab) -> None:
    # A person's --done '[1]' was refused as "the tool returned list, not a
    # JSON object (a dict)": no tool had returned anything.
    lab = sqlite_lab
    _blocked(lab)
    before = digest(lab.root / "state.db")
    for given, kind in (
        ("[1]", "an array"),
        ('"x"', "a string"),
        ("null", "null"),
        ("1", "a number"),
    ):
        result = lab.cli("resolve", "t", "0", "--done", given)
        one_line(result, 4, "--done must be a JSON object", f"got {kind}")
        assert "tool" not in result.stderr
    assert digest(lab.root / "state.db") == before
    assert lab.cli("resolve", "t", "0", "--done", "{}").returncode == 0


def test_resolve_done_over_the_blob_threshold_is_stored_as_a_blob(sqlite_lab: Lab) -> None:
    # A person's output went into the row whatever its size, past the
    # threshold meant to keep the database file small.
    lab = sqlite_lab
    _blocked(lab)
    big = json.dumps({"text": "y" * 5000})
    blobs = lab.root / "state.db.blobs"
    before = sorted(p.name for p in blobs.iterdir()) if blobs.exists() else []
    small = {"NINELIVES_BLOB_THRESHOLD": "1000"}
    one_line(lab.cli("resolve", "t", "1", "--done", big, **small), 4, "no such step")
    assert (sorted(p.name for p in blobs.iterdir()) if blobs.exists() else []) == before
    assert lab.cli("resolve", "t", "0", "--done", big, **small).returncode == 0
    conn = sqlite3.connect(lab.root / "state.db")
    try:
        (row,) = conn.execute("SELECT output FROM steps WHERE task_id = 't'").fetchone()
    finally:
        conn.close()
    assert len(row) < 1000, row[:100]
    assert set(json.loads(row)) == {"$blob"}
    shown = lab.cli("status", "t", "--outputs", "--json").json()
    assert shown["steps"][0]["output"] == json.loads(big)
    assert lab.cli("run", "t", "-q").returncode == 0
    assert lab.cli("verify", "t").returncode == 0
    assert lab.cli("doctor").returncode == 0


PROBED = """
from ninelives.tools import tool


def find(step_input, ctx):
    return {"found": "z" * 5000}


@tool("probed", on_unknown="probe", probe=find)
def probed(step_input, ctx):
    return {"ran": True}
"""


def test_a_probe_answer_over_the_blob_threshold_is_stored_as_a_blob(sqlite_lab: Lab) -> None:
    # The probe's answer is the step's output: it went into the row whatever
    # its size, as resolve --done's did, while a tool's own went to a blob.
    lab = sqlite_lab
    lab.write("probing.py", PROBED)
    lab.write_plan({"goal": "g", "steps": [{"tool": "probed", "input": {}}]})
    small = {"NINELIVES_BLOB_THRESHOLD": "1000", "NINELIVES_TOOLS": "probing"}
    assert lab.cli("create", "t", "plan.json", **small).returncode == 0
    assert lab.cli("run", "t", AGENT_CRASH_AT="after_effect:0", **small).returncode == -9
    assert lab.cli("run", "t", "-q", **small).returncode == 0
    conn = sqlite3.connect(lab.root / "state.db")
    try:
        (row,) = conn.execute("SELECT output FROM steps WHERE task_id = 't'").fetchone()
    finally:
        conn.close()
    assert set(json.loads(row)) == {"$blob"}, row[:100]
    shown = lab.cli("status", "t", "--outputs", "--json").json()
    assert shown["steps"][0]["output"] == {"found": "z" * 5000}
    assert lab.cli("verify", "t").returncode == 0
