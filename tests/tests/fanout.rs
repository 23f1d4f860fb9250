//! Slow subscribers: a feed that falls behind the memory ring or the global broadcast is
//! resumed from the log by cursor, never skips, and never holds the writer back.

use std::collections::HashMap;
use std::sync::Arc;

use orchestrator::engine::auth::Identity;
use orchestrator::engine::config::Limits;
use orchestrator::engine::hub::{GLOBAL_BUFFER, RECENT_EVENTS};
use orchestrator::engine::service::Orchestrator;
use proto_spec::{
    CreateConversationParams, Finality, MessagePayload, SendMessageParams, SubscribeParams,
};
use tests::WAIT;

async fn orchestrator() -> (
    Arc<Orchestrator>,
    (tempfile::TempDir, Option<tests::pg::TestPostgres>),
) {
    let dir = tempfile::tempdir().unwrap();
    let (db, pg) = tests::test_database(dir.path()).await;
    let store = tests::open_store(&db);
    (
        Orchestrator::open(store, Limits::default()).unwrap(),
        (dir, pg),
    )
}

/// Creates a conversation of alice's, as admin.
async fn create(orch: &Orchestrator, id: &str) {
    let p = CreateConversationParams {
        conversation_id: Some(id.into()),
        participants: Some(vec!["alice".into()]),
        ..Default::default()
    };
    orch.create_conversation(&Identity::new("admin", true), p)
        .await
        .unwrap();
}

/// Appends `n` messages to each conversation, `depth` at a time per conversation.
async fn append_many(
    orch: &Arc<Orchestrator>,
    who: &Identity,
    convs: &[&str],
    n: usize,
    depth: usize,
) {
    let mut tasks = Vec::new();
    for c in convs {
        let orch = orch.clone();
        let who = who.clone();
        let c = c.to_string();
        tasks.push(tokio::spawn(async move {
            let mut batch = Vec::new();
            for i in 0..n {
                let p = SendMessageParams {
                    conversation_id: c.clone(),
                    payload: MessagePayload::text(format!("{c}-{i}")),
                    finality: Finality::None,
                    turn_hint: None,
                    client_request_id: None,
                    after_key: None,
                };
                let orch = orch.clone();
                let who = who.clone();
                batch.push(tokio::spawn(async move {
                    orch.send_message(&who, p).await.unwrap()
                }));
                if batch.len() == depth {
                    for t in batch.drain(..) {
                        t.await.unwrap();
                    }
                }
            }
            for t in batch {
                t.await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_feed_of_all_conversations_is_resumed_from_the_log() {
    let (orch, _dir) = orchestrator().await;
    let alice = Identity::new("alice", false);
    for c in ["x", "y", "z"] {
        create(&orch, c).await;
    }
    let mut feed = orch
        .subscribe(
            &alice,
            SubscribeParams {
                conversation_id: None,
                since_seq: Some(0),
                cursors: None,
            },
        )
        .await
        .unwrap();
    // Nobody reads the feed while far more than the broadcast buffer is appended: the writer
    // does not wait for it.
    let per_conv = GLOBAL_BUFFER / 2;
    tokio::time::timeout(
        WAIT * 6,
        // One append at a time per conversation: every commit is its own broadcast item.
        append_many(&orch, &alice, &["x", "y", "z"], per_conv, 1),
    )
    .await
    .expect("appends are not held back by an idle subscriber");
    let mut last: HashMap<String, u64> = HashMap::new();
    let total = 3 * (per_conv + 1);
    for _ in 0..total {
        let ev = tokio::time::timeout(WAIT, feed.next())
            .await
            .expect("event in time")
            .unwrap()
            .unwrap();
        let l = last.entry(ev.conversation_id.clone()).or_insert(0);
        assert_eq!(
            ev.seq,
            *l + 1,
            "no gap, no duplicate in {}",
            ev.conversation_id
        );
        *l = ev.seq;
    }
    for c in ["x", "y", "z"] {
        assert_eq!(last[c], per_conv as u64 + 1);
    }
    // Live events keep coming after the catch-up.
    append_many(&orch, &alice, &["y"], 1, 1).await;
    let ev = tokio::time::timeout(WAIT, feed.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        (ev.conversation_id.as_str(), ev.seq),
        ("y", per_conv as u64 + 2)
    );
    assert!(
        feed.resumed_from_log() > 0,
        "the feed fell behind the broadcast and was resumed from the log"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_feed_behind_the_memory_ring_reads_the_store() {
    let (orch, _dir) = orchestrator().await;
    let alice = Identity::new("alice", false);
    create(&orch, "c").await;
    let mut feed = orch
        .subscribe(
            &alice,
            SubscribeParams {
                conversation_id: Some("c".into()),
                since_seq: Some(0),
                cursors: None,
            },
        )
        .await
        .unwrap();
    let n = RECENT_EVENTS * 10;
    append_many(&orch, &alice, &["c"], n, 256).await;
    for expect in 1..=(n as u64 + 1) {
        let ev = tokio::time::timeout(WAIT, feed.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(ev.seq, expect);
    }
    orch.shutdown().await;
    assert!(
        tokio::time::timeout(WAIT, feed.next())
            .await
            .unwrap()
            .unwrap()
            .is_none(),
        "feeds end at shutdown"
    );
}
