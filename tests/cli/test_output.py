"""The command's own output: a stdout that fails, a reader that goes away, and
text from the store that must not act on the terminal showing it.

A stdout that cannot be written (``/dev/full``, closed) is one line on stderr
and exit 10, never a traceback; a reader that goes away (``| head``) ends the
command quietly. Stored text (a goal, a tool name, a tool's output or error,
a file name) reaches a human view with its control characters escaped.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess

import pytest

from ninelives.cli import EXIT_CODES, printable
from ninelives.errors import OutputFailed
from ninelives.testing import Lab
from ninelives.testing.lab import GUIDE_PLAN, SUMMARY_NOTES

OUTPUT_FAILED = 10
#: ESC, an OSC title change, a CSI clear, a carriage return, C1 CSI, a bidi override.
EVIL = "\x1b]0;pwned\x07\x1b[2J\rover\x9b31m\u202eevil"
ESC_BYTES = (b"\x1b", b"\x07", b"\r", b"\xc2\x9b", "\u202e".encode())


def created(lab: Lab, plan: dict[str, object] | None = None, task_id: str = "t") -> None:
    lab.write("input/notes.txt", SUMMARY_NOTES)
    lab.write_plan(plan or GUIDE_PLAN)
    assert lab.cli("create", task_id, "plan.json").returncode == 0


def run_to(lab: Lab, args: list[str], stdout: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        lab.argv(args), cwd=lab.root, env=lab.env(), stdout=stdout, stderr=subprocess.PIPE,
        text=True, timeout=120, check=False,
    )  # fmt: skip


def run_closed(lab: Lab, args: list[str]) -> subprocess.CompletedProcess[str]:
    """The command with its stdout closed (``>&-``)."""
    return subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", *lab.argv(args)], cwd=lab.root, env=lab.env(),
        stderr=subprocess.PIPE, text=True, timeout=120, check=False,
    )  # fmt: skip


def run_without_stderr(lab: Lab, args: list[str]) -> subprocess.CompletedProcess[str]:
    """The command with its stderr closed (``2>&-``) and its stdout captured."""
    return subprocess.run(
        ["sh", "-c", 'exec "$@" 2>&-', "sh", *lab.argv(args)], cwd=lab.root, env=lab.env(),
        stdout=subprocess.PIPE, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "code"),
    [(["status", "nosuch"], 1), (["bogus"], 4), (["export"], 4), (["run", "t"], 0)],
)
def test_a_closed_stderr_never_sends_error_or_progress_lines_to_stdout(
    sqlite_lab: Lab, args: list[str], code: int
) -> None:
    # `export t 2>&- > journal.jsonl`: stdout is the command's data, whatever
    # happens to stderr; the exit code still tells.
    created(sqlite_lab)
    result = run_without_stderr(sqlite_lab, args)
    assert result.returncode == code, result
    assert "ninelives" not in result.stdout, result.stdout
    assert "t: " not in result.stdout, result.stdout


def test_exit_code_10_is_the_output_failure() -> None:
    assert dict(EXIT_CODES)[OutputFailed] == OUTPUT_FAILED


READERS = [
    ["status", "t"],
    ["status", "t", "--json"],
    ["status", "t", "--outputs"],
    ["export", "t"],
    ["verify", "t"],
    ["--help"],
    ["--version"],
]


@pytest.mark.parametrize("args", READERS, ids=" ".join)
@pytest.mark.parametrize("where", ["full", "closed"])
@pytest.mark.slow
def test_a_stdout_that_cannot_be_written_is_one_line_and_exit_10(
    sqlite_lab: Lab, args: list[str], where: str
) -> None:
    lab = sqlite_lab
    created(lab)
    before = lab.fingerprint("t")
    if where == "full":
        with open("/dev/full", "w") as full:
            result = run_to(lab, args, full)
    else:
        result = run_closed(lab, args)
    assert result.returncode == OUTPUT_FAILED, result
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("ninelives: error: cannot write to stdout: ")
    assert lab.fingerprint("t") == before


@pytest.mark.parametrize("where", ["full", "closed"])
def test_create_says_the_task_was_stored_when_its_confirmation_fails(lab: Lab, where: str) -> None:
    lab.write("input/notes.txt", SUMMARY_NOTES)
    lab.write_plan(GUIDE_PLAN)
    if where == "full":
        with open("/dev/full", "w") as full:
            result = run_to(lab, ["create", "t", "plan.json"], full)
    else:
        result = run_closed(lab, ["create", "t", "plan.json"])
    assert result.returncode == OUTPUT_FAILED, result
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("ninelives: error: task 't' was stored, but cannot write")
    assert lab.cli("status", "t", "--json").json()["status"] == "pending"  # it was
    assert lab.cli("run", "t").returncode == 0


def test_every_change_says_it_was_made_when_its_confirmation_fails(sqlite_lab: Lab) -> None:
    # As create does: the change stands, and a bare "cannot write to stdout"
    # invited the same command again, which was then refused (fork: "task
    # 'u' already exists", exit 4; retry: "is pending, not failed").
    lab = sqlite_lab
    created(lab)
    assert lab.cli("run", "t", "-q").returncode == 0
    lab.write_plan({"goal": "g", "steps": [{"tool": "approval", "input": {"prompt": "ok?"}}]},
                   "approval.json")  # fmt: skip
    assert lab.cli("create", "a", "approval.json").returncode == 0
    assert lab.cli("run", "a", "-q").returncode == 8
    for args, said in (
        (["fork", "t", "u", "--from", "1"], "task 'u' was forked from 't'"),
        (["cancel", "u"], "task 'u' was cancelled"),
        (["approve", "a", "0", "--reject"], "task 'a' step 0 was rejected"),
        (["retry", "a"], "task 'a' is pending again"),
    ):
        result = run_closed(lab, args)
        assert result.returncode == OUTPUT_FAILED, result
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith(f"ninelives: error: {said}, but cannot write"), result
    assert lab.cli("status", "u", "--json").json()["status"] == "cancelled"  # they were
    assert lab.cli("status", "a", "--json").json()["status"] == "pending"


def test_a_reader_that_goes_away_ends_the_command_quietly(sqlite_lab: Lab) -> None:
    lab = sqlite_lab
    created(lab)
    assert lab.cli("run", "t").returncode == 0
    proc = subprocess.Popen(
        lab.argv(["export", "t"]), cwd=lab.root, env=lab.env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before anything is written
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert err == ""


def test_a_reader_that_goes_away_leaves_a_checks_verdict(sqlite_lab: Lab) -> None:
    # `verify --all | head -1` in a deploy script under `set -o pipefail`:
    # the reader went away before the findings were written, and verify
    # exited 0, "no violations", with a step run past its limit in the database.
    lab = sqlite_lab
    created(lab)
    assert lab.cli("run", "t").returncode == 0
    conn = sqlite3.connect(lab.root / "state.db")
    conn.execute("UPDATE steps SET attempts = 99 WHERE idx = 0")  # past any limit
    conn.commit()
    conn.close()
    assert lab.cli("verify", "--all").returncode == 7  # the control: a violation
    for args in (["verify", "--all"], ["verify", "t"]):
        proc = subprocess.Popen(
            lab.argv(args), cwd=lab.root, env=lab.env(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        proc.stdout.close()  # the reader is gone before anything is written
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 7, (args, err)
        assert "Traceback" not in err, err


def test_an_ordinary_stdout_gets_everything(sqlite_lab: Lab) -> None:
    # The control: the same commands with a working stdout exit 0 with output.
    created(sqlite_lab)
    for args in READERS:
        result = sqlite_lab.cli(*args)
        assert result.returncode == 0, result
        assert result.stdout


# -- escapes in human views -------------------------------------------------------------


def evil_plan() -> dict[str, object]:
    return {
        "goal": EVIL,
        "steps": [
            {"tool": "fetch", "input": {"path": "input/notes.txt"}},
            {"tool": "fetch", "input": {"path": f"input/{EVIL}.txt"}},
        ],
    }


def on_a_terminal(lab: Lab, args: list[str]) -> bytes:
    """What ``args`` prints on a pseudo-terminal (so the table view is chosen)."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        lab.argv(args), cwd=lab.root, env=lab.env(), stdout=follower, stderr=subprocess.PIPE
    )
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO once the child has closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.communicate(timeout=120)
    os.close(leader)
    assert proc.returncode == 0
    return b"".join(chunks)


