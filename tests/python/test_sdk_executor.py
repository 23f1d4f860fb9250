"""The Python SDK's agent model against the real server: `ExternalExecutor` in pull and push-claim
mode, the executor's traces and retries as the Rust executor core writes them, deadlines, and
high availability (three push replicas in their own processes, one SIGKILLed mid-turn: every
turn answered exactly once)."""

import asyncio
import os
import pathlib
import signal
import subprocess
import sys

from conftest import ROOT, run
from orchestrator_sdk import Agent, Assignment, Client, ExecPolicy, ExecutorCore, ExternalExecutor, TurnOutcome

ROUND_ROBIN = {"participants": ["alice", "bob"], "policy": {"order": "round_robin", "first": "alice"}}


async def whole_log(client, conversation_id):
    events, since = [], 0
    while True:
        page = await client.tail(conversation_id, since_seq=since, limit=1000)
        if not page["events"]:
            return events
        events.extend(page["events"])
        since = page["events"][-1]["seq"]


def replies(log, author):
    """The turn-closing messages of `author`: (turn, text)."""
    return [
        (e["turn"], e["payload"].get("text"))
        for e in log
        if e["kind"] == "message" and e["author"] == author and e.get("finality") == "turn"
    ]


def executor_traces(log):
    """The executor's traces: (type, attempt, outcome or error)."""
    return [
        (e["payload"]["type"], e["payload"]["attempt"], e["payload"].get("outcome") or e["payload"].get("error"))
        for e in log
        if e["kind"] == "trace" and str(e["payload"].get("type", "")).startswith("turn_")
    ]


async def ask(alice, conversation_id, text, wait_for_reply_to):
    """Alice says `text` in her turn, then waits until bob answered (the log is past it and the
    turn is hers again)."""
    await alice.send_message(conversation_id, text)
    for _ in range(500):
        s = await alice.get_conversation(conversation_id)
        if s["guidance"]["status"] == "may_speak" and s["turn"] > wait_for_reply_to:
            return s["turn"]
        await alice.wait_for_change(conversation_id, s["latestSeq"], 200)
    raise AssertionError(f"bob did not answer {text!r}")


class FlakyEcho(Agent):
    """Fails its first attempt at every turn, then echoes what alice said last."""

    def __init__(self):
        self.attempts = []

    async def handle_turn(self, ctx):
        self.attempts.append((ctx.turn, ctx.attempt))
        if ctx.attempt == 1:
            raise RuntimeError("first attempts fail")
        said = [m for m in await ctx.history() if m["author"] == "alice"]
        await ctx.say(f"echo: {said[-1]['payload']['text']}")
        return TurnOutcome.POSTED


def test_pull_mode_takes_each_turn_once_retries_and_traces_as_the_rust_core(server):
    async def main():
        admin = await Client.connect(server.url, server.tokens["admin"])
        alice = await Client.connect(server.url, server.tokens["alice"])
        bob = await Client.connect(server.url, server.tokens["bob"])
        agent = FlakyEcho()
        executor = ExternalExecutor(bob, agent)
        pulling = asyncio.create_task(executor.run_pull())
        # Created after the executor started: the all-conversations subscription finds it.
        await admin.create_conversation(conversationId="pull", scenario=ROUND_ROBIN)
        turn = 0
        for i in range(3):
            turn = await ask(alice, "pull", f"q{i}", turn)
        for _ in range(200):  # the last run's turn_end is written after the turn moved on
            if len(executor.reports) == 3:
                break
            await asyncio.sleep(0.02)
        log = await whole_log(admin, "pull")
        assert [t for _, t in replies(log, "bob")] == ["echo: q0", "echo: q1", "echo: q2"]
        bob_turns = [t for t, _ in replies(log, "bob")]
        assert agent.attempts == [(t, a) for t in bob_turns for a in (1, 2)]
        # Per turn, as executors/src/core.rs writes them: start, error, start, end.
        traces = executor_traces(log)
        assert traces == [
            step
            for _ in bob_turns
            for step in (
                ("turn_start", 1, None),
                ("turn_error", 1, "first attempts fail"),
                ("turn_start", 2, None),
                ("turn_end", 2, "posted"),
            )
        ]
        keys = sorted(e.get("clientRequestId", "") for e in log if e["kind"] == "trace")
        assert all(k for k in keys), "every executor write carries its key"
        assert [r.label for _, r in executor.reports] == ["done"] * 3
        await bob.close()
        await pulling  # ends when its client closes
        await admin.close()
        await alice.close()

    run(main())


class Sleeper(Agent):
    async def handle_turn(self, ctx):
        await asyncio.sleep(ctx.remaining() + 5)
        return TurnOutcome.POSTED


class Quitter(Agent):
    async def handle_turn(self, ctx):
        await ctx.say("bye", "conversation")
        return TurnOutcome.COMPLETE


