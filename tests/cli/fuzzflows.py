"""Workflows for the fuzz tests of workflow arguments and stored outputs
(``--tools fuzzflows``; importable because pytest puts this folder on ``sys.path``)."""

from __future__ import annotations

from typing import Any

import ninelives

#: What ``emit``'s one step returns: set by the test before each run.
OUTPUT: list[Any] = [None]


@ninelives.workflow("echo")
def echo(ctx: Any, *args: Any, **kwargs: Any) -> Any:
    """One step that returns the workflow's arguments; the workflow returns them too."""
    return ctx.step("echo", lambda: {"args": list(args), "kwargs": kwargs})


@ninelives.workflow("emit")
def emit(ctx: Any) -> Any:
    """One step that returns ``OUTPUT[0]``, whatever it is."""
    return ctx.step("emit", lambda: OUTPUT[0])
