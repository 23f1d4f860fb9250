"""A small A2A agent built with the official `a2a-sdk` server (JSON-RPC binding): it answers
each message with two streamed status updates and a final answer that asks for more input,
and completes when told "bye". Used to check what the official stack puts on the wire, and as
a remote A2A peer in tests.

Run: python reference_server.py PORT   (prints "listening on http://127.0.0.1:PORT")
"""

import asyncio
import sys

import uvicorn
from starlette.applications import Starlette

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events.event_queue_v2 import EventQueue
from a2a.server.request_handlers import DefaultRequestHandlerV2 as DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types import a2a_pb2 as pb


class Echo(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        if not context.current_task:
            await event_queue.enqueue_event(pb.Task(
                id=context.task_id, context_id=context.context_id,
                status=pb.TaskStatus(state=pb.TASK_STATE_SUBMITTED), history=[context.message],
            ))
        text = context.get_user_input()
        await updater.start_work(updater.new_agent_message([pb.Part(text="thinking")]))
        await asyncio.sleep(0.05)
        if text.strip().lower() == "bye":
            await updater.complete(updater.new_agent_message([pb.Part(text="goodbye")]))
            return
        await updater.requires_input(updater.new_agent_message([pb.Part(text=f"echo: {text}")]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


def app(port: int) -> Starlette:
    card = pb.AgentCard(
        name="echo",
        description="Echoes each message and asks for more.",
        version="1.0.0",
        supported_interfaces=[pb.AgentInterface(url=f"http://127.0.0.1:{port}/", protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=pb.AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[pb.AgentSkill(id="echo", name="echo", description="Echoes", tags=["echo"])],
    )
    handler = DefaultRequestHandler(agent_executor=Echo(), task_store=InMemoryTaskStore(), agent_card=card)
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url="/")
    return Starlette(routes=routes)


if __name__ == "__main__":
    port = int(sys.argv[1])
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    uvicorn.run(app(port), host="127.0.0.1", port=port, log_level="warning")
