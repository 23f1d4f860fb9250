//! PostgreSQL: durable appends on one node and on three, beside the raw PostgreSQL ceiling
//! measured in the same run, and cross-node fanout latency.
//!
//! ```text
//! scripts/bench-cluster                                   # starts a PostgreSQL of its own
//! BENCH_PG=postgres://postgres@127.0.0.1:5432/postgres cargo bench --workspace --bench cluster
//! ```
//! `BENCH_PG` names a server on which each phase creates a database of its own. Phases:
//! - **ceiling**: one connection, 1,000-row multi-row inserts (`unnest` in the select list, as
//!   the orchestrator's own) of the rows the orchestrator writes (a message's ~300-byte payload
//!   and its columns) into the orchestrator's own `events` table (its key and index), `synchronous_commit=on`, nothing else in the
//!   transaction — what PostgreSQL itself commits of those rows from one connection on this
//!   machine; and the same payloads into a bare three-column table (`bare`), for comparison;
//! - **one node**: the orchestrator in-process on PostgreSQL, `BENCH_CLIENTS` × `BENCH_DEPTH`
//!   appends in flight over 1,000 conversations (16 × 64 by default: about as many appends in
//!   flight as the ceiling puts in a transaction; the writer commits about half of them at a
//!   time, while the other half gathers);
//! - **three nodes**: the same load spread over three orchestrators on the same database (in
//!   this process: the same machine), each client on one node; once with every client writing
//!   to every conversation (`spread`: each batch finds heads moved by the other nodes and catches
//!   up), once with each conversation written through one node (`affinity`), and once as three
//!   nodes that share nothing (`apart`: each on a database of its own on the same server, each
//!   conversation written through one node as in `affinity`) — what three nodes and one
//!   PostgreSQL make on this machine's cores with no coordination at all, the ceiling of the
//!   other two;
//! - **fanout**: an append through node A, delivered to a subscriber on node C: p50 and p99 of
//!   `BENCH_PINGS` appends one after another.

#[allow(dead_code)] // `settle` is for the SQLite benchmarks' files.
mod common;
use common::fresh_database;
use common::{env, median};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use orchestrator::engine::auth::Identity;
use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
use proto_spec::{MessagePayload, SubscribeParams};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CONVERSATIONS: usize = 1000;

fn text() -> String {
    "lorem ipsum dolor sit amet, consectetur adipiscing elit ".repeat(5)[..280].to_string()
}

/// What the raw ceiling inserts.
#[derive(Clone, Copy)]
enum Shape {
    /// The rows the orchestrator writes, into its own `events` table (its schema, migrated by
    /// opening a store on the database: the same columns, key and index).
    Log,
    /// ~300-byte rows into a bare table of three columns keyed by (conversation, seq).
    Bare,
}

