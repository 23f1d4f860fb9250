"""`Client`: every method of the orchestrator's protocol over one WebSocket, kept alive.

One task owns the connection. When it drops, that task reconnects with exponential backoff and
jitter, authenticates again, subscribes again from the cursor of each subscription (the last
seq it delivered, per conversation) and registers its push executors again, then sends again
every call that had no answer yet. A write sent again is safe: `send_message` and `send_trace`
always carry an idempotency key (one is made when the caller gives none), so the server
answers a write it already took with the original result (`duplicate: true`), and a
subscription skips what it delivered before the drop. Callers see none of it but the wait.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import ssl as ssl_module
import uuid
from dataclasses import dataclass
from typing import Any, Callable, cast

import websockets

from .errors import AuthenticationFailed, ConnectionClosed, ErrorCode, RpcError
from .listing import ListingMethods
from .streams import Offers, Subscription
from .tokens import TokenMethods

log = logging.getLogger("orchestrator_sdk.client")
from .wire import (
    AppendResult,
    ClaimTurnResult,
    CreateConversationResult,
    GetUpdatesResult,
    ListScenariosResult,
    Snapshot,
    TailResult,
    WaitForChangeResult,
)

Json = dict[str, Any]

@dataclass
class _Call:
    method: str
    params: Json
    future: asyncio.Future[Any]
    #: Run by the reader as the answer arrives, before it reads on: a subscription's id is
    #: known before its first event is routed.
    on_result: Callable[[Any], None] | None = None


class Client(TokenMethods, ListingMethods):
    """A connection to the orchestrator as the agent of `token`. Make one with
    `await Client.connect(url, token)`; close it with `await client.close()`."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        ssl: ssl_module.SSLContext | None = None,
        min_backoff: float = 0.05,
        max_backoff: float = 5.0,
        connect_timeout: float = 10.0,
    ) -> None:
        self.url = url
        #: How long `connect` tries to make the first connection before it gives up (a wrong
        #: URL, a server that is not there); once connected, the client reconnects for good.
        self.connect_timeout = connect_timeout
        self._last_error = ""
        self._token = token
        self._ssl = ssl
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._subs: list[Subscription] = []
        self._offers: list[Offers] = []
        self._ws: Any = None
        self._ready = asyncio.Event()
        self._closing = False
        self._fatal: BaseException | None = None
        self._owner: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        #: The agent the token speaks as, once authenticated.
        self.agent_id: str | None = None
        #: How many times the connection was made again after a drop.
        self.reconnects = 0

    @classmethod
    async def connect(cls, url: str, token: str, **options: Any) -> "Client":
        """Connects and authenticates (raising `AuthenticationFailed` for a refused token);
        from then on the client keeps itself connected."""
        client = cls(url, token, **options)
        client._owner = asyncio.create_task(client._own())
        await client._wait_ready()
        return client

    async def close(self) -> None:
        """Closes the connection for good: calls still waiting raise `ConnectionClosed`."""
        self._closing = True
        if self._ws is not None:
            await self._ws.close()
        if self._owner is not None:
            self._owner.cancel()
            try:
                await self._owner
            except (asyncio.CancelledError, Exception):
                pass
        self._fail_all(ConnectionClosed("the client was closed"))

    # -- the protocol's methods -------------------------------------------------------------

    async def create_conversation(self, **params: Any) -> CreateConversationResult:
        """`createConversation` (`conversationId`, `participants`, `metadata`, `scenario`,
        `scenarioName`, `parentConversationId`, `input`: as the protocol names them)."""
        return cast(CreateConversationResult, await self.call("createConversation", params))

    async def get_conversation(self, conversation_id: str) -> Snapshot:
        """`getConversation`: the snapshot with the caller's guidance."""
        return cast(Snapshot, await self.call("getConversation", {"conversationId": conversation_id}))

    async def list_scenarios(self) -> ListScenariosResult:
        """`listScenarios` (admins): the server's scenario library."""
        return cast(ListScenariosResult, await self.call("listScenarios", {}))

    async def tail(self, conversation_id: str, since_seq: int = 0, limit: int | None = None) -> TailResult:
        """`tail`: `{events, latestSeq}` after `since_seq` (at most `limit`, capped at 1,000)."""
        return cast(TailResult, await self.call(
            "tail", _some({"conversationId": conversation_id, "sinceSeq": since_seq, "limit": limit})
        ))

    async def wait_for_change(self, conversation_id: str, since_seq: int, timeout_ms: int) -> WaitForChangeResult:
        """`waitForChange`: `{latestSeq, timedOut}` once the log is past `since_seq`."""
        return cast(WaitForChangeResult, await self.call(
            "waitForChange",
            {"conversationId": conversation_id, "sinceSeq": since_seq, "timeoutMs": timeout_ms},
        ))

    async def get_updates(
        self,
        conversation_id: str,
        since_seq: int | None = None,
        limit: int | None = None,
        timeout_ms: int | None = None,
    ) -> GetUpdatesResult:
        """`getUpdatesOrGuidance`: the messages after `since_seq` with guidance."""
        return cast(GetUpdatesResult, await self.call(
            "getUpdatesOrGuidance",
            _some(
                {
                    "conversationId": conversation_id,
                    "sinceSeq": since_seq,
                    "limit": limit,
                    "timeoutMs": timeout_ms,
                }
            ),
        ))

    async def send_message(
        self,
        conversation_id: str,
        payload: Json | str,
        finality: str = "turn",
        *,
        turn_hint: int | None = None,
        client_request_id: str | None = None,
        after_key: str | None = None,
    ) -> AppendResult:
        """`sendMessage` (`payload`: a message payload, or its text): `{seq, turn, duplicate}`.
        It always carries an idempotency key (a new one when none is given), so a retry after
        a lost answer appends nothing twice. `after_key`: append only after this agent's
        write with that key (PROTOCOL.md, "Held writes")."""
        if isinstance(payload, str):
            payload = {"text": payload}
        params: Json = {
            "conversationId": conversation_id,
            "payload": payload,
            "finality": finality,
            "clientRequestId": client_request_id or _key(),
        }
        if turn_hint is not None:
            params["turnHint"] = {"turn": turn_hint}
        if after_key is not None:
            params["afterKey"] = after_key
        return cast(AppendResult, await self.call("sendMessage", params))

    async def send_trace(
        self,
        conversation_id: str,
        payload: Json,
        *,
        turn: int | None = None,
        client_request_id: str | None = None,
        after_key: str | None = None,
    ) -> AppendResult:
        """`sendTrace`: `{seq, turn, duplicate}`, with an idempotency key and `after_key` as
        `send_message`."""
        return cast(
            AppendResult,
            await self.call(
                "sendTrace", _trace_params(conversation_id, payload, turn, client_request_id, after_key)
            ),
        )

    async def _send_trace_queued(
        self,
        conversation_id: str,
        payload: Json,
        *,
        turn: int | None = None,
        client_request_id: str | None = None,
    ) -> asyncio.Future[AppendResult]:
        """`sendTrace`, returned as soon as the call is on its way (written to the connection,
        or parked for the next one, which sends parked calls in the order they were made): the
        answer is the future's. A write made after this returns reaches the server after the
        trace, so it may be held to it (`after_key`): the executor sends an attempt's
        `turn_start` so and runs the agent at once."""
        params = _trace_params(conversation_id, payload, turn, client_request_id, None)
        i, call = self._register("sendTrace", params, None)
        await self._send(i, call)
        call.future.add_done_callback(lambda _: self._calls.pop(i, None))
        return cast("asyncio.Future[AppendResult]", call.future)

    async def delete_conversation(self, conversation_id: str) -> Any:
        """`deleteConversation` (its tenant's admins, or its creator): it and its
        sub-conversations; `{"deleted": [ids]}`."""
        return await self.call("deleteConversation", {"conversationId": conversation_id})

    async def pause_conversation(self, conversation_id: str) -> Any:
        """`pauseConversation` (admins)."""
        return await self.call("pauseConversation", {"conversationId": conversation_id})

    async def resume_conversation(self, conversation_id: str) -> Any:
        """`resumeConversation` (admins)."""
        return await self.call("resumeConversation", {"conversationId": conversation_id})

    async def fork_conversation(
        self, conversation_id: str, at_seq: int, new_conversation_id: str | None = None
    ) -> CreateConversationResult:
        """`forkConversation` (admins): `{conversationId}` of the copy."""
        return cast(CreateConversationResult, await self.call(
            "forkConversation",
            _some(
                {
                    "conversationId": conversation_id,
                    "atSeq": at_seq,
                    "newConversationId": new_conversation_id,
                }
            ),
        ))

    async def subscribe(self, conversation_id: str | None = None, since_seq: int | None = None) -> Subscription:
        """`subscribe`: the events after `since_seq` of one conversation, or of every
        conversation the caller takes part in (with `since_seq`, each replays after it; without,
        only what commits from now on). Kept across reconnects from its cursors."""
        if conversation_id is not None:
            # "From now on", made exact: the head now is the cursor to resume from.
            if since_seq is None:
                since_seq = (await self.get_conversation(conversation_id))["latestSeq"]
            sub = Subscription(conversation_id, {conversation_id: since_seq})
        elif since_seq is None:
            # The same for every conversation; those created later replay from their start.
            listed = await self.all_conversations(participant=self.agent_id)
            sub = Subscription(None, {c["conversationId"]: c["latestSeq"] for c in listed})
        else:
            sub = Subscription(None, {}, since_all=since_seq)
        self._subs.append(sub)
        await self.call("subscribe", _subscribe_params(sub), on_result=sub._opened)
        return sub

    async def unsubscribe(self, sub: Subscription) -> bool:
        """`unsubscribe`: ends `sub` (its iteration stops after what it holds)."""
        sub._end()
        if sub in self._subs:
            self._subs.remove(sub)
        if sub.server_id is None:
            return False
        return bool(await self.call("unsubscribe", {"subscription": sub.server_id}))

    async def register_executor(self) -> Offers:
        """`registerExecutor {mode: "push"}`: this connection becomes a push replica of its
        agent; the turns offered to it come through the returned `Offers`."""
        offers = Offers()
        self._offers.append(offers)
        await self.call("registerExecutor", {"mode": "push"}, on_result=offers._opened)
        return offers

    async def unregister_executor(self, offers: Offers) -> bool:
        """`unregisterExecutor`: no more offers come to `offers`."""
        offers._end()
        if offers in self._offers:
            self._offers.remove(offers)
        if offers.server_id is None:
            return False
        return bool(await self.call("unregisterExecutor", {"subscription": offers.server_id}))

    async def claim_turn(self, claim_id: str) -> ClaimTurnResult:
        """`claimTurn`: `{granted, conversationId, turn, deadline}`, or `RpcError` with
        `ErrorCode.CLAIM_NOT_FOUND` when another replica has it or the turn is over."""
        return cast(ClaimTurnResult, await self.call("claimTurn", {"claimId": claim_id}))

    async def call(
        self, method: str, params: Json, *, on_result: Callable[[Any], None] | None = None
    ) -> Any:
        """Any method by name: its result, or `RpcError`. Sent again after a reconnect until
        it is answered or the client is closed."""
        i, call = self._register(method, params, on_result)
        await self._send(i, call)
        try:
            return await call.future
        finally:
            self._calls.pop(i, None)

    def _register(
        self, method: str, params: Json, on_result: Callable[[Any], None] | None
    ) -> tuple[int, _Call]:
        """Gives a call its id and keeps it until it is answered (sent again after a
        reconnect, in id order)."""
        if self._closing:
            raise ConnectionClosed("the client was closed")
        if self._fatal is not None:
            raise self._fatal
        i = next(self._ids)
        call = _Call(method, params, asyncio.get_running_loop().create_future(), on_result)
        self._calls[i] = call
        return i, call

    # -- the connection ---------------------------------------------------------------------

    async def _wait_ready(self) -> None:
        ready = asyncio.create_task(self._ready.wait())
        assert self._owner is not None
        done, _ = await asyncio.wait(
            {ready, self._owner}, timeout=self.connect_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if self._owner in done:
            ready.cancel()
            exc = self._owner.exception()
            raise exc if exc is not None else ConnectionClosed("the connection ended")
        if not done:
            ready.cancel()
            why = self._last_error or "no answer"
            await self.close()
            raise ConnectionClosed(
                f"could not connect to {self.url} within {self.connect_timeout:g} s ({why}): "
                "is the server running there? (ORCHESTRATOR_URL)"
            )

    async def _send(self, i: int, call: _Call) -> None:
        ws = self._ws
        if ws is None or not self._ready.is_set():
            return  # sent when the connection is made again
        frame = json.dumps({"jsonrpc": "2.0", "id": i, "method": call.method, "params": call.params})
        try:
            async with self._send_lock:
                await ws.send(frame)
        except websockets.ConnectionClosed:
            pass  # the owner reconnects and sends it again

    async def _own(self) -> None:
        """The connection's owner: connect, take part, and on a drop start again."""
        failures = 0
        while not self._closing:
            try:
                # `ssl` only when given: wss:// without one trusts the system's CAs.
                tls: dict[str, Any] = {} if self._ssl is None else {"ssl": self._ssl}
                async with websockets.connect(self.url, max_size=None, **tls) as ws:
                    await self._authenticate(ws)
                    if self.reconnects == 0:
                        log.info("connected to %s as %s", self.url, self.agent_id)
                    else:
                        log.info("connected again to %s as %s (after %d drops)", self.url, self.agent_id, self.reconnects)
                    self._ws = ws
                    reading = asyncio.create_task(self._read(ws))
                    await self._resume()
                    failures = 0
                    await reading
            except (
                AuthenticationFailed,
                ssl_module.SSLCertVerificationError,
                websockets.exceptions.InvalidURI,
            ) as e:
                # A refused token, a certificate this client does not trust, a URL that is not
                # a WebSocket's: connecting again would not help.
                self._fatal = e
                self._fail_all(e)
                raise
            except (OSError, websockets.WebSocketException, asyncio.TimeoutError) as e:
                self._last_error = str(e) or type(e).__name__
                # Said once when the connection is lost, then now and then while it stays down.
                if failures == 0 or (failures & (failures - 1)) == 0:
                    log.warning("connection to %s failed: %s; trying again", self.url, self._last_error)
            finally:
                self._ws = None
                self._ready.clear()
            if self._closing:
                return
            failures += 1
            self.reconnects += 1
            backoff = min(self._max_backoff, self._min_backoff * 2 ** min(failures, 16))
            await asyncio.sleep(backoff * (0.5 + random.random() / 2))

    async def _authenticate(self, ws: Any) -> None:
        await ws.send(json.dumps({"jsonrpc": "2.0", "id": 0, "method": "authenticate", "params": {"token": self._token}}))
        while True:
            msg = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if msg.get("id") != 0:
                continue
            if "error" in msg:
                e = RpcError.from_wire(msg["error"])
                if e.code == ErrorCode.UNAUTHENTICATED:
                    raise AuthenticationFailed(str(e))
                raise OSError(str(e))
            self.agent_id = msg["result"].get("agentId")
            return

    async def _resume(self) -> None:
        """After (re)authenticating: subscriptions and registrations again, then every call
        still unanswered, in the order they were made."""
        again = sorted(self._calls.items())
        self._ready.set()
        for sub in list(self._subs):
            if sub.server_id is not None:
                asyncio.create_task(self._resubscribe(sub))
        for offers in list(self._offers):
            if offers.server_id is not None:
                asyncio.create_task(self._reregister(offers))
        for i, call in again:
            await self._send(i, call)

    async def _resubscribe(self, sub: Subscription) -> None:
        try:
            await self.call("subscribe", _subscribe_params(sub), on_result=sub._opened)
        except Exception:  # noqa: BLE001 — the next reconnect tries again
            pass

    async def _reregister(self, offers: Offers) -> None:
        try:
            await self.call("registerExecutor", {"mode": "push"}, on_result=offers._opened)
        except Exception:  # noqa: BLE001
            pass

    async def _read(self, ws: Any) -> None:
        async for raw in ws:
            msg = json.loads(raw)
            if "id" in msg and msg.get("method") is None:
                call = self._calls.get(msg["id"])
                if call is None or call.future.done():
                    continue
                if "error" in msg:
                    call.future.set_exception(RpcError.from_wire(msg["error"]))
                else:
                    if call.on_result is not None:
                        call.on_result(msg.get("result"))
                    call.future.set_result(msg.get("result"))
            elif msg.get("method") == "event":
                self._route_event(msg["params"])
            elif msg.get("method") == "request_turn":
                for offers in self._offers:
                    if offers.server_id == msg["params"]["subscription"]:
                        offers.queue.put_nowait(msg["params"]["result"])

    def _route_event(self, params: Json) -> None:
        for sub in list(self._subs):
            if sub.server_id != params["subscription"]:
                continue
            if "error" in params:
                # The server ended it (its conversation was deleted): not subscribed again.
                self._subs.remove(sub)
                sub._fail(RpcError.from_wire(params["error"]))
            else:
                sub._take(params["result"])

    def _fail_all(self, error: BaseException) -> None:
        """Fails every call waiting, and ends every subscription and registration."""
        for call in self._calls.values():
            if not call.future.done():
                call.future.set_exception(error)
        for s in self._subs:
            s._end()
        for o in self._offers:
            o._end()


def _subscribe_params(sub: Subscription) -> Json:
    """`subscribe`'s params for `sub` from its cursors: what it has not delivered yet."""
    if sub.conversation_id is not None:
        return {"conversationId": sub.conversation_id, "sinceSeq": sub.cursors.get(sub.conversation_id, 0)}
    return {"sinceSeq": sub.since_all, "cursors": dict(sub.cursors)}


def _trace_params(
    conversation_id: str,
    payload: Json,
    turn: int | None,
    client_request_id: str | None,
    after_key: str | None,
) -> Json:
    return _some(
        {
            "conversationId": conversation_id,
            "payload": payload,
            "turn": turn,
            "clientRequestId": client_request_id or _key(),
            "afterKey": after_key,
        }
    )


def _some(params: Json) -> Json:
    return {k: v for k, v in params.items() if v is not None}


def _key() -> str:
    return f"py-{uuid.uuid4().hex}"
