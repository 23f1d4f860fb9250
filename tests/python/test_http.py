"""The HTTP routes from clients nobody here wrote: httpx, httpx-sse and curl, against the
release binary. SSE resume (also in the middle of a busy stream), long-poll, REST errors, and
every route of the committed OpenAPI document checked against what the server answers."""

import json
import pathlib
import subprocess
import threading
import time

import httpx
import jsonschema
import pytest
from httpx_sse import connect_sse

from conftest import ROOT, Server

OPENAPI = json.loads((ROOT / "proto-spec" / "openapi.json").read_text())


def auth(token):
    return {"Authorization": f"Bearer {token}"}


def create(server, cid="c1", participants=("alice", "bob")):
    r = httpx.post(
        f"{server.http}/conversations",
        headers=auth(server.tokens["admin"]),
        json={"conversationId": cid, "participants": list(participants)},
    )
    assert r.status_code == 201, r.text
    return r.json()


def post(server, who, text, cid="c1", finality="none", key=None, timeout=10):
    headers = auth(server.tokens[who])
    if key:
        headers["Idempotency-Key"] = key
    return httpx.post(
        f"{server.http}/conversations/{cid}/messages",
        headers=headers,
        json={"payload": {"text": text}, "finality": finality},
        timeout=timeout,
    )


def read_sse(server, who, n, since=None, last_event_id=None, cid="c1"):
    """The first n events of a stream, as (id, seq) pairs."""
    headers = auth(server.tokens[who])
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    params = {} if since is None else {"sinceSeq": since}
    out = []
    with httpx.Client(timeout=httpx.Timeout(10, read=10)) as client:
        with connect_sse(client, "GET", f"{server.http}/conversations/{cid}/events", headers=headers, params=params) as es:
            assert es.response.status_code == 200
            assert es.response.headers["content-type"].startswith("text/event-stream")
            for sse in es.iter_sse():
                ev = sse.json()
                assert int(sse.id) == ev["seq"]
                out.append(ev["seq"])
                if len(out) == n:
                    break
    return out


def test_sse_replays_resumes_by_last_event_id_and_follows_live(server):
    create(server)
    for i in range(10):
        assert post(server, "alice", f"m{i}").status_code == 201
    # From the start (the created event is seq 1), from a cursor, and by Last-Event-ID.
    assert read_sse(server, "bob", 11) == list(range(1, 12))
    assert read_sse(server, "bob", 3, since=5) == [6, 7, 8]
    assert read_sse(server, "bob", 3, since=1, last_event_id=8) == [9, 10, 11]

    # Live: a reader parked at the head gets what is posted next.
    got = []
    reader = threading.Thread(target=lambda: got.extend(read_sse(server, "bob", 2, since=11)))
    reader.start()
    time.sleep(0.3)
    post(server, "alice", "live 1")
    post(server, "alice", "live 2")
    reader.join(10)
    assert got == [12, 13]


def test_sse_reconnect_in_the_middle_of_a_busy_stream_has_no_gap_and_no_duplicate(server):
    create(server)
    total = 400
    writer_done = threading.Event()

    def writer():
        with httpx.Client(headers=auth(server.tokens["alice"]), timeout=10) as c:
            for i in range(total):
                r = c.post(f"{server.http}/conversations/c1/messages", json={"payload": {"text": f"busy {i}"}, "finality": "none"})
                assert r.status_code == 201
        writer_done.set()

    t = threading.Thread(target=writer)
    t.start()
    seen = []
    drops = 0
    last = None
    # Drop the connection every 37 events while the writer is busy, resuming by Last-Event-ID.
    while len(seen) < total + 1:
        chunk = read_sse(server, "bob", min(37, total + 1 - len(seen)), since=0, last_event_id=last)
        seen.extend(chunk)
        last = seen[-1]
        drops += 1
    t.join(30)
    assert writer_done.is_set()
    assert drops > 5
    assert seen == list(range(1, total + 2))


def test_sse_with_curl_resumes_by_last_event_id(server):
    create(server)
    for i in range(5):
        post(server, "alice", f"c{i}")
    out = subprocess.run(
        ["curl", "-sN", "--max-time", "2", "-H", f"Authorization: Bearer {server.tokens['bob']}",
         "-H", "Last-Event-ID: 3", f"{server.http}/conversations/c1/events"],
        capture_output=True, text=True, timeout=20,
    ).stdout
    ids = [int(line[3:]) for line in out.splitlines() if line.startswith("id:")]
    assert ids == [4, 5, 6]
    data = [json.loads(line[5:]) for line in out.splitlines() if line.startswith("data:")]
    assert [d["payload"]["text"] for d in data] == ["c2", "c3", "c4"]


