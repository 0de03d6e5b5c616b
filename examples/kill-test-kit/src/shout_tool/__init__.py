"""``shout {"from": N}``: publish step N's summary in capitals, once in outcome.

The tool is called at least once per step: a run killed after the file was
published but before the step's ``done`` commit calls it again. It stays
correct by naming its file after ``idem_key`` and publishing with
:func:`ninelives.tools.effects.publish_once`, which never writes a name twice.
``SHOUT_UNSAFE=1`` appends to ``shout.log`` instead: the deliberate bug the
kill tests' negative control must catch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ninelives.errors import ToolError
from ninelives.tools.effects import artifacts_folder, publish_once


def shout(step_input: Mapping[str, Any], ctx: Mapping[int, Any], idem_key: str) -> dict[str, Any]:
    """Publish the upper-cased summary of step ``input["from"]`` as ``<idem_key>.md``."""
    source = ctx.get(step_input.get("from"))
    text = source.get("summary") if isinstance(source, Mapping) else None
    if not isinstance(text, str):
        raise ToolError(f"step {step_input.get('from')} has no summary to shout")
    data = text.upper().encode()
    folder = artifacts_folder()  # the task's own folder, recorded when it was created
    if os.environ.get("SHOUT_UNSAFE") == "1":
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "shout.log"), "ab") as log:
            log.write(data + b"\n")
        return {"path": os.path.join(folder, "shout.log")}
    step = int(idem_key.rpartition("-")[2])
    done = publish_once(folder, f"{idem_key}.md", data, step=step)
    # Record the digest and size: `ninelives verify --artifacts` checks the file against them.
    return {
        "path": done.path,
        "deduplicated": done.deduplicated,
        "sha256": done.sha256,
        "bytes": done.size,
    }
