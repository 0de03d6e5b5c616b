"""The built-in ``approval`` tool: its step waits for a person.

The runner never calls it: it parks the step ``waiting``
(:func:`ninelives.runtime.waits.wait_for_approval`) and ``ninelives approve``
decides it (:mod:`ninelives.runtime.decisions`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import PlanError, ToolError
from ..models import APPROVAL_TOOL
from . import Tool


def _check_approval(step_input: Mapping[str, Any]) -> None:
    prompt = step_input.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise PlanError("input needs 'prompt', a non-empty string: what the person decides")


def _never_run(step_input: Mapping[str, Any], ctx: Mapping[int, Any], key: str) -> dict[str, Any]:
    raise ToolError("an approval step is decided by 'ninelives approve', never run")


def make_approval() -> Tool:
    """The built-in ``approval`` tool: ``{"prompt": "..."}``; its step waits for a person."""
    return Tool(
        name=APPROVAL_TOOL, fn=_never_run, validate=_check_approval,
        description="wait for a person to approve (ninelives approve TASK STEP)",
    )  # fmt: skip
