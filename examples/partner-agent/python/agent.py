"""The partner agent in Python: answers each of its turns with what it was told.
Run: ORCHESTRATOR_URL=ws://127.0.0.1:7300/rpc ORCHESTRATOR_TOKEN=oct_… python agent.py [push|pull]"""

import asyncio
import os
import sys

from orchestrator_sdk import Agent, Client, ExternalExecutor, TurnOutcome


class Echo(Agent):
    async def handle_turn(self, ctx):
        history = await ctx.history()
        last = history[-1]["payload"].get("text", "") if history else ""
        await ctx.say(f"You said: {last}")
        return TurnOutcome.POSTED


async def main():
    url = os.environ.get("ORCHESTRATOR_URL", "ws://127.0.0.1:7300/rpc")
    client = await Client.connect(url, os.environ["ORCHESTRATOR_TOKEN"])
    executor = ExternalExecutor(client, Echo())
    if sys.argv[1:] == ["pull"]:
        await executor.run_pull()
    else:
        await executor.run_push()


asyncio.run(main())