def test_the_status_table_escapes_control_characters(lab: Lab) -> None:
    created(lab, evil_plan())
    shown = on_a_terminal(lab, ["status", "t"])
    assert b"task t: pending" in shown  # the table view, not JSON
    body = shown.replace(b"\r\n", b"\n")  # the terminal's own line endings
    assert [seq for seq in ESC_BYTES if seq in body] == []
    assert b"\\x1b]0;pwned\\x07\\x1b[2J\\rover\\x9b31m\\u202eevil" in body


def test_a_plain_goal_is_shown_as_it_is(lab: Lab) -> None:
    # The control: ordinary text (accents and all) is not escaped.
    created(lab, {**evil_plan(), "goal": "Résumé des notes"})
    assert "Résumé des notes".encode() in on_a_terminal(lab, ["status", "t"])


def test_progress_and_error_lines_escape_control_characters(lab: Lab) -> None:
    created(lab, evil_plan())
    lab.write("input/notes.txt", f"{EVIL}\nline two\n")
    result = lab.cli("run", "t", AGENT_MAX_ATTEMPTS="1")
    assert result.returncode == 2, result
    lines = result.stderr.splitlines()
    assert len(lines) == 3, result.stderr  # step 0 done, step 1 error, the error line
    assert [c for c in "\x1b\x07\r\x9b\u202e" if c in result.stderr] == []
    assert "\\u202eevil" in lines[0]  # the output brief of step 0
    assert "input/\\x1b]0;pwned" in lines[1]  # the tool's error echoes the path
    assert lines[2].startswith("ninelives: error: ")


