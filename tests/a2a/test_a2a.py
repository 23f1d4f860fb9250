"""The A2A adapter with the official Python `a2a-sdk` client (protocol 1.0, JSON-RPC): the
Agent Card, a message and its task, a streamed reply, a resubscription to a running task that
receives the rest from the log, cancellation, a retried message, and bad input. Every peer
authenticates with an orchestrator token of its own (the Agent Card's bearer scheme) and speaks
as the scenario's caller participant; tests/a2a/test_a2a_isolation.py holds two competing peers
and anonymous clients to what each may reach."""

import asyncio
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.client.auth import AuthInterceptor, CredentialService
from a2a.types import a2a_pb2 as pb

from conftest import BIN, ROOT, Client, Server, make_certs, run, spawn_listening

A2A_BIN = os.environ.get("ORCHESTRATOR_A2A_BIN", str(pathlib.Path(BIN).with_name("orchestrator-a2a")))

HELPDESK = """
name: helpdesk
participants:
  - id: peer
    external: true
    caller: true
  - id: assistant
    kind: scripted
    replies:
      - "Hello! What do you need?"
      - "Done: your ticket is filed."
      - "Goodbye. TERMINATE"
policy:
  order: round_robin
  first: peer
stop:
  onText: TERMINATE
"""

EXPERT = """
name: expert
participants:
  - id: peer
    external: true
    caller: true
  - id: expert
    external: true
    modes: [converse, plan]
policy:
  order: round_robin
  first: peer
"""


@pytest.fixture
def stack(tmp_path):
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (scenarios / "helpdesk.yaml").write_text(HELPDESK)
    (scenarios / "expert.yaml").write_text(EXPERT)
    # Tenant `other`'s library has an `expert` of its own.
    (scenarios / "tenants" / "other").mkdir(parents=True)
    (scenarios / "tenants" / "other" / "expert.yaml").write_text(EXPERT)
    server = Server(tmp_path / "a2a.db")
    server.tokens = {"admin": server.token("admin", admin=True), "acme": server.token("acme"),
                     "globex": server.token("globex"), "expert": server.token("expert")}
    server.start("127.0.0.1:0", "--scenarios", str(scenarios))
    start_adapter(server)
    global PEER
    PEER = server.tokens["acme"]
    yield server
    server.adapter.send_signal(signal.SIGKILL)
    server.adapter.wait(10)
    server.stop(signal.SIGKILL)


# The token of the peer the tests speak as by default (acme): set by the `stack` fixture.
PEER = None


def start_adapter(server, listen="127.0.0.1:0", *extra):
    """The adapter over `server`, with an admin's token for its check at start only."""
    server.adapter, server.a2a = spawn_listening(
        [A2A_BIN, "--url", server.url, "--listen", listen, "--scenario", "helpdesk", "--scenario", "expert", *extra],
        r"listening on (http://\S+)",
        token=server.tokens["admin"],
    )


class Bearer(CredentialService):
    """The official client's credentials: one orchestrator token, for the card's bearer scheme."""

    def __init__(self, token):
        self.token = token

    async def get_credentials(self, scheme, context):
        return self.token


def user_message(text, message_id, context_id=None, task_id=None):
    m = pb.Message(message_id=message_id, role=pb.ROLE_USER, parts=[pb.Part(text=text)])
    if context_id:
        m.context_id = context_id
    if task_id:
        m.task_id = task_id
    return m


async def client_for(url, streaming, token=None):
    """The official client for the agent at `url`, authenticated as `token` (default: acme)
    through the card's security scheme, as the SDK's AuthInterceptor does it."""
    config = ClientConfig(streaming=streaming, httpx_client=httpx.AsyncClient(timeout=30))
    return await create_client(url, client_config=config, interceptors=[AuthInterceptor(Bearer(token or PEER))])


