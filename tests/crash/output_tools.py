"""Tools that store the output a test chooses, for the stored-output tests.

Loaded by the CLI under test with ``NINELIVES_TOOLS=output_tools`` (the test
copies this file into the lab folder). ``echo`` returns its input's ``output``
as its own; ``probed`` has a probe that answers with the JSON in
``probe-answer.json``, as a service asked "did this key's effect happen?" would.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ninelives.tools import ToolContext, tool


@tool("echo")
def echo(step_input: Mapping[str, Any], ctx: ToolContext) -> Any:
    return step_input["output"]


def _answer(ctx: ToolContext) -> Any:
    return json.loads(Path("probe-answer.json").read_text(encoding="utf-8"))


@tool("probed", on_unknown="probe", probe=_answer)
def probed(step_input: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"ran": ctx.idem_key}


@tool("refused", on_unknown="refuse")
def refused(step_input: Mapping[str, Any], ctx: ToolContext) -> dict[str, Any]:
    return {"ran": ctx.idem_key}