def test_push_mode_claims_runs_and_meets_deadlines(server):
    async def main():
        admin = await Client.connect(server.url, server.tokens["admin"])
        alice = await Client.connect(server.url, server.tokens["alice"])
        bob = await Client.connect(server.url, server.tokens["bob"])
        sleepy = ExternalExecutor(bob, Sleeper(), ExecutorCore(ExecPolicy(max_attempts=1)))
        pushing = asyncio.create_task(sleepy.run_push())
        scenario = {**ROUND_ROBIN, "turn": {"timeout": "1s", "onTimeout": "skip"}}
        await admin.create_conversation(conversationId="late", scenario=scenario)
        await alice.send_message("late", "anyone?")
        traces = []
        for _ in range(100):
            traces = executor_traces(await whole_log(admin, "late"))
            if len(traces) == 2:
                break
            await asyncio.sleep(0.05)
        assert traces == [("turn_start", 1, None), ("turn_error", 1, "deadline exceeded")]
        # The claim expires with the deadline and the turn may be offered again before its
        # timeout lands: a second claim finds the first run still going (or the deadline gone).
        labels = {r.label for _, r in sleepy.reports}
        assert "deadline_exceeded" in labels and labels <= {"deadline_exceeded", "already_running"}
        await bob.close()
        await pushing

        # Another agent (the conversation above goes on turning over between alice and bob).
        carol = await Client.connect(server.url, server.token("carol"))
        quitter = ExternalExecutor(carol, Quitter())
        pushing = asyncio.create_task(quitter.run_push())
        scenario = {"participants": ["alice", "carol"], "policy": {"order": "round_robin", "first": "alice"}}
        await admin.create_conversation(conversationId="quit", scenario=scenario)
        await alice.send_message("quit", "over to you")
        for _ in range(200):
            if quitter.reports and (await admin.get_conversation("quit"))["status"] == "closed":
                break
            await asyncio.sleep(0.05)
        log = await whole_log(admin, "quit")
        assert replies(log, "carol") == []
        assert [e["payload"]["text"] for e in log if e.get("finality") == "conversation"] == ["bye"]
        assert [(r.label, r.outcome) for _, r in quitter.reports] == [("done", TurnOutcome.COMPLETE)]
        # A closed conversation takes no more traces: its turn_end is not written.
        assert executor_traces(log) == [("turn_start", 1, None)]
        await carol.close()
        await pushing
        for c in (admin, alice):
            await c.close()

    run(main())


class Holder(Agent):
    def __init__(self):
        self.release = asyncio.Event()

    async def handle_turn(self, ctx):
        await self.release.wait()
        return TurnOutcome.NO_ACTION


def test_one_invocation_per_conversation_and_agent(server):
    """The same turn handed twice runs once (`already_running`); a later turn waits for the
    invocation running to finish."""

    async def main():
        admin = await Client.connect(server.url, server.tokens["admin"])
        alice = await Client.connect(server.url, server.tokens["alice"])
        bob = await Client.connect(server.url, server.tokens["bob"])
        await admin.create_conversation(conversationId="once", scenario=ROUND_ROBIN)
        await alice.send_message("once", "go")
        s = await bob.get_conversation("once")
        core, agent = ExecutorCore(), Holder()
        loop = asyncio.get_running_loop()
        a = Assignment("once", "bob", s["turn"], loop.time() + 10)
        first = asyncio.create_task(core.run(agent, bob, a))
        await asyncio.sleep(0.2)
        assert (await core.run(agent, bob, a)).label == "already_running"
        later = asyncio.create_task(core.run(agent, bob, Assignment("once", "bob", s["turn"] + 1, loop.time() + 10)))
        await asyncio.sleep(0.2)
        assert not later.done(), "a later turn waits for the running invocation"
        agent.release.set()
        assert (await first).label == "done"
        await later
        for c in (admin, alice, bob):
            await c.close()

    run(main())


def test_three_push_replicas_one_killed_mid_turn_answer_every_turn_once(server, tmp_path):
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    replica = str(ROOT / "tests" / "python" / "sdk_replica.py")

    def start(name):
        p = subprocess.Popen(
            [sys.executable, replica, server.url, server.tokens["bob"], str(marks), name],
            stdout=subprocess.PIPE, text=True, env=env,
        )
        assert p.stdout.readline().strip() == "ready"
        return p

    async def main():
        admin = await Client.connect(server.url, server.tokens["admin"])
        alice = await Client.connect(server.url, server.tokens["alice"])
        await admin.create_conversation(conversationId="ha", scenario=ROUND_ROBIN)
        # The first replica alone holds the first turn of bob; the others join while it works.
        first = start("r1")
        await alice.send_message("ha", "q0")
        for _ in range(200):
            if list(marks.glob("r1.*")):
                break
            await asyncio.sleep(0.02)
        assert list(marks.glob("r1.*")), "the first replica took the turn"
        others = [start("r2"), start("r3")]
        os.kill(first.pid, signal.SIGKILL)  # mid-turn: it posted progress, not its answer
        first.wait()
        turn = await ask_reply(alice, "ha")
        for i in range(1, 6):
            turn = await ask(alice, "ha", f"q{i}", turn)
        log = await whole_log(admin, "ha")
        answered = replies(log, "bob")
        turns = [t for t, _ in answered]
        assert len(turns) == len(set(turns)) == 6, f"every turn answered exactly once: {answered}"
        assert [text for _, text in answered] == [f"answer to turn {t}" for t in turns]
        progress = [e["turn"] for e in log if e["author"] == "bob" and e.get("finality") == "none"]
        assert sorted(set(progress)) == turns and len(progress) == len(set(progress)), "no write twice"
        taken = {p.name.split(".")[0] for p in marks.iterdir()}
        assert "r1" in taken and taken & {"r2", "r3"}, "the killed replica's turn went to another"
        for p in others:
            p.kill()
            p.wait()
        await admin.close()
        await alice.close()

    async def ask_reply(alice, conversation_id):
        """Waits for bob's answer to the turn the killed replica held."""
        for _ in range(500):
            s = await alice.get_conversation(conversation_id)
            if s["guidance"]["status"] == "may_speak" and s["turn"] > 1:
                return s["turn"]
            await alice.wait_for_change(conversation_id, s["latestSeq"], 200)
        raise AssertionError("the turn held by the killed replica was never answered")

    run(main())


