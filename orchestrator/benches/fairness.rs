//! One client's latency while another floods the server or hoards sockets, side by side with
//! the same client alone, in one run (a flood must not raise another client's p99
//! beyond 2×).
//!
//! ```text
//! cargo bench --workspace --bench fairness
//! BENCH_ROUNDS=3 BENCH_CALLS=3000 BENCH_FLOOD_CONNS=8 BENCH_HOARD=1000 cargo bench --workspace --bench fairness
//! ```
//! A `calm` client makes `BENCH_CALLS` calls, one a millisecond (`getConversation`, a read that
//! touches the state and the wire and not the disk) and times each, in three phases per round:
//! alone; while `flood` (another identity) keeps `BENCH_FLOOD_CONNS` connections each with 32
//! calls in flight as fast as answers come back (the server's default rate per identity
//! refuses most of them); and while `hoard` holds `BENCH_HOARD` authenticated idle connections
//! (opened before the phase). The server runs with its default limits (but room for the
//! hoarder's connections); clients and server share the machine's two cores.
//!
//! The flood comes from a process of its own (this binary again, with `FAIRNESS_FLOOD` set), as
//! a flooding client would: in the server's process its tasks would queue in the same runtime
//! as the server's and the calm client's, and the bench would measure the clients' scheduling
//! as much as the server's. `BENCH_FLOOD_IN_PROCESS=1` runs it in process instead (as figures
//! before 2026-11-25 were measured).

mod common;
use common::{env, median};
#[path = "common/raw_ws.rs"]
mod raw_ws;
use raw_ws::{text_frame, Frame, RawWs};

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use orchestrator::engine::auth::create_token;
use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous};
use orchestrator::transport::server;
use serde_json::json;

/// What the calm client saw in one phase: p50 and p99 in milliseconds.
#[derive(Debug, Clone, Copy)]
struct Seen {
    p50: f64,
    p99: f64,
}

/// The calm client's calls, one a millisecond (half its rate), timed one by one.
async fn calm(ws: &mut RawWs, calls: u64, first_id: u64) -> Seen {
    let mut lat = Vec::with_capacity(calls as usize);
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0..calls {
        tick.tick().await;
        let t = Instant::now();
        ws.call(
            first_id + i,
            "getConversation",
            json!({"conversationId": "conv-0"}),
        )
        .await;
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    Seen {
        p50: at(0.50),
        p99: at(0.99),
    }
}

/// One flooding connection: 32 calls in flight, each answer replaced at once, until `stop`.
async fn flood(
    mut ws: RawWs,
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
) {
    const DEPTH: usize = 32;
    let mut frame = Vec::new();
    let req = json!({"jsonrpc": "2.0", "id": 7, "method": "getConversation", "params": {"conversationId": "conv-0"}})
        .to_string();
    let mut burst = Vec::new();
    for _ in 0..DEPTH {
        text_frame(&mut burst, req.as_bytes());
    }
    if ws.write(&burst).await.is_err() {
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        // One frame read, then every frame already read with it: each is replaced in one write.
        frame.clear();
        let mut next = Some(ws.next_frame().await);
        while let Some(f) = next {
            match f {
                Frame::Text(r) => {
                    let counter = if memchr::memmem::find(ws.text(r), b"-32029").is_some() {
                        &refused
                    } else {
                        &answered
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    text_frame(&mut frame, req.as_bytes());
                }
                Frame::Other => {}
                Frame::Closed => return,
            }
            next = ws.buffered_frame();
        }
        if !frame.is_empty() && ws.write(&frame).await.is_err() {
            return;
        }
    }
}

/// A flood running while the calm client measures: in a process of its own, or in this one.
enum Flood {
    Process(std::process::Child),
    InProcess {
        stop: Arc<AtomicBool>,
        tasks: Vec<tokio::task::JoinHandle<()>>,
        counts: (Arc<AtomicU64>, Arc<AtomicU64>),
    },
}

impl Flood {
    /// Starts `conns` flooding connections as `token`; returns once they are all connected.
    async fn start(addr: &str, token: &str, conns: u64, in_process: bool) -> anyhow::Result<Flood> {
        if in_process {
            let stop = Arc::new(AtomicBool::new(false));
            let counts = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            let mut tasks = Vec::new();
            for _ in 0..conns {
                let c = RawWs::connect(addr, token).await;
                tasks.push(tokio::spawn(flood(
                    c,
                    stop.clone(),
                    counts.0.clone(),
                    counts.1.clone(),
                )));
            }
            return Ok(Flood::InProcess {
                stop,
                tasks,
                counts,
            });
        }
        use std::io::BufRead;
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .env("FAIRNESS_FLOOD", format!("{addr} {token} {conns}"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let out = child.stdout.as_mut().expect("piped");
        let mut line = String::new();
        // Blocking this worker only: the server goes on on the other.
        tokio::task::block_in_place(|| std::io::BufReader::new(out).read_line(&mut line))?;
        anyhow::ensure!(line.trim() == "ready", "the flood process said {line:?}");
        Ok(Flood::Process(child))
    }

    /// Stops the flood: how many of its calls were answered and refused.
    async fn stop(self) -> anyhow::Result<(u64, u64)> {
        match self {
            Flood::InProcess {
                stop,
                tasks,
                counts,
            } => {
                stop.store(true, Ordering::Relaxed);
                for t in tasks {
                    t.abort();
                }
                Ok((
                    counts.0.load(Ordering::Relaxed),
                    counts.1.load(Ordering::Relaxed),
                ))
            }
            Flood::Process(mut child) => {
                // Its stdin closing is the signal to stop and report.
                drop(child.stdin.take());
                let out = tokio::task::block_in_place(|| child.wait_with_output())?;
                let text = String::from_utf8_lossy(&out.stdout);
                let mut n = text.split_whitespace().map(|w| w.parse::<u64>());
                match (n.next(), n.next()) {
                    (Some(Ok(a)), Some(Ok(r))) => Ok((a, r)),
                    _ => anyhow::bail!("the flood process reported {text:?}"),
                }
            }
        }
    }
}

/// The flood process: `FAIRNESS_FLOOD` is `ADDR TOKEN CONNECTIONS`. Says `ready` once every
/// connection is made, floods until its stdin closes, then says how many calls were answered
/// and refused.
fn flood_process(spec: &str) -> anyhow::Result<()> {
    let mut parts = spec.split_whitespace();
    let (Some(addr), Some(token), Some(conns)) = (parts.next(), parts.next(), parts.next()) else {
        anyhow::bail!("FAIRNESS_FLOOD: ADDR TOKEN CONNECTIONS, not {spec:?}");
    };
    let conns: u64 = conns.parse()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let flood = Flood::start(addr, token, conns, true).await?;
        println!("ready");
        // Until the parent closes our stdin.
        tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
        })
        .await?;
        let (a, r) = flood.stop().await?;
        println!("{a} {r}");
        anyhow::Ok(())
    })
}

