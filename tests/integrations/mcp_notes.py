"""An MCP server over stdio with one tool, ``post_note``, that logs each run of it."""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")


@server.tool()
def post_note(text: str) -> str:
    """Post a note."""
    with open(os.environ["NOTES_LOG"], "a", encoding="utf-8") as f:
        f.write("tool:post_note\n")
    return f"posted {text}"


if __name__ == "__main__":
    server.run()
