//! Crash recovery: the real server process is killed with SIGKILL at random moments while an
//! internal (scripted) agent and an external (push-claim, over WebSocket) agent talk, and started
//! again on the same database, many times. After every restart: every acknowledged event is
//! there, seq is dense with no duplicate, every closed turn has exactly one decision committed
//! with it; pending turns go on, and in the end every conversation reaches its stop condition.
//!
//! `CRASH_KILLS` sets the number of kills (default 50); `scripts/soak-crash` runs a long soak.

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sdk::proto::*;
use agent_sdk::{
    async_trait, Agent, AgentClient, AgentContext, AgentError, TurnOutcome, WsConfig,
    WsJsonRpcClient,
};
use executors::{ExecutorCore, ExternalExecutor};
use rand::Rng;
use tokio::io::AsyncBufReadExt;

const CONVERSATIONS: usize = 4;
/// The bot's replies: more than the turns it takes while the kills go on.
const BOT_REPLIES: u64 = 5000;

/// What the external agent was told is durable: (conversation, seq) → text.
type Acked = Arc<Mutex<BTreeMap<(String, u64), String>>>;

struct Ext {
    acked: Acked,
    /// Set once the kills are over: the next answers end the conversations (`onText`).
    finish: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl Agent for Ext {
    async fn handle_turn(&self, ctx: &AgentContext) -> Result<TurnOutcome, AgentError> {
        // A little work, so that kills land in the middle of turns.
        let work = rand::rng().random_range(5..15);
        tokio::time::sleep(Duration::from_millis(work)).await;
        let text = if self.finish.load(std::sync::atomic::Ordering::Relaxed) {
            format!("FINISH at turn {}", ctx.turn)
        } else {
            format!("ext answers turn {}", ctx.turn)
        };
        let r = ctx.say(text.clone(), Finality::Turn).await?;
        if let Ok(mut a) = self.acked.lock() {
            a.insert((ctx.conversation_id.clone(), r.seq), text);
        }
        Ok(TurnOutcome::Posted)
    }
}

struct Server {
    child: tokio::process::Child,
}

async fn start(db: &std::path::Path, scenarios: &std::path::Path, port: u16) -> Server {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--db"])
        .arg(db)
        .arg("--scenarios")
        .arg(scenarios)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the server");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the server starts in time")
        .expect("read stdout")
        .expect("a first line");
    assert!(line.contains("listening"), "{line}");
    Server { child }
}