async def send(client, message, immediately=False):
    request = pb.SendMessageRequest(message=message)
    if immediately:
        request.configuration.return_immediately = True
    return [ev async for ev in client.send_message(request)]


def expert_says(server, conversation, text, finality="turn"):
    async def main():
        c = await Client.connect(server.url, server.tokens["expert"])
        for _ in range(100):
            snap = await c.call("getConversation", {"conversationId": conversation})
            if snap["guidance"]["status"] == "may_speak":
                break
            await asyncio.sleep(0.05)
        r = await c.call("sendMessage", {"conversationId": conversation, "payload": {"text": text}, "finality": finality})
        await c.close()
        return r

    return run(main())


def messages_of(server, conversation):
    async def main():
        c = await Client.connect(server.url, server.tokens["admin"])
        tail = await c.call("tail", {"conversationId": conversation, "sinceSeq": 0})
        await c.close()
        return [(e["author"], e["payload"]["text"]) for e in tail["events"] if e["kind"] == "message"]

    return run(main())


def test_agent_card_per_scenario(stack):
    async def main():
        async with httpx.AsyncClient() as http:
            root = await A2ACardResolver(http, stack.a2a).get_agent_card()
            expert = await A2ACardResolver(http, stack.a2a + "/expert").get_agent_card()
            missing = await http.get(stack.a2a + "/nope/.well-known/agent-card.json")
        assert root.name == "helpdesk" and expert.name == "expert"
        assert root.capabilities.streaming
        assert root.supported_interfaces[0].protocol_binding == "JSONRPC"
        assert root.supported_interfaces[0].protocol_version == "1.0"
        assert root.supported_interfaces[0].url == stack.a2a + "/helpdesk/"
        assert missing.status_code == 404

    asyncio.run(main())


def test_send_a_message_get_the_task_and_retry_it(stack):
    async def main():
        client = await client_for(stack.a2a, streaming=False)
        [ev] = await send(client, user_message("I need a ticket", "m-1"))
        task = ev.task
        assert task.status.state == pb.TASK_STATE_INPUT_REQUIRED
        assert task.status.message.parts[0].text == "Hello! What do you need?"
        assert task.status.message.role == pb.ROLE_AGENT
        assert [m.parts[0].text for m in task.history] == ["I need a ticket", "Hello! What do you need?"]
        got = await client.get_task(pb.GetTaskRequest(id=task.id))
        assert got.id == task.id and got.context_id == task.context_id
        assert got.status.state == pb.TASK_STATE_INPUT_REQUIRED
        # The peer retries the same message (same messageId): nothing is appended twice.
        [again] = await send(client, user_message("I need a ticket", "m-1"))
        assert again.task.id == task.id
        # The next message in the same context continues the conversation.
        [nxt] = await send(client, user_message("File it please", "m-2", context_id=task.context_id))
        assert nxt.task.context_id == task.context_id and nxt.task.id != task.id
        assert nxt.task.status.message.parts[0].text == "Done: your ticket is filed."
        # The last exchange closes the conversation: the task completes.
        [last] = await send(client, user_message("Thanks", "m-3", context_id=task.context_id))
        assert last.task.status.state == pb.TASK_STATE_COMPLETED
        await client.close()
        return task.context_id

    conversation = asyncio.run(main())
    assert messages_of(stack, conversation)[:4] == [
        ("acme", "I need a ticket"), ("assistant", "Hello! What do you need?"),
        ("acme", "File it please"), ("assistant", "Done: your ticket is filed."),
    ]


def test_stream_a_reply(stack):
    async def main():
        client = await client_for(stack.a2a, streaming=True)
        events = await send(client, user_message("Stream it", "s-1"))
        await client.close()
        return events

    events = asyncio.run(main())
    assert events[0].HasField("task")
    updates = [e.status_update for e in events[1:]]
    assert [u.status.state for u in updates] == [pb.TASK_STATE_WORKING, pb.TASK_STATE_INPUT_REQUIRED]
    assert updates[0].status.message.parts[0].text == "Hello! What do you need?"
    assert all(u.task_id == events[0].task.id for u in updates)


