"""Outputs stored by every path read back exactly as they were given, on both stores.

A tool's return, a fork's copy, ``resolve --done`` and a probe's answer all go
through one encoder (:func:`ninelives.journal.encode_output`): an output whose
only key is ``"$blob"`` or ``"$raw"`` is stored escaped, so it never reads back
as a blob reference or loses a layer. A fork copies the source's rows as they
are stored. Each test ends with ``verify`` clean.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ninelives.store import is_postgres_url
from ninelives.testing import Lab

pytestmark = pytest.mark.crash

TOOLS = Path(__file__).with_name("output_tools.py")
HEX = "ab" * 32
#: Outputs a reader could take for a reference or an escape, and their neighbours.
SHAPED: list[dict[str, Any]] = [
    {"$raw": {"x": 1}},
    {"$blob": {"sha256": HEX, "size": 3}},
    {"$raw": 5},
    {"$raw": {"$blob": {"sha256": HEX, "size": 3}}},
    {"$blob": "not a reference"},
    {"$raw": {"x": 1}, "y": 2},
    {"plain": {"$raw": {"x": 1}}, "é": "ü ✓"},
]


def _setup(lab: Lab, steps: list[dict[str, Any]], **env: str) -> None:
    shutil.copy(TOOLS, lab.root / "output_tools.py")
    lab.base_env.update(NINELIVES_TOOLS="output_tools", **env)
    lab.write_plan({"goal": "store what was given", "steps": steps})
    created = lab.cli("create", "t", "plan.json")
    assert created.returncode == 0, created


def _outputs(lab: Lab, task_id: str) -> list[Any]:
    shown = lab.cli("status", task_id, "--json", "--outputs")
    assert shown.returncode == 0, shown
    return [step["output"] for step in shown.json()["steps"]]


def _rows(lab: Lab, task_id: str) -> list[str | None]:
    """The stored ``steps.output`` texts, read with the backend's own driver."""
    query = "SELECT output FROM steps WHERE task_id = ? ORDER BY idx"
    if is_postgres_url(lab.db):
        import psycopg

        with psycopg.connect(lab.db, autocommit=True) as conn:
            return [row[0] for row in conn.execute(query.replace("?", "%s"), (task_id,))]
    assert lab.sqlite_path is not None
    conn = sqlite3.connect(lab.sqlite_path)
    try:
        return [row[0] for row in conn.execute(query, (task_id,))]
    finally:
        conn.close()


def _clean(lab: Lab) -> None:
    verified = lab.cli("verify", "--all")
    assert verified.returncode == 0, (verified.stdout, verified.stderr)


@pytest.mark.parametrize("threshold", ["65536", "0"], ids=["in-row", "blobs"])
def test_fork_copies_outputs_as_they_are_stored(lab: Lab, threshold: str) -> None:
    """Shaped outputs of a tool, then a fork from the last step: the fork's
    outputs are the tool's, and its rows the source's, byte for byte (with
    every output in the blob store too: the references are copied)."""
    steps = [{"tool": "echo", "input": {"output": out}} for out in SHAPED]
    _setup(lab, [*steps, {"tool": "echo", "input": {"output": {"last": True}}}],
           NINELIVES_BLOB_THRESHOLD=threshold)  # fmt: skip
    assert lab.cli("run", "t").returncode == 0
    assert _outputs(lab, "t")[: len(SHAPED)] == SHAPED
    forked = lab.cli("fork", "t", "f", "--from", str(len(SHAPED)))
    assert forked.returncode == 0, forked
    assert _outputs(lab, "f")[: len(SHAPED)] == SHAPED
    assert _rows(lab, "f")[: len(SHAPED)] == _rows(lab, "t")[: len(SHAPED)]
    assert lab.cli("run", "f").returncode == 0
    assert _outputs(lab, "f") == _outputs(lab, "t")
    _clean(lab)


@pytest.mark.parametrize("given", SHAPED[:4], ids=["raw", "blob", "raw-scalar", "raw-blob"])
def test_resolve_done_stores_the_output_as_given(lab: Lab, given: dict[str, Any]) -> None:
    """``resolve --done`` with a shaped output: exit 0, the task stays readable
    and its step reads back exactly what was said; the task then finishes."""
    _setup(lab, [{"tool": "refused", "input": {}}, {"tool": "echo", "input": {"output": {}}}])
    killed = lab.cli("run", "t", AGENT_CRASH_AT="after_effect:0")
    assert killed.returncode == -9, killed
    assert lab.cli("run", "t").returncode == 8
    resolved = lab.cli("resolve", "t", "0", "--done", json.dumps(given))
    assert resolved.returncode == 0, resolved
    assert _outputs(lab, "t")[0] == given
    assert lab.cli("run", "t").returncode == 0
    assert _outputs(lab, "t") == [given, {}]
    _clean(lab)


@pytest.mark.parametrize("given", SHAPED[:4], ids=["raw", "blob", "raw-scalar", "raw-blob"])
def test_a_probe_answer_is_stored_as_given(lab: Lab, given: dict[str, Any]) -> None:
    """A step killed after its effect, reconciled by a probe whose answer is
    shaped: the step reads back that answer, and the task is done."""
    _setup(lab, [{"tool": "probed", "input": {}}])
    (lab.root / "probe-answer.json").write_text(json.dumps(given), encoding="utf-8")
    killed = lab.cli("run", "t", AGENT_CRASH_AT="after_effect:0")
    assert killed.returncode == -9, killed
    resumed = lab.cli("run", "t")
    assert resumed.returncode == 0, resumed
    assert _outputs(lab, "t") == [given]
    assert "step_reconciled" in [e["kind"] for e in lab.cli("export", "t").jsonl()]
    _clean(lab)
