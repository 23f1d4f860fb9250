"""A client nobody here wrote (Python `websockets`) against the release binary."""

import asyncio
import json
import signal

import pytest
import websockets

from conftest import Client, RpcError, run


async def setup(server):
    admin = await Client.connect(server.url, server.tokens["admin"])
    await admin.call("createConversation", {"conversationId": "c1", "participants": ["alice", "bob"]})
    await admin.close()


def test_create_post_subscribe_reconnect_resume(server):
    async def main():
        await setup(server)
        alice = await Client.connect(server.url, server.tokens["alice"])
        for i in range(20):
            r = await alice.call("sendMessage", {"conversationId": "c1", "payload": {"text": f"m{i}"}, "finality": "none"})
            assert r == {"seq": i + 2, "turn": 1, "duplicate": False}

        # Subscribe from a cursor: the backlog after it, then live events.
        bob = await Client.connect(server.url, server.tokens["bob"])
        await bob.call("subscribe", {"conversationId": "c1", "sinceSeq": 5})
        seen = []
        for _ in range(6):
            seen.append((await bob.next_event())["seq"])
        assert seen == list(range(6, 12))

        # A writer keeps posting while bob's connection drops mid-stream.
        async def writer():
            for i in range(20, 120):
                await alice.call("sendMessage", {"conversationId": "c1", "payload": {"text": f"m{i}"}, "finality": "none"})

        task = asyncio.create_task(writer())
        for _ in range(10):
            seen.append((await bob.next_event())["seq"])
        await bob.close()
        await asyncio.sleep(0.05)

        # Reconnect and resume from the last seq seen: no gap, no duplicate.
        bob = await Client.connect(server.url, server.tokens["bob"])
        await bob.call("subscribe", {"conversationId": "c1", "sinceSeq": seen[-1]})
        await task
        while seen[-1] < 121:
            seen.append((await bob.next_event())["seq"])
        assert seen == list(range(6, 122))
        tail = await bob.call("tail", {"conversationId": "c1", "sinceSeq": 0})
        assert [e["seq"] for e in tail["events"]] == list(range(1, 122))
        assert tail["events"][1]["author"] == "alice"
        await bob.close()
        await alice.close()

    run(main())


def test_errors_from_a_raw_client(server):
    async def main():
        await setup(server)
        ws = await websockets.connect(server.url)
        await ws.send("{oops")
        assert json.loads(await ws.recv())["error"]["code"] == -32700
        await ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tail", "params": {"conversationId": "c1", "sinceSeq": 0}}))
        assert json.loads(await ws.recv())["error"]["code"] == -32001
        await ws.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "authenticate", "params": {"token": server.tokens["bob"]}}))
        assert json.loads(await ws.recv())["result"]["agentId"] == "bob"
        await ws.send(json.dumps({"jsonrpc": "2.0", "id": 3, "method": "nope", "params": {}}))
        assert json.loads(await ws.recv())["error"]["code"] == -32601
        await ws.send(json.dumps({"jsonrpc": "2.0", "id": 4, "method": "sendMessage",
                                  "params": {"conversationId": "c1", "payload": {"text": "x"}, "finality": "turn", "author": "alice"}}))
        err = json.loads(await ws.recv())["error"]
        assert err["code"] == -32602 and "author" in err["message"]
        await ws.close()

    run(main())


def test_acknowledged_appends_survive_a_kill(server):
    async def post_some():
        await setup(server)
        alice = await Client.connect(server.url, server.tokens["alice"])
        acked = []
        for i in range(50):
            r = await alice.call("sendMessage", {"conversationId": "c1", "payload": {"text": f"k{i}"},
                                                 "finality": "none", "clientRequestId": f"key-{i}"})
            acked.append(r["seq"])
        return acked

    acked = run(post_some())
    server.stop(signal.SIGKILL)
    server.start()

    async def check():
        alice = await Client.connect(server.url, server.tokens["alice"])
        tail = await alice.call("tail", {"conversationId": "c1", "sinceSeq": 0})
        seqs = [e["seq"] for e in tail["events"]]
        assert seqs == list(range(1, len(seqs) + 1))
        assert set(acked) <= set(seqs)
        retry = await alice.call("sendMessage", {"conversationId": "c1", "payload": {"text": "k7"},
                                                 "finality": "none", "clientRequestId": "key-7"})
        assert retry == {"seq": acked[7], "turn": 1, "duplicate": True}
        nxt = await alice.call("sendMessage", {"conversationId": "c1", "payload": {"text": "next"}, "finality": "turn"})
        assert nxt["seq"] == seqs[-1] + 1
        with pytest.raises(RpcError) as e:
            await alice.call("sendMessage", {"conversationId": "c1", "payload": {"text": "other"},
                                             "finality": "none", "clientRequestId": "key-7"})
        assert e.value.code == -32015
        await alice.close()

    run(check())


def test_sigterm_ends_subscriptions_and_exits_cleanly(server):
    async def main():
        await setup(server)
        bob = await Client.connect(server.url, server.tokens["bob"])
        await bob.call("subscribe", {"conversationId": "c1", "sinceSeq": 0})
        assert (await bob.next_event())["seq"] == 1
        loop = asyncio.get_running_loop()
        code = await loop.run_in_executor(None, lambda: server.stop(signal.SIGTERM, timeout=10))
        assert code == 0
        await asyncio.wait_for(bob.reader, 5)

    run(main())
