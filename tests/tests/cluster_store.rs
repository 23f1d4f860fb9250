//! What a node keeps in, reads from and writes to the shared database, and how it stays right
//! when its view is behind: closed conversations loaded when named and let go when idle, the
//! poll that covers lost notifications, trimming, a failed lock, the bound on a batch's jobs
//! (its locks), and a node whose view of a conversation is behind the log (another node
//! committed, and the notification has not reached it yet), which never writes or refuses from
//! that view: the database refuses a batch that inserts a seq another node wrote, and the node
//! catches up and runs the batch again; an answer that writes nothing is decided again on a
//! view read from the log. There the other node's commit is a row written straight into the
//! database, without a notification, so the node's view is behind for certain when the request
//! comes.

use std::collections::HashMap;

use jsonrpsee::core::client::ClientT;
use serde_json::{json, Value};
use tests::{subscribe, test_limits, ws_log as log, ws_send as send, TestServer, P};

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

/// An orchestrator counter as `/metrics` shows it (0 before its first increment).
fn counter(name: &str) -> f64 {
    orchestrator::engine::telemetry::render()
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Batches run again after a conflict.
fn conflicts() -> f64 {
    counter(orchestrator::engine::telemetry::CLUSTER_CONFLICTS)
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

/// On PostgreSQL a node takes the open conversations in right after its start; a closed one
/// stays in the database until a client names it (reads it, lists it, follows every
/// conversation from a cursor), and leaves memory again once nobody holds it and no client
/// named it for a while.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_conversations_are_loaded_when_named_and_let_go_when_idle() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    for id in ["open-1", "done-1", "done-2"] {
        a.create(id, &["alice", "bob"]).await;
    }
    let alice = a.client("alice").await;
    send(&alice, "open-1", "still talking", "k-open").await;
    for id in ["done-1", "done-2"] {
        let _: Value = alice
            .request(
                "sendMessage",
                P(json!({"conversationId": id, "payload": {"text": "bye"}, "finality": "conversation"})),
            )
            .await
            .expect("close");
    }
    let b = a.another_node().await;
    let held = |n: &TestServer| n.running().orchestrator().hub().len();
    b.running().orchestrator().writer().swept().await;
    assert_eq!(held(&b), 1, "only the open conversation is taken in");
    // Named: loaded, with its whole log.
    let bob = b.client("bob").await;
    let on_a = log(&alice, "done-1").await;
    assert_eq!(log(&bob, "done-1").await, on_a);
    assert_eq!(held(&b), 2);
    // Listed: every conversation of the caller, closed ones included.
    let listed: Value = bob
        .request("listConversations", P(json!({})))
        .await
        .expect("list");
    let mut ids: Vec<(&str, &str)> = listed["conversations"]
        .as_array()
        .expect("conversations")
        .iter()
        .map(|c| {
            let id = c["conversationId"].as_str().expect("id");
            (id, c["status"].as_str().expect("status"))
        })
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            ("done-1", "closed"),
            ("done-2", "closed"),
            ("open-1", "active")
        ]
    );
    // Let go when idle (here: at once), then loaded again when named, the same.
    let orch = b.running().orchestrator().clone();
    let forgotten = orch
        .forget_idle(std::time::Duration::ZERO)
        .await
        .expect("forget");
    assert_eq!(forgotten, 2, "both closed conversations let go");
    assert_eq!(held(&b), 1);
    assert_eq!(log(&bob, "done-1").await, on_a);
    // A closed conversation takes nothing, loaded or not.
    let err = bob
        .request::<Value, _>(
            "sendMessage",
            P(json!({"conversationId": "done-2", "payload": {"text": "again"}, "finality": "none"})),
        )
        .await
        .expect_err("closed");
    assert!(err.to_string().contains("closed"), "{err}");
    // Every conversation from a cursor: the closed ones' events too.
    let c = b.another_node().await;
    let carol = c.client("alice").await;
    let mut sub = subscribe(&carol, json!({"sinceSeq": 0})).await;
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 3 {
        let n = tests::next_event(&mut sub, "every conversation's events").await;
        seen.insert(
            n["event"]["conversationId"]
                .as_str()
                .expect("id")
                .to_string(),
        );
    }
    // A view someone holds (a subscription to done-2) is not let go; done-1 is.
    let _one = subscribe(&carol, json!({"conversationId": "done-2", "sinceSeq": 0})).await;
    let on_c = c.running().orchestrator().clone();
    assert_eq!(
        on_c.forget_idle(std::time::Duration::ZERO)
            .await
            .expect("forget"),
        1
    );
    assert!(on_c.hub().get("done-2").is_some() && on_c.hub().get("done-1").is_none());
}

