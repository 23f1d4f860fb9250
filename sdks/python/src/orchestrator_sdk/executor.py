"""Executors: how a turn is run (`ExecutorCore`), and `ExternalExecutor`, which takes an
agent's turns in a partner's process in pull or push-claim mode. Behaves as the Rust executor
core (`executors/src/core.rs`) does:

- one invocation per (conversation, agent) at a time: a second call for the turn running
  returns `already_running`; a call for a later turn waits for the running one to finish;
- each attempt is traced (`turn_start`, then `turn_end` or `turn_error`), each trace under the
  key `t{turn}.a{attempt}.{start|end|err}` so a repeated run writes it once; the agent runs
  without waiting for `turn_start`, its writes held to it (`afterKey`), once the turn is known
  to be still its own (a push claim just granted, or the server's view);
- an attempt that raises is retried after `backoff`, doubled for each retry, while the retry
  would start before the deadline and attempts remain; before a retry the turn must still be
  the agent's;
- an attempt that posted only progress waits `grace` for the turn to close, and is run again
  (`turn_end` with outcome `incomplete`) when it did not;
- past the deadline the attempt is cancelled and traced as `deadline exceeded`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from typing import TYPE_CHECKING, Any

from .agent import Agent, AgentContext, TurnOutcome
from .errors import ErrorCode, RpcError

if TYPE_CHECKING:
    from .client import Client, Json
    from .wire import RequestTurnNotification, Snapshot

log = logging.getLogger("orchestrator_sdk.executor")

#: Refusals that mean the turn is no longer the agent's to take.
_GONE = {
    ErrorCode.TURN_CLOSED,
    ErrorCode.TURN_MISMATCH,
    ErrorCode.CONVERSATION_CLOSED,
    ErrorCode.NOT_YOUR_TURN,
    ErrorCode.CONVERSATION_PAUSED,
    ErrorCode.FORBIDDEN,
    ErrorCode.CONVERSATION_NOT_FOUND,
}


@dataclasses.dataclass(frozen=True)
class ExecPolicy:
    """How the core runs a turn (seconds)."""

    #: How long to wait for the turn to close after the agent returned having posted only
    #: progress (finality `none`).
    grace: float = 0.25
    #: Attempts at most (the first included).
    max_attempts: int = 3
    #: The first retry's delay; it doubles with each retry.
    backoff: float = 0.05

    def retry_after(self, attempt: int, now: float, deadline: float) -> float | None:
        """The wait before the attempt after failed attempt `attempt` (1 for the first), or
        `None` when the retry would start at or past `deadline`."""
        delay = self.backoff * 2 ** max(0, attempt - 1)
        return delay if now + delay < deadline else None


@dataclasses.dataclass(frozen=True)
class Assignment:
    """A turn handed to an executor."""

    conversation_id: str
    agent_id: str
    turn: int
    #: When the turn must be done, on the event loop's clock.
    deadline: float
    #: Context starts after this seq.
    since_seq: int = 0
    mode: str = "converse"
    #: Write `turn_start` and `turn_end` traces (failures are always traced).
    traces: bool = True
    #: The server granted this turn to this executor a moment ago (a push claim's answer,
    #: given only while the turn is the agent's): the first attempt does not ask again.
    granted: bool = False


@dataclasses.dataclass(frozen=True)
class RunReport:
    """How a run ended: `label` is `done` (with the agent's `outcome`), `already_running`,
    `not_mine` (the turn was answered elsewhere, closed or paused), `deadline_exceeded` or
    `failed` (every attempt failed; `error` is the last one)."""

    label: str
    outcome: TurnOutcome | None = None
    error: str | None = None


class _Slot:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.turn = 0
        self.users = 0


def _gone(e: BaseException) -> bool:
    return isinstance(e, RpcError) and e.code in _GONE


async def still_mine(client: Client, conversation_id: str, turn: int) -> bool:
    """Whether `turn` of the conversation is still the client's agent's to take."""
    try:
        s = await client.get_conversation(conversation_id)
    except Exception:  # noqa: BLE001 — not knowing is not "mine"
        return False
    return bool(s["turn"] == turn and s["guidance"]["status"] == "may_speak")


class ExecutorCore:
    """Runs one turn, whoever triggered it. Share one among the executors of a process."""

    def __init__(self, policy: ExecPolicy | None = None) -> None:
        self.policy = policy or ExecPolicy()
        self._slots: dict[tuple[str, str], _Slot] = {}

    async def run(self, agent: Agent, client: Client, a: Assignment) -> RunReport:
        """Runs `agent` for the assignment through `client`."""
        key = (a.conversation_id, a.agent_id)
        slot = self._slots.setdefault(key, _Slot())
        if slot.turn == a.turn:
            return RunReport("already_running")
        slot.users += 1
        try:
            loop = asyncio.get_running_loop()
            try:
                await asyncio.wait_for(slot.lock.acquire(), max(0.0, a.deadline - loop.time()))
            except asyncio.TimeoutError:
                return RunReport("deadline_exceeded")
            try:
                slot.turn = a.turn
                return await self._attempts(agent, client, a)
            finally:
                slot.turn = 0
                slot.lock.release()
        finally:
            slot.users -= 1
            if slot.users == 0:
                self._slots.pop(key, None)

    async def _attempts(self, agent: Agent, client: Client, a: Assignment) -> RunReport:
        loop = asyncio.get_running_loop()
        last_error = ""
        for attempt in range(1, max(1, self.policy.max_attempts) + 1):
            # The first attempt comes straight from an assignment, a claim or fresh guidance;
            # its start trace (which names the turn) fails if the turn has moved on since.
            if attempt > 1 and not await still_mine(client, a.conversation_id, a.turn):
                return RunReport("failed", error=last_error)
            ctx = AgentContext(
                client, a.conversation_id, a.turn, attempt, a.deadline, a.since_seq, a.mode
            )
            # Before the agent runs, the turn must still be its own: a claim just granted says
            # so; otherwise the server's view is asked.
            if attempt == 1 and not a.granted:
                if not await still_mine(client, a.conversation_id, a.turn):
                    return RunReport("not_mine")
            # The attempt's `turn_start` is sent and the agent runs at once, its writes held to
            # the trace (`afterKey`): they land after it, or are refused if it did not land.
            started: asyncio.Future[Any] | None = None
            if a.traces:
                key = ctx._next_key("x")
                try:
                    started = await client._send_trace_queued(
                        a.conversation_id,
                        _trace("turn_start", a, attempt),
                        turn=a.turn,
                        client_request_id=key,
                    )
                except Exception as e:  # noqa: BLE001
                    last_error = str(e)
                    continue
                ctx._hold_writes_to(key)
            ran: Any
            try:
                ran = await asyncio.wait_for(
                    agent.handle_turn(ctx), max(0.0, a.deadline - loop.time())
                )
            except Exception as e:  # noqa: BLE001 — the agent's failure is the attempt's
                ran = e
            if started is not None:
                try:
                    await started
                except Exception as e:  # noqa: BLE001 — nothing the attempt wrote landed
                    if _gone(e):
                        return RunReport("not_mine")
                    last_error = str(e)
                    continue
            if isinstance(ran, asyncio.TimeoutError):
                await self._trace_error(client, a, attempt, "deadline exceeded")
                return RunReport("deadline_exceeded")
            if isinstance(ran, Exception):
                last_error = str(ran) or type(ran).__name__
                log.warning("turn %d of %s: attempt %d failed: %s", a.turn, a.conversation_id, attempt, last_error)
                await self._trace_error(client, a, attempt, last_error)
                delay = self.policy.retry_after(attempt, loop.time(), a.deadline)
                if delay is None:
                    return RunReport("failed", error=last_error)
                await asyncio.sleep(delay)
                continue
            outcome = TurnOutcome(ran)
            if outcome == TurnOutcome.POSTED and not await self._closed_within_grace(client, a):
                # Progress only: the turn is still open. Try again while there is time.
                last_error = "the agent posted progress but did not close its turn"
                await self._trace_end(client, a, attempt, "incomplete")
                continue
            await self._trace_end(client, a, attempt, outcome.value)
            return RunReport("done", outcome=outcome)
        return RunReport("failed", error=last_error)

    async def _trace_error(self, client: Client, a: Assignment, attempt: int, error: str) -> None:
        log.info(
            "an agent's attempt failed: agent=%s conversation=%s turn=%d attempt=%d/%d: %s",
            a.agent_id, a.conversation_id, a.turn, attempt, self.policy.max_attempts, error,
        )
        await self._trace(client, a, "err", {**_trace("turn_error", a, attempt), "error": error})

    async def _trace_end(self, client: Client, a: Assignment, attempt: int, outcome: str) -> None:
        if a.traces:
            await self._trace(client, a, "end", {**_trace("turn_end", a, attempt), "outcome": outcome})

    async def _closed_within_grace(self, client: Client, a: Assignment) -> bool:
        loop = asyncio.get_running_loop()
        until = min(loop.time() + self.policy.grace, a.deadline)
        while True:
            try:
                s = await client.get_conversation(a.conversation_id)
            except Exception:  # noqa: BLE001
                return True
            if s["turn"] != a.turn or s["guidance"]["status"] != "may_speak":
                return True
            left = until - loop.time()
            if left <= 0:
                return False
            try:
                await client.wait_for_change(a.conversation_id, s["latestSeq"], max(1, int(left * 1000)))
            except Exception:  # noqa: BLE001
                return True

    async def _trace(self, client: Client, a: Assignment, what: str, payload: Json) -> None:
        """Writes an executor trace. Once the agent closed its turn the trace lands in the
        current turn (a closed turn takes no traces); its payload names the turn it reports
        on. Its key makes it appear once even if the run is repeated."""
        key = f"t{a.turn}.a{payload['attempt']}.{what}"
        try:
            await client.send_trace(a.conversation_id, payload, turn=a.turn, client_request_id=key)
        except RpcError as e:
            if e.code != ErrorCode.TURN_CLOSED:
                log.debug("executor trace not written: %s", e)
                return
            try:
                await client.send_trace(a.conversation_id, payload, client_request_id=key)
            except Exception as e2:  # noqa: BLE001
                log.debug("executor trace not written: %s", e2)
        except Exception as e:  # noqa: BLE001
            log.debug("executor trace not written: %s", e)


def _trace(kind: str, a: Assignment, attempt: int) -> Json:
    return {"type": kind, "agent": a.agent_id, "turn": a.turn, "attempt": attempt}


def _deadline_from(rfc3339: str | None, default: float) -> float:
    """A wall-clock deadline from the server as a time on the event loop's clock."""
    now = asyncio.get_running_loop().time()
    if not rfc3339:
        return now + default
    try:
        at = datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    except ValueError:
        return now + default
    left = (at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
    return now + max(0.0, left)


class ExternalExecutor:
    """Runs `agent` as the client's identity, taking turns as they come."""

    def __init__(
        self,
        client: Client,
        agent: Agent,
        core: ExecutorCore | None = None,
        *,
        default_timeout: float = 60.0,
    ) -> None:
        self.client = client
        self.agent = agent
        self.core = core or ExecutorCore()
        #: The deadline (seconds) used when the server names none (pull mode without a turn
        #: timeout).
        self.default_timeout = default_timeout
        self._tasks: set[asyncio.Task[Any]] = set()
        #: How each run ended, in order (for logs and tests).
        self.reports: list[tuple[Assignment, RunReport]] = []

    async def run_push(self) -> None:
        """Push-claim mode: registers for `request_turn` offers, claims each one, and runs the
        agent on every claim granted. The reply carries the claimed turn as `turnHint`, so a
        replica that lost its claim cannot post a second reply. Returns when the client is
        closed."""
        offers = await self.client.register_executor()
        try:
            async for offer in offers:
                self._spawn(self._claim_and_run(offer))
        finally:
            await self._drain()

    async def _claim_and_run(self, offer: RequestTurnNotification) -> None:
        try:
            claim = await self.client.claim_turn(offer["claimId"])
        except Exception as e:  # noqa: BLE001 — another replica has it, or the turn is over
            log.debug("claim %s not granted: %s", offer["claimId"], e)
            return
        if not claim.get("granted"):
            return
        a = Assignment(
            conversation_id=claim["conversationId"],
            agent_id=offer["agentId"],
            turn=claim["turn"],
            deadline=_deadline_from(claim.get("deadline"), offer.get("deadlineMs", 60_000) / 1000),
            since_seq=offer.get("sinceSeq", 0),
            mode=offer.get("mode") or "converse",
            granted=True,
        )
        await self._run(a)

    async def run_pull(self) -> None:
        """Pull mode: follows every conversation the agent takes part in (new ones included)
        and runs the agent on each turn its guidance gives it. Each turn is taken at most once
        by this executor; after a reconnect the subscription replays what it missed, so no
        turn is missed. Returns when the client is closed."""
        sub = await self.client.subscribe()
        handled: dict[str, int] = {}
        try:
            for s in await self.client.all_conversations(status="open", participant=self.client.agent_id):
                self._consider(s, handled)
            async for item in sub:
                e = item["event"]
                if e["kind"] == "trace" or (e["kind"] == "message" and e.get("finality") == "none"):
                    continue
                try:
                    s = await self.client.get_conversation(item["conversationId"])
                except Exception as err:  # noqa: BLE001
                    log.debug("guidance not read: %s", err)
                    continue
                self._consider(s, handled)
        finally:
            await self._drain()

    def _consider(self, s: Snapshot, handled: dict[str, int]) -> None:
        """Runs the agent if this snapshot says the turn is its own and it was not taken yet."""
        g = s["guidance"]
        if g["status"] != "may_speak" or s.get("speaker") != self.client.agent_id:
            return
        if handled.get(s["conversationId"], 0) >= s["turn"]:
            return
        handled[s["conversationId"]] = s["turn"]
        a = Assignment(
            conversation_id=s["conversationId"],
            agent_id=self.client.agent_id or "",
            turn=s["turn"],
            deadline=_deadline_from(g.get("deadline"), self.default_timeout),
            mode=g.get("mode") or "converse",
        )
        self._spawn(self._run(a))

    async def _run(self, a: Assignment) -> None:
        log.info("took turn %d of %s", a.turn, a.conversation_id)
        report = await self.core.run(self.agent, self.client, a)
        self.reports.append((a, report))
        if report.label == "done":
            log.info("turn %d of %s done: %s", a.turn, a.conversation_id, report.outcome.value if report.outcome else "")
        elif report.label in ("failed", "deadline_exceeded"):
            log.warning("turn %d of %s %s: %s", a.turn, a.conversation_id, report.label.replace("_", " "), report.error or "")
        else:
            log.info("turn %d of %s not run: %s", a.turn, a.conversation_id, report.label.replace("_", " "))

    def _spawn(self, work: Any) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