def test_long_poll_wakes_on_append_and_times_out(server):
    create(server)
    url = f"{server.http}/conversations/c1/wait"
    # Nothing after the head: times out after about the timeout.
    started = time.monotonic()
    r = httpx.get(url, headers=auth(server.tokens["bob"]), params={"sinceSeq": 1, "timeoutMs": 300})
    took = time.monotonic() - started
    assert r.status_code == 200
    assert r.json() == {"latestSeq": 1, "timedOut": True, "events": []}
    assert took >= 0.3

    # A parked waiter wakes when a message is committed, with the events after its cursor.
    result = {}

    def waiter():
        result["r"] = httpx.get(url, headers=auth(server.tokens["bob"]), params={"sinceSeq": 1, "timeoutMs": 10000}, timeout=20)

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)
    post(server, "alice", "wake up")
    t.join(10)
    body = result["r"].json()
    assert body["timedOut"] is False
    assert body["latestSeq"] == 2
    assert [e["payload"]["text"] for e in body["events"]] == ["wake up"]

    # Already past the cursor: answers at once with the backlog.
    r = httpx.get(url, headers=auth(server.tokens["bob"]), params={"sinceSeq": 0, "timeoutMs": 10000})
    assert [e["seq"] for e in r.json()["events"]] == [1, 2]

    # curl, as a script would.
    out = subprocess.run(
        ["curl", "-s", "-H", f"Authorization: Bearer {server.tokens['bob']}", f"{url}?sinceSeq=1&timeoutMs=50"],
        capture_output=True, text=True, timeout=20,
    ).stdout
    assert json.loads(out)["events"][0]["payload"]["text"] == "wake up"


def test_long_poll_timeout_is_capped(tmp_path):
    s = Server(tmp_path / "cap.db")
    s.tokens = {"admin": s.token("admin", admin=True), "bob": s.token("bob")}
    s.start("127.0.0.1:0", "--max-wait-ms", "400")
    try:
        create(s, participants=("bob",))
        started = time.monotonic()
        r = httpx.get(f"{s.http}/conversations/c1/wait", headers=auth(s.tokens["bob"]),
                      params={"sinceSeq": 1, "timeoutMs": 600000}, timeout=30)
        took = time.monotonic() - started
        assert r.json()["timedOut"] is True
        assert 0.4 <= took < 5
    finally:
        s.stop()


def error_of(r, status, code):
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    return body["error"]


