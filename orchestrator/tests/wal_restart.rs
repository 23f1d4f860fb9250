//! Under commits that never pause, the WAL starts over instead of growing without bound, and
//! every acknowledged event is still read back, before and after a restart of the store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use orchestrator::engine::auth::Identity;
use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous, PAGE_SIZE};
use proto_spec::{
    ConversationParams, CreateConversationParams, Finality, MessagePayload, SendMessageParams,
    TailParams,
};

fn open(path: &std::path::Path) -> Arc<Orchestrator> {
    let store = SqliteStore::open(path, Synchronous::Normal).unwrap();
    Orchestrator::open(Arc::new(store), Limits::default()).unwrap()
}

fn message(text: &str, key: String) -> SendMessageParams {
    SendMessageParams {
        conversation_id: "c".into(),
        payload: MessagePayload::text(text),
        finality: Finality::Turn,
        turn_hint: None,
        client_request_id: Some(key),
        after_key: None,
    }
}

async fn read_all(orch: &Orchestrator, who: &Identity) -> Vec<u64> {
    let mut seqs = Vec::new();
    loop {
        let page = orch
            .tail(
                who,
                TailParams {
                    conversation_id: "c".into(),
                    since_seq: seqs.last().copied().unwrap_or(0),
                    limit: Some(500),
                },
            )
            .await
            .unwrap();
        if page.events.is_empty() {
            return seqs;
        }
        seqs.extend(page.events.iter().map(|e| e.seq));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_starts_over_under_continuous_commits_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("w.db");
    let wal = dir.path().join("w.db-wal");
    let admin = Identity::new("admin", true);
    let alice = Identity::new("alice", false);
    let orch = open(&db);
    orch.create_conversation(
        &admin,
        CreateConversationParams {
            conversation_id: Some("c".into()),
            participants: Some(vec!["alice".into()]),
            ..Default::default()
        },
    )
    .await
    .unwrap();

    // One append per commit (each waits for the one before), each writing at least one WAL
    // frame: without a restart the WAL file would hold at least as many frames as commits.
    let text = "x".repeat(4_000);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut commits: u64 = 0;
    let restarted = loop {
        let ack = orch
            .send_message(&alice, message(&text, format!("k{commits}")))
            .await
            .unwrap();
        commits += 1;
        assert_eq!(ack.seq, commits + 1);
        if commits.is_multiple_of(256) {
            let frames = std::fs::metadata(&wal).unwrap().len() / PAGE_SIZE as u64;
            if commits >= 4_096 && commits >= 4 * frames {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
        }
    };
    let frames = std::fs::metadata(&wal).unwrap().len() / PAGE_SIZE as u64;
    assert!(
        restarted,
        "after {commits} commits the WAL file holds {frames} frames: it never started over"
    );

    let all = read_all(&orch, &alice).await;
    assert_eq!(all, (1..=commits + 1).collect::<Vec<_>>());
    orch.shutdown().await;

    let orch = open(&db);
    let snap = orch
        .get_conversation(
            &alice,
            ConversationParams {
                conversation_id: "c".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(snap.latest_seq, commits + 1);
    assert_eq!(read_all(&orch, &alice).await, all);
    // The keys written before each restart of the WAL are still recognised.
    let dup = orch
        .send_message(&alice, message(&text, "k0".into()))
        .await
        .unwrap();
    assert!(dup.duplicate);
    assert_eq!(dup.seq, 2);
    orch.shutdown().await;
}
