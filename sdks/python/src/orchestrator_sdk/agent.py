"""The agent model: an `Agent` takes one turn at a time through an `AgentContext`, and says
what it did with a `TurnOutcome`. The same model as the Rust SDK's (`agent-sdk`): every write
carries the turn as its `turnHint` (a reply can never land in another turn) and an idempotency
key made from the turn, the attempt and the order of writes (an attempt run again, after a
crash or on another replica, writes nothing twice)."""

from __future__ import annotations

import abc
import asyncio
import enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import Client, Json
    from .wire import AppendResult, Event, GetUpdatesResult, WaitForChangeResult


class TurnOutcome(str, enum.Enum):
    """What an agent says it did with its turn. Advisory: what counts is the finality it
    logged."""

    #: It posted (a reply with finality `turn`, or progress).
    POSTED = "posted"
    #: It hands the turn back without answering.
    YIELD = "yield"
    #: It had nothing to do.
    NO_ACTION = "no_action"
    #: It closed the conversation (finality `conversation`).
    COMPLETE = "complete"


class Agent(abc.ABC):
    """Code that takes one turn at a time. Agents are stateless between turns: they re-read
    what they need from the log. An exception from `handle_turn` fails the attempt; the
    executor traces it and may try again."""

    @abc.abstractmethod
    async def handle_turn(self, ctx: AgentContext) -> TurnOutcome:
        """Takes the turn `ctx` describes."""


class AgentContext:
    """Everything one attempt at one turn needs."""

    def __init__(
        self,
        client: Client,
        conversation_id: str,
        turn: int,
        attempt: int,
        deadline: float,
        since_seq: int = 0,
        mode: str = "converse",
    ) -> None:
        #: The client the agent speaks through.
        self.client = client
        #: The conversation.
        self.conversation_id = conversation_id
        #: The agent taking the turn.
        self.agent_id: str = client.agent_id or ""
        #: The turn (every message is posted with it as `turnHint`).
        self.turn = turn
        #: Which attempt this is (1 for the first).
        self.attempt = attempt
        #: When the turn must be done, on the event loop's clock (`loop.time()`).
        self.deadline = deadline
        #: Where to read context from: the log after this seq.
        self.since_seq = since_seq
        #: What the turn asks for: `converse`, `plan` or `build`.
        self.mode = mode
        self._writes = 0
        # The key of the attempt's `turn_start`, which the executor sent without waiting: this
        # context's writes are appended only after it (`afterKey`), or refused.
        self._after_key: str | None = None

    def _hold_writes_to(self, key: str) -> None:
        """The executor's: this context's later writes are held to its write with `key`."""
        self._after_key = key

    def _next_key(self, what: str) -> str:
        n = self._writes
        self._writes += 1
        return f"t{self.turn}.a{self.attempt}.{what}{n}"

    def remaining(self) -> float:
        """Seconds left before the deadline (0 once it has passed)."""
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    async def get_updates(self, since_seq: int | None = None) -> GetUpdatesResult:
        """New messages and guidance after `since_seq` (the context's cursor when `None`)."""
        return await self.client.get_updates(
            self.conversation_id, since_seq=self.since_seq if since_seq is None else since_seq
        )

    async def history(self) -> list[Event]:
        """Every message of the conversation so far."""
        return await self.messages_after(0)

    async def messages_after(self, after: int) -> list[Event]:
        """Every message after seq `after`, page by page."""
        out: list[Event] = []
        cursor = after
        while True:
            page = await self.get_updates(cursor)
            done = not page["messages"] or page["latestSeq"] <= cursor
            cursor = page["latestSeq"]
            out.extend(page["messages"])
            if done:
                return out

    async def post(self, payload: Json | str, finality: str = "turn") -> AppendResult:
        """Posts a message in this turn: `{seq, turn, duplicate}`. `finality` is `turn` (the
        reply), `none` (progress) or `conversation` (the last word)."""
        return await self.client.send_message(
            self.conversation_id,
            payload,
            finality,
            turn_hint=self.turn,
            client_request_id=self._next_key("m"),
            after_key=self._after_key,
        )

    async def say(self, text: str, finality: str = "turn") -> AppendResult:
        """Posts text in this turn."""
        return await self.post({"text": text}, finality)

    async def post_trace(self, payload: Any) -> AppendResult:
        """Writes a trace for this turn."""
        return await self.client.send_trace(
            self.conversation_id,
            payload,
            turn=self.turn,
            client_request_id=self._next_key("x"),
            after_key=self._after_key,
        )

    async def wait_for_change(self, since_seq: int, timeout: float) -> WaitForChangeResult:
        """Waits until the conversation moves past `since_seq` or `timeout` seconds pass:
        `{latestSeq, timedOut}`."""
        return await self.client.wait_for_change(
            self.conversation_id, since_seq, max(1, int(timeout * 1000))
        )
