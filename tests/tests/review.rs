//! What a review of bad input found on the JSON-RPC wire, each kept fixed: every id the
//! specification allows is answered with that id, ids it does not allow get `-32600` with id
//! null, every error object names its code in `data.error`, methods that end subscriptions ask
//! for authentication first and take nothing but the id, and a connection that answers no ping
//! is closed after three intervals.

use std::time::Duration;

use jsonrpsee::core::client::ClientT;
use orchestrator::engine::config::Limits;
use proto_spec::codes;
use serde_json::{json, Value};
use tests::TestServer;

#[tokio::test]
async fn every_id_the_specification_allows_gets_its_answer_with_that_id() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    let mut raw = ts.raw().await;
    raw.authenticate(ts.token("alice")).await;
    // Numbers JSON-RPC allows that a 64-bit unsigned integer does not hold, and the rest.
    for id in r#"-1 1.5 1.0 18446744073709551616 1e30 "x" null"#.split(' ') {
        raw.send_text(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"getConversation","params":{{"conversationId":"c1"}}}}"#
        ))
        .await;
        let r = raw.recv().await;
        assert_eq!(
            r["id"],
            serde_json::from_str::<Value>(id).unwrap(),
            "{id}: {r}"
        );
        assert_eq!(r["result"]["conversationId"], "c1", "{id}: {r}");
    }
    // The exact text of a number id comes back, not a rounding of it.
    raw.send_text(r#"{"jsonrpc":"2.0","id":18446744073709551616,"method":"nope"}"#)
        .await;
    let text = raw.recv_text().await;
    assert!(text.contains(r#""id":18446744073709551616"#), "{text}");

    for frame in [
        r#"{"jsonrpc":"2.0","id":true,"method":"tail","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":{},"method":"tail","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":[],"method":"tail","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":-1,"method":"tail","id":2,"params":{}}"#,
    ] {
        raw.send_text(frame).await;
        let r = raw.recv().await;
        assert_eq!(r["error"]["code"], codes::INVALID_REQUEST, "{frame}: {r}");
        assert_eq!(r["id"], Value::Null, "{frame}: {r}");
        assert_eq!(r["error"]["data"]["error"], "InvalidRequest", "{r}");
    }

    // The same over HTTP POST.
    let client = reqwest::Client::new();
    let r: Value = client
        .post(format!("{}/rpc", ts.http_base()))
        .body(r#"{"jsonrpc":"2.0","id":-7,"method":"authenticate","params":{"token":"nope"}}"#)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["id"], -7, "{r}");
    assert_eq!(r["error"]["code"], codes::UNAUTHENTICATED, "{r}");
}

#[tokio::test]
async fn every_error_object_names_its_code() {
    let ts = TestServer::with_limits(Limits {
        max_frame_bytes: 4096,
        ..tests::test_limits()
    })
    .await;
    let mut raw = ts.raw().await;
    raw.authenticate(ts.token("alice")).await;
    let cases = [
        ("not json", codes::PARSE_ERROR, "ParseError"),
        (
            r#"{"jsonrpc":"2.0","id":4}"#,
            codes::INVALID_REQUEST,
            "InvalidRequest",
        ),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"dropTables","params":{}}"#,
            codes::METHOD_NOT_FOUND,
            "MethodNotFound",
        ),
        ("[]", codes::BATCH_NOT_SUPPORTED, "BatchNotSupported"),
    ];
    for (frame, code, name) in cases {
        raw.send_text(frame).await;
        let r = raw.recv().await;
        assert_eq!(r["error"]["code"], code, "{frame}: {r}");
        assert_eq!(r["error"]["data"]["error"], name, "{frame}: {r}");
    }
    // A frame over the limit: an object with the limit, and the connection stays open.
    raw.send_text(&"x".repeat(5000)).await;
    let r = raw.recv().await;
    assert_eq!(r["error"]["code"], codes::FRAME_TOO_LARGE, "{r}");
    assert_eq!(
        r["error"]["data"],
        json!({"error": "FrameTooLarge", "limit": 4096}),
        "{r}"
    );
    let r = raw.call(5, "listConversations", json!({})).await;
    assert!(r["result"].is_object(), "{r}");
}

#[tokio::test]
async fn ending_a_subscription_needs_authentication_and_only_the_id() {
    let ts = TestServer::start().await;
    let mut raw = ts.raw().await;
    for method in ["unsubscribe", "unregisterExecutor"] {
        let r = raw.call(1, method, json!([1])).await;
        assert_eq!(r["error"]["code"], codes::UNAUTHENTICATED, "{method}: {r}");
    }
    raw.authenticate(ts.token("alice")).await;
    let r = raw
        .call(2, "registerExecutor", json!({"mode": "push"}))
        .await;
    let id = r["result"].as_u64().expect("a registration id");
    for (method, params) in [
        (
            "unregisterExecutor",
            json!({"subscription": id, "extra": 1}),
        ),
        ("unregisterExecutor", json!([id, 2])),
        ("unsubscribe", json!({"subscription": 1, "x": true})),
    ] {
        let r = raw.call(3, method, params.clone()).await;
        assert_eq!(
            r["error"]["code"],
            codes::INVALID_PARAMS,
            "{method} {params}: {r}"
        );
    }
    let r = raw.call(4, "unregisterExecutor", json!([id])).await;
    assert_eq!(r["result"], true, "{r}");
    let r = raw
        .call(5, "unregisterExecutor", json!({"subscription": id}))
        .await;
    assert_eq!(r["result"], false, "ended already: {r}");
}

#[tokio::test]
async fn a_connection_that_answers_no_ping_is_closed_after_three_intervals() {
    let ts = TestServer::with_limits(Limits {
        ping_interval: Duration::from_millis(200),
        ..tests::test_limits()
    })
    .await;
    // A client that answers pings (every library's reading task does) stays, silent or not.
    let polite = ts.client("alice").await;
    // A client that never reads: it answers no ping. (Timed from before it connects: the
    // server counts the silence from the upgrade, which comes after.)
    let started = std::time::Instant::now();
    let mut deaf = tests::DeafWs::connect(&ts.url()).await;
    deaf.closed().await;
    let after = started.elapsed();
    assert!(
        after >= Duration::from_millis(600),
        "closed after {after:?}, before three intervals"
    );
    // The polite client, silent for as long, was pinged and answered.
    let r: Value = polite
        .request("listConversations", tests::P(json!({})))
        .await
        .expect("still connected");
    assert!(r["conversations"].is_array(), "{r}");
    ts.assert_dropped(&["ping_timeout"]).await;
}

fn host(ts: &TestServer) -> String {
    ts.http_base().trim_start_matches("http://").to_string()
}

/// The JSON error of an HTTP answer (status line, headers, body): its status and error object.
fn http_error(answer: &str) -> (u16, Value) {
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status: {answer}"));
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("");
    let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {answer}"));
    (status, v["error"].clone())
}

#[tokio::test]
async fn every_http_error_is_the_protocols_json() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    let host = host(&ts);
    let bearer = format!("Authorization: Bearer {}\r\n", ts.token("alice"));
    for request in [
        "DELETE /conversations",
        "PUT /conversations/c1",
        "PATCH /conversations/c1/messages",
        "DELETE /me",
    ] {
        let answer = tests::http_raw(&host, request, &bearer, "").await;
        let (status, e) = http_error(&answer);
        assert_eq!(status, 405, "{request}: {answer}");
        assert_eq!(e["code"], codes::METHOD_NOT_FOUND, "{request}: {answer}");
        assert_eq!(e["data"]["error"], "MethodNotFound", "{answer}");
    }
    let answer = tests::http_raw(&host, "GET /conversations/%ff%fe", &bearer, "").await;
    let (status, e) = http_error(&answer);
    assert_eq!(
        (status, e["code"].clone()),
        (400, json!(codes::INVALID_PARAMS)),
        "{answer}"
    );
    let long = format!("GET /conversations/{}", "a".repeat(10_000));
    let answer = tests::http_raw(&host, &long, &bearer, "").await;
    let (status, e) = http_error(&answer);
    assert_eq!(status, 414, "{answer}");
    assert_eq!(e["data"]["error"], "InvalidRequest", "{answer}");
    let answer = tests::http_raw(&host, "GET /rpc", "", "").await;
    let (status, e) = http_error(&answer);
    assert_eq!(
        (status, e["code"].clone()),
        (405, json!(codes::INVALID_REQUEST)),
        "{answer}"
    );
}

