"""examples/research-agent, run as its README runs it, with no model server: the
README's console blocks as written (the stub engine killed after its first turn,
then the recorded model killed right after the post), against its own notes
service and recorded model on loopback; then what the blocks print checked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ninelives.testing import Lab
from readme_blocks import Block, blocks, run_shell

pytestmark = pytest.mark.crash

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "research-agent"
#: The addresses the README names; the test serves each on a free port instead.
NOTES_AT, MODEL_AT = "127.0.0.1:8780", "127.0.0.1:8781"


@pytest.fixture
def example(sqlite_lab: Lab) -> Lab:
    shutil.copytree(EXAMPLE, sqlite_lab.root, dirs_exist_ok=True)
    return sqlite_lab


def _serve(lab: Lab, script: str) -> Iterator[str]:
    """Start one of the example's services on a free port; yield its ``host:port``."""
    service = subprocess.Popen(
        [sys.executable, script, "0"], cwd=lab.root, stdout=subprocess.PIPE, text=True
    )
    assert service.stdout is not None
    listening = service.stdout.readline()  # printed once it listens
    assert "http://127.0.0.1:" in listening, listening
    yield listening.split("http://")[1].split("/")[0].strip()
    service.kill()
    service.wait()
    service.stdout.close()


@pytest.fixture
def notes(example: Lab) -> Iterator[str]:
    yield from _serve(example, "notes_service.py")


@pytest.fixture
def model(example: Lab) -> Iterator[str]:
    yield from _serve(example, "recorded_model.py")


def _consoles(notes: str, model: str) -> list[Block]:
    readme = blocks(EXAMPLE / "README.md")
    consoles = [b for b in readme if b.lang == "console"]
    assert len(consoles) == 2
    return [
        Block(b.lang, b.text.replace(NOTES_AT, notes).replace(MODEL_AT, model), b.line)
        for b in consoles
    ]


def _printed(steps: list[tuple[str, int, str]], command: str) -> str:
    [output] = [out for label, _, out in steps if label.startswith(command)]
    return output


@pytest.mark.slow
def test_the_readme_shows_its_claims_with_no_model_server(
    example: Lab, notes: str, model: str
) -> None:
    # What the README's set-up block exports, the notes service where the test
    # runs it (post_note's default is the README's port), one database for both sides.
    env = example.env(
        {
            "NINELIVES_TOOLS": "research_tools",
            "NOTES_URL": f"http://{notes}/notes",
            "NINELIVES_DB": example.db,
        }
    )
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    outcome, problems = run_shell(_consoles(notes, model), example.root, env)
    assert problems == [], "\n".join(problems)

    # The stub engine: the turn committed before the kill was not asked again.
    quick = json.loads(_printed(outcome.steps, "ninelives status quick --json"))
    assert (quick["status"], quick["model_calls"], quick["model_calls_saved"]) == ("done", 2, 1)

    # The recorded model, killed after the post: posted twice, one note kept ...
    listed = json.loads(_printed(outcome.steps, f"curl -s http://{notes}/notes"))
    assert listed == {"notes": [{"id": 1, "title": "Open questions"}], "posts": 2}
    # ... and no committed turn asked again (the kill was after turn 1's calls ran).
    asked = json.loads(_printed(outcome.steps, f"curl -s http://{model}/asked"))
    assert asked == {"asked": [0, 1, 2]}
    report = json.loads(_printed(outcome.steps, "ninelives status report --json"))
    assert (report["status"], report["model_calls"], report["model_calls_saved"]) == (
        "done",
        3,
        2,
    )

    # Each task's report, under the name its write_artifact step's output gives.
    published = {}
    for task in ("quick", "report"):
        snapshot = example.snapshot(task)
        [write] = [s for s in snapshot.status["steps"] if s["tool"] == "write_artifact"]
        published[task] = Path(write["output"]["path"]).name
        verified = example.cli("verify", task, "--artifacts", "artifacts")
        assert verified.returncode == 0, verified.stdout
    found = example.artifacts()
    assert set(found) == set(published.values())
    assert found[published["report"]].startswith("# Open questions\n- Storage:")
