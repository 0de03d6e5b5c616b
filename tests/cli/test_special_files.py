"""Files someone planted where ninelives reads or cleans: FIFOs, devices, huge
files, hard links, folders under temp names, folders it cannot list or clean.

Each must end in a one-line refusal (a ``step_error`` for tools, a violation
for ``verify``, a progress line for cleanup), never a hang or a traceback.
The subprocess timeouts are the hang detectors: before the fixes these runs
blocked forever in ``open``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ninelives.testing import Lab
from ninelives.testing.lab import GUIDE_PLAN, SUMMARY_NOTES

SUMMARY = "Line one\nLine two\nLine three"
SECRET = "outside-secret-7f3a\nsecond line\nthird line\n"
HANG = 30  # seconds: far more than any of these runs needs, far less than forever


def created(lab: Lab, task_id: str = "t") -> None:
    lab.write("input/notes.txt", SUMMARY_NOTES)
    lab.write_plan(GUIDE_PLAN)
    assert lab.cli("create", task_id, "plan.json").returncode == 0


def killed_before_publishing(lab: Lab, task_id: str = "t") -> None:
    """Leave step 2 (publish) running, as a kill does: only then does the next run
    look for the temporary files a dead attempt may have left."""
    result = lab.cli("run", task_id, AGENT_CRASH_AT="before_effect:2")
    assert result.returncode == -9, result


def errors(lab: Lab, task_id: str = "t") -> list[str]:
    return [e["error"] for e in lab.snapshot(task_id).events if e["kind"] == "step_error"]


def assert_one_line_failure(result: object) -> None:
    assert result.returncode == 2, result  # type: ignore[attr-defined]
    stderr = result.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in stderr
    assert stderr.splitlines()[-1].startswith("ninelives: error: ")


# -- FIFOs ----------------------------------------------------------------------------


def test_a_fifo_at_the_artifact_name_fails_the_step_instead_of_hanging(lab: Lab) -> None:
    created(lab)
    (lab.root / "artifacts").mkdir()
    os.mkfifo(lab.root / "artifacts" / "t-2.md")
    result = lab.cli("run", "t", timeout=HANG, AGENT_MAX_ATTEMPTS="1")
    assert_one_line_failure(result)
    assert ["FIFO" in e for e in errors(lab)] == [True]
    assert lab.artifacts() == {"t-2.md": "special file prw-r--r--"}  # no temp file left


@pytest.mark.parametrize("kind", ["file", "fifo", "dangling link", "device"])
def test_an_artifacts_folder_that_is_not_a_folder_is_named_in_the_step_error(
    lab: Lab, kind: str
) -> None:
    # The step error was the bare "FileExistsError: [Errno 17] File exists: 'artifacts'".
    created(lab)
    folder = lab.root / "artifacts"
    if kind == "file":
        folder.write_text("")
    elif kind == "fifo":
        os.mkfifo(folder)
    elif kind == "dangling link":
        folder.symlink_to(lab.root / "gone")
    else:
        folder.symlink_to(os.devnull)
    result = lab.cli("run", "t", timeout=HANG, AGENT_MAX_ATTEMPTS="1")
    assert_one_line_failure(result)
    assert len(errors(lab)) == 1
    assert "is not a folder" in errors(lab)[0], errors(lab)
    assert "is not a folder" in result.stderr
    if kind == "device":
        assert Path(os.devnull).is_char_device()


def test_fetch_of_a_fifo_fails_the_step_instead_of_hanging(lab: Lab) -> None:
    created(lab)
    notes = lab.root / "input" / "notes.txt"
    notes.unlink()
    os.mkfifo(notes)
    result = lab.cli("run", "t", timeout=HANG, AGENT_MAX_ATTEMPTS="1")
    assert_one_line_failure(result)
    assert ["FIFO" in e for e in errors(lab)] == [True]


def test_verify_reports_a_fifo_at_an_artifact_instead_of_hanging(lab: Lab) -> None:
    created(lab)
    assert lab.cli("run", "t").returncode == 0
    clean = lab.cli("verify", "t", "--artifacts", "artifacts", timeout=HANG)
    assert clean.returncode == 0, clean  # the control: the real file verifies
    final = lab.root / "artifacts" / "t-2.md"
    final.unlink()
    os.mkfifo(final)
    result = lab.cli("verify", "t", "--artifacts", "artifacts", timeout=HANG)
    assert result.returncode == 7, result
    assert "t: artifact_type: step 2: t-2.md is a FIFO, not a regular file" in result.stdout
    assert "Traceback" not in result.stderr


def test_unsafe_append_to_a_fifo_fails_instead_of_hanging(lab: Lab) -> None:
    created(lab)
    (lab.root / "artifacts").mkdir()
    os.mkfifo(lab.root / "artifacts" / "report.log")
    result = lab.cli("run", "t", timeout=HANG, AGENT_MAX_ATTEMPTS="1", AGENT_UNSAFE_EFFECTS="1")
    assert_one_line_failure(result)
    assert len(errors(lab)) == 1


# -- devices, huge files, hard links ---------------------------------------------------


def test_fetch_through_a_symlink_to_a_device_is_refused(lab: Lab) -> None:
    created(lab)
    notes = lab.root / "input" / "notes.txt"
    notes.unlink()
    notes.symlink_to("/dev/zero")
    result = lab.cli("run", "t", timeout=HANG, AGENT_MAX_ATTEMPTS="1")
    assert_one_line_failure(result)
    assert ["outside the workspace" in e for e in errors(lab)] == [True]


def test_fetch_of_a_device_inside_the_workspace_is_refused(lab: Lab) -> None:
    created(lab)
    notes = lab.root / "input" / "notes.txt"
    notes.unlink()
    zero = os.stat("/dev/zero")
    os.mknod(notes, 0o600 | (zero.st_mode & 0o170000), zero.st_rdev)  # root: a real device node
    result = lab.cli("run", "t", timeout=HANG, AGENT_MAX_ATTEMPTS="1")
    assert_one_line_failure(result)
    assert ["is a device, not a regular file" in e for e in errors(lab)] == [True]


def test_fetch_of_a_file_over_the_size_cap_is_refused(lab: Lab) -> None:
    # Over MAX_FETCH_BYTES a file is streamed into the blob store (tests/crash/
    # test_blob_kills.py); NINELIVES_MAX_FETCH is the cap on what fetch reads at all.
    from ninelives.tools.builtin import MAX_FETCH_BYTES

    created(lab)
    with open(lab.root / "input" / "notes.txt", "r+b") as fh:
        fh.truncate(MAX_FETCH_BYTES + 1)  # sparse: costs no disk
    cap = str(MAX_FETCH_BYTES)
    result = lab.cli("run", "t", timeout=HANG, AGENT_MAX_ATTEMPTS="1", NINELIVES_MAX_FETCH=cap)
    assert_one_line_failure(result)
    assert [
        f"larger than fetch's limit of {MAX_FETCH_BYTES} bytes (NINELIVES_MAX_FETCH)" in e
        for e in errors(lab)
    ] == [True]


def test_fetch_at_the_size_cap_is_read(sqlite_lab: Lab) -> None:
    # The control of the cap: a file of exactly the limit is fetched. (SQLite only:
    # what is tested is fetch; storing 32 MiB is each store's own business.)
    from ninelives.tools.builtin import MAX_FETCH_BYTES

    lab = sqlite_lab

    plan = {"goal": "g", "steps": [{"tool": "fetch", "input": {"path": "input/big.txt"}}]}
    lab.write_plan(plan)
    lab.write("input/big.txt", ("x" * 1023 + "\n") * (MAX_FETCH_BYTES // 1024))
    assert lab.cli("create", "t", "plan.json").returncode == 0
    assert lab.cli("run", "t", "-q", timeout=HANG).returncode == 0


def test_fetch_of_a_hard_link_to_a_file_outside_is_refused(lab: Lab, tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text(SECRET, encoding="utf-8")
    created(lab)
    notes = lab.root / "input" / "notes.txt"
    notes.unlink()
    os.link(outside, notes)
    result = lab.cli("run", "t", AGENT_MAX_ATTEMPTS="1")
    assert_one_line_failure(result)
    assert ["2 hard links" in e for e in errors(lab)] == [True]
    assert "outside-secret" not in lab.cli("status", "t", "--outputs").stdout
    # The control: the very same file, as a copy with one name, is read.
    notes.unlink()
    shutil.copyfile(outside, notes)
    assert lab.cli("create", "t2", "plan.json").returncode == 0
    assert lab.cli("run", "t2").returncode == 0
    assert "outside-secret" in lab.cli("status", "t2", "--outputs").stdout


# -- orphan cleanup never stops a run --------------------------------------------------


def test_a_folder_under_a_temp_name_does_not_block_the_task(lab: Lab) -> None:
    created(lab)
    planted = lab.root / "artifacts" / ".t-2.md.0123456789abcdef.tmp"
    planted.mkdir(parents=True)
    (planted / "inside").write_text("x", encoding="utf-8")
    killed_before_publishing(lab)
    # Every run that recovers, not only the first: one killed again, one to the end.
    for crash, code in (("before_effect:2", -9), ("", 0)):
        result = lab.cli("run", "t", AGENT_CRASH_AT=crash)
        assert result.returncode == code, result
        assert "Traceback" not in result.stderr
        said = [line for line in result.stderr.splitlines() if "cannot be removed" in line]
        assert len(said) == 1, result.stderr
        assert ".t-2.md.0123456789abcdef.tmp" in said[0]
    assert lab.artifacts()["t-2.md"] == SUMMARY
    assert (planted / "inside").read_text(encoding="utf-8") == "x"


def test_an_artifacts_folder_that_cannot_be_listed_does_not_block_the_task(lab: Lab) -> None:
    lab.base_env["AGENT_ARTIFACTS"] = "loop"  # recorded with the task at create
    created(lab)
    os.symlink("loop", lab.root / "loop")
    killed_before_publishing(lab)
    result = lab.cli("run", "t")  # listing it fails with ELOOP
    assert result.returncode == 2, result  # publishing there fails too, as a step error
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if "cannot list loop" in line]


def test_a_temp_file_that_cannot_be_unlinked_does_not_block_the_task(lab: Lab) -> None:
    created(lab)
    killed_before_publishing(lab)
    planted = lab.root / "artifacts" / ".t-2.md.fedcba9876543210.tmp"
    planted.parent.mkdir(exist_ok=True)
    planted.write_text("stuck", encoding="utf-8")
    # An immutable file: unlink fails with EPERM even for root, as a file of
    # another user in a shared sticky folder does for everyone else.
    chattr = subprocess.run(["chattr", "+i", str(planted)], capture_output=True, check=False)
    assert chattr.returncode == 0, f"chattr +i is needed here: {chattr.stderr!r}"
    try:
        result = lab.cli("run", "t")
        assert result.returncode == 0, result
        said = [line for line in result.stderr.splitlines() if "cannot be removed" in line]
        assert len(said) == 1, result.stderr
        assert "Operation not permitted" in said[0]
    finally:
        subprocess.run(["chattr", "-i", str(planted)], check=True)
    assert lab.artifacts()["t-2.md"] == SUMMARY


def test_removable_orphans_are_still_removed_quietly(lab: Lab) -> None:
    # The control: an ordinary orphan is removed and nothing is said about it.
    created(lab)
    killed_before_publishing(lab)
    lab.write("artifacts/.t-2.md.0123456789abcdef.tmp", "orphan")
    result = lab.cli("run", "t")
    assert result.returncode == 0, result
    assert "cannot" not in result.stderr
    assert lab.artifacts() == {"t-2.md": SUMMARY}


# -- plan files that are not regular files ---------------------------------------------

PATCHED_CREATE = (
    "import sys, ninelives.plan as p, ninelives.cli as c; p.FIFO_WRITER_WAIT = 0.5; "
    "sys.exit(c.main(sys.argv[1:]))"
)


@pytest.mark.parametrize("target", ["/dev/null", "input"])
def test_a_device_or_folder_as_plan_file_is_refused(lab: Lab, target: str) -> None:
    lab.write("input/notes.txt", "x")
    result = lab.cli("create", "t", target, timeout=HANG)
    assert result.returncode == 4, result
    assert len(result.stderr.splitlines()) == 1
    assert not (lab.root / "state.db").exists() or lab.cli("status", "t").returncode == 1


def test_a_fifo_plan_file_without_a_writer_is_refused_not_waited_on_forever(lab: Lab) -> None:
    import sys

    os.mkfifo(lab.root / "plan.fifo")
    proc = subprocess.run(
        [sys.executable, "-c", PATCHED_CREATE, "--db", lab.db, "create", "t", "plan.fifo"],
        cwd=lab.root, env=lab.env(), capture_output=True, text=True, timeout=HANG, check=False,
    )  # fmt: skip
    assert proc.returncode == 4, proc
    assert proc.stderr.startswith("ninelives: error: plan file plan.fifo is a FIFO")
    assert len(proc.stderr.splitlines()) == 1
    assert lab.cli("status", "t").returncode == 1


def test_a_fifo_or_pipe_plan_file_with_a_writer_is_read(lab: Lab) -> None:
    import json
    import threading

    lab.write("input/notes.txt", SUMMARY_NOTES)
    fifo = lab.root / "plan.fifo"
    os.mkfifo(fifo)

    def write_later() -> None:
        with open(fifo, "w", encoding="utf-8") as fh:  # blocks until create opens it
            fh.write(json.dumps(GUIDE_PLAN))

    writer = threading.Thread(target=write_later, daemon=True)
    writer.start()
    assert lab.cli("create", "a", "plan.fifo", timeout=HANG).returncode == 0
    writer.join(HANG)
    piped = subprocess.run(
        lab.argv(["create", "b", "/dev/stdin"]), input=json.dumps(GUIDE_PLAN), cwd=lab.root,
        env=lab.env(), capture_output=True, text=True, timeout=HANG, check=False,
    )  # fmt: skip
    assert piped.returncode == 0, piped
    assert lab.cli("run", "a").returncode == lab.cli("run", "b").returncode == 0
