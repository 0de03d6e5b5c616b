"""Tools of the research-agent example: list the inputs, post a note to a service.

Load them with ``--tools research_tools`` (or ``NINELIVES_TOOLS=research_tools``)
from this folder.
"""

from __future__ import annotations

import json
import os
import urllib.request

import ninelives

NOTES_URL = os.environ.get("NOTES_URL", "http://127.0.0.1:8780/notes")


@ninelives.tool("list_inputs", schema={"type": "object", "properties": {}})
def list_inputs(input, ctx):
    """The files under input/, for the model to choose from."""
    return {"files": sorted(f"input/{name}" for name in os.listdir("input"))}


@ninelives.tool(
    "post_note",
    description="Post a short note to the team's notes service.",
    schema={
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 200}},
        "required": ["title"],
        "additionalProperties": False,
    },
)
def post_note(input, ctx):
    """POST the note with the step's idempotency key: a retried step (the
    process was killed after posting, before its commit) posts the same key,
    and the service keeps one note."""
    request = urllib.request.Request(
        NOTES_URL,
        data=json.dumps({"title": input["title"]}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": ctx.idem_key},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)
