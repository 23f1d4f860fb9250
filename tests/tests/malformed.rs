//! What a library client would never send, and every limit: each gets its own error, and the
//! server keeps serving the other connections.

use std::time::Duration;

use jsonrpsee::core::client::ClientT;
use orchestrator::engine::config::Limits;
use proto_spec::codes;
use serde_json::{json, Value};
use tests::{TestServer, P};

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {v}"))
}

/// Wrong param types, missing fields, positional params and a forged author: each refused
/// with `InvalidParams` and a message that names the problem.
async fn bad_params_are_refused(raw: &mut tests::RawWs) {
    // Wrong param types, missing fields, positional params.
    let r = raw
        .call(
            9,
            "sendMessage",
            json!({"conversationId": "c1", "payload": "hi", "finality": "turn"}),
        )
        .await;
    assert_eq!(code(&r), codes::INVALID_PARAMS as i64);
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid type"),
        "{r}"
    );
    let r = raw
        .call(
            10,
            "sendMessage",
            json!({"conversationId": "c1", "payload": {"text": "x"}}),
        )
        .await;
    assert_eq!(code(&r), codes::INVALID_PARAMS as i64);
    assert!(
        r["error"]["message"].as_str().unwrap().contains("finality"),
        "{r}"
    );
    let r = raw
        .call(
            11,
            "sendMessage",
            json!({"conversationId": "c1", "payload": {"text": "x"}, "finality": "forever"}),
        )
        .await;
    assert_eq!(code(&r), codes::INVALID_PARAMS as i64);
    let r = raw.call(12, "tail", json!(["c1", 0])).await;
    assert_eq!(code(&r), codes::INVALID_PARAMS as i64);
    // A forged author is refused, not used.
    let r = raw
        .call(13, "sendMessage", json!({"conversationId": "c1", "payload": {"text": "x"}, "finality": "turn", "author": "bob"}))
        .await;
    assert_eq!(code(&r), codes::INVALID_PARAMS as i64);
    assert!(
        r["error"]["message"].as_str().unwrap().contains("author"),
        "{r}"
    );
}

#[tokio::test]
async fn malformed_input_gets_its_error_and_others_keep_being_served() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    // Another connection, busy the whole time.
    let bob = ts.client("bob").await;

    let mut raw = ts.raw().await;
    // Calls before authenticate.
    let r = raw
        .call(1, "tail", json!({"conversationId": "c1", "sinceSeq": 0}))
        .await;
    assert_eq!(code(&r), codes::UNAUTHENTICATED as i64);
    assert_eq!(r["error"]["data"]["error"], "Unauthenticated");
    let r = raw.call(2, "authenticate", json!({"token": "nope"})).await;
    assert_eq!(code(&r), codes::UNAUTHENTICATED as i64);
    raw.authenticate(ts.token("alice")).await;

    // Invalid JSON.
    raw.send_text("{\"jsonrpc\": \"2.0\", \"id\": 3, \"method\": ")
        .await;
    assert_eq!(code(&raw.recv().await), codes::PARSE_ERROR as i64);
    raw.send_text("not json at all").await;
    assert_eq!(code(&raw.recv().await), codes::PARSE_ERROR as i64);
    // Not a request object.
    raw.send_text("{\"jsonrpc\": \"2.0\", \"id\": 4}").await;
    assert_eq!(code(&raw.recv().await), codes::INVALID_REQUEST as i64);
    // A batch, empty or not: one call per frame.
    raw.send_text("[]").await;
    assert_eq!(code(&raw.recv().await), codes::BATCH_NOT_SUPPORTED as i64);
    raw.send_text(
        &json!([
            {"jsonrpc": "2.0", "id": 5, "method": "getConversation", "params": {"conversationId": "c1"}},
            {"jsonrpc": "2.0", "id": 6, "method": "noSuchMethod"}
        ])
        .to_string(),
    )
    .await;
    let r = raw.recv().await;
    assert_eq!(code(&r), codes::BATCH_NOT_SUPPORTED as i64, "{r}");
    // Wrong param types.
    let r = raw.call(7, "tail", json!({"conversationId": 42})).await;
    assert_eq!(code(&r), codes::INVALID_PARAMS as i64);
    // Unknown method.
    let r = raw.call(8, "dropTables", json!({})).await;
    assert_eq!(code(&r), codes::METHOD_NOT_FOUND as i64);
    bad_params_are_refused(&mut raw).await;
    // A well-formed call on the same connection still works, and is authored by alice.
    let r = raw
        .call(
            14,
            "sendMessage",
            json!({"conversationId": "c1", "payload": {"text": "mine"}, "finality": "turn"}),
        )
        .await;
    assert_eq!(r["result"]["seq"], 2, "{r}");
    let tail: Value = bob
        .request("tail", P(json!({"conversationId": "c1", "sinceSeq": 1})))
        .await
        .unwrap();
    assert_eq!(tail["events"][0]["author"], "alice");
    assert_eq!(
        tail["events"].as_array().unwrap().len(),
        1,
        "nothing else was appended"
    );
}

