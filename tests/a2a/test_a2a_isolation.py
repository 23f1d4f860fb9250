"""Two competing partners on one A2A adapter, and strangers: what each may reach.

acme and globex each hold an orchestrator token of their own (neither an admin); an anonymous
client holds none. Each reproduction of how one peer reached another's work is checked here:
nobody is served without credentials, a peer sees, streams, continues and cancels only the
contexts and tasks it started (anything else is "not found", the same whether it exists or
not), context ids cannot be taken ahead of their owner, and one peer flooding the adapter with
streams or new contexts is refused while every other peer is served."""

import asyncio
import json
import time

import httpx
import pytest
from a2a.types import a2a_pb2 as pb

from conftest import Client, run
from test_a2a import auth, client_for, messages_of, rpc, send, start_adapter, stack, user_message  # noqa: F401

SECRET = "card 4111 1111 1111 1111"


def raw_call(url, method, params, headers):
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return httpx.post(url, json=body, headers=headers, timeout=20)


def acme_task(stack, text=SECRET, message_id="acme-1"):
    """acme's first message to the expert scenario: its task (returned at once)."""
    answer = rpc(stack.a2a + "/expert/", "SendMessage", {
        "message": {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]},
        "configuration": {"returnImmediately": True}}, token=stack.tokens["acme"])
    return answer["result"]["task"]


