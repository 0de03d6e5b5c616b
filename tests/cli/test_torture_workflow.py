"""``ninelives torture --workflow NAME --args JSON``: random SIGKILLs on fresh tasks of a
workflow, then the verdict, as for a plan. The negative control's publishing step
appends instead of publishing once: torture must report the duplicates and exit 7."""

from __future__ import annotations

import re

import pytest
from test_torture_command import _counts

from ninelives.testing import Lab

pytestmark = pytest.mark.crash

FLOWS = '''
"""A workflow torture runs: read the notes, shout them, publish them."""
import hashlib
import os
import time

import ninelives
from ninelives.tools.effects import artifacts_folder, publish_once


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


@ninelives.step(name="publish")
def publish(text):
    step = ninelives.current_step()
    data = text.encode()
    folder = artifacts_folder()
    if os.environ.get("TFLOW_UNSAFE") == "1":  # the deliberate bug: append, then linger
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{step.idem_key}.md")
        with open(path, "ab") as fh:
            fh.write(data)
        time.sleep(0.4)
        return {"path": path, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    done = publish_once(folder, f"{step.idem_key}.md", data, step=step.step)
    return {"path": done.path, "sha256": done.sha256, "bytes": done.size}


@ninelives.workflow("notes")
def notes(ctx, path):
    text = ctx.step("read", read, path)
    loud = ctx.step("shout", str.upper, text)
    return publish(loud)
'''
ARGS = '["input/notes.txt"]'


@pytest.fixture
def flows(sqlite_lab: Lab) -> Lab:
    sqlite_lab.guide_setup()
    sqlite_lab.write("tflows.py", FLOWS)
    return sqlite_lab


def test_a_workflow_survives_random_kills(flows: Lab) -> None:
    result = flows.cli(
        "--tools", "tflows", "torture", "--workflow", "notes", "--args", ARGS,
        "--kills", "10", "--seed", "11", "--dir", "t",
    )  # fmt: skip
    assert result.returncode == 0, result
    replay = (
        "ninelives torture --workflow notes --args '[\"input/notes.txt\"]' --kills 10 --seed 11"
    )
    assert f"seed 11 (replay: {replay})" in result.stdout
    counts = _counts(result.stdout)
    assert counts["kills"] == 10
    assert counts["duplicates"] == counts["lost"] == counts["violations"] == 0
    assert counts["recoveries"] >= 1, result.stdout  # the kills reached the steps
    folder = flows.root / "t"
    verify = flows.cli(
        "--db",
        str(folder / "state.db"),
        "verify",
        "--all",
        "--artifacts",
        str(folder / "artifacts"),
    )
    assert verify.returncode == 0, verify
    # Every task a workflow task, each published once under its publishing step's key.
    status = flows.cli("--db", str(folder / "state.db"), "status", "calibration", "--json").json()
    assert status["workflow"] == "notes"
    assert [s["tool"] for s in status["steps"]] == ["read", "shout", "publish"]
    names = {p.name for p in (folder / "artifacts").iterdir()}
    assert "calibration-2.md" in names
    assert all(re.fullmatch(r"(calibration|torture-0-\d+)-2\.md", n) for n in names), names


def test_negative_control_duplicates_of_a_workflow_step_are_found(flows: Lab) -> None:
    result = flows.cli(
        "--tools", "tflows", "torture", "--workflow", "notes", "--args", ARGS,
        "--kills", "10", "--seed", "3", "--dir", "t", "-q", TFLOW_UNSAFE="1",
    )  # fmt: skip
    assert result.returncode == 7, result
    assert _counts(result.stdout)["duplicates"] >= 1, result.stdout
    assert "replay with --seed 3" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--workflow", "nope"),  # not defined in the module
        ("--workflow", "notes", "--args", "[NaN]"),
        ("--workflow", "notes", "--args", "[1e999]"),
        ("--workflow", "notes", "--args", "not json"),
        ("--workflow", "notes", "--args", '"a string"'),
        ("plan.json", "--workflow", "notes"),  # both
        (),  # neither
        ("--workflow", "notes", "--kills", "-1"),
    ],
)
def test_bad_input(flows: Lab, args: tuple[str, ...]) -> None:
    assert flows.cli("create", "keep", "plan.json").returncode == 0
    before = flows.fingerprint("keep")
    result = flows.cli("--tools", "tflows", "torture", *args)
    assert result.returncode == 4, result
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert flows.fingerprint("keep") == before
    assert not [p for p in flows.root.iterdir() if p.name.startswith("ninelives-torture")]


def test_verify_checks_the_files_a_workflow_step_published(flows: Lab) -> None:
    """A workflow step's output is ``{"value": ...}``: ``verify --artifacts`` must read
    the published file's record inside it, as it reads a tool's."""
    created = flows.cli("--tools", "tflows", "create", "w", "--workflow", "notes", "--args", ARGS)
    assert created.returncode == 0, created
    assert flows.cli("--tools", "tflows", "run", "w").returncode == 0
    assert flows.cli("verify", "w", "--artifacts", "artifacts").returncode == 0  # control
    (flows.root / "artifacts" / "w-2.md").write_text("NOT WHAT WAS PUBLISHED", encoding="utf-8")
    tampered = flows.cli("verify", "w", "--artifacts", "artifacts")
    assert tampered.returncode == 7, tampered
    assert "artifact_content" in tampered.stdout
    (flows.root / "artifacts" / "w-2.md").unlink()
    missing = flows.cli("verify", "w", "--artifacts", "artifacts")
    assert missing.returncode == 7, missing
    assert "w-2.md" in missing.stdout