#[tokio::test]
async fn frames_the_websocket_protocol_forbids_end_with_its_close_code() {
    let limits = Limits {
        max_frame_bytes: 64 * 1024,
        ..tests::test_limits()
    };
    let ts = TestServer::with_limits(limits).await;
    // A reserved opcode (3), and a text frame with RSV1 set and no extension agreed: 1002.
    for first in [0x83u8, 0x80 | 0x40 | 0x01] {
        let mut ws = tests::DeafWs::connect(&ts.url()).await;
        ws.send_frame(first, b"{}").await;
        assert_eq!(ws.close_code().await, Some(1002), "first byte {first:#x}");
    }
    // A message fragmented past the limit (40 KiB, 40 KiB, then the rest): 1009.
    let mut ws = tests::DeafWs::connect(&ts.url()).await;
    let part = vec![b' '; 40 * 1024];
    ws.send_frame(0x01, &part).await;
    ws.send_frame(0x00, &part).await;
    ws.send_frame(0x80, &part).await;
    assert_eq!(ws.close_code().await, Some(1009));
    // The server goes on serving others.
    let mut raw = ts.raw().await;
    raw.authenticate(ts.token("alice")).await;
}

#[tokio::test]
async fn frame_and_payload_limits() {
    let limits = Limits {
        max_frame_bytes: 64 * 1024,
        max_payload_bytes: 8 * 1024,
        ..tests::test_limits()
    };
    let ts = TestServer::with_limits(limits).await;
    ts.create("c1", &["alice"]).await;
    let mut raw = ts.raw().await;
    raw.authenticate(ts.token("alice")).await;
    // A payload over the payload limit, in a frame under the frame limit.
    let big = "x".repeat(10 * 1024);
    let r = raw
        .call(
            1,
            "sendMessage",
            json!({"conversationId": "c1", "payload": {"text": big}, "finality": "turn"}),
        )
        .await;
    assert_eq!(code(&r), codes::PAYLOAD_TOO_LARGE as i64);
    assert_eq!(r["error"]["data"]["limit"], 8 * 1024);
    // A frame over the frame limit.
    let huge = "y".repeat(80 * 1024);
    raw.send_text(&json!({"jsonrpc": "2.0", "id": 2, "method": "sendMessage", "params": {"conversationId": "c1", "payload": {"text": huge}, "finality": "turn"}}).to_string()).await;
    let r = raw.recv().await;
    assert_eq!(code(&r), codes::FRAME_TOO_LARGE as i64);
    // The connection keeps serving, and nothing was appended.
    let r = raw
        .call(3, "getConversation", json!({"conversationId": "c1"}))
        .await;
    assert_eq!(r["result"]["latestSeq"], 1, "{r}");
}

