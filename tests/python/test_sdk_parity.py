"""Parity across languages: the partner agent written in Rust (examples/partner-agent, on the
Rust SDK), Python (on sdks/python) and TypeScript (on sdks/typescript), each run as an external
executor in push-claim and in pull mode against the same scenario and the same script of
alice's messages, writes the same log, up to the conversation's id and timestamps: the same
replies, the same executor traces, the same idempotency keys, in the same order."""

import asyncio
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from conftest import BIN, ROOT, run
from orchestrator_sdk import Client

SCENARIO = {"participants": ["alice", "bob"], "policy": {"order": "round_robin", "first": "alice"}}
SCRIPT = ["hello", "what is the plan?", "thanks"]


def partners():
    """The command that runs each language's partner agent, given a mode."""
    rust = pathlib.Path(BIN).with_name("partner-agent")
    ts = ROOT / "examples" / "partner-agent" / "typescript" / "dist" / "agent.js"
    assert rust.is_file(), f"{rust} is not built: cargo build --workspace"
    assert ts.is_file() and shutil.which("node"), (
        f"{ts} is not built: npm ci in sdks/typescript, then npm ci && npx tsc -p . in {ts.parent.parent}"
        " (scripts/test does both)"
    )
    return {
        "rust": lambda mode: [str(rust), mode],
        "python": lambda mode: [sys.executable, str(ROOT / "examples" / "partner-agent" / "python" / "agent.py"), mode],
        "typescript": lambda mode: ["node", str(ts), mode],
    }


async def whole_log(client, conversation_id):
    events, since = [], 0
    while True:
        page = await client.tail(conversation_id, since_seq=since, limit=1000)
        if not page["events"]:
            return events
        events.extend(page["events"])
        since = page["events"][-1]["seq"]


async def converse(admin, alice, conversation_id):
    """Alice's script, each message once bob has answered the one before and his executor has
    written its turn_end (so the log's order does not depend on timing)."""
    await admin.create_conversation(conversationId=conversation_id, scenario=SCENARIO)
    for i, text in enumerate(SCRIPT):
        sent = await alice.send_message(conversation_id, text, client_request_id=f"alice-{i}")
        bob_turn = sent["turn"] + 1
        for _ in range(1000):
            log = await whole_log(admin, conversation_id)
            if any(e["kind"] == "trace" and e["payload"].get("type") == "turn_end"
                   and e["payload"].get("turn") == bob_turn for e in log):
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"bob's turn {bob_turn} in {conversation_id} did not end")


def normalized(log, conversation_id):
    """The log without what differs from run to run: the conversation's id and timestamps."""
    out = []
    for e in log:
        e = {k: v for k, v in e.items() if k not in ("ts", "conversationId")}
        out.append(json.loads(json.dumps(e).replace(conversation_id, "CONV")))
    return out


@pytest.mark.parametrize("mode", ["push", "pull"])
def test_the_same_agent_in_three_languages_writes_the_same_log(server, mode):
    commands = partners()

    async def main():
        admin = await Client.connect(server.url, server.tokens["admin"])
        alice = await Client.connect(server.url, server.tokens["alice"])
        logs = {}
        for language, command in commands.items():
            env = {**os.environ, "ORCHESTRATOR_URL": server.url, "ORCHESTRATOR_TOKEN": server.tokens["bob"]}
            env.pop("ORCHESTRATOR_LOG", None)
            partner = subprocess.Popen(command(mode), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            try:
                conversation_id = f"parity-{mode}-{language}"
                await converse(admin, alice, conversation_id)
                logs[language] = normalized(await whole_log(admin, conversation_id), conversation_id)
            finally:
                partner.kill()
                _, said = partner.communicate()
            # Each says, by default, that it connected and which turns it took.
            for word in ["connected", "took turn", conversation_id]:
                assert word in said, f"{language} did not log {word!r}:\n{said}"
        replies = [e["payload"]["text"] for e in logs["rust"] if e["author"] == "bob" and e["kind"] == "message"]
        assert replies == [f"You said: {t}" for t in SCRIPT]
        traces = [(e["payload"]["type"], e["clientRequestId"]) for e in logs["rust"] if e["kind"] == "trace"]
        assert [t for t, _ in traces] == ["turn_start", "turn_end"] * len(SCRIPT)
        assert logs["python"] == logs["rust"], "Python's log is Rust's"
        assert logs["typescript"] == logs["rust"], "TypeScript's log is Rust's"
        await admin.close()
        await alice.close()

    run(main())


def test_each_partner_agent_gives_up_on_a_wrong_url_with_a_clear_message():
    commands = partners()
    for language, command in commands.items():
        env = {**os.environ, "ORCHESTRATOR_URL": "ws://127.0.0.1:1/rpc", "ORCHESTRATOR_TOKEN": "oct_x",
               "ORCHESTRATOR_CONNECT_TIMEOUT": "1"}
        ran = subprocess.run(command("push"), env=env, capture_output=True, text=True, timeout=60)
        assert ran.returncode == 1, (language, ran.returncode, ran.stderr)
        assert "could not connect to ws://127.0.0.1:1/rpc" in ran.stderr, (language, ran.stderr)
