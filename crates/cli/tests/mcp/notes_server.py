"""A small MCP server for the agent's tests, on the official Python SDK.

Tools: `add_note` (keeps a note in memory), `list_notes` (read-only), and
`crash`, which kills the server mid-session.
"""

import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("notes")
notes: list[str] = []


@server.tool()
def add_note(text: str) -> str:
    """Keep a note."""
    notes.append(text)
    return f"noted ({len(notes)} so far): {text}"


@server.tool()
def list_notes() -> str:
    """Every note kept so far."""
    return "\n".join(notes) or "(no notes)"


@server.tool()
def crash() -> str:
    """Stop the server at once."""
    os._exit(3)


if __name__ == "__main__":
    server.run("stdio")
