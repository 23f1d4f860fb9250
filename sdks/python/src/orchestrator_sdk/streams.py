"""What a `Client` delivers as it arrives: a `Subscription`'s events and an `Offers`'
`request_turn` offers, each a queue that ends when the client closes or the server ends it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, cast

from .errors import ConnectionClosed, RpcError
from .wire import EventNotification, RequestTurnNotification

Json = dict[str, Any]

#: What ends a subscription's queue.
_END: Any = object()


@dataclass
class _Failed:
    """What ends a subscription the server ended with an error (its conversation was
    deleted, say): taking it raises the error."""

    error: RpcError


@dataclass
class Subscription:
    """Events of one conversation, or of every conversation the caller takes part in, in seq
    order per conversation with no gap and no duplicate across reconnects. Iterate it (`async
    for item in sub`): each item is `{"conversationId", "event"}`."""

    conversation_id: str | None
    #: The last seq delivered (or to resume after), per conversation.
    cursors: dict[str, int]
    #: For every conversation: where a conversation with no cursor replays from.
    since_all: int = 0
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    server_id: int | None = None
    closed: bool = False

    def __aiter__(self) -> AsyncIterator[EventNotification]:
        return _items(self.queue)

    async def next(self, timeout: float | None = None) -> EventNotification:
        """The next item, waiting at most `timeout` seconds (`asyncio.TimeoutError` after);
        `ConnectionClosed` once the subscription has ended and what it held was taken."""
        return cast(EventNotification, await _next(self.queue, timeout, "the subscription has ended"))

    def _end(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(_END)

    def _fail(self, error: RpcError) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(_Failed(error))

    def _opened(self, server_id: Any) -> None:
        self.server_id = server_id

    def _take(self, result: Json) -> None:
        conv, event = result["conversationId"], result["event"]
        if event["seq"] <= self.cursors.get(conv, 0):
            return  # delivered before a reconnect
        self.cursors[conv] = event["seq"]
        self.queue.put_nowait(result)


@dataclass
class Offers:
    """The `request_turn` offers made to this connection as a push replica of its agent
    (`Client.register_executor`); claim one with `Client.claim_turn`."""

    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    server_id: int | None = None
    closed: bool = False

    def __aiter__(self) -> AsyncIterator[RequestTurnNotification]:
        return _items(self.queue)

    async def next(self, timeout: float | None = None) -> RequestTurnNotification:
        """The next offer: `{conversationId, agentId, claimId, turn, deadlineMs, sinceSeq, mode}`;
        `ConnectionClosed` once the registration has ended and what it held was taken."""
        return cast(RequestTurnNotification, await _next(self.queue, timeout, "the registration has ended"))

    def _end(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(_END)

    def _opened(self, server_id: Any) -> None:
        self.server_id = server_id


async def _items(queue: asyncio.Queue[Any]) -> AsyncIterator[Any]:
    """A queue's items until its end (raising the error the server ended it with, if any)."""
    while True:
        item = await queue.get()
        if item is _END:
            queue.put_nowait(_END)
            return
        if isinstance(item, _Failed):
            queue.put_nowait(item)
            raise item.error
        yield item


async def _next(queue: asyncio.Queue[Any], timeout: float | None, ended: str) -> Any:
    item = await asyncio.wait_for(queue.get(), timeout)
    if item is _END:
        queue.put_nowait(_END)
        raise ConnectionClosed(ended)
    if isinstance(item, _Failed):
        queue.put_nowait(item)
        raise item.error
    return item
