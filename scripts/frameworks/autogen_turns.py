"""The scripted two-agent exchange in AutoGen 0.7: RoundRobinGroupChat of two agents that answer
with fixed text, ended by MaxMessageTermination. Prints turns/s for one conversation and for
CONVERSATIONS at once, as JSON."""
import asyncio
import json
import sys
import time
from typing import Sequence

from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.base import Response
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import BaseChatMessage, TextMessage
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_core import CancellationToken


class Scripted(BaseChatAgent):
    def __init__(self, name: str) -> None:
        super().__init__(name, "answers with fixed text")
        self.n = 0

    @property
    def produced_message_types(self):
        return (TextMessage,)

    async def on_messages(self, messages: Sequence[BaseChatMessage], cancellation_token: CancellationToken) -> Response:
        self.n += 1
        return Response(chat_message=TextMessage(content=f"{self.name} says {self.n}", source=self.name))

    async def on_reset(self, cancellation_token: CancellationToken) -> None:
        self.n = 0


async def conversation(turns: int) -> None:
    team = RoundRobinGroupChat([Scripted("a"), Scripted("b")], termination_condition=MaxMessageTermination(turns + 1))
    result = await team.run(task="start")
    assert len(result.messages) == turns + 1, len(result.messages)


async def main(turns: int, conversations: int) -> None:
    t = time.perf_counter()
    await conversation(turns)
    single = turns / (time.perf_counter() - t)
    t = time.perf_counter()
    await asyncio.gather(*(conversation(turns) for _ in range(conversations)))
    aggregate = turns * conversations / (time.perf_counter() - t)
    print(json.dumps({"single": single, "aggregate": aggregate}))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