/// Raw PostgreSQL: one connection, 1,000-row transactions keyed by (conversation, seq),
/// `synchronous_commit=on`, nothing else in the transaction.
async fn ceiling(base: &str, secs: f64, shape: Shape) -> anyhow::Result<f64> {
    let url = fresh_database(base, "ceiling").await?;
    if let Shape::Log = shape {
        drop(orchestrator::engine::store::open(
            &url,
            orchestrator::engine::store::sqlite::Synchronous::Full,
        )?);
    }
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    c.batch_execute("SET synchronous_commit = on").await?;
    let ins = match shape {
        Shape::Log => {
            c.prepare(
                "INSERT INTO events (conv, seq, kind, author, turn, finality, payload, client_request_id, request_hash, ts_ms) \
                 SELECT unnest($1::bigint[]), unnest($2::bigint[]), 'message', unnest($4::text[]), 0, NULL, \
                        unnest($3::text[]), NULL, NULL, unnest($5::bigint[])",
            )
            .await?
        }
        Shape::Bare => {
            c.batch_execute(
                "CREATE TABLE rows (conv BIGINT, seq BIGINT, payload TEXT, PRIMARY KEY (conv, seq))",
            )
            .await?;
            c.prepare(
                // The authors and times are bound as for the log's rows, and not stored.
                "INSERT INTO rows SELECT unnest($1::bigint[]), unnest($2::bigint[]), unnest($3::text[]) \
                 WHERE $4::text[] IS NOT NULL AND $5::bigint[] IS NOT NULL",
            )
            .await?
        }
    };
    // The payload as the orchestrator stores a message's.
    let payload = serde_json::to_string(&MessagePayload::text(text()))?;
    let start = Instant::now();
    let mut n = 0i64;
    while start.elapsed().as_secs_f64() < secs {
        let (mut conv, mut seq, mut p, mut author, mut ts) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let now = orchestrator::engine::store::now_ms();
        for i in 0..1000i64 {
            let k = n + i;
            conv.push(k % 1000);
            seq.push(k / 1000 + 1);
            p.push(payload.clone());
            author.push(format!("agent-{}", k % 16));
            ts.push(now);
        }
        c.batch_execute("BEGIN").await?;
        c.execute(&ins, &[&conv, &seq, &p, &author, &ts]).await?;
        c.batch_execute("COMMIT").await?;
        n += 1000;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// `nodes` orchestrators on one new database, with the benchmark's conversations.
async fn cluster(
    base: &str,
    name: &str,
    nodes: usize,
    clients: usize,
) -> anyhow::Result<Vec<Arc<Orchestrator>>> {
    let url = fresh_database(base, name).await?;
    let mut orchs = Vec::new();
    for _ in 0..nodes {
        let store = orchestrator::engine::store::open(
            &url,
            orchestrator::engine::store::sqlite::Synchronous::Full,
        )?;
        let limits = Limits {
            max_connections: 4096,
            max_connections_per_address: 4096,
            max_connections_per_agent: 4096,
            max_append_bytes_per_minute: 0,
            ..Limits::default()
        };
        orchs.push(Orchestrator::open(store, limits)?);
    }
    common::create_conversations(&orchs, CONVERSATIONS, clients).await?;
    Ok(orchs)
}

/// Three nodes that share nothing: each on a database of its own (every conversation made on
/// each; a node writes only those [`Routing::Affinity`] sends it), on the same server.
async fn apart(base: &str, clients: usize) -> anyhow::Result<Vec<Arc<Orchestrator>>> {
    let mut orchs = Vec::new();
    for _ in 0..3 {
        orchs.extend(cluster(base, "apart", 1, clients).await?);
    }
    Ok(orchs)
}

/// How clients pick their node.
#[derive(Clone, Copy, PartialEq)]
enum Routing {
    /// Client `c` on node `c % nodes`, writing to every conversation.
    Spread,
    /// Each append through the node `conversation % nodes`.
    Affinity,
    /// As `Affinity`, on nodes that share nothing ([`apart`]).
    Apart,
}

impl Routing {
    fn name(self) -> &'static str {
        match self {
            Routing::Spread => "spread",
            Routing::Affinity => "affinity",
            Routing::Apart => "apart",
        }
    }
}

/// Acknowledged appends per second: `clients` × `depth` appends in flight for `secs`.
async fn appends(
    orchs: &[Arc<Orchestrator>],
    routing: Routing,
    secs: f64,
    clients: usize,
    depth: usize,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let payload = MessagePayload::text(text());
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        for lane in 0..depth {
            let (stop, orchs, payload) = (stop.clone(), orchs.to_vec(), payload.clone());
            tasks.push(tokio::spawn(async move {
                let who = Identity::new(format!("agent-{c}"), false);
                let mut done = 0u64;
                let mut i = lane;
                while !stop.load(Ordering::Relaxed) {
                    let conv = ((c + i * clients) * 7919) % CONVERSATIONS;
                    let node = match routing {
                        Routing::Spread => c % orchs.len(),
                        Routing::Affinity | Routing::Apart => conv % orchs.len(),
                    };
                    let p = common::message(&format!("conv-{conv}"), payload.clone());
                    if let Err(e) = orchs[node].send_message(&who, p).await {
                        panic!("append failed: {e}");
                    }
                    if !stop.load(Ordering::Relaxed) {
                        done += 1;
                    }
                    i += depth;
                }
                done
            }));
        }
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let mut n = 0;
    for t in tasks {
        n += t.await.expect("a client");
    }
    n as f64 / elapsed
}

/// The writer's counters: batches, events, busy, lock and commit nanoseconds, conflicts,
/// rechecks, writes put off and batches sent behind one committing.
fn counters(o: &Orchestrator) -> [u64; 9] {
    let s = &o.writer().stats;
    [
        s.batches.load(Ordering::Relaxed),
        s.events.load(Ordering::Relaxed),
        s.busy_ns.load(Ordering::Relaxed),
        s.lock_ns.load(Ordering::Relaxed),
        s.commit_ns.load(Ordering::Relaxed),
        s.conflicts.load(Ordering::Relaxed),
        s.rechecks.load(Ordering::Relaxed),
        s.put_off.load(Ordering::Relaxed),
        s.overlapped.load(Ordering::Relaxed),
    ]
}

/// Where one node's writer spent the phase: events per batch, and the shares of the wall time
/// it spent locking and catching up, committing, on the rest of the batch, and waiting for work.
fn profile(before: [u64; 9], after: [u64; 9], secs: f64) -> String {
    let d: Vec<f64> = after
        .iter()
        .zip(before)
        .map(|(a, b)| (a - b) as f64)
        .collect();
    let wall = secs * 1e9;
    format!(
        "{:.0} events per batch, {:.0}% of batches sent behind one committing, {} batches run again after a conflict, {} writes put off; writer time: lock and catch-up {:.0}%, waiting for commits {:.0}%, deciding and handing on {:.0}%, waiting for work {:.0}%",
        d[1] / d[0].max(1.0),
        100.0 * d[8] / d[0].max(1.0),
        d[5] + d[6],
        d[7],
        100.0 * d[3] / wall,
        100.0 * d[4] / wall,
        100.0 * (d[2] - d[3] - d[4]).max(0.0) / wall,
        100.0 * (wall - d[2]).max(0.0) / wall
    )
}

/// Append on `from`, delivered on `to`: milliseconds for each of `pings` appends in a row.
async fn fanout(from: &Orchestrator, to: &Orchestrator, pings: usize) -> anyhow::Result<Vec<f64>> {
    let who = Identity::new("agent-0", false);
    let mut feed = to
        .subscribe(
            &who,
            SubscribeParams {
                conversation_id: Some("conv-0".into()),
                since_seq: None,
                cursors: None,
            },
        )
        .await?;
    let mut lat = Vec::with_capacity(pings);
    for i in 0..pings {
        let p = common::message("conv-0", MessagePayload::text(format!("ping {i}")));
        let t = Instant::now();
        let r = from.send_message(&who, p).await?;
        loop {
            let e = tokio::time::timeout(Duration::from_secs(10), feed.next())
                .await?
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .ok_or_else(|| anyhow::anyhow!("the feed ended"))?;
            if e.seq >= r.seq {
                break;
            }
        }
        lat.push(t.elapsed().as_secs_f64() * 1e3);
    }
    Ok(lat)
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p) as usize]
}

