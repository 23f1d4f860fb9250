"""The partner agent in Python: answers each of its turns with what it was told. Logs its
connection and turns to stderr; gives up on an unreachable ORCHESTRATOR_URL after 10 s.
Run: ORCHESTRATOR_URL=ws://127.0.0.1:7300/rpc ORCHESTRATOR_TOKEN=oct_… python agent.py [push|pull]"""

import asyncio, logging, os, sys

from orchestrator_sdk import Agent, Client, ExternalExecutor, OrchestratorError, TurnOutcome


class Echo(Agent):
    async def handle_turn(self, ctx):
        history = await ctx.history()
        last = history[-1]["payload"].get("text", "") if history else ""
        await ctx.say(f"You said: {last}")
        return TurnOutcome.POSTED


async def main():
    url = os.environ.get("ORCHESTRATOR_URL", "ws://127.0.0.1:7300/rpc")
    token = os.environ.get("ORCHESTRATOR_TOKEN") or sys.exit("partner-agent: ORCHESTRATOR_TOKEN is not set: orchestrator token create --agent ID")
    try:
        client = await Client.connect(url, token, connect_timeout=float(os.environ.get("ORCHESTRATOR_CONNECT_TIMEOUT", "10")))
    except OrchestratorError as e:
        sys.exit(f"partner-agent: {e}")
    executor = ExternalExecutor(client, Echo())
    await (executor.run_pull() if sys.argv[1:] == ["pull"] else executor.run_push())


logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
asyncio.run(main())
