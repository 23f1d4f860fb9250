//! A commit that fails: every caller of the batch gets `Internal`, nothing of it is
//! acknowledged or published, the in-memory state rolls back, and seq stays dense afterwards.
//! And a commit that is slow: the writer's queue fills, and the appends past it wait for room.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use orchestrator::engine::auth::Identity;
use orchestrator::engine::config::Limits;
use orchestrator::engine::error::{Error, Result};
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous};
use orchestrator::engine::store::{
    ConvListing, ConversationRecord, Durability, LogWriter, NewConversation, NewRow, Principals,
    RecoveredEvent, Store, TokenRecord, TokenSelector,
};
use proto_spec::{
    CreateConversationParams, ErrorCode, Event, Finality, MessagePayload, SendMessageParams,
    TailParams,
};

/// SQLite, with switches that make the next commits, or the next syncs, fail, and one that
/// holds the next commit until it is cleared.
#[derive(Debug)]
struct Flaky {
    inner: SqliteStore,
    fail: Arc<AtomicBool>,
    fail_sync: Arc<AtomicBool>,
    hold: Arc<Hold>,
}

/// While `on`, a commit waits (and sets `holding`).
#[derive(Debug, Default)]
struct Hold {
    on: AtomicBool,
    holding: AtomicBool,
}

struct FlakyWriter {
    inner: Box<dyn LogWriter>,
    fail: Arc<AtomicBool>,
    fail_sync: Arc<AtomicBool>,
    hold: Arc<Hold>,
}

impl LogWriter for FlakyWriter {
    fn commit(&mut self, convs: &[NewConversation], rows: &[NewRow<'_>]) -> Result<()> {
        while self.hold.on.load(Ordering::SeqCst) {
            self.hold.holding.store(true, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::Io(std::io::Error::other("disk full")));
        }
        self.inner.commit(convs, rows)
    }

    fn conversation_num(&mut self) -> Result<i64> {
        self.inner.conversation_num()
    }

    fn delete(&mut self, keys: &[String]) -> Result<Vec<String>> {
        self.inner.delete(keys)
    }

    fn durability(&mut self) -> Result<Box<dyn Durability>> {
        Ok(Box::new(FlakySync {
            inner: self.inner.durability()?,
            fail: self.fail_sync.clone(),
        }))
    }
}

/// The writer's durability, with a switch that makes the next syncs fail.
struct FlakySync {
    inner: Box<dyn Durability>,
    fail: Arc<AtomicBool>,
}

impl Durability for FlakySync {
    fn sync(&mut self) -> Result<()> {
        if self.fail.load(Ordering::SeqCst) {
            return Err(Error::Io(std::io::Error::other("EIO on fsync")));
        }
        self.inner.sync()
    }
}

impl Store for Flaky {
    fn writer(&self) -> Result<Box<dyn LogWriter>> {
        Ok(Box::new(FlakyWriter {
            inner: self.inner.writer()?,
            fail: self.fail.clone(),
            fail_sync: self.fail_sync.clone(),
            hold: self.hold.clone(),
        }))
    }
    fn recover(&self, each: &mut dyn FnMut(ConversationRecord, Vec<RecoveredEvent>)) -> Result<()> {
        self.inner.recover(each)
    }
    fn read_events(&self, conversation: &str, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.inner.read_events(conversation, after, limit)
    }
    fn list_conversations(&self) -> Result<Vec<ConvListing>> {
        self.inner.list_conversations()
    }
}

impl Principals for Flaky {
    fn create_tenant(&self, name: &str) -> Result<()> {
        self.inner.create_tenant(name)
    }
    fn list_tenants(&self) -> Result<Vec<proto_spec::TenantSummary>> {
        self.inner.list_tenants()
    }
    fn set_tenant_quotas(&self, name: &str, quotas: &proto_spec::TenantQuotas) -> Result<()> {
        self.inner.set_tenant_quotas(name, quotas)
    }
    fn insert_token(&self, hash: &str, record: &TokenRecord, cap: Option<u64>) -> Result<()> {
        self.inner.insert_token(hash, record, cap)
    }
    fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>> {
        self.inner.find_token(hash)
    }
    fn agent_has_token(&self, tenant: &str, agent_id: &str) -> Result<bool> {
        self.inner.agent_has_token(tenant, agent_id)
    }
    fn list_tokens(&self, tenant: Option<&str>) -> Result<Vec<proto_spec::TokenSummary>> {
        self.inner.list_tokens(tenant)
    }
    fn revoke_tokens(&self, which: &TokenSelector, tenant: Option<&str>) -> Result<usize> {
        self.inner.revoke_tokens(which, tenant)
    }
    fn touch_tokens(&self, used: &[(String, i64)]) -> Result<()> {
        self.inner.touch_tokens(used)
    }
    fn live_tokens(&self, hashes: &[String], now_ms: i64) -> Result<Vec<String>> {
        self.inner.live_tokens(hashes, now_ms)
    }
    fn stored_bytes(&self) -> Result<Vec<(String, u64)>> {
        self.inner.stored_bytes()
    }
    fn exchange_usage(
        &self,
        node: &str,
        mine: &[orchestrator::engine::store::TenantUsage],
        now_ms: i64,
    ) -> Result<Vec<orchestrator::engine::store::TenantUsage>> {
        self.inner.exchange_usage(node, mine, now_ms)
    }
}

fn msg(text: &str, key: Option<&str>) -> SendMessageParams {
    SendMessageParams {
        conversation_id: "c".into(),
        payload: MessagePayload::text(text),
        finality: Finality::Turn,
        turn_hint: None,
        client_request_id: key.map(str::to_string),
        after_key: None,
    }
}

/// A conversation `id` that alice takes part in.
fn with_alice(id: &str) -> CreateConversationParams {
    CreateConversationParams {
        conversation_id: Some(id.into()),
        participants: Some(vec!["alice".into()]),
        ..Default::default()
    }
}

/// The seqs of conversation `c` that readers of the store see.
fn stored_seqs(store: &dyn Store) -> Vec<u64> {
    let events = store.read_events("c", 0, 100).unwrap();
    events.iter().map(|e| e.seq).collect()
}

/// Every event of conversation `c`, as `who` reads it.
async fn log_of(orch: &Orchestrator, who: &Identity) -> Vec<Event> {
    let p = TailParams {
        conversation_id: "c".into(),
        since_seq: 0,
        limit: None,
    };
    orch.tail(who, p).await.unwrap().events
}

#[tokio::test]
async fn a_failed_commit_acknowledges_nothing_and_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let fail = Arc::new(AtomicBool::new(false));
    let store = Flaky {
        inner: SqliteStore::open(dir.path().join("f.db"), Synchronous::Normal).unwrap(),
        fail: fail.clone(),
        fail_sync: Arc::default(),
        hold: Arc::default(),
    };
    let orch = Orchestrator::open(Arc::new(store), Limits::default()).unwrap();
    let admin = Identity::new("admin", true);
    let alice = Identity::new("alice", false);
    let p = with_alice("c");
    orch.create_conversation(&admin, p).await.unwrap();
    let first = orch
        .send_message(&alice, msg("one", Some("k1")))
        .await
        .unwrap();
    assert_eq!((first.seq, first.turn), (2, 1));

