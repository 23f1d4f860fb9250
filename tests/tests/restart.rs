//! Durability across a restart: everything acknowledged is there, seq continues without a gap,
//! a retried clientRequestId is still recognised, and state is rebuilt from the log.

use jsonrpsee::core::client::ClientT;
use proto_spec::codes;
use serde_json::{json, Value};
use tests::{error_code, TestServer, P};

/// A retry of `k7` (acknowledged as `acked`) answers the original result; the same key with
/// another body is refused.
async fn retries_are_recognised(alice: &jsonrpsee::ws_client::WsClient, acked: &Value) {
    let retry: Value = alice
        .request("sendMessage", P(json!({"conversationId": "c1", "payload": {"text": "m7"}, "finality": "none", "clientRequestId": "k7"})))
        .await
        .unwrap();
    assert_eq!(
        retry,
        json!({"seq": acked["seq"], "turn": acked["turn"], "duplicate": true})
    );
    let reused = alice
        .request::<Value, _>(
            "sendMessage",
            P(json!({"conversationId": "c1", "payload": {"text": "other"}, "finality": "none", "clientRequestId": "k7"})),
        )
        .await;
    assert_eq!(error_code(reused), codes::IDEMPOTENCY_KEY_REUSED);
}

#[tokio::test]
async fn everything_acknowledged_survives_a_restart() {
    let mut ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    ts.create("closed", &["alice"]).await;
    let alice = ts.client("alice").await;
    let mut acked = Vec::new();
    for i in 0..20 {
        let finality = if i % 5 == 4 { "turn" } else { "none" };
        let r: Value = alice
            .request(
                "sendMessage",
                P(json!({"conversationId": "c1", "payload": {"text": format!("m{i}")}, "finality": finality, "clientRequestId": format!("k{i}")})),
            )
            .await
            .unwrap();
        acked.push(r);
    }
    let _: Value = alice
        .request("sendMessage", P(json!({"conversationId": "closed", "payload": {"text": "end"}, "finality": "conversation"})))
        .await
        .unwrap();
    drop(alice);

    ts.restart().await;

    let alice = ts.client("alice").await;
    let tail: Value = alice
        .request("tail", P(json!({"conversationId": "c1", "sinceSeq": 0})))
        .await
        .unwrap();
    let events = tail["events"].as_array().unwrap();
    assert_eq!(events.len(), 21);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["seq"], i as u64 + 1);
    }
    for (i, r) in acked.iter().enumerate() {
        let e = &events[r["seq"].as_u64().unwrap() as usize - 1];
        assert_eq!(e["payload"]["text"], format!("m{i}"));
        assert_eq!(e["clientRequestId"], format!("k{i}"));
        assert_eq!(e["turn"], r["turn"]);
    }
    // Turn rebuilt from the log: four turns closed.
    let snap: Value = alice
        .request("getConversation", P(json!({"conversationId": "c1"})))
        .await
        .unwrap();
    assert_eq!(snap["turn"], 5);
    assert_eq!(snap["participants"], json!(["alice", "bob"]));
    // A retry of an acknowledged append is recognised after the restart.
    retries_are_recognised(&alice, &acked[7]).await;
    // Seq continues without a gap.
    let next: Value = alice
        .request(
            "sendMessage",
            P(json!({"conversationId": "c1", "payload": {"text": "after"}, "finality": "turn"})),
        )
        .await
        .unwrap();
    assert_eq!(next["seq"], 22);
    // A closed conversation stays closed; a new conversation gets a fresh number.
    let late = alice
        .request::<Value, _>(
            "sendMessage",
            P(json!({"conversationId": "closed", "payload": {"text": "x"}, "finality": "turn"})),
        )
        .await;
    assert_eq!(error_code(late), codes::CONVERSATION_CLOSED);
    ts.create("c2", &["alice"]).await;
    let r: Value = alice
        .request(
            "sendMessage",
            P(json!({"conversationId": "c2", "payload": {"text": "hi"}, "finality": "turn"})),
        )
        .await
        .unwrap();
    assert_eq!(r["seq"], 2);
    // And once more, with the new conversation in the log.
    drop(alice);
    ts.restart().await;
    let alice = ts.client("alice").await;
    let tail: Value = alice
        .request("tail", P(json!({"conversationId": "c2", "sinceSeq": 0})))
        .await
        .unwrap();
    assert_eq!(tail["latestSeq"], 2);
    let tail: Value = alice
        .request("tail", P(json!({"conversationId": "c1", "sinceSeq": 21})))
        .await
        .unwrap();
    assert_eq!(tail["events"][0]["payload"]["text"], "after");
}

/// SQLite: one server per database file (a second refuses to start until the first stops).
/// PostgreSQL: several nodes share a database, so a second one starts and serves what the
/// first wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_database_refuses_on_sqlite_and_joins_on_postgres() {
    use orchestrator::engine::config::Limits;
    use orchestrator::engine::service::Orchestrator;
    let mut ts = TestServer::start().await;
    let alice = ts.client("admin").await;
    let _: Value = alice
        .request(
            "createConversation",
            P(json!({"conversationId": "shared", "participants": ["alice"]})),
        )
        .await
        .unwrap();
    let second = Orchestrator::open(tests::open_store(&ts.db), Limits::default());
    if tests::on_postgres() {
        let second = second.expect("a second node on the same PostgreSQL database");
        // It serves at once and takes the open conversations in right after.
        second.writer().swept().await;
        let view = second
            .hub()
            .get("shared")
            .expect("the first node's conversation");
        assert_eq!(view.head(), 1);
        second.shutdown().await;
        return;
    }
    let err = second.expect_err("a second writer on the same database");
    assert!(
        matches!(err, orchestrator::engine::error::Error::Locked(_)),
        "{err}"
    );
    assert!(
        err.to_string().contains("in use by another orchestrator"),
        "{err}"
    );
    // Once the first stops, the database can be opened again.
    ts.stop().await;
    let third = Orchestrator::open(tests::open_store(&ts.db), Limits::default()).unwrap();
    third.shutdown().await;
}