def test_resubscribe_to_a_running_task_and_receive_the_rest(stack):
    async def start():
        client = await client_for(stack.a2a + "/expert", streaming=False)
        [ev] = await send(client, user_message("Question for the expert", "r-1"), immediately=True)
        await client.close()
        return ev.task

    task = asyncio.run(start())
    assert task.status.state == pb.TASK_STATE_SUBMITTED
    # The expert answers part of it before anyone listens: the subscription starts from the log.
    expert_says(stack, task.context_id, "Looking into it", finality="none")

    async def follow():
        client = await client_for(stack.a2a + "/expert", streaming=True)
        seen = []

        async def read():
            async for ev in client.subscribe(pb.SubscribeToTaskRequest(id=task.id)):
                seen.append(ev)
                if ev.HasField("status_update") and ev.status_update.status.state == pb.TASK_STATE_INPUT_REQUIRED:
                    return

        reader = asyncio.create_task(read())
        while not seen:
            await asyncio.sleep(0.05)
        await asyncio.to_thread(expert_says, stack, task.context_id, "Here is the answer")
        await asyncio.wait_for(reader, 20)
        await client.close()
        return seen

    seen = asyncio.run(follow())
    first = seen[0].task
    assert first.id == task.id and first.status.state == pb.TASK_STATE_WORKING
    assert first.status.message.parts[0].text == "Looking into it"
    rest = [e.status_update for e in seen[1:]]
    assert [u.status.message.parts[0].text for u in rest] == ["Here is the answer", "Here is the answer"]
    assert [u.status.state for u in rest] == [pb.TASK_STATE_WORKING, pb.TASK_STATE_INPUT_REQUIRED]


def test_cancel_a_task(stack):
    async def main():
        client = await client_for(stack.a2a + "/expert", streaming=False)
        [ev] = await send(client, user_message("Never mind soon", "c-1"), immediately=True)
        canceled = await client.cancel_task(pb.CancelTaskRequest(id=ev.task.id))
        assert canceled.status.state == pb.TASK_STATE_CANCELED
        got = await client.get_task(pb.GetTaskRequest(id=ev.task.id))
        assert got.status.state == pb.TASK_STATE_CANCELED
        with pytest.raises(Exception) as e:
            await client.cancel_task(pb.CancelTaskRequest(id=ev.task.id))
        assert "cancel" in str(e.value).lower()
        await client.close()

    asyncio.run(main())


def auth(token=None):
    return {"A2A-Version": "1.0", "Authorization": f"Bearer {token or PEER}"}


def rpc(url, method, params, token=None):
    r = httpx.post(url, json={"jsonrpc": "2.0", "id": 7, "method": method, "params": params}, headers=auth(token))
    assert r.status_code in (200, 404), r.text
    return r.json()