def test_the_python_partner_example_answers_in_both_modes(server):
    """examples/partner-agent/python/agent.py (30 lines at most), as a partner runs it."""
    example = ROOT / "examples" / "partner-agent" / "python" / "agent.py"
    assert len(example.read_text().splitlines()) <= 30

    async def main():
        admin = await Client.connect(server.url, server.tokens["admin"])
        alice = await Client.connect(server.url, server.tokens["alice"])
        for mode in ("push", "pull"):
            env = {**os.environ, "ORCHESTRATOR_URL": server.url, "ORCHESTRATOR_TOKEN": server.tokens["bob"]}
            partner = subprocess.Popen([sys.executable, str(example), mode], env=env)
            try:
                conv = f"example-{mode}"
                await admin.create_conversation(conversationId=conv, scenario=ROUND_ROBIN)
                await ask(alice, conv, "hello", 0)
                log = await whole_log(admin, conv)
                assert [text for _, text in replies(log, "bob")] == ["You said: hello"]
            finally:
                partner.kill()
                partner.wait()
        await admin.close()
        await alice.close()

    run(main())


class Gated(Agent):
    """Posts progress, waits for its gate, then answers: the same writes whichever replica
    runs it."""

    def __init__(self, gate=None):
        self.gate = gate
        self.ran = []

    async def handle_turn(self, ctx):
        self.ran.append(ctx.turn)
        await ctx.say(f"working on turn {ctx.turn}", "none")
        if self.gate is not None:
            await self.gate.wait()
        await ctx.say(f"answer to turn {ctx.turn}")
        return TurnOutcome.POSTED


def test_a_claim_lost_to_another_replica_through_a_cut_lands_one_reply(server):
    """Replica A, behind a proxy, claims bob's turn and posts progress; the proxy cuts it off
    (it reconnects, slowly); the turn is offered to replica B, which answers. A then finishes
    its attempt: its writes are B's (same keys, same bodies) and land nothing twice."""
    from test_sdk_python import CuttingProxy

    async def main():
        admin = await Client.connect(server.url, server.tokens["admin"])
        alice = await Client.connect(server.url, server.tokens["alice"])
        proxy = await CuttingProxy(server.port).start()
        gate = asyncio.Event()
        a_client = await Client.connect(proxy.url, server.tokens["bob"], min_backoff=1.0, max_backoff=1.0)
        a = ExternalExecutor(a_client, Gated(gate))
        a_task = asyncio.create_task(a.run_push())
        await admin.create_conversation(conversationId="lost", scenario=ROUND_ROBIN)
        await alice.send_message("lost", "q0")
        for _ in range(250):
            if any(e.get("finality") == "none" for e in await whole_log(admin, "lost")):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("replica A did not start the turn")
        b_client = await Client.connect(server.url, server.tokens["bob"])
        b_agent = Gated()
        b = ExternalExecutor(b_client, b_agent)
        b_task = asyncio.create_task(b.run_push())
        proxy.cut()  # A loses its connection holding the claim
        for _ in range(250):
            if replies(await whole_log(admin, "lost"), "bob"):
                break
            await asyncio.sleep(0.02)
        assert b_agent.ran == [2], "replica B took the turn A lost"
        gate.set()  # A's attempt goes on, after its reconnect
        for _ in range(250):
            if a.reports:
                break
            await asyncio.sleep(0.02)
        assert a_client.reconnects > 0
        log = await whole_log(admin, "lost")
        assert replies(log, "bob") == [(2, "answer to turn 2")], "one reply"
        assert [e["payload"]["text"] for e in log if e.get("finality") == "none"] == ["working on turn 2"]
        for c in (a_client, b_client, admin, alice):
            await c.close()
        await asyncio.gather(a_task, b_task)
        await proxy.close()

    run(main())
