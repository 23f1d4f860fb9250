"""The console page in a real browser: Debian's headless Chromium driven by playwright-core
(tests/browser/console.mjs). It signs in, opens a conversation, sees messages posted over /rpc
appear (a streamed turn in one bubble), rides out a server restart by Last-Event-ID without
showing anything twice, pauses and resumes as an admin, and leaves a screenshot in
target/artifacts/console.png."""

import json
import os
import pathlib
import shutil
import signal
import subprocess

import pytest

from conftest import ROOT, Client, Server, run

BROWSER_DIR = ROOT / "tests" / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = ROOT / "target" / "artifacts"


def browser_ready():
    return (
        os.path.exists(CHROMIUM)
        and shutil.which("node")
        and (BROWSER_DIR / "node_modules" / "playwright-core").is_dir()
    )


@pytest.fixture
def viewer_prereqs():
    if not browser_ready():
        message = (
            f"the console test needs {CHROMIUM} (Debian's chromium), node, and "
            "`npm ci` in tests/browser; scripts/test installs them"
        )
        if os.environ.get("ORCHESTRATOR_SKIP_BROWSER") == "1":
            pytest.skip(message)
        pytest.fail(message)


class Page:
    """The browser driver process: one command in, one answer line out."""

    def __init__(self, server, conversation="", who="admin"):
        env = dict(
            os.environ,
            VIEWER_URL=server.http + "/",
            VIEWER_TOKEN=server.tokens[who],
            VIEWER_CONVERSATION=conversation,
            CHROMIUM=CHROMIUM,
        )
        self.proc = subprocess.Popen(
            ["node", str(BROWSER_DIR / "console.mjs")],
            cwd=BROWSER_DIR,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def answer(self, prefix):
        line = self.proc.stdout.readline().strip()
        assert line.startswith(prefix + " "), f"browser said {line!r}, expected {prefix}"
        rest = line[len(prefix) + 1 :]
        return json.loads(rest) if rest[:1] in "[{" else rest

    def do(self, command, answer):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.answer(answer)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("QUIT\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=20)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()


def created(server, conversation_id, scenario):
    """Conversation `conversation_id` from `scenario`, created by the admin."""

    async def create():
        admin = await Client.connect(server.url, server.tokens["admin"])
        await admin.call("createConversation", {"conversationId": conversation_id, "scenario": scenario})
        await admin.close()

    run(create())


def say(server, who, text, finality="turn", conversation="v1"):
    async def main():
        c = await Client.connect(server.url, server.tokens[who])
        r = await c.call("sendMessage", {"conversationId": conversation, "payload": {"text": text}, "finality": finality})
        await c.close()
        return r

    return run(main())


def test_console_in_headless_chromium(server, viewer_prereqs):
    import httpx

    # The console is served under a strict policy: only scripts and styles from this server run
    # (none inline), it talks only to this server, and it cannot be framed.
    page_headers = httpx.get(server.http + "/", timeout=10).headers
    policy = page_headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self';" in policy, policy
    assert "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy, policy
    assert page_headers["x-frame-options"] == "DENY" and page_headers["x-content-type-options"] == "nosniff"
    # Its files come with their own types (nosniff holds them to it); nothing else is served there.
    script = httpx.get(server.http + "/console/core.js", timeout=10)
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript"), script
    style = httpx.get(server.http + "/console/console.css", timeout=10)
    assert style.status_code == 200 and style.headers["content-type"].startswith("text/css"), style
    assert httpx.get(server.http + "/console/../Cargo.toml", timeout=10).status_code == 404

    async def setup():
        admin = await Client.connect(server.url, server.tokens["admin"])
        await admin.call("createConversation", {"conversationId": "v1", "participants": ["alice", "bob"]})
        await admin.close()

    run(setup())
    say(server, "alice", "opening words")
    page = Page(server, "v1")
    try:
        opened = page.answer("OPENED")
        assert opened == [1, 2]

        # A message posted over /rpc appears.
        say(server, "bob", "hello from rpc")
        saw = page.do("EXPECT hello from rpc", "SAW")
        assert saw["seqs"] == [1, 2, 3]

        # A streamed turn: progress messages update one bubble in place, then the final text.
        say(server, "alice", "thinking", finality="none")
        say(server, "alice", "thinking harder", finality="none")
        say(server, "alice", "the answer is 42", finality="turn")
        saw = page.do("EXPECT the answer is 42", "SAW")
        assert saw["seqs"] == [1, 2, 3, 4, 5, 6]
        # One bubble for the streamed turn (seqs 4 and 5 were updates of it), now its final seq.
        assert saw["domSeqs"] == [1, 2, 3, 6], saw

        # The server restarts under the page: the stream drops, and resumes by Last-Event-ID.
        port = server.port
        server.stop()
        server.start(f"127.0.0.1:{port}")
        say(server, "bob", "after the restart")
        saw = page.do("EXPECT after the restart", "SAW")
        assert saw["reconnects"] >= 1
        assert saw["seqs"] == [1, 2, 3, 4, 5, 6, 7], "an event was shown twice or skipped"
        assert len(saw["domSeqs"]) == len(set(saw["domSeqs"]))

        # An admin pauses and resumes from the page.
        page.do("CLICK pause", "CLICKED")
        page.do("STATUS paused", "STATUS")
        page.do("CLICK resume", "CLICKED")
        page.do("STATUS active", "STATUS")

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "console.png"
        page.do(f"SHOT {shot}", "SHOT")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

        # alice opens a sub-conversation: the parent's event links to it, and the child's page
        # shows its input and its parent.
        async def open_child():
            c = await Client.connect(server.url, server.tokens["alice"])
            await c.call("createConversation", {"conversationId": "v1.child", "participants": ["alice", "bob"],
                                                "parentConversationId": "v1", "input": {"text": "the sub-task"}})
            await c.close()

        run(open_child())
        followed = page.do("FOLLOW v1.child", "FOLLOWED")
        assert followed["id"] == "v1.child"
        assert "the sub-task" in followed["texts"]
        assert any("sub-conversation of v1" in t for t in followed["system"]), followed
        # The tree of sub-conversations, from the root.
        assert page.do("TREE", "TREE") == ["v1", "v1.child"]
        page.do(f"SHOT {ARTIFACTS / 'console-tree.png'}", "SHOT")
    finally:
        page.close()


def test_the_viewer_is_a_console(server, viewer_prereqs):
    """alice answers her turn from the composer (it shows once, and the guidance moves on); the
    events pane follows new events, or says how many came while she reads back; a narrow
    screen scrolls no sideways; no request fails. Screenshots in target/artifacts."""

    created(server, "v2", {"participants": ["alice", "bob"], "policy": {"order": "round_robin", "first": "alice"}})
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = Page(server, "v2", who="alice")
    try:
        page.answer("OPENED")
        page.do("GUIDANCE your turn", "GUIDANCE")
        sent = page.do("SEND hello from the browser", "SENT")
        assert sent == {"count": 1, "cleared": True}, sent
        page.do("GUIDANCE waiting for bob", "GUIDANCE")
        page.do(f"SHOT {ARTIFACTS / 'console-composer.png'}", "SHOT")

        # Enough turns to fill the pane: the newest stays in view.
        for i in range(12):
            say(server, "bob", f"bob line {i}", conversation="v2")
            say(server, "alice", f"alice line {i}", conversation="v2")
        assert page.do("VISIBLE alice line 11", "VISIBLE") == "true"

        # Scrolled up, new events wait behind a marker instead of pulling the reader down.
        page.do("SCROLLUP", "SCROLLED")
        say(server, "bob", "while you were reading", conversation="v2")
        marker = page.do("MARKER", "MARKER")
        assert "new event" in marker, marker
        assert page.do("VISIBLE while you were reading", "VISIBLE") == "false"
        page.do(f"SHOT {ARTIFACTS / 'console-marker.png'}", "SHOT")
        page.do("CLICK newer", "CLICKED")
        assert page.do("VISIBLE while you were reading", "VISIBLE") == "true"

        # The timeline: a row per turn, with who held it.
        rows = page.do("TIMELINE", "TIMELINE")
        assert len(rows) == 27, rows
        assert rows[0].startswith("turn 1 · alice") and rows[1].startswith("turn 2 · bob"), rows
        assert "so far" in rows[-1], rows
        page.do(f"SHOT {ARTIFACTS / 'console-timeline.png'}", "SHOT")

        narrow = page.do(f"NARROW {ARTIFACTS / 'console-narrow.png'}", "NARROW")
        assert narrow["scrollWidth"] <= narrow["width"], narrow
        assert page.do("FAILURES", "FAILURES") == []
    finally:
        page.close()


def test_plans_and_deliverables_are_documents(server, viewer_prereqs):
    """alice asks for a plan from the composer's mode menu; the planner's Markdown plan shows
    rendered (headings, a list, bold), the builder's JSON deliverable folded, each with its
    version and the agent and mode that produced it; text is never run as HTML."""

    created(server, "docs", {
        "participants": [
            "alice",
            {"id": "planner", "kind": "scripted", "modes": ["plan", "converse"],
             "plan": {"type": "launch", "sections": ["Goal", "Steps"]},
             "replies": ["# Goal\nShip **it** <script>alert(1)</script>.\n# Steps\n1. Build\n2. Test"]},
            {"id": "builder", "kind": "scripted", "modes": ["build"],
             "deliverable": {"format": "json", "type": "spec"},
             "replies": ['{"endpoints": [{"path": "/status"}], "owner": "ops"}']},
        ],
        "policy": {"order": "round_robin", "first": "alice"}})
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = Page(server, "docs", who="alice")
    try:
        page.answer("OPENED")
        page.do("GUIDANCE your turn", "GUIDANCE")
        page.do("MODE plan", "MODE")
        page.do("SEND Plan the launch", "SENT")
        shown = page.do("DOCS 2", "DOCS")
        plan, spec = shown["docs"]
        assert plan["head"].startswith("planlaunchv1plan mode · by planner · markdown"), plan
        assert plan["headings"] == ["Goal", "Steps"], plan
        assert plan["items"] == ["Build", "Test"], plan
        assert plan["strong"] == ["it"], plan
        assert not plan["rawHtml"], plan
        assert spec["head"].startswith("deliverablespecv1build mode · by builder · json"), spec
        assert spec["folds"][0] == {"label": "{2}", "open": True}, spec
        assert {"label": "endpoints: [1]", "open": False} in spec["folds"], spec
        assert 'owner: "ops"' in spec["leaves"], spec
        assert any("next speaker: planner (turn 2) · plan mode" in s for s in shown["system"]), shown
        assert any("next speaker: builder (turn 3) · build mode" in s for s in shown["system"]), shown
        page.do(f"SHOT {ARTIFACTS / 'console-documents.png'}", "SHOT")
        assert page.do("FAILURES", "FAILURES") == []
    finally:
        page.close()


STANDUP = """
name: standup
description: alice reports; a scripted scribe notes it down.
participants:
  - id: alice
    external: true
  - id: scribe
    kind: scripted
    replies: ["Noted."]
policy:
  order: round_robin
  first: alice
"""


def test_an_admin_creates_from_the_library_and_finds_it_again(tmp_path, viewer_prereqs):
    library = tmp_path / "library"
    library.mkdir()
    (library / "standup.yaml").write_text(STANDUP)
    server = Server(tmp_path / "console.db")
    server.tokens = {"admin": server.token("admin", admin=True), "alice": server.token("alice")}
    server.start("127.0.0.1:0", "--scenarios", str(library))
    page = Page(server)
    try:
        signed_in = page.answer("SIGNEDIN")
        assert signed_in["appHidden"] is True, "the app showed before signing in"
        assert set(signed_in["disabled"]) >= {"say", "send", "timeline-button", "tree-button", "pause", "resume"}
        created = page.do("CREATE standup", "CREATED")
        assert created
        assert page.do("SEARCH standup-nothing", "LISTED") == []
        assert page.do(f"SEARCH {created[:6]}", "LISTED") == [created]

        # alice streams progress, then closes the conversation: no bubble stays "streaming".
        say(server, "alice", "working on it", finality="none", conversation=created)
        say(server, "alice", "done, closing", finality="conversation", conversation=created)
        page.do("EXPECT done, closing", "SAW")
        assert page.do("STREAMING", "STREAMING") == "0"
        page.do(f"SHOT {ARTIFACTS / 'console-created.png'}", "SHOT")
        assert page.do("FAILURES", "FAILURES") == []
    finally:
        page.close()
        server.stop(signal.SIGKILL)


def test_a_participant_sees_the_tree_below_it_and_signing_out_clears_the_token(server, viewer_prereqs):
    """bob opens a sub-conversation of t1 that alice takes no part in; alice (a participant of
    t1, who may read it) finds it in the sidebar and the tree. Signing out empties the token
    field, so the next token pasted signs in as written."""

    async def setup():
        admin = await Client.connect(server.url, server.tokens["admin"])
        await admin.call("createConversation", {"conversationId": "t1", "participants": ["alice", "bob"]})
        await admin.close()
        bob = await Client.connect(server.url, server.tokens["bob"])
        await bob.call("createConversation", {"conversationId": "t1.sub", "participants": ["bob"],
                                              "parentConversationId": "t1", "input": {"text": "bob's errand"}})
        await bob.close()

    run(setup())
    say(server, "alice", "the main thread", conversation="t1")
    page = Page(server, "t1", who="alice")
    try:
        page.answer("OPENED")
        assert page.do("TREE", "TREE") == ["t1", "t1.sub"]
        assert page.do("SEARCH t1", "LISTED") == ["t1", "t1.sub"]
        out = page.do("SIGNOUT", "SIGNEDOUT")
        assert out == {"field": "", "listed": 0}, out
        signed = page.do(f"SIGNIN {server.tokens['bob']}", "SIGNEDIN")
        assert "bob" in signed["who"] and not signed["error"], signed
        assert page.do("FAILURES", "FAILURES") == []
    finally:
        page.close()


def test_the_list_reads_a_page_at_a_time_as_it_is_scrolled(server, viewer_prereqs):
    """150 conversations: the list shows the newest 100, the next 50 once scrolled to its end,
    and the search box asks the server."""

    async def setup():
        admin = await Client.connect(server.url, server.tokens["admin"])
        for i in range(150):
            await admin.call("createConversation", {"conversationId": f"many-{i:03}", "participants": ["alice"]})
        await admin.close()

    run(setup())
    page = Page(server)
    try:
        page.answer("SIGNEDIN")
        first = page.do("SEARCH many-", "LISTED")
        assert len(first) == 100, first[:3]
        both = page.do("SCROLL", "LISTED")
        assert len(both) == 150 and set(both) == {f"many-{i:03}" for i in range(150)}
        assert sorted(page.do("SEARCH many-04", "LISTED")) == [f"many-04{i}" for i in range(10)]
        assert page.do("FAILURES", "FAILURES") == []
    finally:
        page.close()


def test_an_approval_shows_what_is_approved_and_is_answered_by_a_button(server, viewer_prereqs):
    """At a scenario's approval checkpoint the approver sees for whom and after what, with
    Approve and Reject; Approve posts the decision and the approved speaker takes its turn."""

    created(server, "ap1", {
        "participants": [
            {"id": "planner", "kind": "scripted", "replies": ["Ship the status page on Friday."]},
            "alice",
            {"id": "builder", "kind": "scripted", "replies": ["Built it."]},
        ],
        "policy": {"order": "sequence", "sequence": ["planner", "builder"],
                   "approvals": [{"before": "builder", "approver": "alice"}]},
        "stop": {"maxTurns": 3}})
    page = Page(server, "ap1", who="alice")
    try:
        page.answer("OPENED")
        what = page.do("APPROVAL", "APPROVAL")
        assert what == "Approve builder's turn after planner: “Ship the status page on Friday.”?", what
        page.do("CLICK approve", "CLICKED")
        page.do("EXPECT Built it.", "SAW")
        shown = page.do("DOCS 0", "DOCS")
        assert any("alice is asked to approve builder's turn" in t for t in shown["system"]), shown
        assert page.do("FAILURES", "FAILURES") == []
    finally:
        page.close()


def test_an_admin_mints_and_revokes_a_token_in_the_console(server, viewer_prereqs):
    """The tokens panel lists the tenant's tokens (never a token itself), mints one, shown this
    once, that signs in, and revokes it, after which it signs in no more."""
    import httpx

    page = Page(server)
    try:
        page.answer("SIGNEDIN")
        listed = page.do("TOKENS", "TOKENS")
        assert "admin" in listed and "alice" in listed, listed
        token = page.do("MINT console-made", "MINTED")
        assert token.startswith("oct_"), token
        bearer = {"Authorization": f"Bearer {token}"}
        me = httpx.get(server.http + "/me", headers=bearer, timeout=10)
        assert me.status_code == 200 and me.json()["agentId"] == "console-made", me.text
        left = page.do("REVOKE console-made", "REVOKED")
        assert "console-made" not in left and "admin" in left, left
        assert httpx.get(server.http + "/me", headers=bearer, timeout=10).status_code == 401
        assert page.do("FAILURES", "FAILURES") == []
    finally:
        page.close()