fn main() -> anyhow::Result<()> {
    if let Ok(spec) = std::env::var("FAIRNESS_FLOOD") {
        return flood_process(&spec);
    }
    let in_process = std::env::var_os("BENCH_FLOOD_IN_PROCESS").is_some();
    let rounds = env("BENCH_ROUNDS", 3);
    let calls = env("BENCH_CALLS", 3000);
    let flood_conns = env("BENCH_FLOOD_CONNS", 8);
    let hoard = env("BENCH_HOARD", 1000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(SqliteStore::open(dir.path().join("fair.db"), Synchronous::Full)?);
        // calm, flood and hoard: the participants of the conversation made below.
        let tokens: Vec<String> = ["agent-0", "agent-1", "agent-2"]
            .iter()
            .map(|a| create_token(store.as_ref(), a, false))
            .collect::<Result<_, _>>()?;
        let limits = Limits {
            max_connections: (hoard as u32 + flood_conns as u32 + 64).max(1024),
            max_connections_per_address: u32::MAX,
            max_connections_per_agent: u32::MAX,
            max_append_bytes_per_minute: 0,
            ..Limits::default()
        };
        println!(
            "fairness: {calls} calls by one client per phase; flood: {flood_conns} connections × 32 in flight ({}); hoard: {hoard} idle connections; rate limit {} a second, bursts of {}",
            if in_process { "in this process" } else { "in a process of its own" },
            limits.rate_per_identity, limits.rate_burst
        );
        let orch = Orchestrator::open(store, limits)?;
        common::create_conversations(std::slice::from_ref(&orch), 1, 3).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let running = server::start(orch.clone(), listener).await?;
        let addr = running.local_addr().to_string();
        let mut ws = RawWs::connect(&addr, &tokens[0]).await;
        let mut ids = 10u64;
        let mut ratios = (Vec::new(), Vec::new());
        for round in 0..rounds {
            // Alone.
            let alone = calm(&mut ws, calls, ids).await;
            ids += calls;
            // Beside a flood.
            let flooding = Flood::start(&addr, &tokens[1], flood_conns, in_process).await?;
            let started = Instant::now();
            let flooded = calm(&mut ws, calls, ids).await;
            ids += calls;
            let secs = started.elapsed().as_secs_f64();
            let (a, r) = flooding.stop().await?;
            // Beside a hoard of idle connections.
            let mut held = Vec::with_capacity(hoard as usize);
            for _ in 0..hoard {
                held.push(RawWs::connect(&addr, &tokens[2]).await);
            }
            let hoarded = calm(&mut ws, calls, ids).await;
            ids += calls;
            drop(held);
            let (fr, hr) = (flooded.p99 / alone.p99, hoarded.p99 / alone.p99);
            println!(
                "round {round}: alone p50 {:.3} ms p99 {:.3} ms | flood p50 {:.3} p99 {:.3} ({fr:.2}×; the flood: {:.0} answered/s, {:.0} refused/s) | {hoard} idle sockets p50 {:.3} p99 {:.3} ({hr:.2}×)",
                alone.p50, alone.p99, flooded.p50, flooded.p99, a as f64 / secs, r as f64 / secs, hoarded.p50, hoarded.p99
            );
            ratios.0.push(fr);
            ratios.1.push(hr);
            // Let the flood's leftovers drain before the next round.
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        println!(
            "median over {rounds} rounds: calm p99 beside a flood {:.2}× alone, beside {hoard} idle sockets {:.2}× (goal <= 2×)",
            median(ratios.0),
            median(ratios.1)
        );
        running.stop().await;
        anyhow::Ok(())
    })
}