def test_json_views_escape_what_json_dumps_leaves_raw(lab: Lab) -> None:
    created(lab, evil_plan())
    lab.write("input/notes.txt", f"{EVIL}\nline two\n")
    assert lab.cli("run", "t", AGENT_MAX_ATTEMPTS="1").returncode == 2
    status = lab.cli("status", "t", "--json", "--outputs").stdout
    export = lab.cli("export", "t").stdout
    for out in (status, export):
        assert [c for c in "\x1b\x07\r\x9b\u202e" if c in out] == []
    # The same JSON values: escaping changed only how they are written.
    assert json.loads(status)["goal"] == EVIL
    assert json.loads(status)["steps"][0]["output"]["text"].startswith(EVIL)
    errors = [json.loads(line) for line in export.splitlines()]
    assert any(EVIL in e.get("error", "") for e in errors)


def test_verify_escapes_the_names_it_reports(lab: Lab) -> None:
    created(lab)
    assert lab.cli("run", "t").returncode == 0
    folder = "art\x1b[2J\u202e"
    lab.write(f"{folder}/.t-2.md.0123456789abcdef.tmp", "x")
    result = lab.cli("verify", "t", "--artifacts", folder)
    assert result.returncode == 7, result
    assert "stray_temp: temporary file .t-2.md.0123456789abcdef.tmp left in art\\x1b[2J\\u202e" in (
        result.stdout
    )
    assert [c for c in "\x1b\u202e" if c in result.stdout + result.stderr] == []


