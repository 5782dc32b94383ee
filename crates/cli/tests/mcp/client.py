"""Drives cordon's MCP server with the official Python MCP SDK.

usage: client.py stdio CORDON WORKSPACE MARKER [CORDON MCP OPTIONS...]
       client.py http URL TOKEN MARKER

Runs one scenario and prints its observations as one JSON object; the Rust
test (crates/cli/tests/suite/mcp.rs) asserts on them.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def text(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


async def scenario(session, marker):
    out = {}
    init = await session.initialize()
    out["server"] = init.server_info.name
    out["instructions"] = init.instructions or ""
    tools = (await session.list_tools()).tools
    out["tools"] = sorted(t.name for t in tools)
    out["read_only"] = sorted(
        t.name for t in tools if t.annotations is not None and t.annotations.read_only_hint
    )
    out["schemas_are_objects"] = all(t.input_schema.get("type") == "object" for t in tools)

    # The shell persists between calls: directory, variables.
    await session.call_tool("bash", {"command": "mkdir -p sub && cd sub && export GREETING=hello"})
    second = await session.call_tool("bash", {"command": "echo \"$GREETING from $(pwd)\""})
    out["second_bash"] = text(second)
    out["second_bash_error"] = bool(second.is_error)
    out["structured"] = second.structured_content

    wrote = await session.call_tool("write_file", {"path": "notes/a.txt", "content": "written over mcp\n"})
    out["write_error"] = bool(wrote.is_error)
    read = await session.call_tool("read_file", {"path": "notes/a.txt"})
    out["read"] = text(read)
    out["read_error"] = bool(read.is_error)

    escape = await session.call_tool("read_file", {"path": "../../../../etc/hostname"})
    out["escape_error"] = bool(escape.is_error)
    out["escape"] = text(escape)
    absolute = await session.call_tool("write_file", {"path": "/etc/cordon-mcp-test", "content": "x"})
    out["absolute_error"] = bool(absolute.is_error)

    slow = await session.call_tool("bash", {"command": "sleep 30", "timeout": 1})
    out["timeout"] = text(slow)
    out["timeout_error"] = bool(slow.is_error)

    bad = await session.call_tool("read_file", {"nope": 1})
    out["bad_args_error"] = bool(bad.is_error)

    try:
        await session.call_tool("no_such_tool", {})
        out["unknown_tool"] = "no error"
    except Exception as e:  # a protocol error, as the spec asks
        out["unknown_tool"] = str(e)

    # Something that would outlive the connection if the sandbox did.
    kernel = await session.call_tool("bash", {"command": "uname -r"})
    # "Exit code: 0\nstdout:\n<release>\nstderr: (empty)"
    out["kernel"] = text(kernel).split("stdout:\n", 1)[-1].split("\nstderr:", 1)[0].strip()

    bg = await session.call_tool("bash", {"command": f"(sleep {marker} &) ; echo started"})
    out["background"] = text(bg)
    return out


async def main():
    mode = sys.argv[1]
    if mode == "stdio":
        cordon, workspace, marker = sys.argv[2], sys.argv[3], sys.argv[4]
        extra = sys.argv[5:]
        params = StdioServerParameters(
            command=cordon, args=["mcp", "--workspace", workspace, *extra]
        )
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                out = await scenario(session, marker)
    else:
        url, token, marker = sys.argv[2], sys.argv[3], sys.argv[4]
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with client:
            async with streamable_http_client(url, http_client=client) as streams:
                read, write = streams[0], streams[1]
                async with ClientSession(read, write) as session:
                    out = await scenario(session, marker)
    print(json.dumps(out))


asyncio.run(main())