/// The poll that covers lost notifications (`LogWriter::changed_lately`) finds every
/// conversation written lately with its latest head, from the record of commits (which, unlike
/// a notification, has no size limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poll_finds_what_other_nodes_wrote_lately() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let alice = a.client("alice").await;
    for id in ["p-1", "p-2"] {
        a.create(id, &["alice"]).await;
    }
    for i in 0..3 {
        send(&alice, "p-1", "hello", &format!("p1-{i}")).await;
    }
    send(&alice, "p-2", "hello", "p2-0").await;
    // Many conversations at once (in few batches).
    let orch = a.running().orchestrator().clone();
    let admin = orchestrator::engine::auth::Identity::new("admin", true);
    let created = futures::future::join_all((0..900).map(|i| {
        let (orch, admin) = (orch.clone(), admin.clone());
        async move {
            orch.create_conversation(
                &admin,
                agent_sdk::proto::CreateConversationParams {
                    conversation_id: Some(format!("many-{i:04}-{}", "x".repeat(8))),
                    participants: Some(vec!["alice".into()]),
                    ..Default::default()
                },
            )
            .await
        }
    }))
    .await;
    assert!(created.iter().all(Result::is_ok));
    let store = tests::open_store(&a.db);
    let mut w = store.writer().expect("a writer");
    let lately: HashMap<i64, u64> = w.changed_lately().expect("the poll").into_iter().collect();
    let heads: Vec<u64> = {
        let db = tests::pg::connect(&a.db).await.expect("a connection");
        let mut heads = Vec::new();
        for id in ["p-1", "p-2", "many-0899-xxxxxxxx"] {
            let row = db
                .query_one(
                    "SELECT c.num, max(e.seq) FROM conversations c JOIN events e ON e.conv = c.num \
                     WHERE c.id = $1 GROUP BY c.num",
                    &[&id],
                )
                .await
                .expect("the row");
            let (num, head): (i64, i64) = (row.get(0), row.get(1));
            assert_eq!(lately.get(&num), Some(&(head as u64)), "{id}");
            heads.push(head as u64);
        }
        heads
    };
    assert_eq!(heads[..2], [4, 2]);
    assert!(lately.len() >= 902, "{}", lately.len());
}

