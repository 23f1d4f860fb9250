//! Acknowledged durable appends per second: in-process and over WebSocket, beside the raw
//! rusqlite ceiling measured in the same run.
//!
//! ```text
//! cargo bench --workspace --bench appends
//! BENCH_SECS=10 BENCH_CLIENTS=64 BENCH_DEPTH=16 cargo bench --workspace --bench appends
//! ```
//! Every phase uses `synchronous=FULL` (each acknowledged append survives power loss) and
//! ~300-byte payloads; the load spreads over 1,000 conversations. Each round measures the
//! ceiling right before and right after the in-process phase, and the ratio uses their mean.
//!
//! The WebSocket phase runs twice. Its goal line is driven by minimal clients (raw frames,
//! pipelined: each burst of answers is read in one call and its replacements sent in one write),
//! the way a load generator such as wrk is built, so that the two cores measure the server
//! rather than the clients beside it. The second line uses jsonrpsee's `WsClient`, whose
//! per-request work (a request future, a timeout timer on its own thread, a write per request)
//! costs the shared cores about as much as the server's. Beside them, the WebSocket reference:
//! the same raw-frame clients, load and frames on a bare WebSocket server that answers each
//! request at once (`common/echo_ws.rs`: no orchestrator); the goal compares the orchestrator's
//! appends with its round trips. `BENCH_ONLY=in-process`, `websocket`, `websocket-jsonrpsee`,
//! `ceiling` or `echo` runs one phase alone (for profiling). Each agent's budget of bytes appended
//! is off unless `BENCH_BUDGET` names one (bytes a minute; one too large to be spent measures
//! what the budget's bookkeeping costs each append).

mod common;
use common::{env, median, settle};
#[path = "common/echo_ws.rs"]
mod echo_ws;
#[path = "common/raw_ws.rs"]
mod raw_ws;
use raw_ws::{text_frame, Frame, RawWs};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonrpsee::core::client::ClientT;
use jsonrpsee::core::traits::ToRpcParams;
use jsonrpsee::ws_client::WsClientBuilder;
use orchestrator::engine::auth::{create_token, Identity};
use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous};
use orchestrator::transport::server;
use proto_spec::{Finality, MessagePayload, SendMessageParams};
use serde_json::{json, Value};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONVERSATIONS: usize = 1000;

/// Latency is sampled on one request in this many, to keep the clients' own cost down.
const SAMPLE: usize = 16;

fn conversation_ids() -> Arc<Vec<String>> {
    Arc::new((0..CONVERSATIONS).map(|i| format!("conv-{i}")).collect())
}

fn text() -> String {
    "lorem ipsum dolor sit amet, consectetur adipiscing elit ".repeat(5)[..280].to_string()
}

struct P(Value);
impl ToRpcParams for P {
    fn to_rpc_params(self) -> Result<Option<Box<serde_json::value::RawValue>>, serde_json::Error> {
        serde_json::value::to_raw_value(&self.0).map(Some)
    }
}