async fn shutdown(orchs: Vec<Arc<Orchestrator>>) {
    for o in orchs {
        o.shutdown().await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let base = std::env::var("BENCH_PG").map_err(|_| {
        anyhow::anyhow!("BENCH_PG must name a PostgreSQL server (postgres://USER@HOST:PORT/DB); scripts/bench-cluster starts one")
    })?;
    let secs = env("BENCH_SECS", 5) as f64;
    let clients = env("BENCH_CLIENTS", 16) as usize;
    let depth = env("BENCH_DEPTH", 64) as usize;
    let rounds = env("BENCH_ROUNDS", 3);
    let pings = env("BENCH_PINGS", 300) as usize;
    println!("PostgreSQL appends: {clients} clients x {depth} in flight, {CONVERSATIONS} conversations, {secs} s per phase, {rounds} rounds");
    let (mut ceil, mut bare, mut one, mut spread, mut affinity, mut alone) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for round in 0..rounds {
        let c = ceiling(&base, secs, Shape::Log).await?;
        let b = ceiling(&base, secs, Shape::Bare).await?;
        let single = cluster(&base, "one", 1, clients).await?;
        let before = counters(&single[0]);
        let o = appends(&single, Routing::Spread, secs, clients, depth).await;
        println!(
            "round {round}: one node: {}",
            profile(before, counters(&single[0]), secs)
        );
        shutdown(single).await;
        // Each on a cluster of its own: what one leaves behind (conversations other nodes wrote
        // lately, which every node locks for a while) does not slow the other.
        let mut three_nodes = Vec::new();
        for routing in [Routing::Spread, Routing::Affinity, Routing::Apart] {
            let three = match routing {
                Routing::Apart => apart(&base, clients).await?,
                _ => cluster(&base, "three", 3, clients).await?,
            };
            let before: Vec<_> = three.iter().map(|o| counters(o)).collect();
            three_nodes.push(appends(&three, routing, secs, clients, depth).await);
            for (i, o) in three.iter().enumerate() {
                println!(
                    "round {round}: three nodes, {}: node {i}: {}",
                    routing.name(),
                    profile(before[i], counters(o), secs)
                );
            }
            shutdown(three).await;
        }
        let (s, a, p) = (three_nodes[0], three_nodes[1], three_nodes[2]);
        println!(
            "round {round}: ceiling {c:.0} rows/s (bare table {b:.0}); one node {o:.0}/s ({:.2} of the ceiling, {:.2} of the bare one); three nodes spread {s:.0}/s ({:.2} of one node), affinity {a:.0}/s ({:.2}), apart {p:.0}/s ({:.2})",
            o / c,
            o / b,
            s / o,
            a / o,
            p / o
        );
        ceil.push(c);
        bare.push(b);
        one.push(o);
        spread.push(s);
        affinity.push(a);
        alone.push(p);
    }
    let (c, b, o, s, a, p) = (
        median(ceil),
        median(bare),
        median(one),
        median(spread),
        median(affinity),
        median(alone),
    );
    println!("median: ceiling {c:.0} rows/s (bare table {b:.0}) | one node {o:.0} appends/s = {:.2} of the ceiling (goal >= 0.50; {:.2} of the bare one) | three nodes spread {s:.0}/s = {:.2} of one node, affinity {a:.0}/s = {:.2} (goal >= 0.80); sharing nothing (apart) {p:.0}/s = {:.2}", o / c, o / b, s / o, a / o, p / o);
    let three = cluster(&base, "fanout", 3, 1).await?;
    let lat = fanout(&three[0], &three[2], pings).await?;
    let local = fanout(&three[0], &three[0], pings).await?;
    println!(
        "fanout, append on node A -> delivery on node C: p50 {:.2} ms, p99 {:.2} ms ({pings} appends in a row); on node A itself: p50 {:.2} ms, p99 {:.2} ms",
        pct(lat.clone(), 0.5),
        pct(lat, 0.99),
        pct(local.clone(), 0.5),
        pct(local, 0.99)
    );
    shutdown(three).await;
    common::drop_databases(&base).await
}