/// Nodes trim what they no longer need: the record of commits past 5 minutes, and turn claims
/// whose lease ended more than 5 minutes ago (a write under such a claim is refused whether its
/// row is there or not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_commits_and_claims_are_trimmed() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let db = tests::pg::connect(&a.db).await.expect("a connection");
    let old = chrono::Utc::now().timestamp_millis() - 600_000;
    db.execute(
        "INSERT INTO commits (at_ms, heads) VALUES ($1, '1:1')",
        &[&old],
    )
    .await
    .expect("an old commit");
    db.execute(
        "INSERT INTO turn_claims (conversation_id, turn, holder, fence, lease_until_ms) \
         VALUES ('gone', 1, 'node-x', 1, $1), ('recent', 1, 'node-x', 2, $2)",
        &[&old, &(old + 590_000)],
    )
    .await
    .expect("claims");
    // A node trims on its first poll (a second after it starts), then every 30.
    let _b = a.another_node().await;
    let until = tokio::time::Instant::now() + tests::WAIT;
    loop {
        let row = db
            .query_one(
                "SELECT (SELECT count(*) FROM commits WHERE at_ms = $1), \
                        (SELECT count(*) FROM turn_claims WHERE conversation_id = 'gone'), \
                        (SELECT count(*) FROM turn_claims WHERE conversation_id = 'recent')",
                &[&old],
            )
            .await
            .expect("count");
        let (commits, gone, recent): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        if commits == 0 && gone == 0 {
            assert_eq!(recent, 1, "a claim whose lease ended lately is kept");
            break;
        }
        assert!(tokio::time::Instant::now() < until, "not trimmed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A batch whose lock fails in the database (here: a lock timeout while a test connection holds
/// the conversation's lock) is refused, and the node's next batch works: the failed
/// transaction, begun in the same round trip as the lock, is ended, not left aborted under
/// every later statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_lock_leaves_the_writer_working() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    a.create("stuck", &["alice"]).await;
    let db = tests::pg::connect(&a.db).await.expect("a connection");
    let name = url::Url::parse(&a.db).expect("the URL").path()[1..].to_string();
    // Sessions opened from now on give up waiting for a lock after 300 ms.
    db.batch_execute(&format!("ALTER DATABASE {name} SET lock_timeout = '300ms'"))
        .await
        .expect("lock_timeout");
    let b = a.another_node().await;
    let alice = b.client("alice").await;
    send(&alice, "stuck", "before", "k1").await;
    // Written through the other node too: node b catches up on it (and reads its head under
    // the lock from then on).
    send(&a.client("alice").await, "stuck", "from a", "k0").await;
    tests::eventually("node b knows of node a's write", || {
        b.running()
            .orchestrator()
            .hub()
            .get("stuck")
            // Knows of it: it reads back what others write only when something there
            // needs it, and a write of its own to a view behind reads it under the lock.
            .is_some_and(|c| c.core().head.max(c.remote_head()) == 3)
    })
    .await;
    db.batch_execute(&hold_conversation("stuck"))
        .await
        .expect("hold the lock");
    let refused = alice
        .request::<Value, _>(
            "sendMessage",
            P(json!({"conversationId": "stuck", "payload": {"text": "while held"}, "finality": "none", "clientRequestId": "k2"})),
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");
    db.batch_execute("ROLLBACK").await.expect("let go");
    let r = send(&alice, "stuck", "after", "k2").await;
    assert_eq!(r["seq"], 4, "{r}");
    let r = send(&alice, "stuck", "again", "k3").await;
    assert_eq!(r["seq"], 5, "{r}");
}

/// Begins a transaction that holds conversation `id`'s lock as a node's batch takes it.
fn hold_conversation(id: &str) -> String {
    let key = orchestrator::engine::store::postgres::CONV_LOCK_KEY;
    format!("BEGIN; SELECT pg_advisory_xact_lock({key}) FROM (SELECT num AS n FROM conversations WHERE id = '{id}') c")
}

/// A conversation another node wrote lately, whose lock another transaction holds when a batch
/// begins, is not waited for by that batch: its write is put off to the next batch, which waits
/// for the lock, and lands in order once it is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_a_held_conversation_is_put_off_not_waited_for() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    a.create("held", &["alice"]).await;
    let db = tests::pg::connect(&a.db).await.expect("a connection");
    let b = a.another_node().await;
    let alice = b.client("alice").await;
    send(&alice, "held", "before", "k1").await;
    // Written through node a too: node b catches up on it, and counts it contended.
    send(&a.client("alice").await, "held", "from a", "k0").await;
    let orchestrator = b.running().orchestrator();
    tests::eventually("node b knows of node a's write", || {
        orchestrator
            .hub()
            .get("held")
            // Knows of it: it reads back what others write only when something there
            // needs it, and a write of its own to a view behind reads it under the lock.
            .is_some_and(|c| c.core().head.max(c.remote_head()) == 3)
    })
    .await;
    let put_off = || {
        orchestrator
            .writer()
            .stats
            .put_off
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = put_off();
    db.batch_execute(&hold_conversation("held"))
        .await
        .expect("hold the lock");
    let waiting = tokio::spawn({
        let alice = b.client("alice").await;
        async move { send(&alice, "held", "while held", "k2").await }
    });
    tests::eventually("the write is put off", || put_off() > before).await;
    // Put off once, then waited for: nothing lands while the lock is held.
    assert!(!waiting.is_finished());
    db.batch_execute("COMMIT").await.expect("let go");
    let r = waiting.await.expect("the write");
    assert_eq!(r["seq"], 4, "{r}");
    let seqs: Vec<u64> = log(&alice, "held")
        .await
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .collect();
    assert_eq!(seqs, [1, 2, 3, 4]);
}

/// A node reads back what other nodes commit to a conversation only when something there needs
/// it: a view nobody on node b reads or follows stays behind the log (b knows how far), and is
/// brought up to the log's head before a client reads it there, before a list, and before a
/// creation is held to the caps on open conversations (which a conversation closed on another
/// node no longer counts against).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_reads_back_what_others_commit_when_something_there_needs_it() {
    let limits = orchestrator::engine::config::Limits {
        max_open_per_agent: 3,
        ..test_limits()
    };
    let a = TestServer::on_postgres(limits, HashMap::new()).await;
    let b = a.another_node().await;
    let on_b = b.running().orchestrator().clone();
    let ids = ["quiet", "listed", "closing"];
    for id in ids {
        a.create(id, &["alice", "bob"]).await;
    }
    tests::eventually("node b meets the new conversations", || {
        ids.iter().all(|id| on_b.hub().get(id).is_some())
    })
    .await;
    let alice_a = a.client("alice").await;
    for i in 0..5 {
        for id in ids {
            send(&alice_a, id, "from a", &format!("{id}-{i}")).await;
        }
    }
    tests::eventually("node b hears of every write", || {
        ids.iter()
            .all(|id| on_b.hub().get(id).is_some_and(|c| c.remote_head() == 6))
    })
    .await;
    for id in ids {
        let c = on_b.hub().get(id).expect("held");
        assert!(
            c.head() < 6,
            "{id}: node b read back what nobody there needs"
        );
    }
    let bob_b = b.client("bob").await;
    let snap: Value = bob_b
        .request("getConversation", P(json!({"conversationId": "quiet"})))
        .await
        .expect("getConversation");
    assert_eq!(snap["latestSeq"], 6, "a read on node b: {snap}");
    let events = log(&bob_b, "quiet").await;
    assert_eq!(events.len(), 6);
    let list: Value = bob_b
        .request("listConversations", P(json!({})))
        .await
        .expect("listConversations");
    let listed = list["conversations"]
        .as_array()
        .expect("conversations")
        .iter()
        .find(|c| c["conversationId"] == "listed")
        .expect("listed")
        .clone();
    assert_eq!(listed["latestSeq"], 6, "a list on node b: {listed}");
    // The admin holds three open conversations, its cap; one closes through node a, and node b
    // (which reads nothing of it) lets the admin open another.
    let _: Value = a
        .client("bob")
        .await
        .request(
            "sendMessage",
            P(json!({"conversationId": "closing", "payload": {"text": "done"}, "finality": "conversation"})),
        )
        .await
        .expect("closed through node a");
    tests::eventually("node b hears of the close", || {
        on_b.hub()
            .get("closing")
            .is_some_and(|c| c.remote_head() == 7)
    })
    .await;
    let _: Value = b
        .client("admin")
        .await
        .request(
            "createConversation",
            P(json!({"conversationId": "fourth", "participants": ["alice", "bob"]})),
        )
        .await
        .expect("room on node b once it reads the close");
}

/// A message of `text` to conversation `passing` with `finality`, no key.
async fn plain(
    c: &jsonrpsee::ws_client::WsClient,
    text: &str,
    finality: &str,
) -> Result<Value, jsonrpsee::core::ClientError> {
    c.request(
        "sendMessage",
        P(json!({"conversationId": "passing", "payload": {"text": text}, "finality": finality})),
    )
    .await
}

/// A node that writes a conversation other nodes wrote, and nothing on it follows, reads of
/// their events only what moves the conversation's state past its head (an end of turn or of
/// the conversation, an idempotency key, the orchestrator's events); it moves past the others
/// reading only their head. Whatever it read that way, it decides on the log: seqs dense, a
/// key retried answered as first, a closed conversation refused, and a reader there sees every
/// event, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_moves_past_events_that_change_nothing_but_the_head() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    let on_b = b.running().orchestrator().clone();
    a.create("passing", &["alice", "bob"]).await;
    tests::eventually("node b meets the conversation", || {
        on_b.hub().get("passing").is_some()
    })
    .await;
    let (alice_a, bob_b) = (a.client("alice").await, b.client("bob").await);
    for i in 0..5 {
        plain(&alice_a, &format!("plain {i}"), "none")
            .await
            .expect("a plain message through node a");
    }
    tests::eventually("node b hears of them", || {
        on_b.hub()
            .get("passing")
            .is_some_and(|c| c.remote_head() == 6)
    })
    .await;
    let before = counter(orchestrator::engine::telemetry::CLUSTER_PASSED);
    // Node b writes next: it locks the conversation and finds five events that move only
    // the head.
    let r = plain(&bob_b, "from b", "none")
        .await
        .expect("through node b");
    assert_eq!(r["seq"], 7, "{r}");
    let after = counter(orchestrator::engine::telemetry::CLUSTER_PASSED);
    assert!(
        after >= before + 5.0,
        "node b moved past the five plain messages by their head ({before} -> {after})"
    );
    // Through node a: a key, and the end of turn 1.
    let keyed = send(&alice_a, "passing", "keyed", "k-1").await;
    assert_eq!(keyed["seq"], 8, "{keyed}");
    plain(&alice_a, "over to you", "turn")
        .await
        .expect("turn 1 ends");
    // Node b reads those in full: the key retried there answers the first seq, and a write
    // for turn 1 is refused while one for turn 2 lands.
    let alice_b = b.client("alice").await;
    let again = send(&alice_b, "passing", "keyed", "k-1").await;
    assert_eq!(
        again["seq"], 8,
        "the retry on node b answers as the first: {again}"
    );
    let late: Result<Value, _> = bob_b
        .request(
            "sendMessage",
            P(json!({"conversationId": "passing", "payload": {"text": "late"}, "finality": "none", "turnHint": {"turn": 1}})),
        )
        .await;
    assert!(late.is_err(), "turn 1 is over on the log: {late:?}");
    let r = plain(&bob_b, "in turn 2", "none").await.expect("turn 2");
    assert_eq!(
        (r["seq"].as_u64(), r["turn"].as_u64()),
        (Some(10), Some(2)),
        "{r}"
    );
    // More plain messages through node a, then node a closes the conversation: node b,
    // which passes the plain ones by their head, refuses what comes after the close.
    for i in 0..3 {
        plain(&alice_a, &format!("more {i}"), "none")
            .await
            .expect("a plain message");
    }
    plain(&alice_a, "the end", "conversation")
        .await
        .expect("closed through node a");
    let after_close = plain(&bob_b, "after the end", "none").await;
    assert!(after_close.is_err(), "closed on the log: {after_close:?}");
    // A reader on node b sees every event once, in order, including those passed by head.
    let events = log(&bob_b, "passing").await;
    let seqs: Vec<u64> = events.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=14).collect::<Vec<_>>());
    let snap: Value = bob_b
        .request("getConversation", P(json!({"conversationId": "passing"})))
        .await
        .expect("getConversation");
    assert_eq!(snap["latestSeq"], 14, "{snap}");
}