/// Raw rusqlite: 1,000-row transactions at FULL, ~300-byte rows. With `indexed`, the rows also
/// go into a (conv, seq) index spread over 1,000 conversations (the first schema's design).
fn raw_ceiling(dir: &std::path::Path, db: &str, secs: f64, indexed: bool) -> anyhow::Result<f64> {
    let conn = rusqlite::Connection::open(dir.join(db))?;
    // The same page size as the log's, so that the ratio compares like with like.
    conn.pragma_update(
        None,
        "page_size",
        orchestrator::engine::store::sqlite::PAGE_SIZE,
    )?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch(
        "CREATE TABLE rows (id INTEGER PRIMARY KEY, conv INTEGER, seq INTEGER, payload TEXT)",
    )?;
    if indexed {
        conn.execute_batch("CREATE UNIQUE INDEX rows_by_seq ON rows (conv, seq)")?;
    }
    let payload = json!({"text": text()}).to_string();
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        let tx = conn.unchecked_transaction()?;
        {
            let mut st =
                tx.prepare_cached("INSERT INTO rows (conv, seq, payload) VALUES (?1, ?2, ?3)")?;
            for i in 0..1000u64 {
                let k = n + i;
                st.execute(rusqlite::params![
                    (k * 7919) as i64 % 1000,
                    k as i64,
                    payload
                ])?;
            }
        }
        tx.commit()?;
        n += 1000;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

struct Phase {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    mean_batch: f64,
}

fn percentile(lat: &mut [f64], p: f64) -> f64 {
    if lat.is_empty() {
        return 0.0;
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    lat[((lat.len() as f64 - 1.0) * p) as usize]
}

async fn setup(
    dir: &std::path::Path,
    name: &str,
    clients: usize,
) -> anyhow::Result<(Arc<Orchestrator>, Vec<String>)> {
    let store = Arc::new(SqliteStore::open(dir.join(name), Synchronous::Full)?);
    let mut tokens = Vec::new();
    for c in 0..clients {
        tokens.push(create_token(store.as_ref(), &format!("agent-{c}"), false)?);
    }
    let limits = Limits {
        max_connections: 4096,
        max_connections_per_address: 4096,
        max_connections_per_agent: 4096,
        max_append_bytes_per_minute: env("BENCH_BUDGET", 0),
        // The server's own rate per identity (0: none); with fewer clients than the default
        // 64, each is over it.
        rate_per_identity: env("BENCH_RATE", u64::from(Limits::default().rate_per_identity)) as u32,
        ..Limits::default()
    };
    let orch = Orchestrator::open(store, limits)?;
    common::create_conversations(std::slice::from_ref(&orch), CONVERSATIONS, clients).await?;
    Ok((orch, tokens))
}

fn summarize(
    orch: &Orchestrator,
    done: u64,
    elapsed: f64,
    mut lat: Vec<f64>,
    before: (u64, u64),
) -> Phase {
    let stats = &orch.writer().stats;
    let batches = stats.batches.load(Ordering::Relaxed) - before.0;
    let events = stats.events.load(Ordering::Relaxed) - before.1;
    Phase {
        rate: done as f64 / elapsed,
        p50_ms: percentile(&mut lat, 0.50),
        p99_ms: percentile(&mut lat, 0.99),
        mean_batch: events as f64 / batches.max(1) as f64,
    }
}

/// Runs `clients` clients for `secs`, each keeping `depth` appends in flight (as `depth` tasks
/// that each wait for their answer before the next append); `append(c, i)` makes client `c`'s
/// `i`-th append. Returns how many were acknowledged, the elapsed time and sampled latencies in
/// milliseconds.
async fn drive<F, Fut>(secs: f64, clients: usize, depth: usize, append: F) -> (u64, f64, Vec<f64>)
where
    F: Fn(usize, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        for lane in 0..depth {
            let (stop, append) = (stop.clone(), append.clone());
            tasks.push(tokio::spawn(async move {
                // Counted per task (a shared counter would be a contended cache line on every
                // append); only answers that arrive before the stop count.
                let (mut done, mut lat) = (0u64, Vec::new());
                let mut i = lane;
                while !stop.load(Ordering::Relaxed) {
                    let t = (i / depth).is_multiple_of(SAMPLE).then(Instant::now);
                    if let Err(e) = append(c, i).await {
                        panic!("append failed: {e}");
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    lat.extend(t.map(|t| t.elapsed().as_secs_f64() * 1e3));
                    done += 1;
                    i += depth;
                }
                (done, lat)
            }));
        }
    }
    run_for(secs, start, &stop, tasks).await
}

/// Lets `tasks` (the clients, started at `start`) run until `secs` have passed, tells them to
/// stop, and sums what they report: acknowledged appends and sampled latencies.
async fn run_for(
    secs: f64,
    start: Instant,
    stop: &AtomicBool,
    tasks: Vec<tokio::task::JoinHandle<(u64, Vec<f64>)>>,
) -> (u64, f64, Vec<f64>) {
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let (mut n, mut lat) = (0, Vec::new());
    for t in tasks {
        let (done, l) = t.await.expect("a client failed");
        n += done;
        lat.extend(l);
    }
    (n, elapsed, lat)
}

/// The conversation of client `c`'s `i`-th append: spread over all of them.
fn target(ids: &[String], clients: usize, c: usize, i: usize) -> &str {
    &ids[((c + i * clients) * 7919) % CONVERSATIONS]
}

fn writer_counts(orch: &Orchestrator) -> (u64, u64) {
    let stats = &orch.writer().stats;
    (
        stats.batches.load(Ordering::Relaxed),
        stats.events.load(Ordering::Relaxed),
    )
}

async fn in_process(
    dir: &std::path::Path,
    db: &str,
    secs: f64,
    clients: usize,
    depth: usize,
) -> anyhow::Result<Phase> {
    let (orch, _) = setup(dir, db, clients).await?;
    let before = writer_counts(&orch);
    let ids = conversation_ids();
    let payload = MessagePayload::text(text());
    let agents: Arc<Vec<Identity>> = Arc::new(
        (0..clients)
            .map(|c| Identity::new(format!("agent-{c}"), false))
            .collect(),
    );
    let o = orch.clone();
    let (n, elapsed, lat) = drive(secs, clients, depth, move |c, i| {
        let p = SendMessageParams {
            conversation_id: target(&ids, clients, c, i).to_string(),
            payload: payload.clone(),
            finality: Finality::None,
            turn_hint: None,
            client_request_id: None,
            after_key: None,
        };
        let (o, agents) = (o.clone(), agents.clone());
        async move {
            o.send_message(&agents[c], p).await?;
            Ok(())
        }
    })
    .await;
    let phase = summarize(&orch, n, elapsed, lat, before);
    orch.shutdown().await;
    Ok(phase)
}

/// Which client drives the WebSocket phase.
#[derive(Clone, Copy, PartialEq)]
enum Client {
    /// [`RawWs`]: pipelined raw frames, one write and one read per burst of answers, so that
    /// most of the two cores go to the server.
    Raw,
    /// jsonrpsee's `WsClient`, one request future per append in flight (what a Rust partner
    /// would use; it costs the shared cores more than the server's own work per append).
    Jsonrpsee,
}

async fn websocket(
    dir: &std::path::Path,
    db: &str,
    secs: f64,
    clients: usize,
    depth: usize,
    client: Client,
) -> anyhow::Result<Phase> {
    let (orch, tokens) = setup(dir, db, clients).await?;
    let before = writer_counts(&orch);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let running = server::start(orch.clone(), listener).await?;
    let ids = conversation_ids();
    let text = text();
    let (n, elapsed, lat) = match client {
        Client::Raw => {
            drive_raw(
                running.local_addr().to_string(),
                tokens,
                secs,
                depth,
                ids,
                text,
            )
            .await
        }
        Client::Jsonrpsee => {
            let url = running.rpc_url();
            let mut conns = Vec::new();
            for t in &tokens {
                let c = WsClientBuilder::default()
                    .max_concurrent_requests(depth * 2)
                    .build(&url)
                    .await?;
                let _: Value = c.request("authenticate", P(json!({"token": t}))).await?;
                conns.push(c);
            }
            let conns = Arc::new(conns);
            drive(secs, clients, depth, move |c, i| {
                let params = json!({
                    "conversationId": target(&ids, clients, c, i),
                    "payload": {"text": text},
                    "finality": "none",
                });
                let conns = conns.clone();
                async move {
                    let _: Value = conns[c].request("sendMessage", P(params)).await?;
                    Ok(())
                }
            })
            .await
        }
    };
    let phase = summarize(&orch, n, elapsed, lat, before);
    running.stop().await;
    Ok(phase)
}

/// The WebSocket reference: the raw-frame clients of [`websocket`], their load and frames, on
/// a bare WebSocket server that answers each request at once ([`echo_ws`]); round trips a
/// second.
async fn echo(secs: f64, clients: usize, depth: usize) -> anyhow::Result<f64> {
    let addr = echo_ws::start().await?;
    let tokens = (0..clients).map(|c| format!("token-{c}")).collect();
    let (n, elapsed, _) = drive_raw(
        addr.to_string(),
        tokens,
        secs,
        depth,
        conversation_ids(),
        text(),
    )
    .await;
    Ok(n as f64 / elapsed)
}

/// The id of a successful JSON-RPC answer (`{"jsonrpc":"2.0","id":N,"result":...}`), or a panic
/// with the frame: every append of the phase must be acknowledged.
fn answered_id(frame: &[u8]) -> u64 {
    const HEAD: &[u8] = br#"{"jsonrpc":"2.0","id":"#;
    let rest = frame.strip_prefix(HEAD).unwrap_or_default();
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    let id = std::str::from_utf8(&rest[..digits])
        .ok()
        .and_then(|d| d.parse().ok());
    match id {
        Some(id) if rest[digits..].starts_with(br#","result":"#) => id,
        _ => panic!("append failed: {}", String::from_utf8_lossy(frame)),
    }
}

/// One [`RawWs`] connection per token for `secs`, each keeping `depth` appends in flight: every
/// answer read is replaced by a new append, and the appends made for one burst of answers leave
/// in one write. Returns how many were acknowledged before the stop, the elapsed time and sampled
/// latencies in milliseconds.
async fn drive_raw(
    addr: String,
    tokens: Vec<String>,
    secs: f64,
    depth: usize,
    ids: Arc<Vec<String>>,
    text: String,
) -> (u64, f64, Vec<f64>) {
    let clients = tokens.len();
    let stop = Arc::new(AtomicBool::new(false));
    let mut conns = Vec::new();
    for t in &tokens {
        conns.push(RawWs::connect(&addr, t).await);
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, mut ws) in conns.into_iter().enumerate() {
        let (stop, ids, text) = (stop.clone(), ids.clone(), text.clone());
        tasks.push(tokio::spawn(async move {
            let (mut done, mut lat) = (0u64, Vec::new());
            let mut sent_at: HashMap<u64, Instant> = HashMap::new();
            let mut out = Vec::new();
            // Ids from 2 (authenticate was 1); append `i` of this client is id `i + 2`.
            let mut next = 0usize;
            let mut append = |out: &mut Vec<u8>, sent_at: &mut HashMap<u64, Instant>| {
                let id = next as u64 + 2;
                if (next / depth).is_multiple_of(SAMPLE) {
                    sent_at.insert(id, Instant::now());
                }
                let req = format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"sendMessage","params":{{"conversationId":"{}","payload":{{"text":"{text}"}},"finality":"none"}}}}"#,
                    target(&ids, clients, c, next)
                );
                text_frame(out, req.as_bytes());
                next += 1;
            };
            for _ in 0..depth {
                append(&mut out, &mut sent_at);
            }
            let mut in_flight = depth;
            ws.write(&out).await.expect("send");
            let mut stopped = false;
            while in_flight > 0 {
                out.clear();
                let mut frame = Some(ws.next_frame().await);
                while let Some(f) = frame {
                    match f {
                        Frame::Text(r) => {
                            let id = answered_id(ws.text(r));
                            in_flight -= 1;
                            stopped = stopped || stop.load(Ordering::Relaxed);
                            if !stopped {
                                done += 1;
                                lat.extend(
                                    sent_at
                                        .remove(&id)
                                        .map(|t| t.elapsed().as_secs_f64() * 1e3),
                                );
                                append(&mut out, &mut sent_at);
                                in_flight += 1;
                            }
                        }
                        Frame::Other => {}
                        Frame::Closed => panic!("connection closed with appends in flight"),
                    }
                    frame = ws.buffered_frame();
                }
                ws.write(&out).await.expect("send");
            }
            (done, lat)
        }));
    }
    run_for(secs, start, &stop, tasks).await
}

