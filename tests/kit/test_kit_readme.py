"""examples/kill-test-kit/README.md, run as written: in a fresh copy of the checkout,
a new virtualenv, the kit installed with ninelives from the checkout, its kill
tests, and torture of its plan. Network access to the package index is needed
(pip builds both packages in isolated environments, as a user's pip does)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from readme_blocks import blocks, run_shell

pytestmark = [pytest.mark.crash, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
KIT = Path("examples") / "kill-test-kit"


def _fresh_copy(target: Path) -> Path:
    """What a clone of this checkout holds: tracked and new files, nothing ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=False,
    )  # fmt: skip
    if listed.returncode != 0:  # not a git checkout (an unpacked sdist): copy it all
        shutil.copytree(ROOT, target, ignore=shutil.ignore_patterns(".venv", "__pycache__"))
        return target
    for name in listed.stdout.decode().split("\0"):
        source = ROOT / name
        if name and source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def test_the_kit_readme_commands_work_as_written(tmp_path: Path) -> None:
    readme = blocks(ROOT / KIT / "README.md")
    consoles = [b for b in readme if b.lang == "console"]
    assert len(consoles) == 2
    # The first python block is the kit's test module, shown whole.
    shown = next(b for b in readme if b.lang == "python")
    assert shown.text.strip() in (ROOT / KIT / "tests" / "test_kills.py").read_text()

    repo = _fresh_copy(tmp_path / "ninelives")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AGENT_", "PYTEST_", "VIRTUAL_ENV"))
        and k not in ("NINELIVES_DB", "NINELIVES_TOOLS", "PYTHONPATH")
    }
    env["HOME"] = str(tmp_path)
    outcome, problems = run_shell(consoles, repo / KIT, env, timeout=1200)
    assert problems == [], "\n".join(problems)
    torture = outcome.steps[-1]
    assert torture[0] == "ninelives torture plan.json --kills 50"
    assert "duplicates 0  lost commits 0  violations 0" in torture[2]
    assert not list((repo / KIT).glob("ninelives-torture-*"))
