//! A node whose view of a conversation is behind the log (another node committed, and the
//! notification has not reached it yet) never writes or refuses from that view: the database
//! refuses a batch that inserts a seq another node wrote, and the node catches up and runs the
//! batch again; an answer that writes nothing is decided again on a locked view. Here the other
//! node's commit is a row written straight into the database, without a notification, so the
//! node's view is behind for certain when the request comes.

use std::collections::HashMap;

use jsonrpsee::core::client::ClientT;
use serde_json::{json, Value};
use tests::{test_limits, TestServer, P};

/// Appends a copy of the conversation's last event, with `finality`, as the next seq, as
/// another node's commit would (no notification): the log is now one event past every view.
async fn written_elsewhere(db: &str, conversation: &str, finality: &str) -> i64 {
    let db = tests::pg::connect(db).await.expect("a connection");
    db.query_one(
        "INSERT INTO events (conv, seq, kind, author, turn, finality, payload, ts_ms)
         SELECT e.conv, e.seq + 1, 'message', 'bob', e.turn, $2, '{\"text\":\"from elsewhere\"}', e.ts_ms
         FROM events e JOIN conversations c ON c.num = e.conv
         WHERE c.id = $1 ORDER BY e.seq DESC LIMIT 1
         RETURNING seq",
        &[&conversation, &finality],
    )
    .await
    .expect("a row written behind the node's back")
    .get(0)
}

/// The orchestrator's counter of batches run again after a conflict, as `/metrics` shows it.
fn conflicts() -> f64 {
    orchestrator::engine::telemetry::render()
        .lines()
        .find(|l| l.starts_with(orchestrator::engine::telemetry::CLUSTER_CONFLICTS))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_behind_the_log_is_caught_up_and_run_again() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    a.create("behind", &["alice", "bob"]).await;
    let alice = a.client("alice").await;
    let send = |key: &'static str| {
        let alice = &alice;
        async move {
            alice
                .request::<Value, _>(
                    "sendMessage",
                    P(json!({"conversationId": "behind", "payload": {"text": key},
                             "finality": "none", "clientRequestId": key})),
                )
                .await
                .unwrap_or_else(|e| panic!("sendMessage {key}: {e}"))
        }
    };
    assert_eq!(send("first").await["seq"], 2);
    let before = conflicts();
    assert_eq!(written_elsewhere(&a.db, "behind", "none").await, 3);
    // The node decides seq 3 on its view; the database refuses it; the node catches up on seq
    // 3 and writes seq 4.
    let r = send("second").await;
    assert_eq!(r["seq"], 4, "{r}");
    assert!(conflicts() > before, "the batch ran again after a conflict");
    // The retry of the same key answers the same seq.
    assert_eq!(send("second").await["seq"], 4);
    let log: Value = alice
        .request(
            "tail",
            P(json!({"conversationId": "behind", "sinceSeq": 0, "limit": 100})),
        )
        .await
        .expect("tail");
    let events = log["events"].as_array().expect("events");
    let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
    assert_eq!(events[2]["payload"]["text"], "from elsewhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_is_decided_on_the_log_not_on_a_view_behind_it() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    a.create("refusal", &["alice", "bob"]).await;
    let alice = a.client("alice").await;
    let in_turn = |turn: u64, text: &'static str| {
        alice.request::<Value, _>(
            "sendMessage",
            P(
                json!({"conversationId": "refusal", "payload": {"text": text},
                     "finality": "none", "turnHint": {"turn": turn}}),
            ),
        )
    };
    in_turn(1, "in turn 1").await.expect("turn 1 is open");
    // Elsewhere, bob ends turn 1: the log is in turn 2; this node's view is still in turn 1.
    written_elsewhere(&a.db, "refusal", "turn").await;
    // On the node's view alone this would be refused (its view is in turn 1); decided on the
    // log, it lands after bob's message.
    let r = in_turn(2, "in turn 2")
        .await
        .expect("accepted: the log is in turn 2");
    assert_eq!(r["seq"], 4, "{r}");
    assert_eq!(r["turn"], 2, "{r}");
    // And a write for turn 1, which the node's view now knows is over, is refused.
    let late = in_turn(1, "late").await;
    assert!(late.is_err(), "{late:?}");
}
