"""The MCP adapter with the official Python `mcp` client, over stdio and over streamable HTTP.

An external participant talks to an internal scripted assistant only through the adapter's
tools until the conversation closes; in the middle the adapter is killed (SIGKILL) and a new
one started, and the conversation completes with no gap and no duplicate: the participant's
cursor lives with it, not in the adapter."""

import asyncio
import os
import pathlib
import signal
import subprocess
import time

import pytest
from mcp import Client, StdioServerParameters

from conftest import BIN, Client as RpcClient, run, spawn_listening

MCP_BIN = os.environ.get("ORCHESTRATOR_MCP_BIN", str(pathlib.Path(BIN).with_name("orchestrator-mcp")))

SCENARIO = {
    "participants": [
        {"id": "user", "external": True},
        {
            "id": "assistant",
            "kind": "scripted",
            "replies": [
                "Hello! Ask me anything.",
                "An append-only log keeps every decision.",
                "Replicas claim turns, so each is answered once.",
                "That is all for today. TERMINATE",
            ],
        },
    ],
    "policy": {"order": "round_robin", "first": "user"},
    "stop": {"onText": "TERMINATE"},
    "turn": {"timeout": "60s"},
}


def create(server, cid):
    async def main():
        admin = await RpcClient.connect(server.url, server.tokens["admin"])
        await admin.call("createConversation", {"conversationId": cid, "scenario": SCENARIO})
        await admin.close()

    run(main())


def log_messages(server, cid):
    async def main():
        admin = await RpcClient.connect(server.url, server.tokens["admin"])
        tail = await admin.call("tail", {"conversationId": cid, "sinceSeq": 0})
        await admin.close()
        return [e for e in tail["events"] if e["kind"] == "message"]

    return run(main())


def data(result):
    assert not result.is_error, result.content
    return result.structured_content


def kill_adapters(marker):
    """SIGKILLs every adapter process whose command line holds `marker`; how many."""
    out = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    for pid in out:
        os.kill(int(pid), signal.SIGKILL)
    return len(out)


class Participant:
    """The user's side: the cursor and what it saw live here, across adapters."""

    def __init__(self, cid):
        self.cid = cid
        self.cursor = 0
        self.seen = []
        self.asked = 0
        self.closed = False

    async def step(self, client):
        """One wait, then a post if it is our turn."""
        r = data(await client.call_tool("wait_for_updates", {"conversationId": self.cid, "sinceSeq": self.cursor, "timeoutMs": 5000}))
        self.seen.extend(m["seq"] for m in r["messages"])
        self.cursor = r["latestSeq"]
        g = r["guidance"]
        if g["status"] == "closed":
            self.closed = True
        elif g["status"] == "may_speak":
            # The key makes the post safe to repeat after an adapter dies in the middle of it.
            posted = data(await client.call_tool("post_message", {
                "conversationId": self.cid, "text": f"question {self.asked}", "clientRequestId": f"{self.cid}-q{self.asked}",
            }))
            assert posted["seq"] > self.cursor
            self.asked += 1

    async def until(self, client, asked=None):
        for _ in range(100):
            if self.closed or (asked is not None and self.asked >= asked):
                return
            await self.step(client)
        raise AssertionError("the conversation did not move on")


def check_complete(server, p):
    assert p.closed
    messages = log_messages(server, p.cid)
    assert p.seen == [m["seq"] for m in messages], "a message was missed or seen twice"
    mine = [m["payload"]["text"] for m in messages if m["author"] == "user"]
    assert mine == [f"question {i}" for i in range(len(mine))], "a post was doubled or lost"
    assert messages[-1]["author"] in ("assistant", "orchestrator")
    assert any("TERMINATE" in m["payload"]["text"] for m in messages)


def stdio_params(server, marker):
    return StdioServerParameters(
        command=MCP_BIN,
        args=["--url", server.url + "?" + marker],
        env={"ORCHESTRATOR_TOKEN": server.tokens["user"]},
    )


