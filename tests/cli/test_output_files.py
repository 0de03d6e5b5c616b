"""Files a user names for output: ``report -o PATH`` and ``torture --dir DIR``.

A regular file at PATH is replaced whole (a temporary file renamed over it);
anything else is written through and stays what it was: a FIFO, a symlink
(to a file, a FIFO, a device), a character device. Nothing here touches the
machine's ``/dev/null`` until the same path has been shown to keep a private
device node of the same kind a device.
"""

from __future__ import annotations

import os
import stat
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from ninelives import cli
from ninelives.cli import output
from ninelives.testing import Lab, Result

NULL = os.makedev(1, 3)


@pytest.fixture
def done(sqlite_lab: Lab) -> Lab:
    """A lab holding task ``t`` run to done."""
    sqlite_lab.guide_setup()
    assert sqlite_lab.cli("create", "t", "plan.json").returncode == 0
    assert sqlite_lab.cli("run", "t", "-q").returncode == 0
    return sqlite_lab


def page_of(lab: Lab, *, line: bool = False) -> str:
    """The page as ``-o -`` prints it: as one line of stdout with ``line``."""
    result = lab.cli("report", "t", "-o", "-")
    assert result.returncode == 0, result
    return result.stdout if line else result.stdout.removesuffix("\n")


def wrote(result: Result, target: str) -> None:
    assert result.returncode == 0, result
    assert result.stdout.startswith(f"wrote {target} ("), result.stdout


def refused(result: Result, *words: str) -> None:
    assert result.returncode == 10, result
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr


class Reader(threading.Thread):
    """Reads a FIFO to its end in the background, as a ``cat`` would."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.data = path, b""

    def run(self) -> None:
        with open(self.path, "rb") as fh:  # blocks until the writer opens it
            self.data = fh.read()


def test_a_regular_file_is_replaced_whole(done: Lab) -> None:
    (done.root / "page.html").write_text("old")
    wrote(done.cli("report", "t", "-o", "page.html"), "page.html")
    assert (done.root / "page.html").read_text(encoding="utf-8") == page_of(done)
    assert [p.name for p in done.root.iterdir() if p.name.startswith(".report-")] == []


def report_under_umask(lab: Lab, mask: int, target: str) -> Result:
    """``report -o target`` run under ``mask``, as a shell's ``umask`` sets it."""
    old = os.umask(mask)  # the child inherits it
    try:
        return lab.cli("report", "t", "-o", target)
    finally:
        os.umask(old)


def test_a_new_page_takes_the_umask_as_a_shell_redirection_would(done: Lab) -> None:
    # The page holds step outputs from an owner-only database: umask 077 keeps it
    # private; 022 gives the usual 644.
    wrote(report_under_umask(done, 0o077, "private.html"), "private.html")
    assert stat.S_IMODE(os.stat(done.root / "private.html").st_mode) == 0o600
    wrote(report_under_umask(done, 0o022, "shared.html"), "shared.html")
    assert stat.S_IMODE(os.stat(done.root / "shared.html").st_mode) == 0o644


def test_a_replaced_file_keeps_its_permissions(done: Lab) -> None:
    for name, mode in (("private.html", 0o600), ("readonly.html", 0o444)):
        (done.root / name).write_text("old")
        os.chmod(done.root / name, mode)
        wrote(report_under_umask(done, 0o022, name), name)
        assert stat.S_IMODE(os.stat(done.root / name).st_mode) == mode, name
        assert (done.root / name).read_text(encoding="utf-8") == page_of(done)


def test_a_fifo_is_written_through_and_stays_a_fifo(done: Lab) -> None:
    fifo = done.root / "pipe"
    os.mkfifo(fifo)
    reader = Reader(fifo)
    reader.start()
    wrote(done.cli("report", "t", "-o", "pipe"), "pipe")
    reader.join(30)
    assert reader.data.decode("utf-8") == page_of(done)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_symlink_to_a_fifo_is_followed_and_both_stay(done: Lab) -> None:
    fifo = done.root / "pipe"
    os.mkfifo(fifo)
    (done.root / "link").symlink_to("pipe")
    reader = Reader(fifo)
    reader.start()
    wrote(done.cli("report", "t", "-o", "link"), "link")
    reader.join(30)
    assert reader.data.decode("utf-8") == page_of(done)
    assert os.readlink(done.root / "link") == "pipe"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_symlink_to_a_file_writes_the_file_and_keeps_the_link(done: Lab) -> None:
    (done.root / "reports").mkdir()
    (done.root / "reports" / "t.html").write_text("old")
    (done.root / "latest.html").symlink_to("reports/t.html")
    wrote(done.cli("report", "t", "-o", "latest.html"), "latest.html")
    assert os.readlink(done.root / "latest.html") == "reports/t.html"
    assert (done.root / "reports" / "t.html").read_text(encoding="utf-8") == page_of(done)


