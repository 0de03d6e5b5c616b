"""A ``create`` or ``fork`` whose commit fails with EIO or ENOSPC (its one
fdatasync failed under strace): exit 6, and the line says how to learn whether
the task was stored, since there is no run that would recover it."""

from __future__ import annotations

import pytest

from ninelives.testing import Lab
from ninelives.testing.iofault import strace_path

pytestmark = [pytest.mark.linux]


@pytest.mark.parametrize("error", ["EIO", "ENOSPC"])
@pytest.mark.parametrize(
    "args", [("create", "new", "plan.json"), ("fork", "keep", "new", "--from", "1")]
)
def test_a_create_whose_commit_fails_says_how_to_find_out(
    sqlite_lab: Lab, error: str, args: tuple[str, ...]
) -> None:
    # It said "its outcome is unknown, stopping now: the next run recovers";
    # 'ninelives run new' then answered "unknown task" (exit 1).
    lab = sqlite_lab
    lab.guide_setup()
    assert lab.cli("create", "keep", "plan.json").returncode == 0
    assert lab.cli("run", "keep", "-q").returncode == 0
    strace = [strace_path(), "-f", "-qq", "-o", "/dev/null", "-e", "trace=fdatasync",
              "-e", f"inject=fdatasync:error={error}:when=1"]  # fmt: skip
    lab.command = [*strace, *lab.command]
    result = lab.cli(*args)
    assert result.returncode == 6, result
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "next run" not in lines[0], lines[0]
    assert "whether task 'new' was stored is unknown" in lines[0], lines[0]
    assert "'ninelives status new'" in lines[0], lines[0]
