//! Turn latency: from a turn being assigned (the commit of the message that closes the previous
//! turn, with its `next_speaker` decision) to the agent's reply being committed.
//!
//! Three ways the same agent takes its turns, measured one after the other in one run:
//! - in-process: InternalExecutor + InProcessClient inside the server;
//! - push-claim: ExternalExecutor over WebSocket (`request_turn` → `claimTurn` → reply);
//! - pull: ExternalExecutor over WebSocket following guidance on its subscription.
//!
//! Each executor runs the full executor core (a `turn_start` trace, the agent, the reply, a
//! `turn_end` trace), so each turn commits at least two transactions. The driver is in-process
//! and watches the conversation's committed state, so the figures are the server's.
//!
//! ```sh
//! cargo bench --workspace --bench turns      # BENCH_TURNS (default 400), BENCH_SYNC=full|normal
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sdk::proto::*;
use agent_sdk::{
    async_trait, Agent, AgentContext, AgentError, TurnOutcome, WsConfig, WsJsonRpcClient,
};
use executors::{ExecutorCore, ExternalExecutor};
use orchestrator::engine::auth::{create_token, Identity};
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous};
use orchestrator::transport::server;
use serde_json::json;

/// The allocator the server binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Reply;

#[async_trait]
impl Agent for Reply {
    async fn handle_turn(&self, ctx: &AgentContext) -> Result<TurnOutcome, AgentError> {
        ctx.say(format!("answer {}", ctx.turn), Finality::Turn)
            .await?;
        Ok(TurnOutcome::Posted)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    InProcess,
    Push,
    Pull,
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p) as usize]
}

async fn measure(mode: Mode, turns: usize, sync: Synchronous) -> anyhow::Result<Vec<f64>> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(dir.path().join("turns.db"), sync)?);
    let bob_token = create_token(store.as_ref(), "bob", false)?;
    let mut options = orchestrator::host::Options::default();
    // A benchmark appends far past a partner's default budget of bytes.
    options.limits.max_append_bytes_per_minute = 0;
    if mode == Mode::InProcess {
        options.agents.insert("bob".into(), Arc::new(Reply));
    }
    let orch = options.start(store)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let running = server::start(orch.clone(), listener).await?;
    let mut task = None;
    if mode != Mode::InProcess {
        let client = WsJsonRpcClient::connect(WsConfig::new(running.rpc_url(), bob_token))
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let exec = ExternalExecutor::new(
            Arc::new(client),
            Arc::new(Reply),
            Arc::new(ExecutorCore::default()),
        );
        task = Some(tokio::spawn(async move {
            let _ = if mode == Mode::Push {
                exec.run_push().await
            } else {
                exec.run_pull().await
            };
        }));
        if mode == Mode::Push {
            while orch.turns().replicas_of("bob") == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let admin = Identity::new("admin", true);
    let alice = Identity::new("alice", false);
    orch.create_conversation(
        &admin,
        CreateConversationParams {
            conversation_id: Some("bench".into()),
            scenario: Some(json!({"participants": ["alice", "bob"], "policy": {"order": "round_robin", "first": "alice"}})),
            ..Default::default()
        },
    )
    .await?;
    let conv = orch
        .hub()
        .get("bench")
        .ok_or_else(|| anyhow::anyhow!("no conversation"))?;
    let mut lat = Vec::with_capacity(turns);
    for i in 0..turns + 20 {
        let core = conv.core();
        let mut head = conv.watch();
        let sent = orch
            .send_message(
                &alice,
                SendMessageParams {
                    conversation_id: "bench".into(),
                    payload: MessagePayload::text(format!("question {i}")),
                    finality: Finality::Turn,
                    turn_hint: Some(TurnHint { turn: core.turn }),
                    client_request_id: None,
                    after_key: None,
                },
            )
            .await?;
        let assigned = Instant::now();
        let reply_turn = sent.turn + 1;
        // The reply is committed when the turn after bob's begins (alice's again).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let c = conv.core();
            if c.turn > reply_turn {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "no reply to turn {reply_turn}");
            let _ = tokio::time::timeout(Duration::from_millis(100), head.changed()).await;
        }
        if i >= 20 {
            lat.push(assigned.elapsed().as_secs_f64() * 1e3);
        }
        // Let the executor's closing trace land before the next question.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    if let Some(t) = task {
        t.abort();
    }
    running.stop().await;
    Ok(lat)
}

fn main() -> anyhow::Result<()> {
    let turns: usize = std::env::var("BENCH_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let modes = match std::env::var("BENCH_SYNC").as_deref() {
        Ok("normal") => vec![Synchronous::Normal],
        Ok("full") => vec![Synchronous::Full],
        _ => vec![Synchronous::Full, Synchronous::Normal],
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        println!(
            "turn latency: {turns} turns per mode (after 20 warm-up), one conversation, 127.0.0.1, {} cores",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
        for sync in modes {
            println!(
                "synchronous={}:",
                if sync == Synchronous::Full { "FULL (the default)" } else { "NORMAL" }
            );
            let mut inproc = measure(Mode::InProcess, turns, sync).await?;
            let mut push = measure(Mode::Push, turns, sync).await?;
            let mut pull = measure(Mode::Pull, turns, sync).await?;
            let base = percentile(&mut inproc, 0.5);
            for (name, lat) in [
                ("in-process", &mut inproc),
                ("push-claim (WebSocket)", &mut push),
                ("pull (WebSocket)", &mut pull),
            ] {
                let p50 = percentile(lat, 0.5);
                let p99 = percentile(lat, 0.99);
                println!(
                    "  {name:<24} p50 {p50:>6.2} ms  p99 {p99:>6.2} ms  ({:.2}x in-process p50)",
                    p50 / base
                );
            }
        }
        println!("goal: push-claim p50 <= 1 ms");
        Ok(())
    })
}
