//! A simulated power loss, a failing sync and a full disk, under the real store and server.
//!
//! The SQLite store runs over `fault-disk`: a SQLite VFS that passes every call to the
//! operating system's and keeps, for each file, what a sync made durable. At an operation
//! drawn from the seed the power goes off (every later write, sync or deletion fails); the
//! server is dropped, and a new one starts on what the disk would hold: the synced writes, and
//! of the others none or a random subset, each whole. Then every acknowledged event must be
//! there, at its seq, with its text; seq dense in every conversation; nothing there that no
//! client sent, nothing twice; a retried write answers its first answer.
//!
//! `deterministic_power_losses` appends from one client at a time and checkpoints between
//! appends, so that the disk sees its operations in one order: one seed is one run (the test
//! runs some seeds twice to show it). `SEEDS` (default 2,000) sets how many seeds it runs, and
//! `SEED=n` runs one. `power_losses_under_concurrent_appends` appends from several clients
//! at once, so that batches of several appends commit together; the seed fixes what is sent
//! and when the power goes off, not how the appends interleave.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use fault_disk::{Disk, Faults, SplitMix, Survive};
use orchestrator::engine::auth::Identity;
use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::{
    Checkpoints, FileLayer, SqliteOptions, SqliteStore, Synchronous,
};
use proto_spec::{
    ConversationParams, CreateConversationParams, Event, EventKind, Finality, MessagePayload,
    SendMessageParams, TailParams,
};

#[derive(Debug)]
struct Layer(Disk);

impl FileLayer for Layer {
    fn vfs(&self) -> &str {
        self.0.vfs_name()
    }
    fn sync_data(&self, path: &Path) -> std::io::Result<()> {
        self.0.sync_path(path)
    }
}

/// The participants, and the conversations a run may create.
const AUTHORS: [&str; 2] = ["alice", "bob"];
const CONVERSATIONS: u64 = 4;

fn text_of(e: &Event) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(e.payload.get()).ok()?;
    v.get("text").and_then(|t| t.as_str()).map(str::to_string)
}

