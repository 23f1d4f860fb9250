"""A remote A2A agent as a participant (`kind: a2a`), against an agent built with the official
`a2a-sdk` server (tests/a2a/reference_server.py), not our own adapter: its Agent Card is read
and checked, its streamed status updates are posted as progress (finality none), its
input-required answer is its reply with finality turn, the next turn continues the same remote
task, and a card that cannot be read is the turn's error."""

import asyncio
import socket
import subprocess
import sys
import time

import httpx
import pytest

from conftest import ROOT, Client, Server, run


@pytest.fixture
def remote():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "a2a" / "reference_server.py"), str(port)], stdout=subprocess.PIPE, text=True)
    assert "listening" in proc.stdout.readline()
    url = f"http://127.0.0.1:{port}/"
    for _ in range(200):
        try:
            if httpx.get(url + ".well-known/agent-card.json").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    yield url
    proc.kill()
    proc.wait(10)


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "participant.db")
    s.tokens = {"admin": s.token("admin", admin=True)}
    # The reference agent listens on loopback, which agents reach only when the operator says so.
    s.start("127.0.0.1:0", "--agent-net", "loopback")
    yield s
    s.stop()


def scenario(url, replies):
    return {
        "participants": [
            {"id": "asker", "kind": "scripted", "replies": replies},
            {"id": "remote", "kind": "a2a", "url": url, "timeout": "20s"},
        ],
        "policy": {"order": "round_robin", "first": "asker"},
        "stop": {"maxTurns": 2 * len(replies)},
        "turn": {"timeout": "20s"},
    }


async def run_to_end(server, conversation, scenario):
    c = await Client.connect(server.url, server.tokens["admin"])
    await c.call("createConversation", {"conversationId": conversation, "scenario": scenario})
    for _ in range(400):
        snap = await c.call("getConversation", {"conversationId": conversation})
        if snap["status"] == "closed":
            break
        await asyncio.sleep(0.05)
    tail = await c.call("tail", {"conversationId": conversation, "sinceSeq": 0})
    await c.close()
    return snap, tail["events"]


def test_a_remote_a2a_agent_takes_turns_streaming_progress(server, remote):
    snap, events = run(run_to_end(server, "remote-talk", scenario(remote, ["hello there", "bye"])))
    assert snap["status"] == "closed"
    said = [(e["author"], e["payload"]["text"], e["finality"]) for e in events if e["kind"] == "message"]
    # Turn 2: the remote's "thinking" status is progress; its input-required answer ends the turn.
    assert said[0] == ("asker", "hello there", "turn")
    assert ("remote", "thinking", "none") in said[1:3]
    assert said[2] == ("remote", "echo: hello there", "turn")
    assert said[3] == ("asker", "bye", "turn")
    assert said[5] == ("remote", "goodbye", "turn")
    answers = [e["payload"] for e in events if e["kind"] == "message" and e["author"] == "remote" and e["finality"] == "turn"]
    first, second = answers[0]["data"]["a2a"], answers[1]["data"]["a2a"]
    assert first["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert second["state"] == "TASK_STATE_COMPLETED"
    # The second turn continued the task the remote agent left waiting for input.
    assert first["taskId"] and second["taskId"] == first["taskId"]
    assert first["agent"] == "echo"


def test_without_streaming_the_answer_comes_from_send_message(server, remote):
    sc = scenario(remote, ["hello there"])
    sc["participants"][1]["stream"] = False
    snap, events = run(run_to_end(server, "remote-plain", sc))
    said = [(e["author"], e["payload"]["text"], e["finality"]) for e in events if e["kind"] == "message"]
    assert said[:2] == [("asker", "hello there", "turn"), ("remote", "echo: hello there", "turn")], said
    answer = [e["payload"] for e in events if e["kind"] == "message" and e["author"] == "remote"][0]
    assert answer["data"]["a2a"]["state"] == "TASK_STATE_INPUT_REQUIRED"


def test_an_agent_card_that_cannot_be_read_is_the_turns_error(server, remote):
    sc = scenario(remote + "nowhere/", ["hello"])
    sc["turn"] = {"timeout": "3s", "onTimeout": "end"}
    snap, events = run(run_to_end(server, "no-card", sc))
    errors = [e["payload"]["error"] for e in events if e["kind"] == "trace" and e["payload"].get("type") == "turn_error"]
    assert errors, events
    assert "could not read the agent card" in errors[0] and "404" in errors[0], errors
    assert not [e for e in events if e["kind"] == "message" and e["author"] == "remote"]
