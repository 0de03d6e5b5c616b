"""``fetch`` against a folder swapped for a symlink while it reads: the check
and the read are one descriptor walk, so nothing outside is ever read.

A second process keeps swapping ``data/`` (a real folder inside the workspace)
with a symlink to a folder outside. The negative control runs the former
check-then-open (``realpath``, containment test, ``open``) against the same
swapping and must read the outside secret at least once, which proves the
swaps land between a check and its open.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ninelives.errors import ToolError
from ninelives.settings import Settings
from ninelives.tools.builtin import make_fetch

SECRET = "outside-secret-7f3a\n"
FLIPPER = """
import os, sys
ws, out, stop = sys.argv[1:]
data, real = os.path.join(ws, "data"), os.path.join(ws, "data.real")
while not os.path.exists(stop):
    os.rename(data, real)
    os.symlink(out, data)
    os.unlink(data)
    os.rename(real, data)
"""


def _naive_read(root: str, path: str) -> str:
    """The former fetch: resolve, check containment, then open by name."""
    root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(root, path))
    if os.path.commonpath([root, target]) != root:
        raise ToolError("outside")
    with open(target, encoding="utf-8") as fh:
        return fh.read()


def _race(tmp_path: Path, read: object, *, until_leak: bool, tries: int) -> tuple[int, int]:
    ws, out = tmp_path / "ws", tmp_path / "out"
    (ws / "data").mkdir(parents=True, exist_ok=True)
    (ws / "data" / "real.txt").write_text("inside\n", encoding="utf-8")
    out.mkdir(exist_ok=True)
    (out / "real.txt").write_text(SECRET, encoding="utf-8")
    stop = tmp_path / "stop"
    stop.unlink(missing_ok=True)
    flipper = subprocess.Popen([sys.executable, "-c", FLIPPER, str(ws), str(out), str(stop)])
    leaks = reads = 0
    try:
        for _ in range(tries):
            try:
                text = read(str(ws), "data/real.txt")  # type: ignore[operator]
            except (OSError, ToolError):
                continue
            reads += 1
            if SECRET in text:
                leaks += 1
                if until_leak:
                    break
    finally:
        stop.touch()
        flipper.wait(timeout=60)
        if not (ws / "data").exists():
            os.rename(ws / "data.real", ws / "data")
    return leaks, reads


@pytest.mark.slow
def test_fetch_never_reads_through_a_swapped_folder(tmp_path: Path) -> None:
    def read(root: str, path: str) -> str:
        tool = make_fetch(Settings(workspace=root))
        return str(tool({"path": path}, {}, "t-0")["text"])

    started = time.monotonic()
    leaks, reads = _race(tmp_path, read, until_leak=False, tries=20_000)
    assert leaks == 0
    assert reads > 0, "the swapping never left the folder in place"
    assert time.monotonic() - started < 300


def test_negative_control_check_then_open_does_leak(tmp_path: Path) -> None:
    leaks, _ = _race(tmp_path, _naive_read, until_leak=True, tries=200_000)
    assert leaks >= 1
