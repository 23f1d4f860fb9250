"""The Python SDK (`sdks/python`, installed by scripts/test) against the release binary: every
method, typed errors, and its guarantees through a proxy that cuts connections: a subscription
resumes with no gap and no duplicate, and a write cut before its answer lands once."""

import asyncio
import json
import pathlib
import random
import subprocess
import sys

import pytest

from conftest import ROOT, run
from orchestrator_sdk import AuthenticationFailed, Client, ErrorCode, RpcError


def test_error_codes_are_the_protocols():
    """The SDK's table of codes is the one `proto-spec/openrpc.json` lists, name for name."""
    spec = json.loads((ROOT / "proto-spec" / "openrpc.json").read_text())
    wire = {e["name"]: e["code"] for e in spec["x-errors"]}
    ours = {c.wire_name: int(c) for c in ErrorCode}
    assert ours == wire


def test_every_method_and_typed_errors(server):
    async def main():
        admin = await Client.connect(server.url, server.tokens["admin"])
        alice = await Client.connect(server.url, server.tokens["alice"])
        bob = await Client.connect(server.url, server.tokens["bob"])
        assert alice.agent_id == "alice"
        made = await admin.create_conversation(
            conversationId="c1",
            scenario={"participants": ["alice", "bob"], "policy": {"order": "round_robin", "first": "alice"}},
        )
        assert made == {"conversationId": "c1"}
        sub = await bob.subscribe("c1", since_seq=0)
        first = await sub.next(10)
        assert first["conversationId"] == "c1" and first["event"]["seq"] == 1

        # Not bob's turn: a typed refusal with the protocol's code and data.
        with pytest.raises(RpcError) as refused:
            await bob.send_message("c1", "me first")
        assert refused.value.code == ErrorCode.NOT_YOUR_TURN
        assert refused.value.data["error"] == "NotYourTurn"

        snap = await alice.get_conversation("c1")
        r = await alice.send_message("c1", "hello", turn_hint=snap["turn"], client_request_id="k1")
        assert r["duplicate"] is False
        again = await alice.send_message("c1", "hello", turn_hint=snap["turn"], client_request_id="k1")
        assert again == dict(r, duplicate=True), "a retried key answers the original"
        trace = await alice.send_trace("c1", {"type": "note", "text": "thinking"})
        assert trace["seq"] > r["seq"]

        updates = await bob.get_updates("c1", since_seq=0, timeout_ms=0)
        assert [m["payload"]["text"] for m in updates["messages"]] == ["hello"]
        assert updates["guidance"]["status"] == "may_speak"
        changed = await bob.wait_for_change("c1", since_seq=0, timeout_ms=1000)
        assert changed["timedOut"] is False
        tail = await bob.tail("c1", since_seq=0, limit=2)
        assert [e["seq"] for e in tail["events"]] == [1, 2]
        listed = await bob.list_conversations()
        assert [c["conversationId"] for c in listed["conversations"]] == ["c1"]
        assert (await admin.list_scenarios())["scenarios"] == []
        with pytest.raises(RpcError) as forbidden:
            await bob.list_scenarios()
        assert forbidden.value.code == ErrorCode.FORBIDDEN

        # A tenant's admin mints, lists and revokes its tokens (the token shown once).
        made = await admin.create_token("py-token-agent", expires_in="1m")
        assert made["token"].startswith("oct_") and made["tenant"] == "default" and made["expiresMs"]
        listed_tokens = (await admin.list_tokens())["tokens"]
        assert any(t["id"] == made["id"] for t in listed_tokens)
        assert made["token"][4:] not in str(listed_tokens)
        assert (await admin.revoke_token(made["id"]))["revoked"] == 1
        assert (await admin.revoke_token(agent_id="py-token-agent"))["revoked"] == 0
        with pytest.raises(RpcError) as not_admin:
            await bob.list_tokens()
        assert not_admin.value.code == ErrorCode.FORBIDDEN
        # A tenant's quotas are an operator's to set.
        with pytest.raises(RpcError) as not_operator:
            await admin.set_tenant_quotas("default", {"connections": 1})
        assert not_operator.value.code == ErrorCode.FORBIDDEN

        await admin.pause_conversation("c1")
        with pytest.raises(RpcError) as paused:
            await bob.send_message("c1", "while paused")
        assert paused.value.code == ErrorCode.CONVERSATION_PAUSED
        await admin.resume_conversation("c1")
        fork = await admin.fork_conversation("c1", at_seq=2, new_conversation_id="c1-fork")
        assert fork["conversationId"] == "c1-fork"

        seen = [(await sub.next(10))["event"]["seq"] for _ in range(tail["latestSeq"] - 1)]
        assert seen == list(range(2, tail["latestSeq"] + 1))
        assert await bob.unsubscribe(sub) is True
        # Iteration ends once the subscription has, after what it held (the pause and resume).
        rest = [item["event"]["seq"] async for item in sub]
        assert rest == list(range(seen[-1] + 1, seen[-1] + 1 + len(rest))) and len(rest) <= 2

        # A deleted conversation: its subscription ends with the error, and it is gone.
        gone = await bob.subscribe("c1-fork", since_seq=0)
        assert (await gone.next(10))["event"]["seq"] == 1
        assert await admin.delete_conversation("c1-fork") == {"deleted": ["c1-fork"]}
        with pytest.raises(RpcError) as ended:
            while True:
                await gone.next(10)
        assert ended.value.code == ErrorCode.CONVERSATION_NOT_FOUND
        assert ended.value.data["deleted"] is True
        with pytest.raises(RpcError) as deleted:
            await bob.tail("c1-fork", since_seq=0)
        assert deleted.value.code == ErrorCode.CONVERSATION_NOT_FOUND

        with pytest.raises(AuthenticationFailed):
            await Client.connect(server.url, "oct_not-a-token")
        for c in (admin, alice, bob):
            await c.close()

    run(main())


