"""Workflows the workflow tests run in real processes (copied into each lab folder).

The "service" they post to keeps each effect's outcome once per idempotency key
(``outcome/<key>``) and logs every call it gets (``calls.log``): the tests
compare both, so an effect that landed twice in outcome, or a call that a
probe should have spared, shows.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import ninelives


def _log(line: str) -> None:
    with open("calls.log", "a", encoding="utf-8") as log:
        log.write(line + "\n")
        log.flush()
        os.fsync(log.fileno())


def deliver(key: str, text: str) -> dict[str, Any]:
    """The service: log the call; keep the first outcome of each key."""
    _log(f"post {key}")
    folder = Path("outcome")
    folder.mkdir(exist_ok=True)
    target = folder / key
    if not target.exists():
        tmp = folder / f".{key}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    return {"posted": target.read_text(encoding="utf-8")}


def posted(key: str) -> dict[str, Any] | None:
    target = Path("outcome") / key
    return {"posted": target.read_text(encoding="utf-8")} if target.exists() else None


@ninelives.step(name="post", max_attempts=3)
def post_note(text: str) -> dict[str, Any]:
    step = ninelives.current_step()
    assert step is not None
    return deliver(step.idem_key, text)


def _probe(ctx: Any) -> dict[str, Any] | None:
    return posted(ctx.idem_key)


@ninelives.step(name="post_once", on_unknown="probe", probe=_probe)
def post_once(text: str) -> dict[str, Any]:
    step = ninelives.current_step()
    assert step is not None
    return deliver(step.idem_key, text)


def read_ticket(ticket: str) -> dict[str, Any]:
    _log(f"read {ticket}")
    return {"text": f"ticket {ticket}\nsecond line"}


def first_line(text: str) -> str:
    return text.splitlines()[0]


@ninelives.workflow("triage")
def triage(ctx: Any, ticket: str) -> dict[str, Any]:
    t = ctx.step("read", read_ticket, ticket)
    summary = ctx.step("summarize", first_line, t["text"])
    note = post_note("summary: " + summary)
    return {"ticket": ticket, "summary": summary, "note": note["posted"]}


@ninelives.workflow("probed")
def probed(ctx: Any, ticket: str) -> dict[str, Any]:
    t = ctx.step("read", read_ticket, ticket)
    note = post_once("probed: " + t["text"])
    return {"note": note["posted"]}


async def read_later(ticket: str) -> dict[str, Any]:
    await asyncio.sleep(0)
    return read_ticket(ticket)


@ninelives.step(name="apost")
async def apost(text: str) -> dict[str, Any]:
    step = ninelives.current_step()
    assert step is not None
    await asyncio.sleep(0)
    return deliver(step.idem_key, text)


@ninelives.workflow("atriage")
async def atriage(ctx: Any, ticket: str) -> dict[str, Any]:
    t = await ctx.step("read", read_later, ticket)
    summary = await ctx.step("summarize", first_line, t["text"])
    note = await apost("summary: " + summary)
    return {"ticket": ticket, "summary": summary, "note": note["posted"]}