fn runtime(workers: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()?)
}

fn print_phase(name: &str, p: &Phase, ceiling: f64, goal: &str) {
    println!(
        "  {name:<42} {:>9.0} appends/s  ({:>4.1}% of ceiling; goal {goal})  p50 {:.2} ms  p99 {:.2} ms  mean batch {:.0}",
        p.rate,
        100.0 * p.rate / ceiling,
        p.p50_ms,
        p.p99_ms,
        p.mean_batch
    );
}

/// The load of the single-path runs (`BENCH_ONLY`).
#[derive(Clone, Copy)]
struct Knobs {
    secs: f64,
    clients: usize,
    depth: usize,
    inproc_workers: usize,
    ws_workers: usize,
}

/// Measures one path alone (`BENCH_ONLY`: `websocket`, `websocket-jsonrpsee`, `in-process`,
/// `ceiling`, `echo`), for profiling; false for any other value.
fn run_only(only: &str, k: &Knobs, dir: &std::path::Path) -> anyhow::Result<bool> {
    let (secs, clients, depth) = (k.secs, k.clients, k.depth);
    match only {
        "websocket" | "websocket-jsonrpsee" => {
            let client = if only == "websocket" {
                Client::Raw
            } else {
                Client::Jsonrpsee
            };
            let ws = runtime(k.ws_workers)?
                .block_on(websocket(dir, "ws.db", secs, clients, depth, client))?;
            println!(
                "{only}: {:.0} appends/s, mean batch {:.0}",
                ws.rate, ws.mean_batch
            );
        }
        "in-process" => {
            let p = runtime(k.inproc_workers)?.block_on(in_process(
                dir,
                "inproc.db",
                secs,
                clients,
                depth,
            ))?;
            println!(
                "in-process: {:.0} appends/s, mean batch {:.0}",
                p.rate, p.mean_batch
            );
        }
        "ceiling" => {
            let rate = raw_ceiling(dir, "raw.db", secs, false)?;
            println!("ceiling: {rate:.0} rows/s");
        }
        "echo" => {
            let rate = runtime(k.ws_workers)?.block_on(echo(secs, clients, depth))?;
            println!("bare websocket server: {rate:.0} round trips/s");
        }
        _ => return Ok(false),
    }
    Ok(true)
}

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench`; nothing else to parse.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let k = Knobs {
        secs: env("BENCH_SECS", 4) as f64,
        clients: env("BENCH_CLIENTS", 64) as usize,
        depth: env("BENCH_DEPTH", 16) as usize,
        inproc_workers: env("BENCH_INPROC_WORKERS", cores as u64) as usize,
        ws_workers: env("BENCH_WS_WORKERS", cores as u64) as usize,
    };
    let rounds = env("BENCH_ROUNDS", 3).max(1) as usize;
    let dir = tempfile::tempdir()?;

    println!(
        "appends benchmark: synchronous=FULL, ~300-byte payloads, {CONVERSATIONS} conversations, \
         {} clients x {} appends in flight, {} s per phase, {rounds} rounds, {cores} cores",
        k.clients, k.depth, k.secs
    );
    // For profiling one path alone.
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        if run_only(&only, &k, dir.path())? {
            return Ok(());
        }
    }
    let mut results = Vec::new();
    for round in 1..=rounds {
        println!("round {round}:");
        results.push(one_round(dir.path(), round, &k)?);
    }
    let of = |f: fn(&RoundResult) -> f64| median(results.iter().map(f).collect());
    println!(
        "median over {rounds} rounds: in-process/ceiling {:.2} (goal >= 0.80), websocket {:.0} appends/s (goal >= 100,000), \
         websocket/bare websocket server {:.2} (goal >= 0.60), \
         websocket/ceiling {:.2}, websocket with jsonrpsee clients {:.0} appends/s, indexed-raw/ceiling {:.2}",
        of(|r| r.inproc_ratio),
        of(|r| r.ws_rate),
        of(|r| r.echo_ratio),
        of(|r| r.ws_ratio),
        of(|r| r.wsj_rate),
        of(|r| r.indexed_ratio)
    );
    Ok(())
}

/// What one round measured.
struct RoundResult {
    /// In-process appends over the ceiling.
    inproc_ratio: f64,
    /// WebSocket appends over the ceiling.
    ws_ratio: f64,
    /// WebSocket appends over the bare WebSocket server's round trips.
    echo_ratio: f64,
    /// The raw ceiling with an index over the ceiling.
    indexed_ratio: f64,
    /// WebSocket appends a second (raw-frame clients, then jsonrpsee clients).
    ws_rate: f64,
    wsj_rate: f64,
}

/// One round of every phase. The machine is shared and noisy (its speed swings by a fifth
/// from one minute to the next): each round measures the ceiling right before and right after
/// the in-process phase and compares that phase with their mean, so that a drift of the
/// machine's speed during the round cancels out instead of landing on one side of the ratio.
/// The ratios are taken per round; the summary is their median.
fn one_round(dir: &std::path::Path, round: usize, k: &Knobs) -> anyhow::Result<RoundResult> {
    let Knobs {
        secs,
        clients,
        depth,
        inproc_workers,
        ws_workers,
    } = *k;
    settle(dir);
    let before = raw_ceiling(dir, &format!("raw-{round}.db"), secs, false)?;
    settle(dir);
    let inproc = runtime(inproc_workers)?.block_on(in_process(
        dir,
        &format!("inproc-{round}.db"),
        secs,
        clients,
        depth,
    ))?;
    settle(dir);
    let after = raw_ceiling(dir, &format!("raw-after-{round}.db"), secs, false)?;
    let ceiling = (before + after) / 2.0;
    println!(
        "  {:<42} {:>9.0} rows/s     (before {before:.0}, after {after:.0})",
        "raw rusqlite ceiling (1,000-row txns, FULL)", ceiling
    );
    settle(dir);
    let indexed = raw_ceiling(dir, &format!("raw-indexed-{round}.db"), secs, true)?;
    println!(
        "  {:<42} {:>9.0} rows/s     ({:.0}% of ceiling)",
        "raw, with a (conv, seq) index",
        indexed,
        100.0 * indexed / ceiling
    );
    print_phase("in-process", &inproc, ceiling, ">= 80%");
    settle(dir);
    let ws = runtime(ws_workers)?.block_on(websocket(
        dir,
        &format!("ws-{round}.db"),
        secs,
        clients,
        depth,
        Client::Raw,
    ))?;
    print_phase(
        "websocket (raw-frame clients)",
        &ws,
        ceiling,
        ">= 100,000/s",
    );
    let reference = runtime(ws_workers)?.block_on(echo(secs, clients, depth))?;
    println!(
        "  {:<42} {:>9.0} round trips/s  (the websocket phase: {:.0}% of it; goal >= 60%)",
        "bare websocket server, same clients",
        reference,
        100.0 * ws.rate / reference
    );
    settle(dir);
    let wsj = runtime(ws_workers)?.block_on(websocket(
        dir,
        &format!("wsj-{round}.db"),
        secs,
        clients,
        depth,
        Client::Jsonrpsee,
    ))?;
    print_phase("websocket (jsonrpsee clients)", &wsj, ceiling, "-");
    Ok(RoundResult {
        inproc_ratio: inproc.rate / ceiling,
        ws_ratio: ws.rate / ceiling,
        echo_ratio: ws.rate / reference,
        indexed_ratio: indexed / ceiling,
        ws_rate: ws.rate,
        wsj_rate: wsj.rate,
    })
}