/// A batch on a shared log takes at most `MAX_SHARED_BATCH` jobs: each conversation it writes
/// is a lock in PostgreSQL's shared lock table until it commits, which every session shares.
/// Here the writer is held at a commit (a test connection holds the conversation's lock) while
/// 3,000 appends queue behind it; once let go, the queue is written in batches of at most 512.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_on_a_shared_log_takes_a_bounded_number_of_jobs() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    a.create("many", &["alice"]).await;
    let db = tests::pg::connect(&a.db).await.expect("a connection");
    let orchestrator = a.running().orchestrator().clone();
    let stats = orchestrator.writer().stats.clone();
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let alice = orchestrator::engine::auth::Identity::new("alice", false);
    let message = |i: usize| proto_spec::SendMessageParams {
        conversation_id: "many".into(),
        payload: proto_spec::MessagePayload::text(format!("message {i}")),
        finality: proto_spec::Finality::None,
        turn_hint: None,
        client_request_id: None,
        after_key: None,
    };
    db.batch_execute(&hold_conversation("many"))
        .await
        .expect("hold the lock");
    // A batch counts its jobs once decided, before its commit: then it waits at the lock.
    let jobs_before = count(&stats.jobs);
    let first = tokio::spawn(orchestrator.send_message(&alice, message(0)));
    tests::eventually("the writer waits at the held lock", || {
        count(&stats.jobs) > jobs_before
    })
    .await;
    let queued: Vec<_> = (1..=3000)
        .map(|i| tokio::spawn(orchestrator.send_message(&alice, message(i))))
        .collect();
    let batches_before = count(&stats.batches);
    db.batch_execute("COMMIT").await.expect("let go");
    first.await.expect("joined").expect("the first append");
    for q in queued {
        q.await.expect("joined").expect("an append");
    }
    let batches = count(&stats.batches) - batches_before;
    // The held batch, then 3,000 jobs in batches of at most 512: six at least after it, and
    // none of them (nor any batch before) took more than 512 jobs.
    assert!(batches > 3000_u64.div_ceil(512), "{batches} batches");
    assert!(
        (1..=512).contains(&count(&stats.most_jobs)),
        "the largest batch took {} jobs",
        count(&stats.most_jobs)
    );
    let r = send(&a.client("alice").await, "many", "after", "k-after").await;
    assert_eq!(r["seq"], 3003, "{r}");
}