def test_rest_errors_for_each_bad_input(server):
    create(server)
    base = f"{server.http}/conversations/c1/messages"
    good = {"payload": {"text": "x"}, "finality": "none"}
    # No token, a wrong token, a malformed header.
    r = httpx.post(base, json=good)
    error_of(r, 401, -32001)
    assert r.headers["www-authenticate"] == "Bearer"
    error_of(httpx.post(base, json=good, headers=auth("oct_wrong")), 401, -32001)
    error_of(httpx.get(f"{server.http}/conversations", headers={"Authorization": "Basic abc"}), 401, -32001)
    # Another agent's conversation: answered as one that does not exist.
    create(server, "private", participants=("bob",))
    error_of(httpx.get(f"{server.http}/conversations/private", headers=auth(server.tokens["alice"])), 404, -32003)
    error_of(post(server, "alice", "hi", cid="private"), 404, -32003)
    error_of(httpx.get(f"{server.http}/conversations/private/events", headers=auth(server.tokens["alice"])), 404, -32003)
    # Unknown conversation.
    error_of(httpx.get(f"{server.http}/conversations/nope/wait", headers=auth(server.tokens["alice"])), 404, -32003)
    # Invalid JSON, a missing field, an unknown field (a forged author).
    alice = auth(server.tokens["alice"])
    error_of(httpx.post(base, content=b'{"payload": {"text": ', headers=alice), 400, -32700)
    e = error_of(httpx.post(base, json={"payload": {"text": "x"}}, headers=alice), 400, -32602)
    assert "finality" in e["message"]
    error_of(httpx.post(base, json=dict(good, author="mallory"), headers=alice), 400, -32602)
    # A bad query.
    error_of(httpx.get(f"{server.http}/conversations/c1/wait?sinceSeq=abc", headers=alice), 400, -32602)
    error_of(httpx.get(f"{server.http}/conversations/c1/events", headers=dict(alice, **{"Last-Event-ID": "x"})), 400, -32602)
    # A body over the limit (1 MiB by default), and a payload over the payload limit (256 KiB).
    big = {"payload": {"text": "x" * (2 * 1024 * 1024)}, "finality": "none"}
    error_of(httpx.post(base, json=big, headers=alice), 413, -32030)
    # The same without a Content-Length (chunked): counted while it is read.
    def chunks():
        yield b'{"payload": {"text": "'
        for _ in range(32):
            yield b"x" * 65536
        yield b'"}, "finality": "none"}'
    error_of(httpx.post(base, content=chunks(), headers=alice), 413, -32030)
    mid = {"payload": {"text": "x" * (300 * 1024)}, "finality": "none"}
    error_of(httpx.post(base, json=mid, headers=alice), 413, -32030)
    # A reused Idempotency-Key with another body; the same body is answered as a duplicate.
    r1 = post(server, "alice", "once", key="k-1")
    assert r1.status_code == 201
    r2 = post(server, "alice", "once", key="k-1")
    assert r2.status_code == 200 and r2.json() == dict(r1.json(), duplicate=True)
    error_of(post(server, "alice", "twice", key="k-1"), 409, -32015)
    # Turn rules answer 409 with their code: bob closes the turn, then alice's stale hint.
    assert post(server, "bob", "done", finality="turn").status_code == 201
    r = httpx.post(base, headers=alice, json={"payload": {"text": "late"}, "finality": "turn", "turnHint": {"turn": 1}})
    error_of(r, 409, -32013)
    # Creating needs an admin; an existing id is a conflict.
    error_of(httpx.post(f"{server.http}/conversations", headers=alice, json={"participants": ["alice"]}), 403, -32002)
    error_of(httpx.post(f"{server.http}/conversations", headers=auth(server.tokens["admin"]),
                        json={"conversationId": "c1", "participants": ["alice"]}), 409, -32004)
    # Pausing: admins only; then a message is refused as paused.
    error_of(httpx.post(f"{server.http}/conversations/c1/pause", headers=alice), 403, -32002)
    assert httpx.post(f"{server.http}/conversations/c1/pause", headers=auth(server.tokens["admin"])).status_code == 200
    error_of(post(server, "alice", "while paused"), 409, -32016)
    # An unknown route.
    error_of(httpx.get(f"{server.http}/nowhere"), 404, -32601)
    # Nothing above was appended: the log holds what was acknowledged, and nothing else.
    r = httpx.get(f"{server.http}/conversations/c1/wait", headers=auth(server.tokens["admin"]), params={"sinceSeq": 0, "timeoutMs": 0})
    texts = [e["payload"].get("text") for e in r.json()["events"] if e["kind"] == "message"]
    assert texts == ["once", "done"]


def test_metrics_count_appends_errors_and_subscribers(server):
    create(server)
    post(server, "alice", "counted")
    httpx.get(f"{server.http}/conversations/c1", headers=auth("oct_wrong"))
    text = httpx.get(f"{server.http}/metrics").text
    lines = text.splitlines()
    assert any(l.startswith("orchestrator_appends_total ") and float(l.split()[1]) >= 2 for l in lines), text
    assert 'orchestrator_errors_total{code="Unauthenticated",transport="http"}' in text
    assert "orchestrator_commit_seconds_bucket" in text
    assert "orchestrator_commit_batch_size_bucket" in text
    # An open SSE stream shows as a subscriber while it lives.
    with httpx.Client(timeout=10) as c:
        with connect_sse(c, "GET", f"{server.http}/conversations/c1/events", headers=auth(server.tokens["bob"])) as es:
            events = es.iter_sse()  # kept alive: a collected generator closes the stream
            next(events)
            during = httpx.get(f"{server.http}/metrics").text
    assert [l for l in during.splitlines() if l.startswith("orchestrator_subscribers")] == ['orchestrator_subscribers{transport="sse"} 1'], during
    health = httpx.get(f"{server.http}/healthz").json()
    assert health["status"] == "ok"