#[tokio::test]
async fn slow_heads_and_bodies_do_not_hold_a_socket_and_sockets_are_counted() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ts = TestServer::with_limits(Limits {
        header_timeout: Duration::from_millis(300),
        max_sockets: 4,
        ..tests::test_limits()
    })
    .await;
    ts.create("c1", &["alice", "bob"]).await;
    let host = host(&ts);
    // A head trickled a byte at a time, never finished: the socket is closed.
    let mut trickle = tokio::net::TcpStream::connect(&host).await.unwrap();
    trickle.write_all(b"GET /me HTTP/1.1\r\nHo").await.unwrap();
    let mut sink = Vec::new();
    tokio::time::timeout(tests::WAIT, trickle.read_to_end(&mut sink))
        .await
        .expect("closed in time")
        .ok();
    // A body announced and never sent: 408 with the protocol's error.
    let answer = tests::http_raw(
        &host,
        "POST /conversations/c1/messages",
        &format!(
            "Authorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n",
            ts.token("alice")
        ),
        "",
    )
    .await;
    let (status, e) = http_error(&answer);
    assert_eq!(status, 408, "{answer}");
    assert_eq!(e["data"]["error"], "InvalidRequest", "{answer}");
    // Four idle sockets take every place: the fifth is refused with 503 at once.
    let mut idle = Vec::new();
    for _ in 0..4 {
        idle.push(tokio::net::TcpStream::connect(&host).await.unwrap());
    }
    let answer = tests::http_raw(&host, "GET /healthz", "", "").await;
    let (status, e) = http_error(&answer);
    assert_eq!(status, 503, "{answer}");
    assert_eq!(e["code"], codes::RATE_LIMITED, "{answer}");
    // The idle ones are closed for sending no head, and the server serves again.
    for mut s in idle {
        let mut sink = Vec::new();
        tokio::time::timeout(tests::WAIT, s.read_to_end(&mut sink))
            .await
            .expect("closed in time")
            .ok();
    }
    let answer = tests::http_raw(&host, "GET /healthz", "", "").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    ts.assert_dropped(&["header_timeout", "socket_limit"]).await;
}