/// On PostgreSQL the writer decides and sends a batch while the one before it commits; the
/// second commits only after the first has. Here the writer is first held at another
/// conversation's lock while two appends queue up, so that they make one batch, which is left in
/// flight and waits at the conversation's lock (held by a test connection); two more appends make
/// a second batch, decided on the state the first left and sent behind it. Then the test
/// connection writes the seq the first would write, as another node would, and lets go: the first
/// fails, the second is rolled back with it, both states are put back, and both run again on
/// the log as it is, in their order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sent_behind_one_that_fails_is_undone_with_it() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    a.create("pair", &["alice", "bob"]).await;
    a.create("gate", &["alice"]).await;
    let alice = a.client("alice").await;
    assert_eq!(send(&alice, "pair", "before", "k0").await["seq"], 2);
    let orchestrator = a.running().orchestrator().clone();
    let writer = orchestrator.writer();
    let stats = writer.stats.clone();
    let count = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    let (overlapped, conflicted) = (count(&stats.overlapped), conflicts());
    let (gate, db) = (
        tests::pg::connect(&a.db).await.expect("a connection"),
        tests::pg::connect(&a.db).await.expect("a connection"),
    );
    gate.batch_execute(&hold_conversation("gate"))
        .await
        .expect("hold the gate");
    db.batch_execute(&hold_conversation("pair"))
        .await
        .expect("hold the lock");
    let spawn_send = |client: jsonrpsee::ws_client::WsClient,
                      conv: &'static str,
                      text: &'static str,
                      key: &'static str| {
        tokio::spawn(async move { send(&client, conv, text, key).await })
    };
    // The writer waits at the gate's lock (a lone write is committed and waited for).
    let jobs = count(&stats.jobs);
    let gated = spawn_send(a.client("alice").await, "gate", "gate", "g1");
    tests::eventually("the writer waits at the gate", || count(&stats.jobs) > jobs).await;
    let first = [
        spawn_send(a.client("alice").await, "pair", "first a", "k1"),
        spawn_send(a.client("alice").await, "pair", "first b", "k2"),
    ];
    tests::eventually("the first batch's appends are queued", || {
        writer.queued() >= 2
    })
    .await;
    let jobs = count(&stats.jobs);
    gate.batch_execute("COMMIT").await.expect("open the gate");
    gated.await.expect("joined");
    tests::eventually("the first batch is decided", || {
        count(&stats.jobs) >= jobs + 2
    })
    .await;
    let second = [
        spawn_send(a.client("alice").await, "pair", "second a", "k3"),
        spawn_send(a.client("alice").await, "pair", "second b", "k4"),
    ];
    tests::eventually("the second batch is sent behind the first", || {
        count(&stats.overlapped) > overlapped
    })
    .await;
    assert!(first.iter().chain(&second).all(|t| !t.is_finished()));
    // Seq 3, which the first batch writes, written first by "another node".
    db.batch_execute(
        "INSERT INTO events (conv, seq, kind, author, turn, finality, payload, ts_ms)
         SELECT e.conv, e.seq + 1, 'message', 'bob', e.turn, NULL, '{\"text\":\"from elsewhere\"}', e.ts_ms
         FROM events e JOIN conversations c ON c.num = e.conv
         WHERE c.id = 'pair' ORDER BY e.seq DESC LIMIT 1;
         COMMIT",
    )
    .await
    .expect("seq 3 written elsewhere, the lock let go");
    let mut answered = Vec::new();
    for (t, text) in first
        .into_iter()
        .chain(second)
        .zip(["first a", "first b", "second a", "second b"])
    {
        let seq = t.await.expect("joined")["seq"].as_u64().expect("a seq");
        answered.push((seq, text.to_string()));
    }
    // The first batch's appends (in the order they came), then the second's.
    let mut by_batch = [answered[0].0, answered[1].0, answered[2].0, answered[3].0];
    by_batch[..2].sort_unstable();
    by_batch[2..].sort_unstable();
    assert_eq!(by_batch, [4, 5, 6, 7], "{answered:?}");
    assert!(conflicts() > conflicted, "the first batch conflicted");
    // Retries answer what was committed; the state goes on from the log's head.
    assert_eq!(
        send(&alice, "pair", "second b", "k4").await["seq"],
        answered[3].0
    );
    assert_eq!(send(&alice, "pair", "after", "k5").await["seq"], 8);
    let texts: Vec<(u64, String)> = log(&alice, "pair")
        .await
        .iter()
        .filter_map(|e| {
            Some((
                e["seq"].as_u64()?,
                e["payload"]["text"].as_str()?.to_string(),
            ))
        })
        .collect();
    let mut expected = vec![(2, "before".to_string()), (3, "from elsewhere".to_string())];
    answered.sort_unstable();
    expected.extend(answered);
    expected.push((8, "after".to_string()));
    assert_eq!(texts, expected, "every event once, as answered, seq dense");
}
