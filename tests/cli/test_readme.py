"""Every command and program of README.md and of the docs pages, run as written.

The pages are README.md, then every page of the site in the order of
``mkdocs.yml``'s ``nav`` (a reader's order: the getting-started page makes the
files the guides use). ``sh`` and ``console`` blocks run in one bash process, in
that order, starting in a copy of ``examples/demo`` with the installed
``ninelives`` first on the PATH and no ``AGENT_*``/``NINELIVES_DB`` from the
parent; ``python`` blocks run as scripts (twice) in a folder holding the demo's
``plan.json`` and ``input/notes.txt``; ``json`` blocks must be valid plans. A
few blocks run elsewhere, each listed in :data:`ELSEWHERE` with where; a block
that is neither run here nor listed fails the test, so a new block is tested
from the day it is written.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ninelives.plan import plan_from_dict, validate
from ninelives.settings import Settings
from ninelives.tools.builtin import default_registry
from readme_blocks import Block, blocks, run_shell

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = ROOT / "mkdocs.yml"
DOCS = ROOT / "docs"

#: Blocks run by something other than this test, by their first line.
ELSEWHERE = {
    "make demo   # create a task, SIGKILL it mid-step, resume it, print its journal and its one "
    "artifact": "make test runs make demo in a fresh copy (scripts/check-install.sh)",
    "pip install .                   # in a checkout; the SQLite core has no dependency": (
        "make test builds the wheel and installs it in a fresh virtualenv"
    ),
    "pip install .                          # in a checkout; the SQLite core has no dependency": (
        "make test builds the wheel and installs it in a fresh virtualenv"
    ),
    "$ ninelives ui --port 8765 &": "tests/cli/test_ui.py starts the view and reads every page",
    "$ ninelives export demo --format otlp-json \\": (
        "tests/cli/test_export_formats.py posts it with curl to an OTLP/HTTP receiver on 127.0.0.1"
    ),
    "pip install '.[postgres]'         # in a checkout: psycopg 3, imported only by this backend": (
        "the suite's own PostgreSQL cluster (tests/pgcluster.py) stands in for this server"
    ),
    "from agents import Agent, Runner": (
        "examples/openai-agents-agent is this agent, run by "
        "tests/examples/test_framework_examples.py"
    ),
}
#: Data shown, not run: schema sketches, configuration fragments, diagrams.
DATA_LANGS = {"sql", "toml", ""}
POSTGRES_FIRST_LINE = "export NINELIVES_DB=postgresql://localhost/ninelives"


def pages() -> list[Path]:
    """README.md, then the site's pages in ``nav`` order (read without a YAML parser:
    each page is a ``Title: path.md`` line of ``nav``)."""
    nav = MKDOCS.read_text(encoding="utf-8").partition("\nnav:\n")[2]
    found = re.findall(r"^\s+- (?:[^:\n]+: )?(\S+\.md)\s*$", nav, re.M)
    return [ROOT / "README.md", *(DOCS / name for name in found)]


def _env(tmp: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AGENT_") and k not in ("NINELIVES_DB", "NINELIVES_TOOLS")
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp)
    return env


def _all() -> list[Block]:
    return [b for page in pages() for b in blocks(page, str(page.relative_to(ROOT)))]


def _shell(postgres: bool) -> list[Block]:
    chosen = []
    for block in _all():
        if block.lang not in ("sh", "console") or block.first in ELSEWHERE:
            continue
        if block.first.startswith(POSTGRES_FIRST_LINE) != postgres and not _makes_files(block):
            continue
        chosen.append(block)
    return chosen


def _makes_files(block: Block) -> bool:
    return block.first.startswith("mkdir -p quickstart/input")


def test_every_page_is_in_the_nav_once() -> None:
    # A page left out of nav would not be built in order, nor its blocks run here.
    listed = [p.relative_to(DOCS).as_posix() for p in pages()[1:]]
    assert len(listed) == len(set(listed)), "a page is listed twice in mkdocs.yml's nav"
    on_disk = sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))
    assert sorted(listed) == on_disk


def test_every_block_is_run_or_accounted_for() -> None:
    found = _all()
    assert any(b.source.startswith("docs/") for b in found), "no docs page was read"
    run = {b.where for b in _shell(False)} | {b.where for b in _shell(True)}
    for block in found:
        handled = (
            block.where in run
            or block.first in ELSEWHERE
            or block.lang in ("python", "json")
            or block.lang in DATA_LANGS
        )
        assert handled, f"{block.where}: a {block.lang!r} block nothing runs"
    assert set(ELSEWHERE) <= {b.first for b in found}, "ELSEWHERE names a block that is gone"


@pytest.mark.slow
def test_the_shell_blocks_work_as_written(tmp_path: Path) -> None:
    work = _folder(tmp_path, "work")
    outcome, problems = run_shell(_shell(False), work, _env(tmp_path))
    assert problems == [], "\n".join(problems)
    assert sorted(os.listdir(work / "artifacts")) == ["demo-2.md"]  # the README's own task
    folder = work / "quickstart"
    assert sorted(os.listdir(folder / "artifacts")) == ["demo-2.md", "replay-2.md"]
    labels = [label for label, _, _ in outcome.steps]
    assert any(label.startswith("AGENT_CRASH_AT=after_effect:2") for label in labels)


@pytest.mark.postgres
def test_the_postgresql_block_works_as_written(tmp_path: Path, pg_database: str) -> None:
    parts = []
    chosen = _shell(True)
    assert [b.first.startswith(POSTGRES_FIRST_LINE) for b in chosen] == [False, True]
    for block in chosen:
        if block.first.startswith(POSTGRES_FIRST_LINE):
            # The one change: the suite's server instead of the reader's own.
            text = block.text.replace("postgresql://localhost/ninelives", pg_database, 1)
            block = Block(block.lang, text, block.line, block.source)
        parts.append(block)
    _, problems = run_shell(parts, tmp_path, _env(tmp_path))
    assert problems == [], "\n".join(problems)


def test_the_json_blocks_are_valid_plans() -> None:
    tools = default_registry(Settings())
    plans = [b for b in _all() if b.lang == "json"]
    assert {b.source for b in plans} >= {"README.md", "docs/guides/plans-and-tools.md"}
    for block in plans:
        try:
            validate(plan_from_dict(json.loads(block.text)), tools.lookup)
        except Exception as exc:
            raise AssertionError(f"{block.where}: not a valid plan: {exc}") from exc


def _python_blocks() -> list[Block]:
    # A program shown twice (the README's examples are also in a guide) runs once.
    chosen: dict[str, Block] = {}
    for b in _all():
        if b.lang == "python" and b.first not in ELSEWHERE:
            chosen.setdefault(b.text, b)
    return list(chosen.values())


def _python(code: str, cwd: Path, tmp: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = _env(tmp)
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip


def _folder(tmp: Path, name: str) -> Path:
    folder = tmp / name
    shutil.copytree(ROOT / "examples" / "demo", folder)
    return folder


@pytest.mark.parametrize("block", _python_blocks(), ids=lambda b: b.where)
def test_each_python_block_runs_as_written(block: Block, tmp_path: Path) -> None:
    folder = _folder(tmp_path, "work")
    first = _python(block.text, folder, tmp_path)
    assert first.returncode == 0, f"{block.where}:\n{first.stderr}"
    assert "Traceback" not in first.stderr
    again = _python(block.text, folder, tmp_path)  # a second run must work too
    assert again.returncode == 0, f"{block.where}, second run:\n{again.stderr}"


def test_the_library_example_resumes_after_a_kill(tmp_path: Path) -> None:
    block = next(b for b in _python_blocks() if 'rt.submit("demo"' in b.text)
    folder = _folder(tmp_path, "killed")
    killed = _python(block.text, folder, tmp_path, AGENT_CRASH_AT="after_effect:2")
    assert killed.returncode == -9, killed.stderr
    resumed = _python(block.text, folder, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "'status': 'done'" in resumed.stdout
    assert "step_recovered 2" in resumed.stdout
    assert sorted(os.listdir(folder / "artifacts")) == ["demo-2.md"]


def test_the_readme_workflow_resumes_after_a_kill(tmp_path: Path) -> None:
    # The README's durable-code example says a rerun after a kill finds the stored task.
    block = next(b for b in _python_blocks() if '@ninelives.workflow("headline")' in b.text)
    folder = _folder(tmp_path, "killed")
    killed = _python(block.text, folder, tmp_path, AGENT_CRASH_AT="after_effect:1")
    assert killed.returncode == -9, killed.stderr
    resumed = _python(block.text, folder, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "artifacts/headline-1-1.md" in resumed.stdout
    assert sorted(os.listdir(folder / "artifacts")) == ["headline-1-1.md"]
    published = (folder / "artifacts" / "headline-1-1.md").read_text(encoding="utf-8")
    assert published == (folder / "input" / "notes.txt").read_text().splitlines()[0].upper()