    fail.store(true, Ordering::SeqCst);
    let err = orch
        .send_message(&alice, msg("lost", Some("k2")))
        .await
        .unwrap_err()
        .to_rpc();
    assert_eq!(err.code, ErrorCode::Internal);
    let p = with_alice("d");
    assert_eq!(
        orch.create_conversation(&admin, p.clone())
            .await
            .unwrap_err()
            .to_rpc()
            .code,
        ErrorCode::Internal
    );
    let snap = orch
        .get_conversation(
            &alice,
            proto_spec::ConversationParams {
                conversation_id: "c".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (snap.latest_seq, snap.turn),
        (2, 2),
        "nothing of the failed batch is visible"
    );

    fail.store(false, Ordering::SeqCst);
    // The failed key was not recorded: the retry appends, at the next dense seq and turn.
    let retry = orch
        .send_message(&alice, msg("lost", Some("k2")))
        .await
        .unwrap();
    assert_eq!((retry.seq, retry.turn, retry.duplicate), (3, 2, false));
    // The acknowledged key is still known.
    let dup = orch
        .send_message(&alice, msg("one", Some("k1")))
        .await
        .unwrap();
    assert!(dup.duplicate);
    // The conversation whose creation failed can be created now.
    orch.create_conversation(&admin, p).await.unwrap();
    let seqs: Vec<u64> = log_of(&orch, &alice).await.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    orch.shutdown().await;
}

#[tokio::test]
async fn a_failed_sync_acknowledges_nothing_more_and_the_log_stops() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let fail_sync = Arc::new(AtomicBool::new(false));
    let store = Arc::new(Flaky {
        inner: SqliteStore::open(&path, Synchronous::Full).unwrap(),
        fail: Arc::default(),
        fail_sync: fail_sync.clone(),
        hold: Arc::default(),
    });
    let orch = Orchestrator::open(store.clone(), Limits::default()).unwrap();
    let admin = Identity::new("admin", true);
    let alice = Identity::new("alice", false);
    let p = with_alice("c");
    orch.create_conversation(&admin, p).await.unwrap();
    let first = orch.send_message(&alice, msg("one", None)).await.unwrap();
    assert_eq!(first.seq, 2);
    assert_eq!(
        stored_seqs(store.as_ref()),
        vec![1, 2],
        "an acknowledged event is readable"
    );

