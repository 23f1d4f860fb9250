//! Several nodes on one PostgreSQL database (whatever the suites' backend): any node serves any
//! client and any conversation, and the log's invariants hold across them.

use std::collections::HashMap;

use jsonrpsee::core::client::ClientT;
use jsonrpsee::ws_client::WsClient;
use serde_json::{json, Value};
use tests::{subscribe, test_limits, TestServer, P, WAIT};

async fn send(c: &WsClient, conv: &str, text: &str, key: &str) -> Value {
    c.request(
        "sendMessage",
        P(json!({"conversationId": conv, "payload": {"text": text}, "finality": "none", "clientRequestId": key})),
    )
    .await
    .unwrap_or_else(|e| panic!("sendMessage {key}: {e}"))
}

/// Every event of `conv` as `c` reads it, in pages.
async fn log(c: &WsClient, conv: &str) -> Vec<Value> {
    let mut all = Vec::new();
    loop {
        let page: Value = c
            .request(
                "tail",
                P(json!({"conversationId": conv, "sinceSeq": all.len(), "limit": 500})),
            )
            .await
            .expect("tail");
        let events = page["events"].as_array().expect("events").clone();
        if events.is_empty() {
            return all;
        }
        all.extend(events);
    }
}

/// Writers on two nodes append to one conversation at once, each retrying every append on the
/// other node with the same key: every acknowledged event is in the log once, seq is dense, the
/// retry answers what the first call answered, and a subscriber on a third node sees every
/// event in seq order with no gap and no duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_on_every_node_keep_seq_dense_and_keys_unique() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    let c = a.another_node().await;
    a.create("shared", &["alice", "bob"]).await;
    // Created on A; readable on C at once (C loads what it has not met).
    let carol_view = c.client("alice").await;
    let mut sub = subscribe(
        &carol_view,
        json!({"conversationId": "shared", "sinceSeq": 0}),
    )
    .await;
    const EACH: usize = 60;
    let mut writers = Vec::new();
    for (who, first, second) in [("alice", &a, &b), ("bob", &b, &a)] {
        let (on, retry) = (first.client(who).await, second.client(who).await);
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..EACH {
                let key = format!("{who}-{i}");
                let r = send(&on, "shared", &format!("{who} {i}"), &key).await;
                let again = send(&retry, "shared", &format!("{who} {i}"), &key).await;
                assert_eq!(
                    r["seq"], again["seq"],
                    "a retry on the other node answers the original"
                );
                acked.push((key, r["seq"].as_u64().expect("seq")));
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.expect("writer"));
    }
    let total = 1 + 2 * EACH as u64;
    let events = log(&carol_view, "shared").await;
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=total).collect::<Vec<_>>(), "dense, in order");
    let mut keys = HashMap::new();
    for e in &events {
        if let Some(k) = e["clientRequestId"].as_str() {
            assert!(
                keys.insert(k.to_string(), e["seq"].as_u64().unwrap())
                    .is_none(),
                "{k} twice"
            );
        }
    }
    for (key, seq) in &acked {
        assert_eq!(
            keys.get(key),
            Some(seq),
            "acknowledged {key} is in the log at its seq"
        );
    }
    let mut expect = 1;
    while expect <= total {
        let n = tokio::time::timeout(WAIT, sub.next())
            .await
            .expect("an event on node C in time")
            .expect("open")
            .expect("an event");
        assert_eq!(n["event"]["seq"], expect, "no gap, no duplicate on node C");
        expect += 1;
    }
}

/// A subscription to all of an agent's conversations on one node follows conversations created
/// on another, and a turn hint is one compare-and-set across nodes: of two replies to the same
/// turn sent to different nodes, one lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_conversations_and_turn_hints_hold_across_nodes() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    let bob_on_b = b.client("bob").await;
    let mut all = subscribe(&bob_on_b, json!({"sinceSeq": 0})).await;
    a.create("made-on-a", &["alice", "bob"]).await;
    let first = tokio::time::timeout(WAIT, all.next())
        .await
        .expect("B hears of A's conversation in time")
        .expect("open")
        .expect("an event");
    assert_eq!(first["conversationId"], "made-on-a");
    assert_eq!(first["event"]["seq"], 1);
    // Both reply to turn 1, one through each node: exactly one lands.
    let alice_on_a = a.client("alice").await;
    let alice_on_b = b.client("alice").await;
    let reply = |text: &str| json!({"conversationId": "made-on-a", "payload": {"text": text}, "finality": "turn", "turnHint": {"turn": 1}});
    let (x, y) = tokio::join!(
        alice_on_a.request::<Value, _>("sendMessage", P(reply("from A"))),
        alice_on_b.request::<Value, _>("sendMessage", P(reply("from B"))),
    );
    assert_eq!(
        x.is_ok() as u8 + y.is_ok() as u8,
        1,
        "one reply per turn: {x:?} {y:?}"
    );
    let events = log(&bob_on_b, "made-on-a").await;
    let replies = events
        .iter()
        .filter(|e| e["kind"] == "message" && e["turn"] == 1)
        .count();
    assert_eq!(replies, 1, "{events:?}");
}
