//! `subscribe` frames written straight into the connection (orchestrator/src/transport/push.rs): the
//! answer before any event, frames never torn by the server's own frames, a subscriber that
//! stops reading let go by the publisher and caught up from the log, and `unsubscribe`.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use orchestrator::engine::auth::Identity;
use proto_spec::{Finality, MessagePayload, SendMessageParams};
use serde_json::{json, Value};
use tests::{TestServer, WAIT};
use tokio_tungstenite::tungstenite::Message;

/// Appends `n` messages of `size` bytes to `conv` as alice, in process, `depth` at a time.
async fn append(ts: &TestServer, conv: &str, n: usize, size: usize) {
    let orch = ts.running().orchestrator().clone();
    let alice = Identity::new("alice", false);
    let text = "x".repeat(size);
    let mut pending = Vec::new();
    for i in 0..n {
        let p = SendMessageParams {
            conversation_id: conv.into(),
            payload: MessagePayload::text(format!("{i} {text}")),
            finality: Finality::None,
            turn_hint: None,
            client_request_id: None,
            after_key: None,
        };
        let orch = orch.clone();
        let alice = alice.clone();
        pending.push(tokio::spawn(async move {
            orch.send_message(&alice, p).await.expect("append")
        }));
        if pending.len() == 32 {
            for t in pending.drain(..) {
                t.await.unwrap();
            }
        }
    }
    for t in pending {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_answer_to_subscribe_comes_before_any_of_its_events() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    append(&ts, "c1", 20, 10).await;
    // While events keep coming, each new subscription's first frame is its answer.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let busy = {
        let orch = ts.running().orchestrator().clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let alice = Identity::new("alice", false);
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let p = SendMessageParams {
                    conversation_id: "c1".into(),
                    payload: MessagePayload::text(format!("busy {i}")),
                    finality: Finality::None,
                    turn_hint: None,
                    client_request_id: None,
                    after_key: None,
                };
                orch.send_message(&alice, p).await.expect("append");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    for round in 0..20u64 {
        let mut raw = ts.raw().await;
        raw.authenticate(ts.token("bob")).await;
        let since = if round % 2 == 0 {
            json!(0)
        } else {
            Value::Null
        };
        let mut params = json!({"conversationId": "c1"});
        if !since.is_null() {
            params["sinceSeq"] = since;
        }
        let r = raw.call(7, "subscribe", params).await;
        assert_eq!(r["id"], 7, "the first frame is the answer: {r}");
        let sub = r["result"].as_u64().expect("a numeric subscription id");
        let n = raw.recv().await;
        assert_eq!(n["method"], "event", "{n}");
        assert_eq!(n["params"]["subscription"], sub);
        assert_eq!(n["params"]["result"]["conversationId"], "c1");
        if round % 2 == 0 {
            assert_eq!(
                n["params"]["result"]["event"]["seq"], 1,
                "replayed from the start"
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    busy.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_answers_share_a_connection_without_tearing_a_frame() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(ts.url()).await.unwrap();
    let call = |id: u64, method: &str, params: Value| {
        Message::text(
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        )
    };
    ws.send(call(1, "authenticate", json!({"token": ts.token("alice")})))
        .await
        .unwrap();
    // Calls on a connection run concurrently: the others go once authenticated.
    loop {
        let msg = tokio::time::timeout(WAIT, ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(&t).unwrap();
            assert_eq!(v["result"]["ok"], true, "{v}");
            break;
        }
    }
    ws.send(call(
        2,
        "subscribe",
        json!({"conversationId": "c1", "sinceSeq": 0}),
    ))
    .await
    .unwrap();
    // Appends pipelined on the same connection: their answers (written by the JSON-RPC
    // server) and their events (written by the publisher) interleave frame by frame. Fewer
    // than the connection's cap on calls in flight (256 by default): past it a call is refused
    // with RateLimited, as it should, whenever the log commits slower than they are sent (as on
    // PostgreSQL, on a loaded machine).
    const APPENDS: u64 = 200;
    for i in 0..APPENDS {
        ws.send(call(
            100 + i,
            "sendMessage",
            json!({"conversationId": "c1", "payload": {"text": format!("m{i} {}", "y".repeat(3000))}, "finality": "none"}),
        ))
        .await
        .unwrap();
    }
    let mut answers = 0;
    let mut next_seq = 1u64;
    let mut subscribed = false;
    while answers < APPENDS || next_seq <= APPENDS + 1 {
        let msg = tokio::time::timeout(WAIT, ws.next())
            .await
            .expect("frames in time")
            .expect("open")
            .expect("a well-formed frame");
        let Message::Text(t) = msg else { continue };
        let v: Value = serde_json::from_str(&t).expect("every frame is whole JSON");
        if v["method"] == "event" {
            assert!(subscribed, "an event before the subscription's answer");
            assert_eq!(
                v["params"]["result"]["event"]["seq"], next_seq,
                "no gap, no duplicate"
            );
            next_seq += 1;
        } else if v["id"] == 2 {
            subscribed = true;
        } else if v["id"].as_u64().is_some_and(|id| id >= 100) {
            assert!(v["result"]["seq"].is_u64(), "{v}");
            answers += 1;
        }
    }
}

/// The server's count of subscribers resumed from the log
/// (`orchestrator_subscribers_resumed_total`), read from `/metrics`.
async fn resumed_count(ts: &TestServer) -> f64 {
    let url = format!("http://{}/metrics", ts.running().local_addr());
    let body = http_get(&url).await;
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with("orchestrator_subscribers_resumed_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// GET over a plain TCP connection (HTTP/1.1, `Connection: close`): the body.
async fn http_get(url: &str) -> String {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_once('/').unwrap();
    let out = tests::http_raw(host, &format!("GET /{path}"), "", "").await;
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_is_let_go_then_caught_up_from_the_log() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    let mut raw = ts.raw().await;
    raw.authenticate(ts.token("bob")).await;
    let r = raw
        .call(1, "subscribe", json!({"conversationId": "c1"}))
        .await;
    assert!(r["result"].is_u64(), "{r}");
    let before = resumed_count(&ts).await;
    // ~24 MB of events while the subscriber reads nothing: far past the kernel's buffers and
    // the connection's own, so the publisher lets it go. The appends never wait for it.
    let appended =
        tokio::time::timeout(Duration::from_secs(60), append(&ts, "c1", 3000, 8000)).await;
    assert!(
        appended.is_ok(),
        "appends were held back by a subscriber that reads nothing"
    );
    let after = resumed_count(&ts).await;
    assert!(
        after > before,
        "the subscriber was never let go ({before} → {after})"
    );
    // Now it reads: every event, in order, once.
    let mut expect = 2u64;
    while expect <= 3001 {
        let n = raw.recv().await;
        let seq = n["params"]["result"]["event"]["seq"]
            .as_u64()
            .expect("an event");
        assert_eq!(seq, expect, "no gap, no duplicate");
        expect += 1;
    }
    // And it is live again: a new event arrives.
    append(&ts, "c1", 1, 10).await;
    let n = raw.recv().await;
    assert_eq!(n["params"]["result"]["event"]["seq"], 3002);
}

#[tokio::test]
async fn unsubscribe_ends_the_events() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    let mut raw = ts.raw().await;
    raw.authenticate(ts.token("bob")).await;
    let r = raw
        .call(
            1,
            "subscribe",
            json!({"conversationId": "c1", "sinceSeq": 0}),
        )
        .await;
    let sub = r["result"].as_u64().unwrap();
    let n = raw.recv().await;
    assert_eq!(n["params"]["result"]["event"]["seq"], 1);
    let r = raw.call(2, "unsubscribe", json!([sub])).await;
    assert_eq!(r["result"], true, "{r}");
    append(&ts, "c1", 5, 10).await;
    // The next frame is the answer to this call, not an event.
    let r = raw
        .call(3, "getConversation", json!({"conversationId": "c1"}))
        .await;
    assert_eq!(r["id"], 3, "{r}");
    assert_eq!(r["result"]["latestSeq"], 6);
    let r = raw
        .call(4, "unsubscribe", json!({"subscription": sub}))
        .await;
    assert_eq!(r["result"], false, "already ended: {r}");
    let r = raw.call(5, "unsubscribe", json!({"what": 1})).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
}