#[tokio::test]
async fn a_long_poll_answer_stays_within_the_answer_limit() {
    // Frames of 4 KiB: answers of at most 64 KiB.
    let ts = TestServer::with_limits(Limits {
        max_frame_bytes: 4096,
        max_payload_bytes: 3000,
        ..tests::test_limits()
    })
    .await;
    ts.create("c1", &["alice", "bob"]).await;
    let mut raw = ts.raw().await;
    raw.authenticate(ts.token("alice")).await;
    let text = "x".repeat(2500);
    for i in 0..60 {
        let r = raw
            .call(
                i + 1,
                "sendTrace",
                json!({"conversationId": "c1", "payload": {"text": text}}),
            )
            .await;
        assert!(r["result"]["seq"].is_u64(), "{r}");
    }
    // Over WebSocket, `tail` of it all is refused as too large.
    let r = raw
        .call(100, "tail", json!({"conversationId": "c1", "sinceSeq": 0}))
        .await;
    assert_eq!(r["error"]["code"], codes::RESPONSE_TOO_LARGE, "{r}");
    // A long-poll answers what fits, and the rest when asked again from there.
    let client = reqwest::Client::new();
    let mut since = 0;
    let mut rounds = 0;
    while since < 61 {
        let answer = client
            .get(format!(
                "{}/conversations/c1/wait?sinceSeq={since}&timeoutMs=1000",
                ts.http_base()
            ))
            .bearer_auth(ts.token("bob"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        let body = answer.bytes().await.unwrap();
        assert!(body.len() <= 64 * 1024, "{} bytes", body.len());
        let v: Value = serde_json::from_slice(&body).unwrap();
        let events = v["events"].as_array().unwrap();
        assert_eq!(events[0]["seq"], since + 1, "no gap");
        since = events.last().unwrap()["seq"].as_u64().unwrap();
        rounds += 1;
        assert!(rounds < 10);
    }
    assert!(
        rounds >= 3,
        "the log did not need several answers: {rounds}"
    );
}

#[tokio::test]
async fn a_parked_long_poll_is_answered_when_the_server_stops() {
    let mut ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    let url = format!(
        "{}/conversations/c1/wait?sinceSeq=1&timeoutMs=30000",
        ts.http_base()
    );
    let token = ts.token("bob").to_string();
    let parked = tokio::spawn(async move {
        reqwest::Client::new()
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
    });
    ts.wait_for_waiters("c1", 1).await;
    ts.stop().await;
    let answer = parked.await.unwrap();
    assert_eq!(answer.status(), 200);
    let v: Value = answer.json().await.unwrap();
    assert_eq!(v["timedOut"], true, "{v}");
    assert_eq!(v["events"], json!([]), "{v}");
}