fn token(db: &std::path::Path, agent: &str, admin: bool) -> String {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_orchestrator"));
    cmd.args(["token", "create", "--agent", agent, "--db"])
        .arg(db);
    if admin {
        cmd.arg("--admin");
    }
    let out = cmd.output().expect("token create");
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A port free on 127.0.0.1 (the server is started on it again after each kill).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A client that reconnects quickly after a kill.
fn fast_reconnect(url: &str, token: &str) -> WsConfig {
    let mut c = WsConfig::new(url.to_string(), token);
    c.backoff_min = Duration::from_millis(10);
    c.backoff_max = Duration::from_millis(100);
    c
}

/// Checks the log of every conversation; returns how many are closed.
async fn check(admin: &WsJsonRpcClient, acked: &Acked, round: usize) -> usize {
    // What was acknowledged before the logs are read must be in them.
    let acked = acked.lock().unwrap().clone();
    let mut closed = 0;
    for c in 0..CONVERSATIONS {
        let id = format!("crash-{c}");
        // Page through the whole log (a page is at most 1,000 events).
        let mut log: Vec<Event> = Vec::new();
        loop {
            let since = log.last().map_or(0, |e| e.seq);
            let page = admin
                .tail(TailParams {
                    conversation_id: id.clone(),
                    since_seq: since,
                    limit: None,
                })
                .await
                .expect("tail");
            let done = page.events.is_empty()
                || page.events.last().map(|e| e.seq) == Some(page.latest_seq);
            log.extend(page.events);
            if done {
                break;
            }
        }
        for (i, e) in log.iter().enumerate() {
            assert_eq!(
                e.seq,
                i as u64 + 1,
                "round {round}, {id}: seq dense, no duplicate"
            );
        }
        let by_seq: HashMap<u64, &Event> = log.iter().map(|e| (e.seq, e)).collect();
        for ((conv, seq), text) in acked.iter().filter(|((c, _), _)| *c == id) {
            let e = by_seq
                .get(seq)
                .unwrap_or_else(|| panic!("round {round}: acknowledged {conv}#{seq} lost"));
            assert_eq!(
                e.payload_value()["text"],
                *text,
                "round {round}: {conv}#{seq}"
            );
        }
        // Every message that closed a turn is followed, in the same commit, by its decision.
        let mut decisions: HashMap<u64, usize> = HashMap::new();
        for (i, e) in log.iter().enumerate() {
            let p = e.payload_value();
            if e.kind == EventKind::System && p["type"] == "next_speaker" {
                *decisions.entry(e.turn).or_default() += 1;
            }
            if e.kind == EventKind::Message && e.finality == Some(Finality::Turn) {
                let next = log.get(i + 1).unwrap_or_else(|| {
                    panic!(
                        "round {round}, {id}: turn {} closed without a decision",
                        e.turn
                    )
                });
                let np = next.payload_value();
                let decided = (next.kind == EventKind::System
                    && np["type"] == "next_speaker"
                    && next.turn == e.turn + 1)
                    || (next.author == ORCHESTRATOR_AUTHOR
                        && next.finality == Some(Finality::Conversation));
                assert!(
                    decided,
                    "round {round}, {id}: turn {} closed without its decision: {next:?}",
                    e.turn
                );
            }
        }
        assert!(
            decisions.values().all(|n| *n == 1),
            "round {round}, {id}: one decision per turn: {decisions:?}"
        );
        if log
            .last()
            .is_some_and(|e| e.finality == Some(Finality::Conversation))
        {
            assert_eq!(
                log.last().unwrap().payload_value()["data"]["reason"],
                "on_text"
            );
            closed += 1;
        }
    }
    closed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_nothing_acknowledged() {
    let kills: usize = std::env::var("CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("crash.db");
    let scenarios = dir.path().join("scenarios");
    std::fs::create_dir(&scenarios).unwrap();
    let replies: Vec<String> = (1..=BOT_REPLIES).map(|i| format!("bot says {i}")).collect();
    let scenario = serde_json::json!({
        "name": "crash",
        "participants": [{"id": "bot", "kind": "scripted", "replies": replies}, "ext"],
        "policy": {"order": "round_robin", "first": "bot"},
        "stop": {"onText": "FINISH"},
        "turn": {"timeout": "30s"}
    });
    std::fs::write(scenarios.join("crash.json"), scenario.to_string()).unwrap();
    let admin_token = token(&db, "admin", true);
    let ext_token = token(&db, "ext", false);
    let port = free_port();
    let url = format!("ws://127.0.0.1:{port}/rpc");

    let mut server = start(&db, &scenarios, port).await;
    let fast = |t: &str| fast_reconnect(&url, t);
    let admin = WsJsonRpcClient::connect(fast(&admin_token))
        .await
        .expect("admin");
    for c in 0..CONVERSATIONS {
        admin
            .create_conversation(CreateConversationParams {
                conversation_id: Some(format!("crash-{c}")),
                scenario_name: Some("crash".into()),
                ..Default::default()
            })
            .await
            .expect("create");
    }
    let acked: Acked = Arc::default();
    let finish: Arc<std::sync::atomic::AtomicBool> = Arc::default();
    let ext = WsJsonRpcClient::connect(fast(&ext_token))
        .await
        .expect("ext");
    let exec = ExternalExecutor::new(
        Arc::new(ext.clone()),
        Arc::new(Ext {
            acked: acked.clone(),
            finish: finish.clone(),
        }),
        Arc::new(ExecutorCore::default()),
    );
    let executor = tokio::spawn(async move { exec.run_push().await });

    let until = tokio::time::Instant::now() + Duration::from_secs(120 + kills as u64 * 2);
    let mut progress = Vec::new();
    for round in 0..kills {
        let pause = rand::rng().random_range(5..150);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        server.child.kill().await.expect("SIGKILL");
        server = start(&db, &scenarios, port).await;
        let closed = check(&admin, &acked, round).await;
        assert!(
            closed < CONVERSATIONS,
            "round {round}: the conversations ended before the kills did"
        );
        progress.push(acked.lock().unwrap().len());
        assert!(
            tokio::time::Instant::now() < until,
            "{round} kills took too long"
        );
    }
    // The agents kept talking between kills.
    let moved = progress.windows(2).filter(|w| w[1] > w[0]).count();
    assert!(moved > kills.min(50) / 2, "{progress:?}");
    // Let them finish: every conversation reaches its stop condition.
    finish.store(true, std::sync::atomic::Ordering::Relaxed);
    let done_by = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let closed = check(&admin, &acked, kills).await;
        if closed == CONVERSATIONS {
            break;
        }
        assert!(
            tokio::time::Instant::now() < done_by,
            "{closed} of {CONVERSATIONS} closed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    executor.abort();
    let acks = acked.lock().unwrap().len();
    assert!(acks > 0);
    println!("{kills} kills; {acks} external answers acknowledged and found; all {CONVERSATIONS} conversations reached their stop condition");
    server.child.kill().await.ok();
}

/// Waits until the parent's log holds `n` events of `kind` (`subconversation_started`…); their
/// payloads.
async fn tree_events(
    admin: &WsJsonRpcClient,
    parent: &str,
    kind: &str,
    n: usize,
) -> Vec<serde_json::Value> {
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let tail = admin
            .tail(TailParams {
                conversation_id: parent.into(),
                since_seq: 0,
                limit: None,
            })
            .await
            .expect("tail");
        let found: Vec<serde_json::Value> = tail
            .events
            .iter()
            .map(|e| e.payload_value())
            .filter(|p| p["type"] == kind)
            .collect();
        if found.len() >= n {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{parent}: {n} × {kind} did not happen"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `ext` answers the open turn of a child conversation.
async fn ext_answers(ext: &WsJsonRpcClient, child: &str, text: &str) {
    ext.send_message(SendMessageParams {
        conversation_id: child.into(),
        payload: MessagePayload::text(text),
        finality: Finality::Turn,
        turn_hint: None,
        client_request_id: Some(format!("answer-{child}")),
    })
    .await
    .expect("ext answers");
}

/// The scenario library of the tree test: `tree` (a planner calling `leaf` twice) and `leaf`.
fn tree_library(dir: &std::path::Path) -> std::path::PathBuf {
    let scenarios = dir.join("scenarios");
    std::fs::create_dir(&scenarios).unwrap();
    let tree = serde_json::json!({
        "participants": [
            {"id": "asker", "kind": "scripted", "replies": ["plan it"]},
            {"id": "planner", "kind": "orchestrate", "steps": [
                {"call": "leaf", "as": "a", "input": "first: {{$.input.text}}"},
                {"call": "leaf", "as": "b", "input": "{{$.steps.a.text}}, then second"}
            ]}
        ],
        "policy": {"order": "round_robin", "first": "asker"},
        "stop": {"maxTurns": 2},
        "turn": {"timeout": "60s"}
    });
    let leaf = serde_json::json!({
        "participants": ["ext"],
        "policy": {"order": "round_robin", "first": "ext"},
        "stop": {"maxTurns": 1}
    });
    std::fs::write(scenarios.join("tree.json"), tree.to_string()).unwrap();
    std::fs::write(scenarios.join("leaf.json"), leaf.to_string()).unwrap();
    scenarios
}

/// The whole log of `id` once it is closed (within 30 s).
async fn closed_log(admin: &WsJsonRpcClient, id: &str) -> Vec<proto_spec::Event> {
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let snap = admin.get_conversation(id).await.expect("snapshot");
        if snap.status == ConversationStatus::Closed {
            return admin
                .tail(TailParams {
                    conversation_id: id.into(),
                    since_seq: 0,
                    limit: None,
                })
                .await
                .expect("tail")
                .events;
        }
        assert!(tokio::time::Instant::now() < until, "{id} did not finish");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_of_sub_conversations_resumes_after_sigkill_and_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tree.db");
    let scenarios = tree_library(dir.path());
    let admin_token = token(&db, "admin", true);
    let ext_token = token(&db, "ext", false);
    let port = free_port();
    let url = format!("ws://127.0.0.1:{port}/rpc");
    let config = |t: &str| fast_reconnect(&url, t);
    let mut server = start(&db, &scenarios, port).await;
    let admin = WsJsonRpcClient::connect(config(&admin_token))
        .await
        .expect("admin");
    let ext = WsJsonRpcClient::connect(config(&ext_token))
        .await
        .expect("ext");
    admin
        .create_conversation(CreateConversationParams {
            conversation_id: Some("tree".into()),
            scenario_name: Some("tree".into()),
            ..Default::default()
        })
        .await
        .expect("create");

    // The first child is open, waiting for ext: the server dies.
    let started = tree_events(&admin, "tree", "subconversation_started", 1).await;
    let first = started[0]["child"].as_str().unwrap().to_string();
    server.child.kill().await.expect("SIGKILL");
    server = start(&db, &scenarios, port).await;
    ext_answers(&ext, &first, "A is done").await;

    // The planner's turn is taken again from the log: it finds its first child finished and
    // opens the second; the server dies again while that one is open.
    let started = tree_events(&admin, "tree", "subconversation_started", 2).await;
    let second = started[1]["child"].as_str().unwrap().to_string();
    assert_ne!(first, second);
    server.child.kill().await.expect("SIGKILL");
    server = start(&db, &scenarios, port).await;
    let input = admin
        .tail(TailParams {
            conversation_id: second.clone(),
            since_seq: 0,
            limit: None,
        })
        .await
        .expect("the second child's log")
        .events[1]
        .payload_value();
    assert_eq!(input["text"], "A is done, then second");
    ext_answers(&ext, &second, "B is done").await;

    // The tree finishes: two children, each started and finished once; the planner answers.
    let finished = tree_events(&admin, "tree", "subconversation_finished", 2).await;
    let log = closed_log(&admin, "tree").await;
    let count = |kind: &str| {
        log.iter()
            .filter(|e| e.payload_value()["type"] == kind)
            .count()
    };
    assert_eq!(count("subconversation_started"), 2, "no child opened twice");
    assert_eq!(count("subconversation_finished"), 2);
    assert_eq!(finished[1]["result"]["text"], "B is done");
    let planner: Vec<_> = log
        .iter()
        .filter(|e| e.author == "planner" && e.kind == EventKind::Message)
        .collect();
    assert_eq!(planner.len(), 1, "the planner answered once");
    assert_eq!(planner[0].payload_value()["text"], "B is done");
    for (i, e) in log.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1, "seq is dense");
    }
    server.child.kill().await.ok();
}