def assert_null_device(path: Path) -> None:
    st = os.lstat(path)
    assert stat.S_ISCHR(st.st_mode), oct(st.st_mode)
    assert st.st_rdev == NULL


def test_a_symlink_chain_to_dev_null_leaves_it_a_device(done: Lab) -> None:
    (done.root / "one").symlink_to(os.devnull)
    (done.root / "two").symlink_to("one")
    wrote(done.cli("report", "t", "-o", "two"), "two")
    assert os.readlink(done.root / "two") == "one"
    assert os.readlink(done.root / "one") == os.devnull
    assert_null_device(Path(os.devnull))


def test_a_character_device_is_written_through_never_replaced(done: Lab) -> None:
    # A private node of /dev/null's kind (mknod needs root, as the suite's mounts do):
    # only once that one stayed a device is the machine's own /dev/null named.
    node = done.root / "null"
    os.mknod(node, stat.S_IFCHR | 0o666, NULL)
    wrote(done.cli("report", "t", "-o", "null"), "null")
    assert_null_device(node)
    wrote(done.cli("report", "t", "-o", os.devnull), os.devnull)
    assert_null_device(Path(os.devnull))


def test_dev_stdout_gets_the_page_in_order(done: Lab) -> None:
    # A version that renamed its page over /dev/stdout left a regular file there,
    # for every later process on the machine: say so rather than fail obscurely.
    assert os.path.islink("/dev/stdout"), "/dev/stdout is no longer a symlink on this machine"
    with open(done.root / "out.html", "w", encoding="utf-8") as out:
        proc = subprocess.run(
            done.argv(["report", "t", "-o", "/dev/stdout"]), cwd=done.root, env=done.env(),
            stdout=out, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (done.root / "out.html").read_text(encoding="utf-8") == page_of(done, line=True)
    assert os.path.islink("/dev/stdout")  # written through, never replaced


@pytest.mark.parametrize("case", ["folder", "dangling symlink"])
def test_what_cannot_be_written_through_is_refused_and_left(done: Lab, case: str) -> None:
    target = done.root / "target"
    if case == "folder":
        target.mkdir()
    else:
        target.symlink_to("nowhere")
    refused(done.cli("report", "t", "-o", "target"), "cannot write target")
    assert target.is_dir() if case == "folder" else os.readlink(target) == "nowhere"
    assert not (done.root / "nowhere").exists()


def test_a_fifo_nobody_reads_is_refused_not_waited_on_forever(
    done: Lab, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    os.mkfifo(done.root / "pipe")
    monkeypatch.chdir(done.root)
    monkeypatch.setattr(output, "FIFO_READER_WAIT", 0.2)
    assert cli.main(["report", "t", "-o", "pipe"]) == 10
    err = capsys.readouterr().err
    assert "no process opened for reading" in err, err
    assert stat.S_ISFIFO(os.lstat(done.root / "pipe").st_mode)


@pytest.mark.parametrize("kind", ["file", "device"])
def test_torture_dir_that_is_not_a_folder_is_one_line(done: Lab, kind: str) -> None:
    target = "afile" if kind == "file" else os.devnull
    if kind == "file":
        (done.root / "afile").write_text("keep")
    result = done.cli("torture", "plan.json", "--kills", "0", "--dir", target)
    assert result.returncode == 4, result
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "not a folder" in result.stderr
    if kind == "file":
        assert (done.root / "afile").read_text() == "keep"
    else:
        assert_null_device(Path(os.devnull))


def test_an_empty_torture_dir_is_bad_input_not_the_working_directory(sqlite_lab: Lab) -> None:
    # `--dir "$DIR"` with DIR unset: the session's database, locks and artifacts
    # went into the project folder the command ran in.
    sqlite_lab.guide_setup()
    before = sorted(p.name for p in sqlite_lab.root.iterdir())
    result = sqlite_lab.cli("torture", "plan.json", "--kills", "0", "--dir", "")
    assert result.returncode == 4, result
    assert "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "--dir" in result.stderr, result.stderr
    assert sorted(p.name for p in sqlite_lab.root.iterdir()) == before


def test_an_empty_report_file_is_bad_input(done: Lab) -> None:
    # `-o "$OUT"` with OUT unset: exit 10 ("cannot write : No such file or
    # directory"), the code of an output that failed, not of the input given.
    files = done.files()
    result = done.cli("report", "t", "-o", "")
    assert result.returncode == 4, result
    assert result.stderr.count("\n") == 1, result.stderr
    assert "-o is empty" in result.stderr, result.stderr
    assert done.files() == files