def test_mcp_over_stdio_survives_an_adapter_kill(server):
    server.tokens["user"] = server.token("user")
    create(server, "mcp-stdio")
    p = Participant("mcp-stdio")
    marker = "adapter=stdio-test"  # in a query the server ignores; it marks this test's adapters

    async def main():
        async with Client(stdio_params(server, marker)) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == {"wait_for_updates", "post_message", "list_conversations", "get_conversation"}
            listed = data(await client.call_tool("list_conversations", {}))
            assert [c["conversationId"] for c in listed["conversations"]] == ["mcp-stdio"]
            await p.until(client, asked=2)
            assert kill_adapters(marker) == 1
            with pytest.raises(Exception):
                await asyncio.wait_for(p.step(client), 10)
        async with Client(stdio_params(server, marker)) as client:
            await p.until(client)

    asyncio.run(asyncio.wait_for(main(), 120))
    check_complete(server, p)


class HttpAdapter:
    def __init__(self, server, listen="127.0.0.1:0", http_token=None, extra=()):
        extra = (["--http-token", http_token] if http_token else []) + list(extra)
        self.proc, self.url = spawn_listening(
            [MCP_BIN, "--url", server.url, "--http", listen, *extra], r"(http://\S+/mcp)", token=server.tokens["user"]
        )
        self.listen = self.url.removeprefix("http://").removesuffix("/mcp")

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def test_mcp_over_streamable_http_survives_an_adapter_kill(server):
    server.tokens["user"] = server.token("user")
    create(server, "mcp-http")
    p = Participant("mcp-http")
    adapter = HttpAdapter(server)

    async def main():
        nonlocal adapter
        async with Client(adapter.url) as client:
            await p.until(client, asked=2)
        adapter.kill()
        adapter = HttpAdapter(server, adapter.listen)
        async with Client(adapter.url) as client:
            await p.until(client)

    try:
        asyncio.run(asyncio.wait_for(main(), 120))
    finally:
        adapter.kill()
    check_complete(server, p)


def test_mcp_tool_errors_say_what_to_do(server):
    server.tokens["user"] = server.token("user")
    create(server, "mcp-errors")

    async def create_turns():
        admin = await RpcClient.connect(server.url, server.tokens["admin"])
        await admin.call("createConversation", {"conversationId": "mcp-turns", "scenario": {
            "participants": [{"id": "other", "external": True}, {"id": "user", "external": True}],
            "policy": {"order": "round_robin", "first": "other"},
        }})
        await admin.call("createConversation", {"conversationId": "mcp-modes", "scenario": {
            "participants": [{"id": "user", "external": True},
                             {"id": "planner", "external": True, "modes": ["plan", "converse"]}],
            "policy": {"order": "round_robin", "first": "user"},
        }})
        await admin.close()

    run(create_turns())
    adapter = HttpAdapter(server)

    async def main():
        async with Client(adapter.url) as client:
            # Unknown conversation.
            r = await client.call_tool("get_conversation", {"conversationId": "nope"})
            assert r.is_error and r.structured_content["error"] == "ConversationNotFound"
            assert "list_conversations" in r.structured_content["whatToDo"]
            # Not your turn: in this conversation another (silent) participant speaks first.
            r = await client.call_tool("post_message", {"conversationId": "mcp-turns", "text": "too early"})
            assert r.is_error and r.structured_content["error"] == "NotYourTurn"
            assert "wait_for_updates" in r.structured_content["whatToDo"]
            w = data(await client.call_tool("wait_for_updates", {"conversationId": "mcp-turns", "timeoutMs": 0}))
            assert w["guidance"]["status"] == "wait" and w["guidance"]["speaker"] == "other"
            # A mode the next speaker does not support is refused, with what to do.
            r = await client.call_tool("post_message", {"conversationId": "mcp-modes", "text": "build it", "mode": "build"})
            assert r.is_error and r.structured_content["error"] == "ModeNotSupported", r
            assert "its modes" in r.structured_content["whatToDo"]
            r = await client.call_tool("post_message", {"conversationId": "mcp-modes", "text": "plan it", "mode": "plan"})
            assert not r.is_error, r
            # Malformed arguments: a missing field, a wrong type, an unknown field.
            for bad in ({"text": "no conversation"}, {"conversationId": "mcp-errors", "text": 5},
                        {"conversationId": "mcp-errors", "text": "x", "author": "mallory"}):
                try:
                    r = await client.call_tool("post_message", bad)
                except Exception as e:  # a JSON-RPC error: invalid params
                    assert "param" in str(e).lower() or "invalid" in str(e).lower(), e
                else:
                    assert r.is_error, bad
            # Closed: the admin closes the conversation; then posting says stop.
            async def close():
                admin = await RpcClient.connect(server.url, server.tokens["admin"])
                c = await RpcClient.connect(server.url, server.tokens["user"])
                for _ in range(50):
                    snap = await c.call("getConversation", {"conversationId": "mcp-errors"})
                    if snap["guidance"]["status"] == "may_speak":
                        break
                    await asyncio.sleep(0.05)
                await c.call("sendMessage", {"conversationId": "mcp-errors", "payload": {"text": "bye"}, "finality": "conversation"})
                await admin.close()
                await c.close()

            await close()
            r = await client.call_tool("post_message", {"conversationId": "mcp-errors", "text": "after the end"})
            assert r.is_error and r.structured_content["error"] == "ConversationClosed"
            assert "Stop" in r.structured_content["whatToDo"]
            w = data(await client.call_tool("wait_for_updates", {"conversationId": "mcp-errors", "sinceSeq": 0, "timeoutMs": 0}))
            assert w["guidance"]["status"] == "closed"

    try:
        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        adapter.kill()