    fail_sync.store(true, Ordering::SeqCst);
    let err = orch
        .send_message(&alice, msg("unsynced", None))
        .await
        .unwrap_err()
        .to_rpc();
    assert_eq!(err.code, ErrorCode::Internal);
    // Written to the WAL but not synced: not readable, not published.
    assert_eq!(stored_seqs(store.as_ref()), vec![1, 2]);
    let snap = orch
        .get_conversation(
            &alice,
            proto_spec::ConversationParams {
                conversation_id: "c".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(snap.latest_seq, 2);

    // A later sync would not prove the failed one's pages reached the disk: the log stays
    // stopped, for appends and creations alike, even once syncs work again.
    fail_sync.store(false, Ordering::SeqCst);
    let err = orch
        .send_message(&alice, msg("after", None))
        .await
        .unwrap_err()
        .to_rpc();
    assert_eq!(err.code, ErrorCode::Internal);
    assert!(err.message.contains("restarted"), "{}", err.message);
    let p = with_alice("d");
    assert_eq!(
        orch.create_conversation(&admin, p)
            .await
            .unwrap_err()
            .to_rpc()
            .code,
        ErrorCode::Internal
    );
    orch.shutdown().await;
    drop(orch);
    drop(store);

    // Restarted on the same file, the server takes appends again after what the disk holds:
    // the acknowledged events, and the unacknowledged one if it reached the disk.
    let store = SqliteStore::open(&path, Synchronous::Full).unwrap();
    let orch = Orchestrator::open(Arc::new(store), Limits::default()).unwrap();
    let next = orch.send_message(&alice, msg("two", None)).await.unwrap();
    let events = log_of(&orch, &alice).await;
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=next.seq).collect::<Vec<_>>());
    assert!(next.seq == 3 || next.seq == 4);
    assert_eq!(events[1].payload.get(), r#"{"text":"one"}"#);
    orch.shutdown().await;
}

#[tokio::test]
async fn appends_past_a_full_queue_wait_for_room_and_all_commit() {
    let dir = tempfile::tempdir().unwrap();
    let hold = Arc::new(Hold::default());
    let store = Flaky {
        inner: SqliteStore::open(dir.path().join("q.db"), Synchronous::Normal).unwrap(),
        fail: Arc::default(),
        fail_sync: Arc::default(),
        hold: hold.clone(),
    };
    let orch = Orchestrator::open(Arc::new(store), Limits::default()).unwrap();
    let admin = Identity::new("admin", true);
    let alice = Identity::new("alice", false);
    orch.create_conversation(&admin, with_alice("c"))
        .await
        .unwrap();
    let note = |i: usize| SendMessageParams {
        finality: Finality::None,
        ..msg(&format!("note {i}"), None)
    };
    // The writer takes one append and is held in its commit...
    hold.on.store(true, Ordering::SeqCst);
    let first = orch.send_message(&alice, note(0));
    while !hold.holding.load(Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    // ...while more appends are made than the queue holds: those past it are not refused;
    // they wait for room once awaited.
    let n = orchestrator::engine::writer::QUEUE + 100;
    let pending: Vec<_> = (1..=n)
        .map(|i| orch.send_message(&alice, note(i)))
        .collect();
    hold.on.store(false, Ordering::SeqCst);
    let mut seqs = vec![first.await.unwrap().seq];
    for r in futures::future::join_all(pending).await {
        seqs.push(r.unwrap().seq);
    }
    seqs.sort_unstable();
    let expected: Vec<u64> = (2..=n as u64 + 2).collect();
    assert_eq!(seqs, expected, "every append committed once, seq dense");
    orch.shutdown().await;
}
