"""Tools whose effect is counted outside the process, for the unknown-outcome tests.

Loaded by the CLI under test with ``NINELIVES_TOOLS=effect_tools`` (the lab copies
this file into its folder). Each ``charge_*`` tool appends its idempotency key
to ``effects.log`` (fsynced: the count survives SIGKILL) and leaves a marker
file named by the key, which the probes look for, as a payment service's
"find the charge by its idempotency key" would.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from typing import Any

from ninelives.errors import ToolError
from ninelives.tools import ToolContext, tool

LOG = "effects.log"


def _charge(ctx: ToolContext) -> dict[str, Any]:
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{ctx.idem_key}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    with open(f"charged-{ctx.idem_key}", "w", encoding="utf-8") as marker:
        marker.write("1")
    return {"charged": ctx.idem_key}


def _probe(ctx: ToolContext) -> Mapping[str, Any] | None:
    if os.path.exists("probe-unsure"):
        raise ToolError("the payment service does not answer")
    if os.path.exists(f"charged-{ctx.idem_key}"):
        return {"charged": ctx.idem_key, "reconciled": True}
    return None


def _liar(ctx: ToolContext) -> Mapping[str, Any] | None:
    return None  # the negative control: a probe that never finds the effect


def _fatal_probe(ctx: ToolContext) -> Mapping[str, Any] | None:
    os.kill(os.getpid(), signal.SIGKILL)  # asking kills the process (out of memory, a crash)
    return None


@tool("charge_fatal_probe", on_unknown="probe", probe=_fatal_probe)
def charge_fatal_probe(step_input: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return _charge(ctx)


@tool("charge_rerun")
def charge_rerun(step_input: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return _charge(ctx)


@tool("charge_probe", on_unknown="probe", probe=_probe)
def charge_probe(step_input: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return _charge(ctx)


@tool("charge_refuse", on_unknown="refuse")
def charge_refuse(step_input: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return _charge(ctx)


@tool("charge_liar", on_unknown="probe", probe=_liar)
def charge_liar(step_input: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return _charge(ctx)


def _slow_probe(ctx: ToolContext) -> Mapping[str, Any] | None:
    """Says it is asking, then waits until the test lets it answer (``probe-go``)."""
    with open("probing", "w", encoding="utf-8") as marker:
        marker.write("1")
    deadline = time.monotonic() + 30
    while not os.path.exists("probe-go") and time.monotonic() < deadline:
        time.sleep(0.02)
    return _probe(ctx)


@tool("charge_slow_probe", on_unknown="probe", probe=_slow_probe)
def charge_slow_probe(step_input: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return _charge(ctx)
