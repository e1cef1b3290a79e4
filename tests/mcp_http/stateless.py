"""Calls over streamable HTTP with the official Python SDK's `Client`, which speaks the
2026-07-28 protocol (it probes `server/discover`): no session, every request on its own, for
tests/mcp_http.rs.

    python stateless.py '<plan as JSON>'

The plan: {"url", "token", "calls": [{"tool", "arguments", "meta"?}]}. Each call is made by a
client of its own, connected for it and closed after it, as a client retrying after a dropped
connection makes it; the script prints one JSON line per call: the `CallToolResult` as it came
over the wire, plus "protocol": the version the client spoke.
"""

import asyncio
import json
import sys

from mcp.client.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


async def run(plan):
    headers = {"Authorization": f"Bearer {plan['token']}"}
    for call in plan["calls"]:
        async with create_mcp_http_client(headers=headers) as http:
            async with Client(streamable_http_client(plan["url"], http_client=http), mode="auto") as client:
                result = await client.call_tool(call["tool"], call["arguments"], meta=call.get("meta"))
                reply = result.model_dump(by_alias=True, mode="json", exclude_none=True)
                reply["protocol"] = client.protocol_version
                print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    asyncio.run(run(json.loads(sys.argv[1])))
