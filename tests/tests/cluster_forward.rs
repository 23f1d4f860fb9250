//! On several nodes, a client's append with a key is made by the one node that writes its
//! conversation, whichever node the client is connected to; the log's invariants hold, a client
//! reads its own writes on its node, a node that goes away is written around, and only nodes
//! can forward.

use std::collections::HashMap;
use std::sync::Arc;

use jsonrpsee::core::client::ClientT;
use orchestrator::engine::peers::Peers;
use serde_json::{json, Value};
use tests::{test_limits, ws_log as log, TestServer, P, WAIT};

fn peers(node: &TestServer) -> &Arc<Peers> {
    node.running()
        .orchestrator()
        .peers()
        .expect("a node on PostgreSQL has peers")
}

/// Waits until every node sees all `n` nodes alive (each says so every second).
async fn until_all_see(nodes: &[&TestServer], n: usize) {
    tokio::time::timeout(WAIT, async {
        while nodes.iter().any(|node| peers(node).nodes() != n) {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("every node sees {n} nodes"));
}

async fn send(c: &jsonrpsee::ws_client::WsClient, conv: &str, text: &str, key: &str) -> Value {
    c.request(
        "sendMessage",
        P(json!({"conversationId": conv, "payload": {"text": text}, "finality": "none", "clientRequestId": key})),
    )
    .await
    .unwrap_or_else(|e| panic!("sendMessage {key}: {e}"))
}

/// Writers on all three nodes append to the same twelve conversations with keys. Once the
/// nodes see each other, about two thirds of each node's appends are made by another node;
/// every acknowledged append is in the log once at its seq, seq is dense, a retry on another
/// node answers the original, and each writer reads its own append on its node right after the
/// answer. Keyless appends are made where they arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_go_to_the_node_that_writes_their_conversation() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    let c = a.another_node().await;
    until_all_see(&[&a, &b, &c], 3).await;
    const CONVS: usize = 12;
    for i in 0..CONVS {
        a.create(&format!("f{i}"), &["alice", "bob", "carol"]).await;
    }
    let nodes = [&a, &b, &c];
    let mut writers = Vec::new();
    for (n, who) in ["alice", "bob", "carol"].into_iter().enumerate() {
        let on = nodes[n].client(who).await;
        let retry = nodes[(n + 1) % 3].client(who).await;
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for round in 0..6 {
                for i in 0..CONVS {
                    let conv = format!("f{i}");
                    let key = format!("{who}-{round}-{i}");
                    let r = send(&on, &conv, &key, &key).await;
                    let seq = r["seq"].as_u64().expect("seq");
                    // Read on the node written through: the append is there at once.
                    let snap: Value = on
                        .request("getConversation", P(json!({"conversationId": conv})))
                        .await
                        .expect("getConversation");
                    assert!(
                        snap["latestSeq"].as_u64().expect("latestSeq") >= seq,
                        "{who} reads its own write {seq} on its node: {snap}"
                    );
                    if round == 0 {
                        let again = send(&retry, &conv, &key, &key).await;
                        assert_eq!(
                            again["seq"], r["seq"],
                            "a retry elsewhere answers the original"
                        );
                        assert_eq!(again["duplicate"], true);
                    }
                    acked.push((conv, key, seq));
                }
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.expect("writer"));
    }
    let reader = c.client("alice").await;
    let mut logs = HashMap::new();
    for i in 0..CONVS {
        let conv = format!("f{i}");
        let events = log(&reader, &conv).await;
        let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert_eq!(
            seqs,
            (1..=seqs.len() as u64).collect::<Vec<_>>(),
            "{conv}: dense"
        );
        logs.insert(conv, events);
    }
    for (conv, key, seq) in &acked {
        let with_key: Vec<&Value> = logs[conv]
            .iter()
            .filter(|e| e["clientRequestId"] == *key)
            .collect();
        assert_eq!(with_key.len(), 1, "{key} once in {conv}");
        assert_eq!(with_key[0]["seq"], *seq, "{key} at its acknowledged seq");
    }
    // Each node wrote about a third of the conversations: about two thirds of its appends went
    // to another node (every one after its link was up), and none was made here after all.
    for node in nodes {
        let (sent, made_here) = peers(node).forwarded();
        assert!(
            sent >= 12,
            "{} sent {sent} of its 6 x 12 + 12 appends on",
            peers(node).name()
        );
        assert_eq!(made_here, 0, "every forwarded append was answered");
    }
    // Without a key an append is made where it arrives.
    let before = peers(&a).forwarded().0;
    let alice = a.client("alice").await;
    for i in 0..CONVS {
        let _: Value = alice
            .request(
                "sendMessage",
                P(json!({"conversationId": format!("f{i}"), "payload": {"text": "no key"}, "finality": "none"})),
            )
            .await
            .expect("sendMessage without a key");
    }
    assert_eq!(peers(&a).forwarded().0, before, "keyless appends stay");
}

/// A node that stops is written around: its share of the conversations goes to the others
/// (at once after a graceful stop), and appends sent to the others go on without an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_is_written_around() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let mut b = a.another_node().await;
    until_all_see(&[&a, &b], 2).await;
    for i in 0..8 {
        a.create(&format!("s{i}"), &["alice", "bob"]).await;
    }
    let alice = a.client("alice").await;
    for i in 0..8 {
        send(&alice, &format!("s{i}"), "before", &format!("before-{i}")).await;
    }
    b.stop().await;
    // A leaving node takes itself out of the list: the next beat of A no longer sees it.
    until_all_see(&[&a], 1).await;
    for i in 0..8 {
        let r = send(&alice, &format!("s{i}"), "after", &format!("after-{i}")).await;
        assert_eq!(r["duplicate"], false);
    }
    for i in 0..8 {
        let events = log(&alice, &format!("s{i}")).await;
        let texts: Vec<&str> = events
            .iter()
            .filter_map(|e| e["payload"]["text"].as_str())
            .collect();
        assert_eq!(texts, ["before", "after"], "s{i}: {events:?}");
    }
}

/// Only a node forwards: a client calling the nodes' method is told it does not exist, a
/// credential with a wrong secret authenticates nothing, and a node's connection calls no
/// client method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_nodes_forward() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    a.create("guarded", &["alice", "bob"]).await;
    let forward = json!({"agentId": "bob", "admin": true, "method": "sendMessage",
        "params": {"conversationId": "guarded", "payload": {"text": "as bob"}, "finality": "none", "clientRequestId": "x"}});
    let alice = a.client("alice").await;
    let e = alice
        .request::<Value, _>("orchestrator.forward", P(forward.clone()))
        .await
        .expect_err("a client cannot forward");
    assert!(
        e.to_string().contains("-32601") || e.to_string().contains("no method"),
        "{e}"
    );

    let mut raw = a.raw().await;
    raw.send_text(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "authenticate",
            "params": {"token": "node.not-the-secret.evil"}})
        .to_string(),
    )
    .await;
    let answer = raw.recv().await;
    assert_eq!(answer["error"]["code"], -32001, "a wrong secret: {answer}");
    raw.send_text(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "orchestrator.forward", "params": forward})
            .to_string(),
    )
    .await;
    let answer = raw.recv().await;
    assert_eq!(answer["error"]["code"], -32601, "{answer}");
    let events = log(&alice, "guarded").await;
    assert!(
        events.iter().all(|e| e["author"] != "bob"),
        "nothing was written as bob: {events:?}"
    );
}
