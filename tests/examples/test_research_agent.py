"""examples/research-agent, run as its README runs it: against the stub engine,
and against a loopback model server with its notes service, killed after the
post and resumed."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from ninelives.testing import Lab
from ninelives.testing.fakellm import Turn, fake_model_server

pytestmark = pytest.mark.crash

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "research-agent"
REPORT = "# Open questions\n- output size\n- lease length\n- local model"
SCRIPT = (
    Turn(calls=[("fetch", {"path": f"input/{n}.md"}) for n in ("alpha", "beta", "gamma")]),
    Turn(
        calls=[
            ("write_artifact", {"name": "report.md", "text": REPORT}),
            ("post_note", {"title": "Open questions"}),
        ]
    ),
    Turn(text="The report is published and the note posted."),
)
POST_STEP = 7  # 0 list_inputs, 1 turn, 2-4 fetch, 5 turn, 6 write_artifact, 7 post_note, 8 turn


@pytest.fixture
def example(sqlite_lab: Lab) -> Lab:
    shutil.copytree(EXAMPLE, sqlite_lab.root, dirs_exist_ok=True)
    sqlite_lab.base_env["NINELIVES_TOOLS"] = "research_tools"
    return sqlite_lab


@pytest.fixture
def notes(example: Lab) -> Iterator[str]:
    from pgcluster import free_port

    port = free_port()
    service = subprocess.Popen(
        [sys.executable, "notes_service.py", str(port)], cwd=example.root, stdout=subprocess.PIPE
    )
    assert service.stdout is not None
    service.stdout.readline()  # listening
    url = f"http://127.0.0.1:{port}/notes"
    example.base_env["NOTES_URL"] = url
    yield url
    service.kill()
    service.wait()
    service.stdout.close()


def listed(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=5) as response:
        return dict(json.load(response))


def test_the_example_runs_on_the_stub_engine(example: Lab) -> None:
    assert example.cli("create", "report", "plan.json").returncode == 0
    result = example.cli("run", "report")
    assert result.returncode == 0, result.stderr
    [name] = example.artifacts()
    assert name == "report-2+report.md"
    assert example.cli("verify", "report", "--artifacts", "artifacts").returncode == 0


def test_killed_after_the_post_the_note_is_kept_once(example: Lab, notes: str) -> None:
    assert example.cli("create", "report", "plan.json").returncode == 0
    with fake_model_server(*SCRIPT, by_turn=True) as fake:
        env = {"NINELIVES_LLM": "ollama", "NINELIVES_LLM_URL": fake.url, "NINELIVES_LLM_MODEL": "m"}
        killed = example.cli("run", "report", AGENT_CRASH_AT=f"after_effect:{POST_STEP}", **env)
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        resumed = example.cli("run", "report", **env)
        assert resumed.returncode == 0, resumed.stderr
        assert fake.turns() == [0, 1, 2]  # no committed turn asked twice
    seen = listed(notes)
    assert seen["posts"] == 2  # the killed attempt posted, and so did its retry ...
    assert seen["notes"] == [{"id": 1, "title": "Open questions"}]  # ... under one key
    assert example.artifacts() == {"report-6+report.md": REPORT}
    status = example.cli("status", "report", "--json").json()
    assert status["status"] == "done"
    assert status["model_calls"] == 3
    assert status["model_calls_saved"] == 2
    assert example.cli("verify", "report", "--artifacts", "artifacts").returncode == 0