def test_bad_input_gets_a2a_errors(stack):
    url = stack.a2a + "/expert/"
    # Unknown task, unknown context, malformed message, unknown method.
    assert rpc(url, "GetTask", {"id": "nope~1"})["error"]["code"] == -32001
    assert rpc(url, "GetTask", {"id": "garbage"})["error"]["code"] == -32001
    assert rpc(url, "SendMessage", {"message": {"messageId": "x1", "role": "ROLE_USER", "parts": [{"text": "hi"}], "contextId": "no-such"}})["error"]["code"] == -32001
    assert rpc(url, "SendMessage", {"message": {"messageId": "x2", "role": "ROLE_USER"}})["error"]["code"] == -32602
    assert rpc(url, "SendMessage", {})["error"]["code"] == -32602
    assert rpc(url, "Bogus", {})["error"]["code"] == -32601
    r = httpx.post(url, content=b"{not json", headers={"A2A-Version": "1.0"})
    assert r.json()["error"]["code"] == -32700

    # Not your turn: the expert holds the turn after the peer spoke.
    first = rpc(url, "SendMessage", {"message": {"messageId": "t1", "role": "ROLE_USER", "parts": [{"text": "one"}]}, "configuration": {"returnImmediately": True}})
    context = first["result"]["task"]["contextId"]
    second = rpc(url, "SendMessage", {"message": {"messageId": "t2", "role": "ROLE_USER", "parts": [{"text": "two"}], "contextId": context}, "configuration": {"returnImmediately": True}})
    assert second["error"]["code"] == -32600 and "input-required" in second["error"]["message"]

    # A closed conversation: the expert ends it; the task completes; sending again is refused.
    expert_says(stack, context, "That is all.", finality="conversation")
    task = rpc(url, "GetTask", {"id": first["result"]["task"]["id"]})["result"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    third = rpc(url, "SendMessage", {"message": {"messageId": "t3", "role": "ROLE_USER", "parts": [{"text": "three"}], "contextId": context}})
    assert third["error"]["code"] == -32600 and "closed" in third["error"]["message"]
    assert rpc(url, "CancelTask", {"id": first["result"]["task"]["id"]})["error"]["code"] == -32002
    assert messages_of(stack, context) == [("acme", "one"), ("expert", "That is all.")]


def test_a_peer_asks_for_a_mode_in_the_message_metadata(stack):
    url = stack.a2a + "/expert/"
    ask = lambda mid, mode: rpc(url, "SendMessage", {"message": {"messageId": mid, "role": "ROLE_USER", "parts": [{"text": "go"}],
                                                                  "metadata": {"mode": mode}}, "configuration": {"returnImmediately": True}})
    refused = ask("m1", "build")
    assert refused["error"]["code"] == -32602, refused
    assert "expert does not support mode build (its modes: converse, plan)" in refused["error"]["message"], refused
    assert ask("m2", "dance")["error"]["code"] == -32602
    planned = ask("m3", "plan")
    context = planned["result"]["task"]["contextId"]

    async def guidance():
        c = await Client.connect(stack.url, stack.tokens["expert"])
        snap = await c.call("getConversation", {"conversationId": context})
        await c.close()
        return snap["guidance"]

    g = run(guidance())
    assert g["status"] == "may_speak" and g["mode"] == "plan", g


def shape(v):
    """The structure of a JSON value: keys and types, not values."""
    if isinstance(v, dict):
        return {k: shape(x) for k, x in v.items() if k != "metadata"}
    if isinstance(v, list):
        return [shape(v[0])] if v else []
    return type(v).__name__


@pytest.fixture
def official():
    """The official a2a-sdk server (tests/a2a/reference_server.py) on a free port: its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ref = subprocess.Popen([sys.executable, str(ROOT / "tests" / "a2a" / "reference_server.py"), str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert "listening" in ref.stdout.readline()
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(url + "/.well-known/agent-card.json")
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        yield url
    finally:
        ref.send_signal(signal.SIGKILL)
        ref.wait(10)


def test_the_wire_has_the_shape_of_the_official_server(stack, official):
    """The same calls against an agent built with the official a2a-sdk server and against the
    adapter give answers of the same structure (Agent Card, task, streamed events)."""
    ours = stack.a2a + "/helpdesk/"
    card_keys = set(httpx.get(official + "/.well-known/agent-card.json").json())
    assert card_keys <= set(httpx.get(stack.a2a + "/helpdesk/.well-known/agent-card.json").json())

    def send(url, mid):
        return rpc(url, "SendMessage", {"message": {"messageId": mid, "role": "ROLE_USER", "parts": [{"text": "hello"}]}})["result"]

    theirs, mine = send(official + "/", "w-1"), send(ours, "w-1")
    assert shape(theirs) == shape(mine)

    def stream(url, mid):
        body = {"jsonrpc": "2.0", "id": "s", "method": "SendStreamingMessage", "params": {"message": {"messageId": mid, "role": "ROLE_USER", "parts": [{"text": "again"}]}}}
        with httpx.stream("POST", url, json=body, headers={**auth(), "Accept": "text/event-stream"}, timeout=20) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [l for l in r.iter_lines() if l.startswith("data:")]
        return [json.loads(l[5:]) for l in lines]

    theirs, mine = stream(official + "/", "w-2"), stream(ours, "w-2")
    assert [list(e["result"]) for e in theirs] == [list(e["result"]) for e in mine] == [["task"], ["statusUpdate"], ["statusUpdate"]]
    assert shape(theirs[-1]) == shape(mine[-1])


def raw(url, body, headers=None):
    """One JSON-RPC request with an exact body (ids of any type) and headers (default: the
    version and acme's credentials): the answer."""
    r = httpx.post(url, content=json.dumps(body), headers={"content-type": "application/json", **(auth() if headers is None else headers)})
    return r.json()


def test_refusals_are_those_of_the_official_server_side_by_side(stack, official):
    """A2A 1.0.1 where the official SDK's server is the reference: the same requests, sent to
    it and to the adapter, are refused with the same codes."""
    ours = stack.a2a + "/expert/"
    theirs = official + "/"
    message = lambda mid, **more: {"message": {"messageId": mid, "role": "ROLE_USER", "parts": [{"text": "hello"}], **more}}

    def both(method, params, id=7, headers=None, ids=None):
        """The error of each side (ids: a task id per side, put in for TASK)."""
        got = []
        for url, task in zip([theirs, ours], ids or [None, None]):
            p = json.loads(json.dumps(params).replace("TASK", task or "TASK"))
            got.append(raw(url, {"jsonrpc": "2.0", "id": id, "method": method, "params": p}, headers))
        return got

    def same(case, answers, code):
        codes = [a.get("error", {}).get("code") for a in answers]
        assert codes == [code, code], f"{case}: {answers}"

    # The A2A-Version header: another version, or none (which means 0.3).
    same("version 0.9", both("SendMessage", message("v1"), headers={"A2A-Version": "0.9"}), -32009)
    same("no version", both("SendMessage", message("v2"), headers={}), -32009)
    # An id that is not a string, a number or null: -32600 with id null.
    for bad in [True, {}, []]:
        answers = both("GetTask", {"id": "x"}, id=bad)
        same(f"id {bad!r}", answers, -32600)
        assert [a["id"] for a in answers] == [None, None], answers
    # A message without a role.
    same("no role", both("SendMessage", {"message": {"messageId": "r1", "parts": [{"text": "x"}]}}), -32602)
    # A task on each side.
    t_theirs = raw(theirs, {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": message("a1")})["result"]["task"]
    t_ours = raw(ours, {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {**message("a1"), "configuration": {"returnImmediately": True}}})["result"]["task"]
    ids = [t_theirs["id"], t_ours["id"]]
    same("negative historyLength", both("GetTask", {"id": "TASK", "historyLength": -1}, ids=ids), -32602)
    for method, params in [("GetTaskPushNotificationConfig", {"taskId": "TASK", "id": "c"}),
                           ("ListTaskPushNotificationConfigs", {"taskId": "TASK"}),
                           ("DeleteTaskPushNotificationConfig", {"taskId": "TASK", "id": "c"})]:
        same(method, both(method, params, ids=ids), -32003)
    same("taskId and contextId disagree", both("SendMessage", message("a2", taskId="TASK", contextId="another"), ids=ids), -32602)
    # A task in a terminal state: the official agent completes on "bye"; the expert ends ours.
    raw(theirs, {"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {"message": {"messageId": "a3", "role": "ROLE_USER", "parts": [{"text": "bye"}], "taskId": t_theirs["id"], "contextId": t_theirs["contextId"]}}})
    expert_says(stack, t_ours["contextId"], "Done.", finality="conversation")
    same("a message to a terminal task", both("SendMessage", message("a4", taskId="TASK"), ids=ids), -32004)
    # What was refused reached nothing: ours holds the first message and the expert's only.
    assert messages_of(stack, t_ours["contextId"]) == [("acme", "hello"), ("expert", "Done.")]


def test_list_tasks_pages_through_the_callers_tasks(stack, official):
    """ListTasks with the official client: every task the caller opened (a follow-up in a task
    opens none), newest first, a page at a time by token; a context filter; and the same
    refusals as the official server for a page size out of range, a negative historyLength and
    a token it did not give."""
    async def open_three():
        client = await client_for(stack.a2a + "/expert/", streaming=False)
        opened = []
        for i in range(3):
            [ev] = await send(client, user_message(f"Question {i}", f"lt-{i}"), immediately=True)
            opened.append(ev.task)
        await client.close()
        return opened

    async def follow_up_and_list(first):
        client = await client_for(stack.a2a + "/expert/", streaming=False)
        await send(client, user_message("And a follow-up", "lt-f", context_id=first.context_id, task_id=first.id), immediately=True)
        pages, token = [], ""
        while True:
            page = await client.list_tasks(pb.ListTasksRequest(page_size=2, page_token=token))
            pages.append(page)
            token = page.next_page_token
            if not token:
                break
        alone = await client.list_tasks(pb.ListTasksRequest(context_id=first.context_id, history_length=1))
        await client.close()
        return pages, alone

    opened = asyncio.run(open_three())
    expert_says(stack, opened[0].context_id, "A first answer.")
    pages, alone = asyncio.run(follow_up_and_list(opened[0]))
    assert [len(p.tasks) for p in pages] == [2, 1], pages
    assert all(p.total_size == 3 and p.page_size == 2 for p in pages)
    listed = [t for p in pages for t in p.tasks]
    assert sorted(t.id for t in listed) == sorted(t.id for t in opened)
    # Newest status first: the task with the follow-up moved last.
    assert listed[0].id == opened[0].id
    stamps = [t.status.timestamp.ToMilliseconds() for t in listed]
    assert stamps == sorted(stamps, reverse=True), stamps
    assert [t.id for t in alone.tasks] == [opened[0].id]
    assert len(alone.tasks[0].history) == 1

    def both(params):
        return [raw(url, {"jsonrpc": "2.0", "id": 3, "method": "ListTasks", "params": params}).get("error", {}).get("code")
                for url in [official + "/", stack.a2a + "/expert/"]]

    for case in [{"pageSize": 0}, {"pageSize": 101}, {"historyLength": -1}, {"pageToken": "zz-not-a-token"}]:
        assert both(case) == [-32602, -32602], case
    ok = raw(stack.a2a + "/expert/", {"jsonrpc": "2.0", "id": 4, "method": "ListTasks", "params": {"status": "TASK_STATE_COMPLETED"}})
    assert ok["result"]["tasks"] == [] and ok["result"]["totalSize"] == 0, ok

    # A conversation the peer takes part in but did not start through the adapter lists
    # nothing.
    async def elsewhere():
        c = await Client.connect(stack.url, stack.tokens["admin"])
        await c.call("createConversation", {"conversationId": "not-the-peers", "participants": ["acme", "expert"]})
        await c.close()

    asyncio.run(elsewhere())
    expert_says(stack, "not-the-peers", "Private.")
    other = raw(stack.a2a + "/expert/", {"jsonrpc": "2.0", "id": 5, "method": "ListTasks", "params": {"contextId": "not-the-peers"}})
    assert other["result"]["tasks"] == [] and other["result"]["totalSize"] == 0, other


def test_a_retried_first_message_answers_at_once(stack):
    """A first message (no contextId) sent again with its messageId after the turn went to the
    others: the same task comes back at once, and nothing is appended (found by the fuzzer:
    the retry waited up to 30 s for a turn that was the expert's)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"messageId": "first-retry", "role": "ROLE_USER", "parts": [{"text": "Hello"}]},
        "configuration": {"returnImmediately": True}}}
    first = raw(stack.a2a + "/expert/", body)["result"]["task"]
    again = httpx.post(stack.a2a + "/expert/", json=body, headers=auth(), timeout=10).json()
    assert again["result"]["task"]["id"] == first["id"], again
    assert messages_of(stack, first["contextId"]) == [("acme", "Hello")]


def test_tasks_survive_an_adapter_restart(stack):
    """The adapter keeps nothing: after a SIGKILL and a restart, a task reads the same from
    the log, and the context goes on."""
    async def first():
        client = await client_for(stack.a2a, streaming=False)
        [ev] = await send(client, user_message("Before the restart", "k-1"))
        await client.close()
        return ev.task

    task = asyncio.run(first())
    assert task.status.state == pb.TASK_STATE_INPUT_REQUIRED
    listen = stack.a2a.removeprefix("http://")
    stack.adapter.send_signal(signal.SIGKILL)
    stack.adapter.wait(10)
    start_adapter(stack, listen)

    async def second():
        client = await client_for(stack.a2a, streaming=False)
        again = await client.get_task(pb.GetTaskRequest(id=task.id))
        assert again.status.state == task.status.state
        assert [m.parts[0].text for m in again.history] == [m.parts[0].text for m in task.history]
        [ev] = await send(client, user_message("After the restart", "k-2", context_id=task.context_id))
        await client.close()
        return ev.task

    nxt = asyncio.run(second())
    assert nxt.context_id == task.context_id
    assert nxt.status.message.parts[0].text == "Done: your ticket is filed."


def test_over_tls_the_official_client_reaches_the_scenario_through_both_hops(tmp_path):
    """The orchestrator on wss:// and the adapter on https://, each with a certificate of a CA the
    test makes (`test-certs`); the adapter trusts the orchestrator's CA through
    ORCHESTRATOR_CA_FILE, the official client the adapter's through its httpx client."""
    import ssl

    upstream, own = make_certs(tmp_path, "orchestrator"), make_certs(tmp_path, "adapter")
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    (scenarios / "helpdesk.yaml").write_text(HELPDESK)
    server = Server(tmp_path / "a2a-tls.db")
    server.tokens = {"admin": server.token("admin", admin=True), "acme": server.token("acme")}
    server.start("127.0.0.1:0", "--scenarios", str(scenarios), "--tls-cert", upstream["cert"], "--tls-key", upstream["key"])
    assert server.url.startswith("wss://")
    adapter, url = spawn_listening(
        [A2A_BIN, "--url", server.url, "--listen", "127.0.0.1:0", "--scenario", "helpdesk",
         "--tls-cert", own["cert"], "--tls-key", own["key"]],
        r"listening on (https://\S+)", token=server.tokens["admin"], env={"ORCHESTRATOR_CA_FILE": upstream["ca"]})
    try:
        async def main():
            verify = ssl.create_default_context(cafile=own["ca"])
            http = httpx.AsyncClient(timeout=30, verify=verify)
            card = await A2ACardResolver(http, url).get_agent_card()
            assert card.supported_interfaces[0].url == url + "/helpdesk/"
            client = await create_client(url, client_config=ClientConfig(streaming=False, httpx_client=http),
                                         interceptors=[AuthInterceptor(Bearer(server.tokens["acme"]))])
            [ev] = await send(client, user_message("I need a ticket", "tls-1"))
            assert ev.task.status.message.parts[0].text == "Hello! What do you need?"
            await client.close()
            # Without the adapter's CA the client refuses it.
            with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
                async with httpx.AsyncClient() as plain:
                    await A2ACardResolver(plain, url).get_agent_card()

        asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        adapter.send_signal(signal.SIGKILL)
        adapter.wait(10)
        server.stop(signal.SIGKILL)