def test_a_push_replica_is_offered_the_turn_and_claims_it(server):
    async def main():
        admin = await Client.connect(server.url, server.tokens["admin"])
        bob = await Client.connect(server.url, server.tokens["bob"])
        offers = await bob.register_executor()
        await admin.create_conversation(
            conversationId="p1",
            scenario={"participants": ["alice", "bob"], "policy": {"order": "round_robin", "first": "bob"}},
        )
        offer = await offers.next(10)
        assert offer["conversationId"] == "p1" and offer["agentId"] == "bob"
        granted = await bob.claim_turn(offer["claimId"])
        assert granted["granted"] is True
        r = await bob.send_message("p1", "my turn", turn_hint=granted["turn"])
        assert r["turn"] == granted["turn"]
        with pytest.raises(RpcError) as gone:
            await bob.claim_turn("no-such-claim")
        assert gone.value.code == ErrorCode.CLAIM_NOT_FOUND
        assert await bob.unregister_executor(offers) is True
        await admin.close()
        await bob.close()

    run(main())


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 in front of the server that can cut every connection through it."""

    def __init__(self, target_port):
        self.target_port = target_port
        self.pipes = set()

    async def start(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}/rpc"
        return self

    async def _serve(self, reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        pair = (writer, up_writer)
        self.pipes.add(pair)

        async def pump(src, dst):
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self.pipes.discard(pair)

    def cut(self):
        """Cuts every connection through the proxy at once (both sides, mid-stream)."""
        for down, up in list(self.pipes):
            for w in (down, up):
                w.transport.abort()
        self.pipes.clear()

    async def close(self):
        self.cut()
        self.server.close()


def test_writes_held_to_a_trace_sent_without_waiting(server):
    """What the executor runs an attempt with (the trace sent without waiting, the agent's
    writes held to it by its context): a write held to a key that is not in the log is
    refused; one sent right behind the trace it is held to, before the trace's answer, lands
    after it."""

    async def main():
        admin = await Client.connect(server.url, server.tokens["admin"])
        alice = await Client.connect(server.url, server.tokens["alice"])
        await admin.create_conversation(conversationId="h1", participants=["alice"])
        with pytest.raises(RpcError) as refused:
            await alice.send_message("h1", "too early", "none", after_key="t1.a1.x0")
        assert refused.value.code == ErrorCode.INVALID_PARAMS
        started = await alice._send_trace_queued(
            "h1", {"type": "turn_start"}, client_request_id="t1.a1.x0"
        )
        reply = await alice.send_message("h1", "held", "none", after_key="t1.a1.x0")
        start = await started
        assert reply["seq"] == start["seq"] + 1
        for c in (admin, alice):
            await c.close()

    run(main())


def test_resume_and_retried_writes_through_a_proxy_that_cuts(server):
    """A subscriber and a writer behind a proxy that cuts their connections every 50–150 ms
    while a direct writer posts: the subscriber sees every event once, in seq order; every
    write the cut writer made lands once (its retries carry the same idempotency key)."""

    async def main():
        admin = await Client.connect(server.url, server.tokens["admin"])
        await admin.create_conversation(conversationId="busy", participants=["alice", "bob"])
        proxy = await CuttingProxy(server.port).start()
        bob = await Client.connect(proxy.url, server.tokens["bob"], min_backoff=0.01, max_backoff=0.2)
        cut_alice = await Client.connect(proxy.url, server.tokens["alice"], min_backoff=0.01, max_backoff=0.2)
        direct = await Client.connect(server.url, server.tokens["alice"])
        sub = await bob.subscribe("busy", since_seq=0)

        async def cutter(stop):
            while not stop.is_set():
                await asyncio.sleep(random.uniform(0.05, 0.15))
                proxy.cut()

        async def write(client, prefix, n):
            for i in range(n):
                await client.send_message("busy", f"{prefix}{i}", "none")

        stop = asyncio.Event()
        cutting = asyncio.create_task(cutter(stop))
        await asyncio.gather(write(direct, "d", 150), write(cut_alice, "c", 150))
        stop.set()
        await cutting
        total = 1 + 300
        seqs = []
        while len(seqs) < total:
            seqs.append((await sub.next(20))["event"]["seq"])
        assert seqs == list(range(1, total + 1)), "no gap, no duplicate, in order"
        log = []
        since = 0
        while True:
            page = await admin.tail("busy", since_seq=since, limit=1000)
            log.extend(page["events"])
            if not page["events"]:
                break
            since = page["events"][-1]["seq"]
        texts = [e["payload"].get("text") for e in log if e["kind"] == "message"]
        assert sorted(texts) == sorted([f"d{i}" for i in range(150)] + [f"c{i}" for i in range(150)])
        assert bob.reconnects > 0 and cut_alice.reconnects > 0, "the proxy did cut them"
        for c in (admin, bob, cut_alice, direct):
            await c.close()
        await proxy.close()

    run(main())


def test_the_package_is_typed_and_checks_strictly():
    """`py.typed` ships, and mypy --strict finds nothing in the package."""
    package = pathlib.Path(ROOT) / "sdks" / "python" / "src" / "orchestrator_sdk"
    assert (package / "py.typed").exists()
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(package)],
        capture_output=True, text=True, timeout=300,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_wire_types_are_the_schemas():
    """wire.py (and the TypeScript SDK's wire.ts) are what scripts/gen-sdk-types makes of
    proto-spec/schemas now: a change to the protocol's types that is not regenerated fails."""
    checked = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen-sdk-types"), "--check"], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stderr
