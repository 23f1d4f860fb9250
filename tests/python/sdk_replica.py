"""A push replica of one agent on the Python SDK, run as its own process by
test_sdk_executor.py (which SIGKILLs one mid-turn). Usage: sdk_replica.py URL TOKEN MARKS_DIR NAME.

Its agent posts progress, says which turn it holds (a file MARKS_DIR/NAME.TURN), waits a
moment, then answers. Its writes are the same whichever replica makes them, so a turn taken
over by another replica writes nothing twice."""

import asyncio
import pathlib
import sys

from orchestrator_sdk import Agent, Client, ExternalExecutor, TurnOutcome


class Answerer(Agent):
    def __init__(self, marks: pathlib.Path, name: str) -> None:
        self.marks = marks
        self.name = name

    async def handle_turn(self, ctx):
        await ctx.say(f"working on turn {ctx.turn}", "none")
        (self.marks / f"{self.name}.{ctx.turn}").touch()
        await asyncio.sleep(0.3)
        await ctx.say(f"answer to turn {ctx.turn}")
        return TurnOutcome.POSTED


async def main(url: str, token: str, marks: str, name: str) -> None:
    client = await Client.connect(url, token)
    print("ready", flush=True)
    await ExternalExecutor(client, Answerer(pathlib.Path(marks), name)).run_push()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
