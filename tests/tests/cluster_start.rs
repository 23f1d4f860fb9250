//! A node on PostgreSQL starts serving before it holds the open conversations, and takes them
//! in after its start (the sweep): named and listed at once, their pending turns run, and it
//! knows the log's head however the other nodes write meanwhile.

use std::collections::HashMap;
use std::sync::Arc;

use jsonrpsee::core::client::ClientT;
use serde_json::{json, Value};
use tests::cluster::{counting_agents, create_with_policy, Counting};
use tests::{test_limits, ws_send as send, TestServer, P};

/// Conversations `c-0` … `c-{n-1}` between alice and bob, made through `node`.
async fn create_many(node: &TestServer, n: usize) {
    let admin = node.client("admin").await;
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        futures::future::join_all(chunk.iter().map(|i| {
            let admin = &admin;
            async move {
                let _: Value = admin
                    .request(
                        "createConversation",
                        P(json!({"conversationId": format!("c-{i}"), "participants": ["alice", "bob"]})),
                    )
                    .await
                    .expect("create");
            }
        }))
        .await;
    }
}

/// While a node takes the open conversations in after its start, another node keeps writing
/// them: whatever was written before, during or after the sweep, the new node ends with every
/// conversation at the log's head, well before the 30-second look at everything written lately
/// (a notice about one the sweep has not reached is left to it, and the sweep reads that
/// conversation after the commit the notice is about).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_starting_while_another_writes_ends_at_the_logs_heads() {
    const OPEN: usize = 600;
    const WRITES: usize = 1200;
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    create_many(&a, OPEN).await;
    let alice = a.client("alice").await;
    let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let written = written.clone();
        tokio::spawn(async move {
            for i in 0..WRITES {
                let id = format!("c-{}", (i * 7919) % OPEN);
                send(&alice, &id, "meanwhile", &format!("k-{i}")).await;
                written.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        })
    };
    tests::eventually("the first writes", || {
        written.load(std::sync::atomic::Ordering::SeqCst) >= 100
    })
    .await;
    let b = a.another_node().await;
    writer.await.expect("the writer");
    let (on_a, on_b) = (
        a.running().orchestrator().clone(),
        b.running().orchestrator().clone(),
    );
    on_b.writer().swept().await;
    let head = |o: &orchestrator::engine::service::Orchestrator, id: &str| {
        o.hub().get(id).map(|c| c.head())
    };
    // Node b holds each conversation at the log's head, or knows how far behind it its view
    // is (it reads back what other nodes commit only when something there needs it): nothing
    // written was missed.
    let known = |id: &str| on_b.hub().get(id).map(|c| c.head().max(c.remote_head()));
    tests::eventually("node b knows the log's head of every conversation", || {
        (0..OPEN).all(|i| {
            let id = format!("c-{i}");
            known(&id).is_some() && known(&id) == head(&on_a, &id)
        })
    })
    .await;
    // A client reading through node b sees the log's head.
    let bob = b.client("bob").await;
    for i in 0..OPEN {
        let id = format!("c-{i}");
        let snap: Value = bob
            .request("getConversation", P(json!({"conversationId": id})))
            .await
            .expect("getConversation");
        assert_eq!(
            snap["latestSeq"].as_u64(),
            head(&on_a, &id),
            "{id} read through node b"
        );
    }
}

/// A node serves before it holds the open conversations, and takes them in a slice at a time
/// after its start, turns included: here more than two slices' worth, the last of which has a
/// pending turn of an internal agent that only the new node runs. A client that names a
/// conversation right after the start is answered (it is loaded then); `listConversations`
/// right after the start lists every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_serves_at_once_and_takes_the_open_conversations_in_after() {
    const OPEN: usize = 600;
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    create_many(&a, OPEN).await;
    // Last (the highest number): alice speaks, then bot1, whom no node runs yet.
    create_with_policy(&a, "duo", &["alice", "bot1"]).await;
    let alice = a.client("alice").await;
    let _: Value = alice
        .request(
            "sendMessage",
            P(
                json!({"conversationId": "duo", "payload": {"text": "your turn"},
                     "finality": "turn", "turnHint": {"turn": 1}}),
            ),
        )
        .await
        .expect("alice's turn");
    let agent = Arc::new(Counting::default());
    let b = a.another_node_with(counting_agents(&agent)).await;
    let on_b = b.client("admin").await;
    let snapshot: Value = on_b
        .request("getConversation", P(json!({"conversationId": "c-0"})))
        .await
        .expect("named right after the start");
    assert_eq!(snapshot["conversationId"], "c-0");
    let listed: Value = on_b
        .request("listConversations", P(json!({"limit": 1000})))
        .await
        .expect("list");
    assert_eq!(
        listed["conversations"]
            .as_array()
            .expect("conversations")
            .len(),
        OPEN + 1,
        "every open conversation listed right after the start"
    );
    let orch = b.running().orchestrator().clone();
    orch.writer().swept().await;
    assert_eq!(orch.hub().len(), OPEN + 1, "every open conversation held");
    // bot1's turn, pending since before node b started, runs there once.
    tests::eventually("bot1 answers turn 2 of duo", || {
        agent
            .runs
            .lock()
            .map(|r| r.get(&("duo".to_string(), 2)) == Some(&1))
            .unwrap_or(false)
    })
    .await;
    tests::ws_log_until(&on_b, "duo", "bot1's reply landed", |log| {
        log.iter()
            .any(|e| e["kind"] == "message" && e["author"] == "bot1" && e["turn"] == 2)
    })
    .await;
}
