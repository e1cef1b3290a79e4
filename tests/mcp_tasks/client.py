"""One MCP client over streamable HTTP, with the official Python SDK, for tests/mcp_tasks.rs.

    python client.py '<plan as JSON>'

The SDK's `Client` speaks the 2026-07-28 protocol (it probes `server/discover`). It has no
Tasks support of its own; it has an extension API, and `Tasks` below is the Tasks extension
(SEP-2663) written on it: the client declares `io.modelcontextprotocol/tasks` in every
request's capabilities, and a `tools/call` answered with a task (`resultType: "task"`) is
polled with `tasks/get` until the task ends.

The plan: {"url", "token", "read_timeout": seconds, "tasks": bool, "call": {"tool",
"arguments"}, "resolve"?: bool, "hold"?: bool, "pollers"?: [{"url", "token"}]}. The script
prints one JSON line per event:

- with "resolve", the SDK resolves the task itself (`Client.call_tool`): {"result": the final
  CallToolResult, "task": its id, "statuses": what each poll said};
- else {"result": ...} when the call was answered at once, or {"task": the CreateTaskResult};
  then, with "hold", it waits for a line on stdin (the test restarts the server meanwhile);
  then each poller, in its own session with its own token, polls the task until it ends:
  {"poller": i, "statuses": [...], "result": ...}, or {"poller": i, "error": {"code",
  "message"}} when the server refuses to say.
"""

import asyncio
import json
import sys
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp.client.client import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, Field

TASKS = "io.modelcontextprotocol/tasks"
TERMINAL = ("completed", "failed", "cancelled")


def emit(value):
    print(json.dumps(value), flush=True)


class TaskHandle(types.Result):
    """SEP-2663 `CreateTaskResult`: a task in lieu of the call's result."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"] = Field(alias="resultType")
    task_id: str
    status: str
    poll_interval_ms: int | None = None


class TaskParams(types.RequestParams):
    task_id: str


class GetTask(types.Request[TaskParams, Literal["tasks/get"]]):
    """SEP-2663 `tasks/get`; its task id also goes in the `Mcp-Name` header."""

    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"


class DetailedTask(types.Result):
    """SEP-2663 `GetTaskResult`: the task, with its result or error once it ended."""

    model_config = ConfigDict(extra="allow")
    task_id: str
    status: str
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


# What the SDK's own resolution saw: the task's id and each poll's status.
RESOLVED: dict[str, Any] = {"statuses": []}


async def poll(session, task_id, statuses):
    """Polls `task_id` until it ends; its last state."""
    while True:
        task = await session.send_request(GetTask(params=TaskParams(task_id=task_id)), DetailedTask)
        statuses.append(task.status)
        if task.status in TERMINAL:
            return task
        await anyio.sleep((task.poll_interval_ms or 100) / 1000)


async def resolve(handle: TaskHandle, ctx: ClaimContext) -> types.CallToolResult:
    RESOLVED["task"] = handle.task_id
    task = await poll(ctx.session, handle.task_id, RESOLVED["statuses"])
    if task.status != "completed":
        raise RuntimeError(f"task ended {task.status}: {task.error}")
    return types.CallToolResult.model_validate(task.result)


class Tasks(ClientExtension):
    identifier = TASKS

    def claims(self):
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=resolve)]


def client(url, http, plan, tasks):
    return Client(
        streamable_http_client(url, http_client=http),
        mode="auto",
        read_timeout_seconds=plan.get("read_timeout"),
        extensions=[Tasks()] if tasks else None,
    )


def dump(result):
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def run_poller(index, url, token, task_id, plan):
    headers = {"Authorization": f"Bearer {token}"}
    async with create_mcp_http_client(headers=headers) as http:
        async with client(url, http, plan, True) as c:
            statuses = []
            try:
                task = await poll(c.session, task_id, statuses)
            except MCPError as e:
                emit({"poller": index, "statuses": statuses, "error": {"code": e.code, "message": e.error.message}})
                return
            emit({"poller": index, "statuses": statuses, "status": task.status, "result": task.result})


async def run(plan):
    call = plan["call"]
    headers = {"Authorization": f"Bearer {plan['token']}"}
    async with create_mcp_http_client(headers=headers) as http:
        async with client(plan["url"], http, plan, plan["tasks"]) as c:
            if plan.get("resolve"):
                result = await c.call_tool(call["tool"], call["arguments"])
                emit({"result": dump(result), "task": RESOLVED.get("task"), "statuses": RESOLVED["statuses"]})
                return
            answer = await c.session.call_tool(call["tool"], call["arguments"], allow_claimed=True)
    if not isinstance(answer, TaskHandle):
        emit({"result": dump(answer)})
        return
    emit({"task": dump(answer)})
    if plan.get("hold"):
        await anyio.to_thread.run_sync(sys.stdin.readline)
    for index, poller in enumerate(plan.get("pollers") or [{"url": plan["url"], "token": plan["token"]}]):
        await run_poller(index, poller["url"], poller["token"], answer.task_id, plan)


def main():
    asyncio.run(run(json.loads(sys.argv[1])))


if __name__ == "__main__":
    main()