def test_printable_escapes_controls_and_keeps_text() -> None:
    assert printable("a\x1bb\nc\td\u202e") == "a\\x1bb\\nc\\td\\u202e"
    assert printable("Résumé — ok ✓") == "Résumé — ok ✓"


@pytest.mark.parametrize("where", ["gone", "full", "closed"])
def test_gc_whose_output_fails_still_removes_every_batch(sqlite_lab: Lab, where: str) -> None:
    # gc prints each batch once committed; a stdout that fails stops the
    # printing, never the gc: the other batches (and the blob sweep) still go.
    lab = sqlite_lab
    lab.write("input/notes.txt", SUMMARY_NOTES)
    fetch = {"tool": "fetch", "input": {"path": "input/notes.txt"}}
    lab.write_plan({"goal": "g", "steps": [fetch]})
    for n in range(4):
        assert lab.cli("create", f"t{n}", "plan.json").returncode == 0
        assert lab.cli("run", f"t{n}", "-q").returncode == 0
    args = ["gc", "--older-than", "0s", "--batch", "1"]
    if where == "gone":
        proc = subprocess.Popen(
            lab.argv(args), cwd=lab.root, env=lab.env(), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        proc.stdout.close()
        _, err = proc.communicate(timeout=120)
        assert (proc.returncode, err) == (0, "")
    else:
        if where == "full":
            with open("/dev/full", "w") as full:
                result = run_to(lab, args, full)
        else:
            result = run_closed(lab, args)
        assert result.returncode == OUTPUT_FAILED, result
        assert result.stderr.count("\n") == 1, result.stderr
        assert result.stderr.startswith("ninelives: error: cannot write to stdout: ")
    assert lab.cli("ls", "--json").stdout == ""  # every task removed


#: Text no 8-bit encoding holds whole: Latin-1, an arrow, CJK, and one beyond the BMP.
WIDE = "résumé → 中文 \U0001f600"


def _ageless(row: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in row.items() if k != "age"}  # ls: seconds since, as read


@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_stdout_that_cannot_encode_the_text_escapes_it(sqlite_lab: Lab, encoding: str) -> None:
    # PYTHONIOENCODING=ascii or a Latin-1 locale: stored text that the encoding
    # cannot hold is escaped, never a traceback; JSON stays the same JSON values.
    lab = sqlite_lab
    created(lab, {**GUIDE_PLAN, "goal": WIDE})
    lab.write("input/notes.txt", f"{WIDE}\nline two\n")
    assert lab.cli("run", "t").returncode == 0
    # A step error that echoes the text reaches the journal too.
    lab.write_plan({"goal": "g", "steps": [{"tool": "fetch", "input": {"path": WIDE}}]}, "f.json")
    assert lab.cli("create", "f", "f.json").returncode == 0
    assert lab.cli("run", "f", AGENT_MAX_ATTEMPTS="1").returncode == 2
    for args in (
        ["status", "t", "--json", "--outputs"], ["ls", "--json"], ["export", "f"],
        ["export", "f", "--format", "otlp-json"],
    ):  # fmt: skip
        narrow = lab.cli(*args, PYTHONIOENCODING=encoding)
        assert (narrow.returncode, narrow.stderr) == (0, ""), args
        assert narrow.stdout.isascii(), args
        utf8 = lab.cli(*args).stdout
        assert WIDE in utf8, args  # the control: the text is there to escape
        wide = [json.loads(line) for line in utf8.splitlines()]
        assert [_ageless(v) for v in narrow.jsonl()] == [_ageless(v) for v in wide], args
    # Text that is not JSON is written in the stream's encoding (Latin-1 holds é).
    csv = subprocess.run(
        lab.argv(["export", "f", "--format", "csv"]), cwd=lab.root, capture_output=True,
        env=lab.env({"PYTHONIOENCODING": encoding}), timeout=120, check=False,
    )  # fmt: skip
    assert (csv.returncode, csv.stderr) == (0, b"")
    assert b"\\u2192" in csv.stdout
