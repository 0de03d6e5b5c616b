"""The guide's three tools, written once and run unchanged by every system of ``peers.py``.

``fetch`` reads a file of the working directory, ``summarize`` keeps its first
three non-empty lines (the stub engine's rule), ``publish`` writes an artifact
exactly once in outcome (a temporary file, fsync, rename, fsync of the folder;
the same content already at the name is left alone). Each system wraps these
same functions in its own form: ninelives tools (``register`` below, also what
``ninelives --tools peertools`` loads), a ninelives workflow (``peer_summary``),
DBOS steps, LangGraph nodes and tasks, the minimal reference's plain calls.
``CALLS`` counts the calls in this process.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

import ninelives

NOTES = "Line one\n\n  Line two  \nLine three\nLine four\n"
SUMMARY = "Line one\nLine two\nLine three"
INPUT = "input/notes.txt"
ARTIFACTS = "artifacts"
CALLS = {"fetch": 0, "summarize": 0, "publish": 0}


def fetch(path: str) -> dict[str, Any]:
    """The UTF-8 text of ``path``, its length and SHA-256."""
    CALLS["fetch"] += 1
    with open(path, "rb") as f:
        data = f.read()
    text = data.decode("utf-8")
    return {"chars": len(text), "sha256": hashlib.sha256(data).hexdigest(), "text": text}


def summarize(text: str) -> dict[str, Any]:
    """The first three non-empty lines of ``text``, stripped."""
    CALLS["summarize"] += 1
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return {"summary": "\n".join(lines[:3]), "engine": "stub"}


def publish(folder: str, name: str, text: str) -> dict[str, Any]:
    """Publish ``text`` as ``folder/name`` durably; a second call with it changes nothing."""
    CALLS["publish"] += 1
    data = text.encode()
    final = os.path.join(folder, name)
    try:
        with open(final, "rb") as f:
            if f.read() == data:
                return {"path": final, "deduplicated": True, "bytes": len(data)}
    except FileNotFoundError:
        pass
    tmp = os.path.join(folder, f".{name}.{os.urandom(6).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return {"path": final, "deduplicated": False, "bytes": len(data)}


# -- the same three functions as ninelives tools ------------------------------------

PLAN: dict[str, Any] = {
    "goal": "Summarize notes into a report",
    "steps": [
        {"tool": "peer_fetch", "input": {"path": INPUT}},
        {"tool": "peer_summarize", "input": {"from": 0}},
        {"tool": "peer_publish", "input": {"from": 1}},
    ],
}


def _fetch(step_input: Mapping[str, Any], ctx: Mapping[int, Any], idem_key: str) -> Any:
    return fetch(step_input["path"])


def _summarize(step_input: Mapping[str, Any], ctx: Mapping[int, Any], idem_key: str) -> Any:
    return summarize(ctx[step_input["from"]]["text"])


def _publish(step_input: Mapping[str, Any], ctx: Mapping[int, Any], idem_key: str) -> Any:
    return publish(ARTIFACTS, f"{idem_key}.md", ctx[step_input["from"]]["summary"])


def register(registry: Any) -> None:
    """Add the three tools to a ninelives registry (``--tools peertools``)."""
    registry.register("peer_fetch", _fetch)
    registry.register("peer_summarize", _summarize)
    registry.register("peer_publish", _publish)


# -- and as a ninelives workflow ------------------------------------------------------


@ninelives.step(name="publish")
def publish_step(text: str) -> dict[str, Any]:
    """``publish`` as a durable step, named after its idempotency key as the tool is."""
    step = ninelives.current_step()
    assert step is not None, "publish_step runs as a step of peer_summary"
    return publish(ARTIFACTS, f"{step.idem_key}.md", text)


@ninelives.workflow("peer_summary")
def peer_summary(ctx: Any, path: str) -> dict[str, Any]:
    """The plan's three steps as code: two ``ctx.step`` calls and a decorated step."""
    fetched = ctx.step("fetch", fetch, path)
    summary = ctx.step("summarize", summarize, fetched["text"])
    return publish_step(summary["summary"])
