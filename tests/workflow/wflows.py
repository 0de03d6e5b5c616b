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


@ninelives.workflow("gated")
def gated(ctx: Any, ticket: str) -> dict[str, Any]:
    t = ctx.step("read", read_ticket, ticket)
    decision = ctx.approval("review", prompt=f"post a note for {ticket}?")
    note = post_note("approved: " + t["text"])
    return {"decision": decision, "note": note["posted"]}


@ninelives.workflow("asking")
def asking(ctx: Any, ticket: str) -> dict[str, Any]:
    decision = ctx.approval("review", f"post a note for {ticket}?", on_reject="answer")
    if not decision["approved"]:
        return {"decision": decision, "note": None}
    return {"decision": decision, "note": post_note("approved: " + ticket)["posted"]}


@ninelives.workflow("napping")
def napping(ctx: Any, seconds: float) -> dict[str, Any]:
    start = ctx.now()
    ctx.sleep(seconds)
    woke = ctx.now()
    note = post_note("woke")
    return {"slept": woke - start, "note": note["posted"], "id": ctx.uuid(), "r": ctx.random()}


@ninelives.workflow("anapping")
async def anapping(ctx: Any, seconds: float) -> dict[str, Any]:
    start = await ctx.now()
    await ctx.sleep(seconds)
    decision = await ctx.approval("review")
    woke = await ctx.now()
    return {"slept": woke - start, "decision": decision}


def big(n: int) -> str:
    _log(f"big {n}")
    return "x" * n


@ninelives.workflow("blobby")
def blobby(ctx: Any, n: int) -> dict[str, Any]:
    value = ctx.step("big", big, n)
    note = post_note(f"len {len(value)}")
    return {"len": len(value), "note": note["posted"]}


@ninelives.workflow("recurse")
def recurse(ctx: Any, n: int) -> Any:
    ctx.step("s", first_line, f"{n}")
    return recurse.call(ctx, n + 1)


@ninelives.workflow("threaded")
def threaded(ctx: Any) -> dict[str, Any]:
    import threading

    errors: list[str] = []

    def other() -> None:
        try:
            ctx.step("t", first_line, "a")
        except Exception as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    return {"errors": errors}


def dawdle(seconds: float) -> float:
    """Wait until the test writes ``release`` (at most ``seconds``): the test
    cancels first, so the cancel always lands while this step runs."""
    import os
    import time

    deadline = time.monotonic() + seconds
    while not os.path.exists("release") and time.monotonic() < deadline:
        time.sleep(0.05)
    return seconds


@ninelives.workflow("slowpoke")
def slowpoke(ctx: Any, seconds: float) -> dict[str, Any]:
    ctx.step("dawdle", dawdle, seconds)
    note = post_note("after the wait")
    return {"note": note["posted"]}


@ninelives.workflow("dozing")
def dozing(ctx: Any, seconds: float) -> dict[str, Any]:
    ctx.sleep(seconds)
    note = post_note("after the sleep")
    return {"note": note["posted"]}