#[tokio::test]
async fn in_flight_limit_per_connection() {
    let limits = Limits {
        max_in_flight_per_connection: 2,
        ..tests::test_limits()
    };
    let ts = TestServer::with_limits(limits).await;
    ts.create("c1", &["alice"]).await;
    let mut raw = ts.raw().await;
    raw.authenticate(ts.token("alice")).await;
    // Two long waits hold both slots; the third call is refused at once.
    for id in [1, 2] {
        raw.send_text(&json!({"jsonrpc": "2.0", "id": id, "method": "waitForChange", "params": {"conversationId": "c1", "sinceSeq": 1, "timeoutMs": 1500}}).to_string()).await;
    }
    ts.wait_for_waiters("c1", 2).await;
    let r = raw
        .call(3, "getConversation", json!({"conversationId": "c1"}))
        .await;
    assert_eq!(r["id"], 3);
    assert_eq!(code(&r), codes::RATE_LIMITED as i64);
    // Another connection is not affected.
    let mut other = ts.raw().await;
    other.authenticate(ts.token("alice")).await;
    let r = other
        .call(4, "getConversation", json!({"conversationId": "c1"}))
        .await;
    assert_eq!(r["result"]["latestSeq"], 1);
    // Once the waits end, the connection takes calls again.
    let a = raw.recv().await;
    let b = raw.recv().await;
    assert_eq!(a["result"]["timedOut"], true);
    assert_eq!(b["result"]["timedOut"], true);
    let r = raw
        .call(5, "getConversation", json!({"conversationId": "c1"}))
        .await;
    assert_eq!(r["result"]["latestSeq"], 1);
}

#[tokio::test]
async fn connection_limit() {
    let limits = Limits {
        max_connections: 2,
        ..tests::test_limits()
    };
    let ts = TestServer::with_limits(limits).await;
    let _a = ts.raw().await;
    let _b = ts.raw().await;
    let third = tokio_tungstenite::connect_async(ts.url()).await;
    match third {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => assert_eq!(resp.status(), 429),
        other => panic!("expected HTTP 429, got {other:?}"),
    }
    drop(_a);
    // A slot frees once a connection closes.
    let mut ok = false;
    for _ in 0..50 {
        if tokio_tungstenite::connect_async(ts.url()).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ok, "a slot freed after a connection closed");
}

#[tokio::test]
async fn subscription_limit_per_connection() {
    let limits = Limits {
        max_subscriptions_per_connection: 1,
        ..tests::test_limits()
    };
    let ts = TestServer::with_limits(limits).await;
    ts.create("c1", &["alice"]).await;
    let mut raw = ts.raw().await;
    raw.authenticate(ts.token("alice")).await;
    let r = raw
        .call(1, "subscribe", json!({"conversationId": "c1"}))
        .await;
    assert!(r["result"].is_number() || r["result"].is_string(), "{r}");
    let r = raw
        .call(2, "subscribe", json!({"conversationId": "c1"}))
        .await;
    assert_eq!(code(&r), codes::TOO_MANY_SUBSCRIPTIONS as i64);
    let r = raw
        .call(3, "getConversation", json!({"conversationId": "c1"}))
        .await;
    assert_eq!(r["result"]["latestSeq"], 1);
}

#[tokio::test]
async fn requests_hyper_cannot_read_are_refused_in_the_protocols_error_shape() {
    let ts = TestServer::start().await;
    let addr = ts.running().local_addr().to_string();
    let long_target = format!("GET /{}", "a".repeat(70_000));
    let huge_header = format!("Authorization: Bearer {}\r\n", "a".repeat(1_000_000));
    let cases = [
        ("GARBAGE", String::new(), 400),
        (long_target.as_str(), String::new(), 414),
        ("GET /me", huge_header, 431),
    ];
    for (request, headers, status) in cases {
        let answer = tests::http_raw(&addr, request, &headers, "").await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status} ")),
            "{status}: {}",
            &answer[..answer.len().min(200)]
        );
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let v: Value =
            serde_json::from_str(body).unwrap_or_else(|e| panic!("{status}: {e}: {body}"));
        assert_eq!(v["error"]["code"], -32600, "{status}: {v}");
        assert_eq!(v["error"]["data"]["status"], status, "{v}");
    }
}