def test_mcp_over_http_needs_its_bearer_token_and_beyond_loopback_one_is_required(server):
    """With --http-token, a call without the token (or with another) is 401 and nothing reaches
    the orchestrator; with it, the tools work. Listening beyond loopback without a token is
    refused at start, with the reason."""
    import httpx
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    server.tokens["user"] = server.token("user")
    create(server, "mcp-auth")
    adapter = HttpAdapter(server, http_token="s3cret-token")
    try:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
        headers = {"Accept": "application/json, text/event-stream"}
        for auth in (None, "Bearer wrong", "Basic czNjcmV0LXRva2Vu", "Bearer s3cret-token-and-more"):
            h = dict(headers, **({"Authorization": auth} if auth else {}))
            r = httpx.post(adapter.url, json=init, headers=h, timeout=10)
            assert r.status_code == 401, (auth, r.status_code, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            assert "--http-token" in r.json()["error"]

        async def main():
            # The scheme is case-insensitive.
            client = httpx2.AsyncClient(headers={"Authorization": "bearer s3cret-token"}, timeout=30)
            async with Client(streamable_http_client(adapter.url, http_client=client)) as mcp:
                r = await mcp.call_tool("post_message", {"conversationId": "mcp-auth", "text": "with the token", "finality": "none"})
                assert not r.is_error, r

        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        adapter.kill()

    # Beyond loopback, no token: refused at start, saying what to give.
    env = dict(os.environ, ORCHESTRATOR_TOKEN=server.tokens["user"])
    env.pop("ORCHESTRATOR_MCP_HTTP_TOKEN", None)
    out = subprocess.run([MCP_BIN, "--url", server.url, "--http", "0.0.0.0:0"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0, out
    assert "listens beyond loopback" in out.stderr and "--http-token" in out.stderr, out.stderr


def test_mcp_sessions_over_http_are_capped(server):
    """With --max-sessions 2, a third session is refused (503, RateLimited) while two are open,
    and opens once one of them is closed."""
    import httpx

    server.tokens["user"] = server.token("user")
    adapter = HttpAdapter(server, extra=["--max-sessions", "2"])
    headers = {"Accept": "application/json, text/event-stream"}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    try:
        opened = []
        for _ in range(2):
            r = httpx.post(adapter.url, json=init, headers=headers, timeout=10)
            assert r.status_code == 200, r.text
            opened.append(r.headers["mcp-session-id"])
        r = httpx.post(adapter.url, json=init, headers=headers, timeout=10)
        assert r.status_code == 503, r.text
        e = r.json()["error"]
        assert e["code"] == -32029 and e["data"] == {"error": "RateLimited", "limit": 2}, e
        assert "too many MCP sessions" in e["message"], e
        # A call in an open session still goes through.
        listed = httpx.post(adapter.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                            headers=dict(headers, **{"mcp-session-id": opened[0], "mcp-protocol-version": "2025-06-18"}), timeout=10)
        assert listed.status_code in (200, 202), listed.text
        # One closed: a new session opens.
        r = httpx.delete(adapter.url, headers={"mcp-session-id": opened[1]}, timeout=10)
        assert r.status_code in (200, 202, 204), r.text
        for _ in range(50):
            r = httpx.post(adapter.url, json=init, headers=headers, timeout=10)
            if r.status_code == 200:
                break
            time.sleep(0.05)
        assert r.status_code == 200, r.text
    finally:
        adapter.kill()


def test_mcp_over_http_each_caller_acts_as_its_own_token(server):
    """Without --token, each MCP client authenticates with its own orchestrator token and acts
    as that agent: alice and bob, through one adapter, each see and write only their own
    conversations. No token or a token the orchestrator does not know is 401; the endpoint
    answers only the Host values it is given; a shared secret makes no sense here and is
    refused at start; beyond loopback it starts, since every caller brings its own token."""
    import httpx
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    tokens = {agent: server.token(agent) for agent in ("alice", "bob")}
    # alice of another tenant: the same agent id, another principal.
    elsewhere = server.tenant_token("elsewhere", "alice")

    async def make():
        admin = await RpcClient.connect(server.url, server.tokens["admin"])
        for agent in tokens:
            await admin.call("createConversation", {"conversationId": f"mcp-{agent}", "participants": [agent]})
        await admin.close()

    run(make())
    proc, url = spawn_listening([MCP_BIN, "--url", server.url, "--http", "127.0.0.1:0", "--allowed-host", "127.0.0.1,mcp.test"],
                                r"(http://\S+/mcp)")
    try:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
        headers = {"Accept": "application/json, text/event-stream"}
        for auth in (None, "Bearer oct_" + "0" * 64, "Basic YWxpY2U="):
            h = dict(headers, **({"Authorization": auth} if auth else {}))
            r = httpx.post(url, json=init, headers=h, timeout=10)
            assert r.status_code == 401, (auth, r.status_code, r.text)
            assert "orchestrator" in r.json()["error"]
        alice = dict(headers, Authorization=f"Bearer {tokens['alice']}")
        port = url.removeprefix("http://127.0.0.1:").removesuffix("/mcp")
        assert httpx.post(url, json=init, headers=dict(alice, Host=f"mcp.test:{port}"), timeout=10).status_code == 200
        assert httpx.post(url, json=init, headers=dict(alice, Host="elsewhere.test"), timeout=10).status_code == 403

        async def as_agent(agent, token=None):
            client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token or tokens[agent]}"}, timeout=30)
            async with Client(streamable_http_client(url, http_client=client)) as mcp:
                listed = data(await mcp.call_tool("list_conversations", {}))
                other = "mcp-bob" if agent == "alice" else "mcp-alice"
                refused = await mcp.call_tool("get_conversation", {"conversationId": other})
                posted = await mcp.call_tool("post_message", {"conversationId": other, "text": "let me in", "finality": "none"})
                mine = await mcp.call_tool("post_message", {"conversationId": f"mcp-{agent}", "text": f"{agent} here", "finality": "none"})
                return [c["conversationId"] for c in listed["conversations"]], refused, posted, mine

        for agent in tokens:
            ids, refused, posted, mine = asyncio.run(asyncio.wait_for(as_agent(agent), 60))
            assert ids == [f"mcp-{agent}"], ids
            assert refused.is_error and posted.is_error, (refused, posted)
            assert not mine.is_error, mine
        for agent in tokens:
            said = [(e["author"], e["payload"]["text"]) for e in log_messages(server, f"mcp-{agent}")]
            assert said == [(agent, f"{agent} here")], said
        # The other tenant's alice lists nothing of the default tenant's, reads and writes none
        # of it (its own post goes nowhere: it has no conversation mcp-alice).
        ids, refused, posted, mine = asyncio.run(asyncio.wait_for(as_agent("alice", elsewhere), 60))
        assert ids == [] and refused.is_error and posted.is_error and mine.is_error, (ids, refused, posted, mine)
        said = [(e["author"], e["payload"]["text"]) for e in log_messages(server, "mcp-alice")]
        assert said == [("alice", "alice here")], said
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    env = dict(os.environ)
    env.pop("ORCHESTRATOR_TOKEN", None)
    out = subprocess.run([MCP_BIN, "--url", server.url, "--http", "127.0.0.1:0", "--http-token", "s3cret"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0 and "leave --http-token out" in out.stderr, out.stderr
    beyond = subprocess.Popen([MCP_BIN, "--url", server.url, "--http", "0.0.0.0:0"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in beyond.stdout.readline()
    finally:
        beyond.send_signal(signal.SIGKILL)
        beyond.wait(10)
