//! The same agents inside the server and in a partner's process: parity of the logs, push-claim
//! under chaos, and the WebSocket client across cut connections.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agent_sdk::proto::*;
use agent_sdk::{
    async_trait, Agent, AgentClient, AgentContext, AgentError, ExecutorClient, TurnOutcome,
    WsJsonRpcClient,
};
use executors::{ExecutorCore, ExternalExecutor};
use orchestrator::engine::turns::TurnConfig;
use rand::Rng;
use serde_json::{json, Value};
use tests::proxy::Proxy;
use tests::{TestServer, WAIT};

/// One agent with every behaviour of the parity suite; the driver's last message says which.
struct Behaviours;

#[async_trait]
impl Agent for Behaviours {
    async fn handle_turn(&self, ctx: &AgentContext) -> Result<TurnOutcome, AgentError> {
        let history = ctx.history().await?;
        let ask = history
            .iter()
            .rev()
            .find(|m| m.author != ctx.agent_id)
            .map(|m| {
                m.payload_value()["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .unwrap_or_default();
        match ask.as_str() {
            "reply" => {
                ctx.say(format!("reply to turn {}", ctx.turn), Finality::Turn)
                    .await?;
                Ok(TurnOutcome::Posted)
            }
            "stream" => {
                for part in ["thinking", "still thinking"] {
                    ctx.say(part, Finality::None).await?;
                }
                ctx.say("streamed answer", Finality::Turn).await?;
                Ok(TurnOutcome::Posted)
            }
            "yield" => Ok(TurnOutcome::Yield),
            "traces" => {
                ctx.post_trace(json!({"type": "tool_call", "tool": "search"}))
                    .await?;
                ctx.post_trace(json!({"type": "tool_result", "hits": 3}))
                    .await?;
                ctx.say("answer with traces", Finality::Turn).await?;
                Ok(TurnOutcome::Posted)
            }
            "flaky" => {
                if ctx.attempt == 1 {
                    return Err("the first attempt fails".into());
                }
                ctx.say(
                    format!("recovered on attempt {}", ctx.attempt),
                    Finality::Turn,
                )
                .await?;
                Ok(TurnOutcome::Posted)
            }
            "overrun" => {
                tokio::time::sleep(Duration::from_secs(30)).await;
                ctx.say("too late", Finality::Turn).await?;
                Ok(TurnOutcome::Posted)
            }
            "finish" => {
                ctx.say("goodbye", Finality::Conversation).await?;
                Ok(TurnOutcome::Complete)
            }
            other => Err(format!("unknown request {other:?}").into()),
        }
    }
}

const BEHAVIOURS: [&str; 7] = [
    "reply", "stream", "yield", "traces", "flaky", "overrun", "finish",
];

fn scenario(timeout: &str) -> Value {
    json!({
        "participants": ["alice", "bob"],
        "policy": {"order": "round_robin", "first": "alice"},
        "turn": {"timeout": timeout}
    })
}

/// The whole log of a conversation, read as admin.
async fn log_of(admin: &dyn AgentClient, id: &str) -> Vec<Event> {
    tests::full_log(admin, id).await
}

/// Waits until the executor has finished the turn: its last trace is written.
async fn wait_finished(admin: &dyn AgentClient, id: &str) -> Vec<Event> {
    tests::log_until(admin, id, "the turn finished", |log| {
        let done = log.iter().any(|e| {
            let p = e.payload_value();
            e.kind == EventKind::Trace
                && (p["type"] == "turn_end" && p["outcome"] != "incomplete"
                    || p["type"] == "turn_error" && p["error"] == "deadline exceeded")
        });
        // A closed conversation takes no more traces.
        let closed = log
            .iter()
            .any(|e| e.finality == Some(Finality::Conversation));
        done || closed
    })
    .await
}

/// Runs every behaviour against a server whose `bob` is driven by `setup`, and returns the logs
/// with timestamps blanked.
async fn run_suite(server: &TestServer) -> BTreeMap<String, Vec<Value>> {
    let admin = server.sdk("admin", None).await;
    let alice = server.sdk("alice", None).await;
    let mut logs = BTreeMap::new();
    for b in BEHAVIOURS {
        let id = format!("parity-{b}");
        let timeout = if b == "overrun" { "700ms" } else { "20s" };
        admin
            .create_conversation(CreateConversationParams {
                conversation_id: Some(id.clone()),
                scenario: Some(scenario(timeout)),
                ..Default::default()
            })
            .await
            .expect("create");
        alice
            .send_message(SendMessageParams {
                conversation_id: id.clone(),
                payload: MessagePayload::text(b),
                finality: Finality::Turn,
                turn_hint: Some(TurnHint { turn: 1 }),
                client_request_id: Some(format!("ask-{b}")),
                after_key: None,
            })
            .await
            .expect("ask");
        let log = wait_finished(&admin, &id).await;
        // Let anything late land before reading the log for good.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let again = log_of(&admin, &id).await;
        // The log only grows: what was read first is still its beginning, unchanged.
        assert_eq!(
            again.get(..log.len()),
            Some(&log[..]),
            "{id}: the log read again does not begin with the one read first"
        );
        logs.insert(
            b.to_string(),
            again
                .into_iter()
                .map(|e| {
                    let mut v = serde_json::to_value(&e).unwrap();
                    v["ts"] = Value::Null;
                    v
                })
                .collect(),
        );
    }
    logs
}

fn internal_bob() -> HashMap<String, Arc<dyn Agent>> {
    let mut m: HashMap<String, Arc<dyn Agent>> = HashMap::new();
    m.insert("bob".into(), Arc::new(Behaviours));
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parity_internal_and_external_executors_write_the_same_log() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    // Inside the server: InternalExecutor + InProcessClient.
    let internal =
        TestServer::with_options(tests::test_limits(), TurnConfig::default(), internal_bob()).await;
    let inside = run_suite(&internal).await;

    // In a partner's process, push-claim: ExternalExecutor + WsJsonRpcClient.
    let push_server = TestServer::start().await;
    let bob: Arc<dyn ExecutorClient> = Arc::new(push_server.sdk("bob", None).await);
    let push = ExternalExecutor::new(bob, Arc::new(Behaviours), Arc::new(ExecutorCore::default()));
    let push_task = tokio::spawn(async move { push.run_push().await });
    let until = tokio::time::Instant::now() + WAIT;
    while push_server
        .running()
        .orchestrator()
        .turns()
        .replicas_of("bob")
        == 0
    {
        assert!(
            tokio::time::Instant::now() < until,
            "the push executor did not register"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pushed = run_suite(&push_server).await;
    push_task.abort();

    // In a partner's process, pull: ExternalExecutor following guidance.
    let pull_server = TestServer::start().await;
    let bob: Arc<dyn ExecutorClient> = Arc::new(pull_server.sdk("bob", None).await);
    let pull = ExternalExecutor::new(bob, Arc::new(Behaviours), Arc::new(ExecutorCore::default()));
    // No wait for it to subscribe: it subscribes, then lists what it takes part in, so a
    // conversation created before, between or after is seen either way.
    let pull_task = tokio::spawn(async move { pull.run_pull().await });
    let pulled = run_suite(&pull_server).await;
    pull_task.abort();

    for b in BEHAVIOURS {
        let (i, p, l) = (&inside[b], &pushed[b], &pulled[b]);
        assert_eq!(i, p, "behaviour {b}: internal and push-claim logs differ");
        assert_eq!(i, l, "behaviour {b}: internal and pull logs differ");
    }
    check_behaviours(&inside);
}

/// The logs say what each behaviour did: a reply between its traces, two progress messages, a
/// yield, tool traces, a retry after a failure, an overrun stopped at the deadline, a close.
fn check_behaviours(inside: &BTreeMap<String, Vec<Value>>) {
    let types = |b: &str| -> Vec<String> {
        inside[b]
            .iter()
            .map(|e| match e["kind"].as_str().unwrap() {
                "message" => format!(
                    "message:{}:{}",
                    e["author"].as_str().unwrap(),
                    e["finality"].as_str().unwrap()
                ),
                _ => format!(
                    "{}:{}",
                    e["kind"].as_str().unwrap(),
                    e["payload"]["type"].as_str().unwrap_or("")
                ),
            })
            .collect()
    };
    assert_eq!(
        types("reply"),
        [
            "system:created",
            "system:next_speaker",
            "message:alice:turn",
            "system:next_speaker",
            "trace:turn_start",
            "message:bob:turn",
            "system:next_speaker",
            "trace:turn_end"
        ]
    );
    assert_eq!(
        types("stream")
            .iter()
            .filter(|t| *t == "message:bob:none")
            .count(),
        2
    );
    assert!(types("yield").ends_with(&["trace:turn_start".into(), "trace:turn_end".into()]));
    assert_eq!(
        inside["yield"].last().unwrap()["payload"]["outcome"],
        "yield"
    );
    assert_eq!(
        types("traces")
            .iter()
            .filter(|t| t.starts_with("trace:tool_"))
            .count(),
        2
    );
    let flaky = types("flaky");
    assert_eq!(
        flaky.iter().filter(|t| *t == "trace:turn_start").count(),
        2,
        "{flaky:?}"
    );
    assert!(flaky.contains(&"trace:turn_error".to_string()));
    // Overrun: the executor stops the agent at the deadline and says so; then the turn timeout
    // (a moment after the deadline) passes the turn on.
    let overrun = types("overrun");
    let err = overrun
        .iter()
        .position(|t| t == "trace:turn_error")
        .expect("turn_error");
    let timeout = overrun
        .iter()
        .position(|t| t == "system:turn_timeout")
        .expect("turn_timeout");
    assert!(err < timeout, "{overrun:?}");
    assert!(inside["overrun"]
        .iter()
        .any(|e| e["payload"]["error"] == "deadline exceeded"));
    assert!(!overrun.iter().any(|t| t.starts_with("message:bob")));
    assert_eq!(
        types("finish")
            .iter()
            .filter(|t| *t == "message:bob:conversation")
            .count(),
        1
    );
}

/// Answers every turn; the last one closes the conversation.
struct Counter {
    turns: u64,
}

#[async_trait]
impl Agent for Counter {
    async fn handle_turn(&self, ctx: &AgentContext) -> Result<TurnOutcome, AgentError> {
        // A little work, so that chaos lands in the middle of turns.
        let pause = rand::rng().random_range(0..3);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let last = ctx.turn >= self.turns;
        let finality = if last {
            Finality::Conversation
        } else {
            Finality::Turn
        };
        ctx.say(format!("answer {}", ctx.turn), finality).await?;
        Ok(if last {
            TurnOutcome::Complete
        } else {
            TurnOutcome::Posted
        })
    }
}

struct Replica {
    client: WsJsonRpcClient,
    task: tokio::task::JoinHandle<()>,
}

async fn replica(server: &TestServer, turns: u64) -> Replica {
    let client = server.sdk("bob", None).await;
    let exec = ExternalExecutor::new(
        Arc::new(client.clone()),
        Arc::new(Counter { turns }),
        Arc::new(ExecutorCore::default()),
    );
    let task = tokio::spawn(async move {
        let _ = exec.run_push().await;
    });
    Replica { client, task }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_claim_replicas_under_chaos_answer_each_turn_exactly_once() {
    const CONVERSATIONS: usize = 20;
    const TURNS: u64 = 50; // 1,000 turns in all
    let config = TurnConfig {
        claim_window: Duration::from_millis(300),
        default_timeout: Duration::from_secs(2),
    };
    let server = TestServer::with_options(tests::test_limits(), config, HashMap::new()).await;
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(replica(&server, TURNS).await);
    }
    let admin = server.sdk("admin", None).await;
    for c in 0..CONVERSATIONS {
        admin
            .create_conversation(CreateConversationParams {
                conversation_id: Some(format!("ha-{c}")),
                scenario: Some(json!({"participants": ["bob"], "policy": {"order": "round_robin"}, "turn": {"timeout": "10s"}})),
                ..Default::default()
            })
            .await
            .expect("create");
    }
    // Chaos: cut a replica's connection, or kill it and start a new one, at random.
    let until = tokio::time::Instant::now() + Duration::from_secs(120);
    let (mut cuts, mut kills) = (0, 0);
    loop {
        let open = admin
            .list_conversations(Default::default())
            .await
            .expect("list")
            .conversations
            .iter()
            .filter(|s| s.status != ConversationStatus::Closed)
            .count();
        if open == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{open} conversations still open"
        );
        let (pick, kill, pause) = {
            let mut rng = rand::rng();
            (
                rng.random_range(0..replicas.len()),
                rng.random_bool(0.4),
                rng.random_range(20..120),
            )
        };
        if kill {
            let old = replicas.swap_remove(pick);
            old.task.abort();
            drop(old.client);
            kills += 1;
            replicas.push(replica(&server, TURNS).await);
        } else {
            replicas[pick].client.cut_connection();
            cuts += 1;
        }
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    for r in &replicas {
        r.task.abort();
    }
    assert!(
        cuts + kills > 5,
        "too little chaos: {cuts} cuts, {kills} kills"
    );
    // Every turn answered once: one bob message per turn, turns 1..=TURNS, the last closing.
    for c in 0..CONVERSATIONS {
        assert_each_turn_answered_once(&admin, &format!("ha-{c}"), TURNS).await;
    }
    let stats = &server.running().orchestrator().turns().stats;
    println!(
        "chaos: {cuts} cuts, {kills} kills; offers {}, re-offers {}, claims {}",
        stats.offers.load(Ordering::Relaxed),
        stats.reoffers.load(Ordering::Relaxed),
        stats.claims.load(Ordering::Relaxed)
    );
}

/// Bob answered each of the first `turns_in_all` turns of `id` exactly once, the last closing
/// the conversation.
async fn assert_each_turn_answered_once(admin: &WsJsonRpcClient, id: &str, turns_in_all: u64) {
    let log = log_of(admin, id).await;
    let answers: Vec<&Event> = log
        .iter()
        .filter(|e| e.kind == EventKind::Message)
        .collect();
    let turns: Vec<u64> = answers.iter().map(|e| e.turn).collect();
    // On failure, the log around the first turn without an answer.
    let missing = (1..=turns_in_all).find(|t| !turns.contains(t)).unwrap_or(0);
    let around: Vec<String> = log
        .iter()
        .filter(|e| e.turn + 2 >= missing && e.turn <= missing + 2)
        .map(|e| {
            format!(
                "{} {:?} {} {} {}",
                e.seq,
                e.kind,
                e.author,
                e.turn,
                e.payload.get()
            )
        })
        .collect();
    assert_eq!(
        turns,
        (1..=turns_in_all).collect::<Vec<_>>(),
        "{id}: turns answered; around turn {missing}:\n{}",
        around.join("\n")
    );
    assert!(answers.iter().all(|e| e.author == "bob"));
    assert_eq!(
        answers.last().unwrap().finality,
        Some(Finality::Conversation)
    );
}

/// Ten tasks appending `n` messages between them to `cut`, each answering its seqs.
fn spawn_writers(
    writer: &agent_sdk::WsJsonRpcClient,
    sent: &Arc<AtomicU64>,
    n: u64,
) -> Vec<tokio::task::JoinHandle<Vec<u64>>> {
    (0..10)
        .map(|w| {
            let (writer, sent) = (writer.clone(), sent.clone());
            tokio::spawn(async move {
                let mut seqs = Vec::new();
                for i in 0..n / 10 {
                    let r = writer
                        .send_message(SendMessageParams {
                            conversation_id: "cut".into(),
                            payload: MessagePayload::text(format!("w{w} m{i}")),
                            finality: Finality::None,
                            turn_hint: None,
                            client_request_id: None,
                            after_key: None,
                        })
                        .await
                        .expect("append survives the cuts");
                    sent.fetch_add(1, Ordering::Relaxed);
                    seqs.push(r.seq);
                }
                seqs
            })
        })
        .collect()
}

/// Cuts every connection through `proxy` every 2 ms until the writers are done; the number of
/// connections cut. A machine too slow to reconnect and answer within 2 ms would never see an
/// append through, so after 50 cuts in a row with no append answered the proxy holds off until
/// one is.
async fn cut_until_done(
    proxy: &Proxy,
    writers: &[tokio::task::JoinHandle<Vec<u64>>],
    sent: &AtomicU64,
    n: u64,
) -> usize {
    let mut cuts = 0;
    let (mut seen, mut fruitless) = (0, 0);
    let until = tokio::time::Instant::now() + Duration::from_secs(120);
    while !writers.iter().all(|w| w.is_finished()) {
        let now = sent.load(Ordering::Relaxed);
        assert!(
            tokio::time::Instant::now() < until,
            "appends stalled at {now} of {n}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
        if now > seen {
            (seen, fruitless) = (now, 0);
        } else if fruitless >= 50 {
            continue;
        }
        fruitless += 1;
        cuts += proxy.cut();
    }
    cuts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ws_client_resumes_across_cut_connections_with_no_gap_duplicate_or_double_append() {
    const N: u64 = 300;
    let server = TestServer::start().await;
    server.create("cut", &["alice", "bob"]).await;
    let proxy = Proxy::start(server.running().local_addr()).await;
    let watcher = server.sdk("alice", Some(proxy.rpc_url())).await;
    let writer = server.sdk("bob", Some(proxy.rpc_url())).await;
    let mut events = watcher
        .subscribe(SubscribeParams {
            conversation_id: Some("cut".into()),
            since_seq: Some(0),
            cursors: None,
        })
        .await
        .expect("subscribe");
    let mut everything = watcher
        .subscribe(SubscribeParams::default())
        .await
        .expect("subscribe all");

    // Ten writers append concurrently while the proxy cuts every connection every 2 ms, often
    // while a reconnected client is still subscribing again and re-sending its calls.
    let sent = Arc::new(AtomicU64::new(0));
    let writers = spawn_writers(&writer, &sent, N);
    let cuts = cut_until_done(&proxy, &writers, &sent, N).await;
    let mut seqs = Vec::new();
    for w in writers {
        seqs.extend(w.await.unwrap());
    }
    seqs.sort();
    seqs.dedup();
    assert_eq!(seqs.len() as u64, N, "every append has its own seq");
    assert!(cuts > 0);
    assert!(writer.stats().reconnects.load(Ordering::Relaxed) > 0);
    assert!(
        writer.stats().resent.load(Ordering::Relaxed) > 0,
        "no call was in flight at a cut"
    );

    // The log holds each message once.
    let admin = server.sdk("admin", None).await;
    let log = log_of(&admin, "cut").await;
    let messages = log.iter().filter(|e| e.kind == EventKind::Message).count() as u64;
    assert_eq!(messages, N, "no double append");
    let head = log.last().unwrap().seq;

    // Both subscriptions saw 1..=head in order, once each, across the cuts.
    for (name, stream) in [
        ("one conversation", &mut events),
        ("every conversation", &mut everything),
    ] {
        let mut expected = if name == "one conversation" { 1 } else { 0 };
        if expected == 0 {
            // Subscribed "from now" after the conversation was created: starts after its head then.
            expected = 2;
        }
        while expected <= head {
            let n = tokio::time::timeout(WAIT, stream.next())
                .await
                .expect("event in time")
                .expect("stream open");
            assert_eq!(n.event.seq, expected, "{name}: gap or duplicate");
            expected += 1;
        }
    }
    println!(
        "{cuts} connections cut; writer: {} reconnects, {} calls sent again; watcher dropped {} replayed events",
        writer.stats().reconnects.load(Ordering::Relaxed),
        writer.stats().resent.load(Ordering::Relaxed),
        watcher.stats().duplicates_dropped.load(Ordering::Relaxed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_wait_outlives_a_cut_connection_and_sees_the_change() {
    let server = TestServer::start().await;
    server.create("wait", &["alice", "bob"]).await;
    let proxy = Proxy::start(server.running().local_addr()).await;
    let alice = server.sdk("alice", Some(proxy.rpc_url())).await;
    let head = alice
        .get_conversation("wait")
        .await
        .expect("snapshot")
        .latest_seq;
    let waiting = tokio::spawn({
        let alice = alice.clone();
        async move {
            alice
                .wait_for_change(WaitForChangeParams {
                    conversation_id: "wait".into(),
                    since_seq: head,
                    timeout_ms: 30_000,
                })
                .await
        }
    });
    // Cut while the wait is parked on the server, then post once the client has sent it again.
    server.wait_for_waiters("wait", 1).await;
    assert!(proxy.cut() > 0);
    tests::eventually("the wait is sent again", || {
        alice.stats().resent.load(Ordering::Relaxed) > 0
    })
    .await;
    let bob = server.sdk("bob", None).await;
    bob.send_message(SendMessageParams {
        conversation_id: "wait".into(),
        payload: MessagePayload::text("now"),
        finality: Finality::None,
        turn_hint: None,
        client_request_id: None,
        after_key: None,
    })
    .await
    .expect("post");
    let r = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("the wait ends")
        .unwrap()
        .expect("wait");
    assert!(!r.timed_out);
    assert_eq!(r.latest_seq, head + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_executor_across_cut_connections_misses_no_turn_and_takes_none_twice() {
    const ROUNDS: u64 = 30;
    let server = TestServer::start().await;
    let proxy = Proxy::start(server.running().local_addr()).await;
    let bob = server.sdk("bob", Some(proxy.rpc_url())).await;
    let exec = ExternalExecutor::new(
        Arc::new(bob.clone()),
        Arc::new(Behaviours),
        Arc::new(ExecutorCore::default()),
    );
    // Subscribed or not yet, it finds the conversation (see the parity test).
    let pull = tokio::spawn(async move { exec.run_pull().await });
    let admin = server.sdk("admin", None).await;
    admin
        .create_conversation(CreateConversationParams {
            conversation_id: Some("pull-cuts".into()),
            scenario: Some(scenario("20s")),
            ..Default::default()
        })
        .await
        .expect("create");
    let alice = server.sdk("alice", None).await;
    for round in 0..ROUNDS {
        let turn = 1 + 2 * round;
        alice
            .send_message(SendMessageParams {
                conversation_id: "pull-cuts".into(),
                payload: MessagePayload::text("reply"),
                finality: Finality::Turn,
                turn_hint: Some(TurnHint { turn }),
                client_request_id: Some(format!("ask-{round}")),
                after_key: None,
            })
            .await
            .expect("ask");
        // Cut bob's connection at a different moment of most turns: before he hears of it,
        // while he answers, or as his answer lands.
        if round % 3 != 2 {
            let pause = rand::rng().random_range(0..4);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            proxy.cut();
        }
        // Bob's reply hands the turn back to alice.
        let until = tokio::time::Instant::now() + WAIT;
        loop {
            let s = alice.get_conversation("pull-cuts").await.expect("snapshot");
            if s.turn > turn + 1 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < until,
                "turn {} was not answered",
                turn + 1
            );
            let _ = alice
                .wait_for_change(WaitForChangeParams {
                    conversation_id: "pull-cuts".into(),
                    since_seq: s.latest_seq,
                    timeout_ms: 200,
                })
                .await;
        }
    }
    pull.abort();
    let log = log_of(&admin, "pull-cuts").await;
    let replies: Vec<u64> = log
        .iter()
        .filter(|e| e.kind == EventKind::Message && e.author == "bob")
        .map(|e| e.turn)
        .collect();
    assert_eq!(
        replies,
        (1..=ROUNDS).map(|r| 2 * r).collect::<Vec<_>>(),
        "one reply per turn of bob's"
    );
    let starts = log
        .iter()
        .filter(|e| e.kind == EventKind::Trace && e.payload_value()["type"] == "turn_start")
        .count() as u64;
    assert_eq!(starts, ROUNDS, "each turn was taken once");
    assert!(
        bob.stats().reconnects.load(Ordering::Relaxed) > 0,
        "no connection was cut"
    );
}