/// What the clients were told, and what they tried.
#[derive(Debug, Default)]
struct Ledger {
    /// Conversations whose creation was acknowledged.
    created: HashSet<String>,
    /// Conversations whose creation was tried.
    tried_convs: HashSet<String>,
    /// Acknowledged messages: (conversation, seq) → (text, key).
    acked: BTreeMap<(String, u64), (String, String)>,
    /// Every message tried: text → (conversation, key, author, finality).
    tried: HashMap<String, (String, String, &'static str, Finality)>,
    /// What the calls that failed answered.
    errors: Vec<String>,
}

fn store_options(disk: &Disk, restart_frames: i64) -> SqliteOptions {
    SqliteOptions {
        sync: Synchronous::Full,
        files: Some(Arc::new(Layer(disk.clone()))),
        checkpoints: Checkpoints::Manual { restart_frames },
    }
}

/// Runs a workload drawn from `rng` until it ends or a call fails (then `Some` of the step
/// that failed), on `store`; the ledger says what it did.
async fn workload(
    rng: &mut SplitMix,
    orch: &Orchestrator,
    store: &SqliteStore,
    steps: std::ops::Range<u64>,
    ledger: &mut Ledger,
) -> Option<u64> {
    let admin = Identity::new("admin", true);
    let mut convs: Vec<String> = ledger.created.iter().cloned().collect();
    convs.sort();
    for step in steps {
        if convs.is_empty() || (convs.len() < CONVERSATIONS as usize && rng.chance(0.1)) {
            let id = format!("c{}", convs.len());
            ledger.tried_convs.insert(id.clone());
            let p = CreateConversationParams {
                conversation_id: Some(id.clone()),
                participants: Some(AUTHORS.iter().map(|a| a.to_string()).collect()),
                ..Default::default()
            };
            if let Err(e) = orch.create_conversation(&admin, p).await {
                ledger.errors.push(e.to_rpc().message);
                return Some(step);
            }
            ledger.created.insert(id.clone());
            convs.push(id);
            continue;
        }
        let conv = convs[rng.range(0, convs.len() as u64 - 1) as usize].clone();
        let author = AUTHORS[rng.range(0, 1) as usize];
        let finality = if rng.chance(0.3) {
            Finality::Turn
        } else {
            Finality::None
        };
        let text = format!("m{step}-{}", rng.next_u64() % 1_000_000);
        let key = format!("k{step}");
        ledger
            .tried
            .insert(text.clone(), (conv.clone(), key.clone(), author, finality));
        let p = SendMessageParams {
            conversation_id: conv.clone(),
            payload: MessagePayload::text(&text),
            finality,
            turn_hint: None,
            client_request_id: Some(key.clone()),
            after_key: None,
        };
        match orch.send_message(&Identity::new(author, false), p).await {
            Ok(r) => {
                ledger.acked.insert((conv, r.seq), (text, key));
            }
            Err(e) => {
                ledger.errors.push(e.to_rpc().message);
                return Some(step);
            }
        }
        if rng.chance(0.25) {
            // A checkpoint between two appends (a failure is the power going off: the next
            // append finds it).
            let _ = store.checkpoint_pass();
        }
    }
    None
}

/// Every event of `conv`, as alice reads it.
async fn log_of(orch: &Orchestrator, conv: &str) -> Vec<Event> {
    let alice = Identity::new("alice", false);
    let mut out: Vec<Event> = Vec::new();
    loop {
        let p = TailParams {
            conversation_id: conv.into(),
            since_seq: out.last().map_or(0, |e| e.seq),
            limit: Some(500),
        };
        let page = orch.tail(&alice, p).await.expect("tail after restart");
        if page.events.is_empty() {
            return out;
        }
        out.extend(page.events);
    }
}

/// What one seed found.
#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
struct Outcome {
    acked: usize,
    ops: u64,
    recovered: usize,
    extra: usize,
}

/// Checks the log a restarted server serves against what the clients were told.
async fn check(seed: u64, orch: &Orchestrator, ledger: &Ledger) -> Outcome {
    let mut out = Outcome {
        acked: ledger.acked.len(),
        ..Outcome::default()
    };
    for conv in &ledger.tried_convs {
        let snap = orch
            .get_conversation(
                &Identity::new("alice", false),
                ConversationParams {
                    conversation_id: conv.clone(),
                },
            )
            .await;
        if ledger.created.contains(conv) {
            assert!(
                snap.is_ok(),
                "seed {seed}: acknowledged conversation {conv} lost"
            );
        }
        if snap.is_err() {
            continue;
        }
        let log = log_of(orch, conv).await;
        let mut seen = HashSet::new();
        for (i, e) in log.iter().enumerate() {
            assert_eq!(e.seq, i as u64 + 1, "seed {seed}: {conv} is not dense");
            if e.kind != EventKind::Message {
                continue;
            }
            let text = text_of(e).unwrap_or_default();
            let Some((tconv, key, _, _)) = ledger.tried.get(&text) else {
                panic!(
                    "seed {seed}: {conv} seq {} holds {text:?}, which no client sent",
                    e.seq
                );
            };
            assert_eq!(tconv, conv, "seed {seed}: {text} in the wrong conversation");
            assert_eq!(e.client_request_id.as_deref(), Some(key.as_str()));
            assert!(
                seen.insert(text.clone()),
                "seed {seed}: {text} twice in {conv}"
            );
            out.recovered += 1;
            if !ledger.acked.contains_key(&(conv.clone(), e.seq)) {
                out.extra += 1;
            }
        }
        for ((c, seq), (text, _)) in ledger
            .acked
            .range((conv.clone(), 0)..(conv.clone(), u64::MAX))
        {
            let e = log.get(*seq as usize - 1).unwrap_or_else(|| {
                panic!(
                    "seed {seed}: acknowledged {c} seq {seq} ({text}) lost; log ends at {}",
                    log.len()
                )
            });
            assert_eq!(
                text_of(e).as_deref(),
                Some(text.as_str()),
                "seed {seed}: {c} seq {seq}"
            );
        }
    }
    // Every message that landed tried again with its key (acknowledged or not): it answers
    // its seq and appends nothing.
    let mut logs: HashMap<String, Vec<Event>> = HashMap::new();
    for conv in &ledger.created {
        logs.insert(conv.clone(), log_of(orch, conv).await);
    }
    for (text, (conv, key, author, finality)) in &ledger.tried {
        let Some(landed) = logs.get(conv).and_then(|log| {
            log.iter()
                .find(|e| text_of(e).as_deref() == Some(text.as_str()))
        }) else {
            continue;
        };
        let p = SendMessageParams {
            conversation_id: conv.clone(),
            payload: MessagePayload::text(text),
            finality: *finality,
            turn_hint: None,
            client_request_id: Some(key.clone()),
            after_key: None,
        };
        let r = orch
            .send_message(&Identity::new(*author, false), p)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: retry of {key}: {e}"));
        assert_eq!(
            r.seq, landed.seq,
            "seed {seed}: retry of {key} answered another seq"
        );
    }
    for (conv, log) in &logs {
        let now = log_of(orch, conv).await.len();
        assert_eq!(now, log.len(), "seed {seed}: a retry appended to {conv}");
    }
    out
}

/// A run's directories: the disk it runs on, and the one a restart reads what survived from.
struct Dirs {
    run: std::path::PathBuf,
    before: std::path::PathBuf,
    after: std::path::PathBuf,
}

impl Dirs {
    fn new(base: &Path, name: &str) -> Dirs {
        let run = base.join(name);
        let (before, after) = (run.join("before"), run.join("after"));
        std::fs::create_dir_all(&before).unwrap();
        std::fs::create_dir_all(&after).unwrap();
        Dirs { run, before, after }
    }
}

/// Opens a store on the disk and a server on it, or `None` if the disk refused.
fn start(
    disk: &Disk,
    dirs: &Dirs,
    restart_frames: i64,
) -> Option<(Arc<SqliteStore>, Arc<Orchestrator>)> {
    let store = SqliteStore::open_with(
        dirs.before.join("log.db"),
        store_options(disk, restart_frames),
    );
    let store = Arc::new(store.ok()?);
    let orch = Orchestrator::open(store.clone(), Limits::default()).ok()?;
    Some((store, orch))
}

/// Turns the power off (if it is still on), starts a server on what survived, and checks it.
async fn restart_and_check(
    disk: &Disk,
    seed: u64,
    dirs: &Dirs,
    survive: Survive,
    ledger: &Ledger,
) -> Outcome {
    let ops = disk.ops();
    disk.reset_faults(Faults {
        power_off_at: Some(0),
        ..Faults::default()
    });
    disk.survivors(&dirs.after, survive).unwrap();
    disk.reset(Faults::default());
    let store = SqliteStore::open_with(dirs.after.join("log.db"), store_options(disk, 8))
        .unwrap_or_else(|e| panic!("seed {seed}: the store does not open after the loss: {e}"));
    let orch = Orchestrator::open(Arc::new(store), Limits::default())
        .unwrap_or_else(|e| panic!("seed {seed}: the server does not start after the loss: {e}"));
    let mut out = check(seed, &orch, ledger).await;
    out.ops = ops;
    orch.shutdown().await;
    drop(orch);
    let _ = std::fs::remove_dir_all(&dirs.run);
    out
}

fn survive_of(rng: &mut SplitMix) -> Survive {
    if rng.chance(0.5) {
        Survive::Synced
    } else {
        Survive::Some {
            chance: 0.5,
            seed: rng.next_u64(),
        }
    }
}

/// One seed: a workload on a fresh log until the power goes off, then a server started on what
/// survived, checked.
async fn one_seed(disk: &Disk, seed: u64, base: &Path) -> Outcome {
    let mut rng = SplitMix(seed);
    let dirs = Dirs::new(base, &format!("s{seed}"));
    let power_off_at = rng.range(1, 900);
    let restart_frames = rng.range(2, 24) as i64;
    let survive = survive_of(&mut rng);
    disk.reset(Faults {
        power_off_at: Some(power_off_at),
        ..Faults::default()
    });
    let mut ledger = Ledger::default();
    if let Some((store, orch)) = start(disk, &dirs, restart_frames) {
        workload(&mut rng, &orch, &store, 0..80, &mut ledger).await;
        orch.shutdown().await;
    }
    restart_and_check(disk, seed, &dirs, survive, &ledger).await
}

fn seeds() -> Vec<u64> {
    if let Ok(one) = std::env::var("SEED") {
        return vec![one.parse().expect("SEED is a number")];
    }
    let n: u64 = std::env::var("SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000);
    (1..=n).collect()
}

#[test]
fn deterministic_power_losses() {
    let disk = Disk::register("power-loss-deterministic").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let base = tempfile::tempdir().unwrap();
    let (mut acked, mut extra, mut runs) = (0, 0, 0);
    rt.block_on(async {
        for seed in seeds() {
            let out = one_seed(&disk, seed, base.path()).await;
            if seed % 50 == 1 {
                // The same seed, the same run.
                let again = one_seed(&disk, seed, base.path()).await;
                assert_eq!(out, again, "seed {seed} ran two ways");
            }
            acked += out.acked;
            extra += out.extra;
            runs += 1;
        }
    });
    println!(
        "power loss: {runs} seeds, {acked} events acknowledged, 0 lost, {extra} committed without their answer and kept"
    );
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A fault that makes calls fail without the power going off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    FailingSync,
    FullDisk,
}

/// Runs 150 seeds with `fault` injected at a moment drawn from each; after the first call it
/// made fail, a few more calls (none may be acknowledged), then a power loss and a restart,
/// checked. How many seeds the fault hit, and the events acknowledged.
async fn fault_seeds(fault: Fault, disk: &Disk, base: &Path) -> (u64, usize) {
    let (mut hit, mut acked) = (0, 0);
    for seed in 1..=150u64 {
        let mut rng = SplitMix(seed ^ 0x5eed);
        let dirs = Dirs::new(base, &format!("{fault:?}{seed}"));
        disk.reset(match fault {
            Fault::FailingSync => Faults {
                fail_sync_at: Some(rng.range(1, 90)),
                ..Faults::default()
            },
            Fault::FullDisk => Faults {
                full_after_bytes: Some(rng.range(200_000, 3_000_000)),
                ..Faults::default()
            },
        });
        let mut ledger = Ledger::default();
        if let Some((store, orch)) = start(disk, &dirs, rng.range(2, 24) as i64) {
            if let Some(step) = workload(&mut rng, &orch, &store, 0..100, &mut ledger).await {
                let acked_then = ledger.acked.len();
                let first = ledger.errors.last().cloned().unwrap_or_default();
                for n in 1..=3 {
                    workload(&mut rng, &orch, &store, step + n..step + n + 1, &mut ledger).await;
                }
                assert_eq!(
                    ledger.acked.len(),
                    acked_then,
                    "seed {seed}: acknowledged after {fault:?}"
                );
                // Every call since answered the same clear error.
                let expected = match fault {
                    Fault::FailingSync => "a sync of the disk failed",
                    Fault::FullDisk => orchestrator::engine::error::DISK_FULL,
                };
                if first.contains(expected) {
                    hit += 1;
                    for e in &ledger.errors {
                        assert!(e.contains(expected), "seed {seed}: {e}");
                    }
                }
                if fault == Fault::FullDisk {
                    // Room again: the log takes writes again, after the ones it refused.
                    disk.reset_faults(Faults::default());
                    let more =
                        workload(&mut rng, &orch, &store, step + 4..step + 40, &mut ledger).await;
                    assert_eq!(more, None, "seed {seed}: {:?}", ledger.errors.last());
                    assert!(ledger.acked.len() > acked_then, "seed {seed}");
                }
            }
            orch.shutdown().await;
        }
        acked += ledger.acked.len();
        let survive = survive_of(&mut rng);
        restart_and_check(disk, seed, &dirs, survive, &ledger).await;
    }
    (hit, acked)
}

/// Runs [`fault_seeds`] on a disk of its own; the seeds the fault hit (asked to be most of them).
fn fault_test(fault: Fault, name: &str) {
    let disk = Disk::register(name).unwrap();
    let base = tempfile::tempdir().unwrap();
    let (hit, acked) = runtime().block_on(fault_seeds(fault, &disk, base.path()));
    assert!(hit > 60, "{fault:?} hit only {hit} of 150 seeds");
    println!("{fault:?}: 150 seeds, hit in {hit}, {acked} events acknowledged, 0 lost");
}

/// A sync that fails: the call whose commit it was to make durable fails with the log-stopped
/// error, and so does every later write; after a power loss every acknowledged event is there.
#[test]
fn a_failing_sync_stops_the_log_and_loses_nothing_acknowledged() {
    fault_test(Fault::FailingSync, "power-loss-failing-sync");
}

/// A disk that fills: the calls that do not fit fail with the disk-full error and write
/// nothing; once there is room again the log goes on, seq dense; after a power loss every
/// acknowledged event is there.
#[test]
fn a_full_disk_refuses_writes_until_there_is_room() {
    fault_test(Fault::FullDisk, "power-loss-full-disk");
}

/// Several clients append at once, so that the writer commits their appends in batches and
/// syncs several commits at a time; the power goes off at an operation drawn from the seed.
/// (The seed fixes what is sent and when the power goes off; how the appends interleave is
/// the scheduler's.)
#[test]
fn power_losses_under_concurrent_appends() {
    let disk = Disk::register("power-loss-concurrent").unwrap();
    let base = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (mut acked, mut extra) = (0, 0);
    rt.block_on(async {
        for seed in 1..=120u64 {
            let mut rng = SplitMix(seed ^ 0xc0c0);
            let dirs = Dirs::new(base.path(), &format!("c{seed}"));
            disk.reset(Faults {
                power_off_at: Some(rng.range(40, 700)),
                ..Faults::default()
            });
            let survive = survive_of(&mut rng);
            let ledger = Arc::new(std::sync::Mutex::new(Ledger::default()));
            if let Some((store, orch)) = start(&disk, &dirs, rng.range(2, 24) as i64) {
                let admin = Identity::new("admin", true);
                let mut tasks = Vec::new();
                for t in 0..4u64 {
                    let conv = format!("c{t}");
                    ledger.lock().unwrap().tried_convs.insert(conv.clone());
                    let p = CreateConversationParams {
                        conversation_id: Some(conv.clone()),
                        participants: Some(AUTHORS.iter().map(|a| a.to_string()).collect()),
                        ..Default::default()
                    };
                    if orch.create_conversation(&admin, p).await.is_err() {
                        break;
                    }
                    ledger.lock().unwrap().created.insert(conv.clone());
                    let (orch, ledger) = (orch.clone(), ledger.clone());
                    tasks.push(tokio::spawn(async move {
                        for i in 0..60u64 {
                            let author = AUTHORS[(i % 2) as usize];
                            let text = format!("t{t}-{i}");
                            let key = format!("k{t}-{i}");
                            ledger.lock().unwrap().tried.insert(
                                text.clone(),
                                (conv.clone(), key.clone(), author, Finality::None),
                            );
                            let p = SendMessageParams {
                                conversation_id: conv.clone(),
                                payload: MessagePayload::text(&text),
                                finality: Finality::None,
                                turn_hint: None,
                                client_request_id: Some(key.clone()),
                                after_key: None,
                            };
                            match orch.send_message(&Identity::new(author, false), p).await {
                                Ok(r) => {
                                    ledger
                                        .lock()
                                        .unwrap()
                                        .acked
                                        .insert((conv.clone(), r.seq), (text, key));
                                }
                                Err(_) => return,
                            }
                        }
                    }));
                }
                let checkpoints = {
                    let store = store.clone();
                    tokio::spawn(async move {
                        for _ in 0..200 {
                            let _ = store.checkpoint_pass();
                            tokio::task::yield_now().await;
                        }
                    })
                };
                for t in tasks {
                    t.await.unwrap();
                }
                checkpoints.await.unwrap();
                orch.shutdown().await;
            }
            let ledger = std::mem::take(&mut *ledger.lock().unwrap());
            let out = restart_and_check(&disk, seed, &dirs, survive, &ledger).await;
            acked += out.acked;
            extra += out.extra;
        }
    });
    println!("concurrent power loss: 120 seeds, {acked} events acknowledged, 0 lost, {extra} committed without their answer and kept");
}

/// A log that is damaged is refused at start, never served: a seq missing from a conversation,
/// and a page of the log's table overwritten.
#[test]
fn a_damaged_log_is_refused_at_start() {
    let base = tempfile::tempdir().unwrap();
    let rt = runtime();
    for damage in ["a missing seq", "a damaged page"] {
        let db = base.path().join(format!("{}.db", damage.replace(' ', "-")));
        rt.block_on(async {
            let store = SqliteStore::open(&db, Synchronous::Full).unwrap();
            let orch = Orchestrator::open(Arc::new(store), Limits::default()).unwrap();
            let admin = Identity::new("admin", true);
            for c in 0..3 {
                let p = CreateConversationParams {
                    conversation_id: Some(format!("c{c}")),
                    participants: Some(AUTHORS.iter().map(|a| a.to_string()).collect()),
                    ..Default::default()
                };
                orch.create_conversation(&admin, p).await.unwrap();
                for i in 0..400 {
                    let p = SendMessageParams {
                        conversation_id: format!("c{c}"),
                        payload: MessagePayload::text(format!("message {i} {}", "x".repeat(200))),
                        finality: Finality::None,
                        turn_hint: None,
                        client_request_id: None,
                        after_key: None,
                    };
                    orch.send_message(&Identity::new("alice", false), p)
                        .await
                        .unwrap();
                }
            }
            orch.shutdown().await;
        });
        let conn = rusqlite::Connection::open(&db).unwrap();
        if damage == "a missing seq" {
            conn.execute(
                "DELETE FROM events WHERE seq = 7 AND conv = (SELECT num FROM conversations WHERE id = 'c1')",
                [],
            )
            .unwrap();
            drop(conn);
        } else {
            let root: i64 = conn
                .query_row(
                    "SELECT rootpage FROM sqlite_master WHERE name = 'events'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            conn.pragma_update(None, "wal_checkpoint", "TRUNCATE")
                .unwrap();
            drop(conn);
            let mut bytes = std::fs::read(&db).unwrap();
            let page = orchestrator::engine::store::sqlite::PAGE_SIZE as usize;
            let at = (root as usize - 1) * page;
            for (i, b) in bytes[at..at + page].iter_mut().enumerate() {
                *b = (i * 7 + 13) as u8;
            }
            std::fs::write(&db, bytes).unwrap();
        }
        let started = rt.block_on(async {
            let store = SqliteStore::open(&db, Synchronous::Full)?;
            Orchestrator::open(Arc::new(store), Limits::default()).map(|_| ())
        });
        let err = started.expect_err(damage).to_string();
        println!("{damage}: {err}");
        match damage {
            "a missing seq" => assert!(err.contains("seq 8 follows seq 6"), "{err}"),
            _ => assert!(
                err.contains("malformed") || err.contains("corrupt"),
                "{err}"
            ),
        }
    }
}
