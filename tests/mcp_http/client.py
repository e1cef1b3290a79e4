"""One MCP client session over streamable HTTP, with the official Python SDK, for tests/mcp_http.rs.

    python client.py '<plan as JSON>'

The plan: {"url", "token", "calls": [{"tool", "arguments", "meta"?, "progress"?}],
"exit_after_progress"?: true}. The script connects with `Authorization: Bearer <token>` (none when the token is empty),
initializes, makes the calls in order and prints one JSON line per call: the `CallToolResult`
as it came over the wire, plus "progress": the notifications that arrived for the call, in
order, when the call asked for them, and "protocol": the revision the session agreed on.

With "exit_after_progress" the process ends abruptly (no session teardown, no reply read) as
soon as the first call's first progress notification arrives: a client whose connection drops
mid-call.

A session the server refuses (an HTTP 401 or 403 answer, which the SDK reports only as a
failed request) prints {"refused": <status>} and exits with status 3.
"""

import asyncio
import json
import os
import sys

from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def emit(value):
    print(json.dumps(value), flush=True)


# The HTTP statuses of the refusals the server answered with.
REFUSALS = []


async def note_refusal(response):
    if response.status_code in (401, 403):
        REFUSALS.append(response.status_code)


async def run(plan):
    # An empty token: no credentials at all.
    headers = {"Authorization": f"Bearer {plan['token']}"} if plan["token"] else {}
    async with create_mcp_http_client(headers=headers) as http_client:
        http_client.event_hooks["response"].append(note_refusal)
        async with streamable_http_client(plan["url"], http_client=http_client) as (read, write):
            async with ClientSession(read, write) as session:
                initialized = await session.initialize()
                for call in plan["calls"]:
                    progress = []

                    async def on_progress(done, total, message, progress=progress):
                        progress.append([done, total, message])
                        if plan.get("exit_after_progress"):
                            # No teardown: the connection drops as a crashed client's would.
                            os._exit(0)

                    result = await session.call_tool(
                        call["tool"],
                        call["arguments"],
                        progress_callback=on_progress if call.get("progress") else None,
                        meta=call.get("meta"),
                    )
                    reply = result.model_dump(by_alias=True, mode="json", exclude_none=True)
                    reply["progress"] = progress
                    reply["protocol"] = initialized.protocol_version
                    emit(reply)


def main():
    plan = json.loads(sys.argv[1])
    try:
        asyncio.run(run(plan))
    except BaseException:
        if REFUSALS:
            emit({"refused": REFUSALS[0]})
            sys.exit(3)
        raise


if __name__ == "__main__":
    main()