def registry():
    """Resolves the document's `#/components/schemas/...` references."""
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    return Registry().with_resource("urn:openapi", DRAFT202012.create_resource(OPENAPI))


def validate(schema, instance):
    wrapped = json.loads(json.dumps(schema).replace('"#/components', '"urn:openapi#/components'))
    jsonschema.Draft202012Validator(wrapped, registry=registry()).validate(instance)


def test_every_openapi_route_is_served_as_documented(server):
    """Walks the committed OpenAPI document: each operation answers with a documented status,
    and each JSON body (success or error) validates against the documented schema."""
    create(server)
    # The deletion's route deletes a conversation of its own, not the one the others read.
    create(server, "doomed")
    post(server, "alice", "for the walk")
    admin = auth(server.tokens["admin"])
    served = httpx.get(f"{server.http}/openapi.json").json()
    assert served == OPENAPI, "the server serves another document than the committed one"
    bodies = {
        ("post", "/conversations"): {"conversationId": "walk", "participants": ["alice"]},
        ("post", "/conversations/{id}/messages"): {"payload": {"text": "walk"}, "finality": "none"},
    }
    checked = 0
    for path, ops in OPENAPI["paths"].items():
        for method, op in ops.items():
            url = server.http + path.replace("{id}", "doomed" if method == "delete" and path == "/conversations/{id}" else "c1")
            kwargs = {"headers": dict(admin), "timeout": 10}
            if (method, path) in bodies:
                kwargs["json"] = bodies[(method, path)]
            if path.endswith("/wait"):
                kwargs["params"] = {"sinceSeq": 0, "timeoutMs": 0}
            if path.endswith("/events"):
                with httpx.Client() as c:
                    with connect_sse(c, "GET", url, **kwargs) as es:
                        assert str(es.response.status_code) in op["responses"]
                        first = next(iter(es.iter_sse())).json()
                        validate({"$ref": "#/components/schemas/Event"}, first)
                checked += 1
                continue
            r = httpx.request(method.upper(), url, **kwargs)
            assert str(r.status_code) in op["responses"], (method, path, r.status_code, r.text)
            media = op["responses"][str(r.status_code)]["content"]
            if "application/json" in media and "schema" in media["application/json"]:
                validate(media["application/json"]["schema"], r.json())
            else:
                expected = next(iter(media))
                assert r.headers["content-type"].startswith(expected), (path, r.headers["content-type"])
            # Each documented error answers with the documented error body.
            if op.get("security") and op["security"][0].get("bearer") is not None:
                bad = httpx.request(method.upper(), url, timeout=10)
                assert bad.status_code == 401
                validate(op["responses"]["401"]["content"]["application/json"]["schema"], bad.json())
            checked += 1
    assert checked == sum(len(ops) for ops in OPENAPI["paths"].values()) >= 12


def test_a_slow_sse_reader_is_resumed_from_the_log_and_skips_nothing(server):
    create(server)
    total = 1500
    with httpx.Client(timeout=httpx.Timeout(30, read=30)) as c:
        with connect_sse(c, "GET", f"{server.http}/conversations/c1/events", headers=auth(server.tokens["bob"])) as es:
            events = es.iter_sse()
            assert int(next(events).id) == 1
            # The reader stops reading while the log grows well past what memory keeps.
            with httpx.Client(headers=auth(server.tokens["alice"]), timeout=10) as w:
                for i in range(total):
                    payload = {"payload": {"text": f"slow {i} " + "x" * 200}, "finality": "none"}
                    assert w.post(f"{server.http}/conversations/c1/messages", json=payload).status_code == 201
            seqs = [int(next(events).id) for _ in range(total)]
    assert seqs == list(range(2, total + 2))


def test_sse_streams_end_promptly_when_the_server_stops(server):
    create(server)
    ended = threading.Event()

    def reader():
        with httpx.Client(timeout=httpx.Timeout(30, read=30)) as c:
            with connect_sse(c, "GET", f"{server.http}/conversations/c1/events", headers=auth(server.tokens["bob"])) as es:
                for _ in es.iter_sse():
                    pass
        ended.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    time.sleep(0.5)
    started = time.monotonic()
    assert server.stop() == 0
    assert time.monotonic() - started < 5, "an open SSE stream held the shutdown"
    assert ended.wait(5), "the stream did not end"