def test_an_anonymous_client_is_served_nothing(stack):
    task = acme_task(stack)
    url = stack.a2a + "/expert/"
    calls = [
        ("SendMessage", {"message": {"messageId": "anon-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}),
        ("SendMessage", {"message": {"messageId": "anon-2", "role": "ROLE_USER", "parts": [{"text": "hi"}], "contextId": task["contextId"]}}),
        ("ListTasks", {}),
        ("GetTask", {"id": task["id"]}),
        ("SubscribeToTask", {"id": task["id"]}),
        ("CancelTask", {"id": task["id"]}),
    ]
    for headers in [{"A2A-Version": "1.0"},
                    {"A2A-Version": "1.0", "Authorization": "Bearer oct_" + "0" * 64},
                    {"A2A-Version": "1.0", "Authorization": "Basic YWxpY2U6c2VjcmV0"}]:
        for method, params in calls:
            r = raw_call(url, method, params, headers)
            assert r.status_code == 401, (headers, method, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == -32040, r.text
            assert SECRET not in r.text
    # Nothing reached acme's conversation; the task is as acme left it.
    assert messages_of(stack, task["contextId"]) == [("acme", SECRET)]
    got = rpc(url, "GetTask", {"id": task["id"]}, token=stack.tokens["acme"])["result"]
    assert got["status"]["state"] == "TASK_STATE_SUBMITTED"


def test_the_agent_card_declares_the_bearer_scheme(stack):
    card = httpx.get(stack.a2a + "/expert/.well-known/agent-card.json").json()
    [(name, scheme)] = card["securitySchemes"].items()
    assert scheme["httpAuthSecurityScheme"]["scheme"] == "Bearer"
    assert card["securityRequirements"] == [{"schemes": {name: {"list": []}}}]


def test_a_peer_reaches_only_what_it_started(stack):
    """globex, authenticated, tries every way into acme's context and task: each is answered as
    not found, with the same words as an id that never existed."""
    task = acme_task(stack)
    url = stack.a2a + "/expert/"
    globex = stack.tokens["globex"]
    context = task["contextId"]

    def error(method, params):
        answer = rpc(url, method, params, token=globex)
        assert "error" in answer, answer
        assert SECRET not in json.dumps(answer)
        return answer["error"]

    def same_as_missing(method, params, real, missing):
        theirs = error(method, json.loads(json.dumps(params).replace("ID", real)))
        none = error(method, json.loads(json.dumps(params).replace("ID", missing)))
        assert theirs["code"] == none["code"] == -32001, (theirs, none)
        assert theirs["message"].replace(real, "ID") == none["message"].replace(missing, "ID"), (theirs, none)

    ghost_task, ghost_context = "a2a-00000000000000000000000000000000~2", "a2a-00000000000000000000000000000000"
    for method in ["GetTask", "CancelTask", "SubscribeToTask"]:
        same_as_missing(method, {"id": "ID"}, task["id"], ghost_task)
    message = {"message": {"messageId": "g-1", "role": "ROLE_USER", "parts": [{"text": "mine now"}], "contextId": "ID"}}
    same_as_missing("SendMessage", message, context, ghost_context)
    follow = {"message": {"messageId": "g-2", "role": "ROLE_USER", "parts": [{"text": "mine now"}], "taskId": "ID"}}
    same_as_missing("SendMessage", follow, task["id"], ghost_task)
    listed = rpc(url, "ListTasks", {}, token=globex)["result"]
    assert listed["tasks"] == [] and listed["totalSize"] == 0, listed
    alone = rpc(url, "ListTasks", {"contextId": context}, token=globex)["result"]
    assert alone["tasks"] == [], alone
    # The same context from the other scenario's endpoint is not acme's either: a context
    # belongs to the scenario it was started from.
    assert rpc(stack.a2a + "/helpdesk/", "GetTask", {"id": task["id"]}, token=stack.tokens["acme"])["error"]["code"] == -32001
    # acme's conversation holds acme's message only; its task was not cancelled.
    assert messages_of(stack, context) == [("acme", SECRET)]
    got = rpc(url, "GetTask", {"id": task["id"]}, token=stack.tokens["acme"])["result"]
    assert got["status"]["state"] == "TASK_STATE_SUBMITTED"


def test_an_agent_of_another_tenant_with_the_same_id_reaches_nothing(stack):
    """`acme` of tenant `other` is not the default tenant's `acme`: its calls on acme's task
    and context are answered as for ids that never existed, its list is its own, and its own
    work (from its tenant's `expert`) is not acme's."""
    task = acme_task(stack)
    url = stack.a2a + "/expert/"
    other = stack.tenant_token("other", "acme")

    def error(method, params):
        answer = rpc(url, method, params, token=other)
        assert "error" in answer, answer
        assert SECRET not in json.dumps(answer)
        return answer["error"]

    ghost = "a2a-00000000000000000000000000000000"
    for method in ["GetTask", "CancelTask", "SubscribeToTask"]:
        theirs, none = error(method, {"id": task["id"]}), error(method, {"id": ghost + "~2"})
        assert theirs["code"] == none["code"] == -32001, (theirs, none)
        assert theirs["message"].replace(task["id"], "ID") == none["message"].replace(ghost + "~2", "ID")
    message = {"messageId": "o-1", "role": "ROLE_USER", "parts": [{"text": "mine now"}], "contextId": task["contextId"]}
    assert error("SendMessage", {"message": message})["code"] == -32001
    assert rpc(url, "ListTasks", {}, token=other)["result"]["tasks"] == []
    # Its own task, from its own tenant's library: not listed to the default tenant's acme.
    own = rpc(url, "SendMessage", {"message": {"messageId": "o-2", "role": "ROLE_USER", "parts": [{"text": "ours"}]},
                                   "configuration": {"returnImmediately": True}}, token=other)["result"]["task"]
    listed = rpc(url, "ListTasks", {}, token=stack.tokens["acme"])["result"]["tasks"]
    assert own["id"] not in [t["id"] for t in listed] and task["id"] in [t["id"] for t in listed]
    assert messages_of(stack, task["contextId"]) == [("acme", SECRET)]


def test_conversations_the_adapter_did_not_start_are_not_contexts(stack):
    """acme takes part in a conversation an admin made (with the expert) and bob's private one
    exists too: neither is reachable through the adapter, and nothing is posted into them."""
    async def make():
        c = await Client.connect(stack.url, stack.tokens["admin"])
        await c.call("createConversation", {"conversationId": "direct-acme", "participants": ["acme", "expert"]})
        await c.call("createConversation", {"conversationId": "hr-case-17", "participants": ["expert", "globex"]})
        await c.close()

    run(make())
    url = stack.a2a + "/expert/"
    for context in ["direct-acme", "hr-case-17"]:
        answer = rpc(url, "SendMessage", {"message": {"messageId": f"x-{context}", "role": "ROLE_USER",
                                                       "parts": [{"text": "hello"}], "contextId": context}}, token=stack.tokens["acme"])
        assert answer["error"]["code"] == -32001, answer
        listed = rpc(url, "ListTasks", {"contextId": context}, token=stack.tokens["acme"])["result"]
        assert listed["tasks"] == [], listed
        assert messages_of(stack, context) == []


def test_context_ids_cannot_be_taken_ahead_of_their_owner(stack):
    """The same messageId from two peers opens two contexts; neither can tell the other's id;
    acme's first message is never refused because globex used its messageId first."""
    g = rpc(stack.a2a + "/expert/", "SendMessage", {"message": {"messageId": "shared-id", "role": "ROLE_USER", "parts": [{"text": "globex"}]},
                                                     "configuration": {"returnImmediately": True}}, token=stack.tokens["globex"])["result"]["task"]
    a = acme_task(stack, text="acme", message_id="shared-id")
    assert a["contextId"] != g["contextId"]
    assert a["contextId"].startswith("a2a-") and len(a["contextId"]) == 36
    assert messages_of(stack, a["contextId"]) == [("acme", "acme")]
    # A retry of acme's first message finds acme's context again.
    again = acme_task(stack, text="acme", message_id="shared-id")
    assert again["id"] == a["id"]


def test_a_peer_over_its_caps_is_refused_and_the_others_are_served(stack):
    """globex opens streams until its cap and drops them after their first frame; further
    streams are refused with the adapter's limit error while acme is served at once; once
    globex's streams are gone, their places (and the waits behind them) are free again. New
    contexts beyond the adapter's rate are refused the same way."""
    stack.adapter.kill()
    stack.adapter.wait(10)
    start_adapter(stack, "127.0.0.1:0", "--max-streams-per-peer", "4", "--max-new-contexts-per-minute", "6")
    url = stack.a2a + "/expert/"
    task = rpc(url, "SendMessage", {"message": {"messageId": "gl-1", "role": "ROLE_USER", "parts": [{"text": "q"}]},
                                    "configuration": {"returnImmediately": True}}, token=stack.tokens["globex"])["result"]["task"]

    async def flood():
        async with httpx.AsyncClient(timeout=20) as http:
            headers = {**auth(stack.tokens["globex"]), "Accept": "text/event-stream"}
            body = {"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": {"id": task["id"]}}
            held, refused = [], []
            for _ in range(12):
                cm = http.stream("POST", url, json=body, headers=headers)
                r = await cm.__aenter__()
                if r.headers.get("content-type", "").startswith("text/event-stream"):
                    lines = r.aiter_lines()
                    while not (await lines.__anext__()).startswith("data:"):
                        pass
                    held.append((cm, lines))  # the lines' iterator too: dropping it closes the stream
                else:
                    refused.append(json.loads(await r.aread()))
                    await cm.__aexit__(None, None, None)
            # acme is served while globex is over its cap.
            t = await asyncio.to_thread(acme_task, stack, "still served", "acme-flood")
            assert t["status"]["state"] == "TASK_STATE_SUBMITTED"
            for cm, _ in held:
                await cm.__aexit__(None, None, None)
            return len(held), refused

    held, refused = asyncio.run(flood())
    assert held == 4, held
    assert len(refused) == 8 and all(r["error"]["code"] == -32050 for r in refused), refused
    assert "TOO_MANY_STREAMS" in json.dumps(refused[0])

    async def again():
        # The places come back once the adapter sees the streams gone.
        async with httpx.AsyncClient(timeout=20) as http:
            headers = {**auth(stack.tokens["globex"]), "Accept": "text/event-stream"}
            body = {"jsonrpc": "2.0", "id": 2, "method": "SubscribeToTask", "params": {"id": task["id"]}}
            for _ in range(400):
                async with http.stream("POST", url, json=body, headers=headers) as r:
                    if r.headers.get("content-type", "").startswith("text/event-stream"):
                        return True
                await asyncio.sleep(0.05)
        return False

    assert asyncio.run(again())

    # New contexts: globex already started one; five more pass, the next is refused.
    new = lambda i, token: rpc(url, "SendMessage", {"message": {"messageId": f"new-{i}", "role": "ROLE_USER", "parts": [{"text": "q"}]},
                                                    "configuration": {"returnImmediately": True}}, token=token)
    for i in range(5):
        assert "result" in new(i, stack.tokens["globex"])
    over = new(99, stack.tokens["globex"])
    assert over["error"]["code"] == -32050 and "TOO_MANY_NEW_CONTEXTS" in json.dumps(over), over
    assert "result" in new(100, stack.tokens["acme"])


def test_the_official_client_of_another_peer_finds_nothing(stack):
    """The same refusals through the official a2a-sdk client, authenticated as globex through
    the Agent Card's scheme: acme's task is not found, acme's context takes nothing, and
    ListTasks lists none of acme's."""
    task = acme_task(stack)

    async def main():
        client = await client_for(stack.a2a + "/expert", streaming=False, token=stack.tokens["globex"])
        with pytest.raises(Exception) as got:
            await client.get_task(pb.GetTaskRequest(id=task["id"]))
        assert type(got.value).__name__ == "TaskNotFoundError", repr(got.value)
        with pytest.raises(Exception):
            await send(client, user_message("mine now", "g-official", context_id=task["contextId"]))
        listed = await client.list_tasks(pb.ListTasksRequest())
        await client.close()
        return listed

    listed = asyncio.run(main())
    assert list(listed.tasks) == [] and listed.total_size == 0
    assert messages_of(stack, task["contextId"]) == [("acme", SECRET)]


def test_a_peer_over_its_calls_in_flight_is_refused_and_the_others_are_served(stack):
    """With one call in flight allowed a peer, globex's blocking SendMessage (nobody answers it)
    holds its place: globex's next call is refused with the adapter's limit error, while acme
    is served."""
    import threading

    stack.adapter.kill()
    stack.adapter.wait(10)
    start_adapter(stack, "127.0.0.1:0", "--max-calls-per-peer", "1")
    url = stack.a2a + "/expert/"
    blocking = {"message": {"messageId": "hold-1", "role": "ROLE_USER", "parts": [{"text": "wait for the expert"}]}}
    def hold():
        # The holder may itself be refused while one of the ListTasks below is in flight: it
        # tries again until its call is taken. It then ends when the adapter answers (60 s) or
        # is stopped at the test's end: either is fine.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                answer = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": blocking},
                                    headers=auth(stack.tokens["globex"]), timeout=30).json()
            except httpx.HTTPError:
                return
            if answer.get("error", {}).get("code") != -32050:
                return
            time.sleep(0.02)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    refused = None
    for _ in range(400):
        answer = rpc(url, "ListTasks", {}, token=stack.tokens["globex"])
        if "error" in answer:
            refused = answer
            break
        time.sleep(0.05)
    assert refused is not None and refused["error"]["code"] == -32050, refused
    assert "TOO_MANY_CALLS" in json.dumps(refused)
    assert "result" in rpc(url, "ListTasks", {}, token=stack.tokens["acme"])
