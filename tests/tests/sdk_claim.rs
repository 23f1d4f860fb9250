//! The Rust SDK's side of the client scenario every SDK's suite runs (the Python and TypeScript
//! suites have the same): a claim lost to another replica through a proxy that cuts.

use std::sync::{Arc, Mutex};

use agent_sdk::proto::*;
use agent_sdk::{async_trait, Agent, AgentClient, AgentContext, AgentError, TurnOutcome};
use executors::{ExecutorCore, ExternalExecutor};
use serde_json::json;
use tests::proxy::Proxy;
use tests::{TestServer, WAIT};

/// Posts progress, waits for its gate (open when `None`), then answers its turn.
struct Gated {
    gate: Option<Arc<tokio::sync::Notify>>,
    ran: Mutex<Vec<u64>>,
    /// Set once an attempt's answer has been sent (whatever came back).
    answered: tokio::sync::watch::Sender<bool>,
}

impl Gated {
    fn new(gate: Option<Arc<tokio::sync::Notify>>) -> Arc<Gated> {
        Arc::new(Gated {
            gate,
            ran: Mutex::default(),
            answered: tokio::sync::watch::Sender::new(false),
        })
    }
}

#[async_trait]
impl Agent for Gated {
    async fn handle_turn(&self, ctx: &AgentContext) -> Result<TurnOutcome, AgentError> {
        if let Ok(mut ran) = self.ran.lock() {
            ran.push(ctx.turn);
        }
        ctx.say(format!("working on turn {}", ctx.turn), Finality::None)
            .await?;
        if let Some(gate) = &self.gate {
            gate.notified().await;
        }
        let answer = ctx
            .say(format!("answer to turn {}", ctx.turn), Finality::Turn)
            .await;
        self.answered.send_replace(true);
        answer?;
        Ok(TurnOutcome::Posted)
    }
}

/// The messages of `log` by `author` that closed a turn: (turn, text).
fn replies(log: &[Event], author: &str) -> Vec<(u64, String)> {
    log.iter()
        .filter(|e| e.author == author && e.finality == Some(Finality::Turn))
        .map(|e| {
            let text = e.payload_value()["text"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            (e.turn, text)
        })
        .collect()
}

/// Waits until `done` holds for `admin`'s view of `id`'s log (at most [`WAIT`]).
async fn until_log(admin: &dyn AgentClient, id: &str, what: &str, done: impl Fn(&[Event]) -> bool) {
    tests::log_until(admin, id, what, done).await;
}

/// Replica A, behind a proxy, claims bob's turn and posts progress; the proxy cuts it off; the
/// turn is offered to replica B, which answers. A then finishes its attempt after its
/// reconnect: its writes are B's (same keys, same bodies) and land nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lost_to_another_replica_through_a_cut_lands_one_reply() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    admin
        .create_conversation(CreateConversationParams {
            conversation_id: Some("lost".into()),
            scenario: Some(json!({"participants": ["alice", "bob"],
                "policy": {"order": "round_robin"}, "turn": {"timeout": "30s"}})),
            ..Default::default()
        })
        .await
        .expect("create");
    let proxy = Proxy::start(server.running().local_addr()).await;
    let gate = Arc::new(tokio::sync::Notify::new());
    let a_agent = Gated::new(Some(gate.clone()));
    let a_client = server.sdk("bob", Some(proxy.rpc_url())).await;
    let a = ExternalExecutor::new(
        Arc::new(a_client.clone()),
        a_agent.clone(),
        Arc::new(ExecutorCore::default()),
    );
    let a_task = tokio::spawn(async move {
        let _ = a.run_push().await;
    });
    let alice = server.sdk("alice", None).await;
    alice
        .send_message(SendMessageParams {
            conversation_id: "lost".into(),
            payload: MessagePayload::text("q0"),
            finality: Finality::Turn,
            turn_hint: None,
            client_request_id: Some("q0".into()),
            after_key: None,
        })
        .await
        .expect("alice's turn");
    until_log(&admin, "lost", "replica A starting the turn", |log| {
        log.iter().any(|e| e.finality == Some(Finality::None))
    })
    .await;

    let b_agent = Gated::new(None);
    let b = ExternalExecutor::new(
        Arc::new(server.sdk("bob", None).await),
        b_agent.clone(),
        Arc::new(ExecutorCore::default()),
    );
    let b_task = tokio::spawn(async move {
        let _ = b.run_push().await;
    });
    // A loses its connection while it holds the claim.
    assert!(
        proxy.cut() > 0,
        "replica A's connection goes through the proxy"
    );
    until_log(&admin, "lost", "replica B answering", |log| {
        !replies(log, "bob").is_empty()
    })
    .await;
    assert_eq!(
        *b_agent.ran.lock().unwrap(),
        [2],
        "replica B took the turn A lost"
    );

    // A's attempt goes on, over its new connection: its answer is sent and answered.
    gate.notify_one();
    tokio::time::timeout(WAIT, a_agent.answered.subscribe().wait_for(|a| *a))
        .await
        .expect("replica A's attempt answers")
        .expect("the flag");
    assert_eq!(*a_agent.ran.lock().unwrap(), [2]);
    let log = tests::full_log(&admin, "lost").await;
    assert_eq!(
        replies(&log, "bob"),
        [(2, "answer to turn 2".to_string())],
        "one reply"
    );
    let progress: Vec<_> = log
        .iter()
        .filter(|e| e.finality == Some(Finality::None))
        .map(|e| e.payload_value()["text"].clone())
        .collect();
    assert_eq!(progress, [json!("working on turn 2")]);
    a_task.abort();
    b_task.abort();
}
