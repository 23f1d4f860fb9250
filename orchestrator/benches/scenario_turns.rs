//! Internal turn loop: two scripted agents take turns on the durable log (FULL sync), for one
//! conversation and for 100 at once, beside the raw fsync rate of the same disk measured in the
//! same run, and (with `BENCH_PY` pointing at a Python with the frameworks installed; see
//! `scripts/bench-frameworks`) the same scripted exchange in AutoGen 0.7 and LangGraph 1.2.
//!
//! ```sh
//! scripts/bench-frameworks                       # makes the Python environment, then runs this
//! cargo bench --workspace --bench scenario_turns # without the frameworks
//! ```
//! Knobs: BENCH_TURNS (turns per conversation when many run at once, and in the frameworks;
//! default 200), BENCH_CONVERSATIONS (100), BENCH_SINGLE_TURNS (turns of the one-conversation
//! run, 4,000), BENCH_WARM_UP (turns of a conversation run before it on the same database and
//! not timed, 4,000: a new database's WAL file grows for its first second or so, and a running
//! server's does not), BENCH_ROUNDS (3, of the one-conversation run beside the raw rates),
//! BENCH_ONLY (`traced` or `untraced`: only the loop over many conversations of that kind, for a
//! profile).
//! With `BENCH_PG` naming a PostgreSQL server (`postgres://USER@HOST:PORT/DB`), the same loops
//! run on the PostgreSQL backend too (a database of their own), beside PostgreSQL's raw rate
//! of one-row commits from one connection (`synchronous_commit=on`).

mod common;
use common::{env, fresh_database, median, settle};

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use orchestrator::engine::auth::Identity;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous};
use proto_spec::CreateConversationParams;
use serde_json::{json, Value};

/// The allocator the server binary uses.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Appends and fsyncs a small record, again and again: what one durable commit costs at least.
fn fsync_rate(dir: &std::path::Path, secs: f64) -> anyhow::Result<f64> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("fsync.bin"))?;
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        f.write_all(&[7u8; 128])?;
        f.sync_data()?;
        n += 1;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// One-row SQLite transactions at FULL, WAL, with the log's page size: what one durable commit
/// of the orchestrator costs at least.
fn sqlite_commit_rate(dir: &std::path::Path, secs: f64) -> anyhow::Result<f64> {
    let conn = rusqlite::Connection::open(dir.join("raw.db"))?;
    conn.pragma_update(None, "page_size", 16_384)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, payload TEXT)")?;
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        conn.execute("INSERT INTO t (payload) VALUES (?1)", ["a says 1"])?;
        n += 1;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

fn scenario(turns: u64, traces: bool) -> Value {
    let replies = |who: &str| -> Vec<String> {
        (1..=turns / 2 + 1)
            .map(|i| format!("{who} says {i}"))
            .collect()
    };
    json!({
        "participants": [
            {"id": "a", "kind": "scripted", "replies": replies("a")},
            {"id": "b", "kind": "scripted", "replies": replies("b")}
        ],
        "policy": {"order": "round_robin", "first": "a"},
        "stop": {"maxTurns": turns},
        "turn": {"traces": traces}
    })
}

/// Starts `count` conversations named `{prefix}{n}` and waits until all of them have closed.
async fn run_conversations(
    orch: &Arc<Orchestrator>,
    prefix: &str,
    count: usize,
    turns: u64,
    traces: bool,
) -> anyhow::Result<()> {
    let admin = Identity::new("admin", true);
    let mut creating = Vec::new();
    for c in 0..count {
        let (orch, admin) = (orch.clone(), admin.clone());
        let id = format!("{prefix}{c}");
        creating.push(tokio::spawn(async move {
            orch.create_conversation(
                &admin,
                CreateConversationParams {
                    conversation_id: Some(id),
                    scenario: Some(scenario(turns, traces)),
                    ..Default::default()
                },
            )
            .await
        }));
    }
    for c in creating {
        c.await??;
    }
    for c in 0..count {
        let id = format!("{prefix}{c}");
        let conv = orch
            .hub()
            .get(&id)
            .ok_or_else(|| anyhow::anyhow!("no {id}"))?;
        let mut head = conv.watch();
        let deadline = Instant::now() + Duration::from_secs(600);
        while !conv.core().closed {
            anyhow::ensure!(Instant::now() < deadline, "{id} did not finish");
            let _ = tokio::time::timeout(Duration::from_millis(100), head.changed()).await;
        }
    }
    Ok(())
}

/// Turns per second over `conversations` conversations of `turns` turns each, run at once, on
/// a fresh database; with `warm_up` turns, one conversation of that many runs first (not
/// timed), so that the log is measured as a running server has it rather than as a new file.
async fn turn_loop(
    conversations: usize,
    turns: u64,
    traces: bool,
    warm_up: u64,
) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let store = Arc::new(SqliteStore::open(
        dir.path().join("turns.db"),
        Synchronous::Full,
    )?);
    timed_loop(store, conversations, turns, traces, warm_up).await
}

/// [`turn_loop`] on a new database of the PostgreSQL server `base`.
async fn pg_turn_loop(
    base: &str,
    conversations: usize,
    turns: u64,
    traces: bool,
    warm_up: u64,
) -> anyhow::Result<f64> {
    let url = fresh_database(base, "turns").await?;
    let store = orchestrator::engine::store::open(&url, Synchronous::Full)?;
    timed_loop(store, conversations, turns, traces, warm_up).await
}

/// PostgreSQL's raw rate of durable commits: one connection, one-row transactions,
/// `synchronous_commit=on`, nothing else.
async fn pg_commit_rate(base: &str, secs: f64) -> anyhow::Result<f64> {
    let url = fresh_database(base, "commits").await?;
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    c.batch_execute(
        "SET synchronous_commit = on; CREATE TABLE t (id BIGSERIAL PRIMARY KEY, payload TEXT)",
    )
    .await?;
    let ins = c.prepare("INSERT INTO t (payload) VALUES ($1)").await?;
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        c.execute(&ins, &[&"a says 1"]).await?;
        n += 1;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

/// Runs the loop on `store` (see [`turn_loop`]).
async fn timed_loop(
    store: Arc<dyn orchestrator::engine::store::Store>,
    conversations: usize,
    turns: u64,
    traces: bool,
    warm_up: u64,
) -> anyhow::Result<f64> {
    let orch = orchestrator::host::Options::default().start(store)?;
    if warm_up > 0 {
        run_conversations(&orch, "warm-up", 1, warm_up, traces).await?;
    }
    let start = Instant::now();
    run_conversations(&orch, "c", conversations, turns, traces).await?;
    let elapsed = start.elapsed().as_secs_f64();
    orch.shutdown().await;
    Ok(turns as f64 * conversations as f64 / elapsed)
}

fn framework(
    py: &str,
    script: &str,
    turns: u64,
    conversations: usize,
    extra: &[String],
) -> anyhow::Result<(f64, f64)> {
    let path = format!(
        "{}/../scripts/frameworks/{script}",
        env!("CARGO_MANIFEST_DIR")
    );
    let out = std::process::Command::new(py)
        .args([path, turns.to_string(), conversations.to_string()])
        .args(extra)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)?;
    Ok((
        v["single"].as_f64().unwrap_or(0.0),
        v["aggregate"].as_f64().unwrap_or(0.0),
    ))
}

/// The same loops on PostgreSQL (`BENCH_PG`: a server's URL; a database of its own per loop):
/// the database it ran on and its rates (one conversation, many, each with traces), or `None`.
fn postgres_loops(
    rt: &tokio::runtime::Runtime,
    conversations: usize,
    turns: u64,
    single_turns: u64,
    warm_up: u64,
) -> anyhow::Result<Option<(String, [f64; 4])>> {
    Ok(match std::env::var("BENCH_PG") {
        Ok(base) => {
            println!("PostgreSQL (a database of its own per loop), the same loops:");
            let commits = rt.block_on(pg_commit_rate(&base, 2.0))?;
            let warm = warm_up.min(1_000);
            let one = rt.block_on(pg_turn_loop(&base, 1, single_turns, false, warm))?;
            let one_traced = rt.block_on(pg_turn_loop(&base, 1, single_turns, true, warm))?;
            let many_traced = rt.block_on(pg_turn_loop(&base, conversations, turns, true, 0))?;
            let many = rt.block_on(pg_turn_loop(&base, conversations, turns, false, 0))?;
            println!(
                "  raw one-row commits (one connection, synchronous_commit=on) {commits:>8.0} /s"
            );
            println!(
                "  one conversation, turn.traces: false {one:>8.0} turns/s ({:.0}% of the raw commit rate); with traces {one_traced:>8.0} turns/s",
                100.0 * one / commits
            );
            println!(
                "  {conversations} conversations: with traces {many_traced:>8.0} turns/s; turn.traces: false {many:>8.0} turns/s"
            );
            Some((base, [one, many, one_traced, many_traced]))
        }
        Err(_) => {
            println!("  (PostgreSQL not run: set BENCH_PG)");
            None
        }
    })
}

/// The same exchange in the frameworks (`BENCH_PY`: a Python with them), beside the
/// orchestrator's rates on SQLite (`sqlite`) and PostgreSQL (`pg`).
fn compare_with_frameworks(
    rt: &tokio::runtime::Runtime,
    py: &str,
    turns: u64,
    conversations: usize,
    sqlite: [f64; 4],
    pg: Option<(String, [f64; 4])>,
) -> anyhow::Result<()> {
    println!(
        "the same exchange in the frameworks ({turns} turns; the orchestrator's ratios without its traces, which the frameworks do not write, then with them):"
    );
    let mut runs = vec![
        (
            "AutoGen 0.7 RoundRobinGroupChat",
            "autogen_turns.py",
            Vec::new(),
            sqlite,
            "goal >= 50x aggregate",
        ),
        (
            "LangGraph 1.2 + SqliteSaver",
            "langgraph_turns.py",
            Vec::new(),
            sqlite,
            "goal >= 100x aggregate",
        ),
    ];
    if let Some((base, ours)) = pg {
        let url = rt.block_on(fresh_database(&base, "langgraph"))?;
        runs.push((
            "LangGraph 1.2 + PostgresSaver",
            "langgraph_pg_turns.py",
            vec![url],
            ours,
            "no goal: reported",
        ));
    }
    for (name, script, extra, ours, goal) in runs {
        match framework(py, script, turns, conversations, &extra) {
            Ok((s, a)) => println!(
                "  {name:<32} one {s:>6.0} turns/s, {conversations} at once {a:>6.0} turns/s  (orchestrator: {:.1}x one, {:.1}x aggregate; with traces {:.1}x, {:.1}x; {goal})",
                ours[0] / s,
                ours[1] / a,
                ours[2] / s,
                ours[3] / a
            ),
            Err(e) => println!("  {name}: failed: {e}"),
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let turns = env("BENCH_TURNS", 200);
    let single_turns = env("BENCH_SINGLE_TURNS", 4_000);
    let warm_up = env("BENCH_WARM_UP", 4_000);
    let rounds = env("BENCH_ROUNDS", 3).max(1) as usize;
    let conversations = env("BENCH_CONVERSATIONS", 100) as usize;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        let traces = match only.as_str() {
            "traced" => true,
            "untraced" => false,
            _ => anyhow::bail!("BENCH_ONLY: `traced` or `untraced`, not {only:?}"),
        };
        let rate = rt.block_on(turn_loop(conversations, turns, traces, 0))?;
        println!(
            "{conversations} conversations at once, {turns} turns each, {only}: {rate:.0} turns/s"
        );
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    println!(
        "scripted turn loop: 2 scripted agents, round robin, synchronous=FULL, {} cores",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "one conversation: {single_turns} turns after {warm_up} not timed, turn.traces: false (1 commit a turn), beside the disk's raw rates, {rounds} rounds"
    );
    let (mut ratios, mut singles) = (Vec::new(), Vec::new());
    let mut last_fsync = f64::NAN;
    for round in 1..=rounds {
        settle(dir.path());
        let fsync = fsync_rate(dir.path(), 1.0)?;
        last_fsync = fsync;
        settle(dir.path());
        let commits = sqlite_commit_rate(dir.path(), 1.0)?;
        settle(dir.path());
        let single = rt.block_on(turn_loop(1, single_turns, false, warm_up))?;
        println!(
            "  round {round}: raw fsync (128-byte appends + fdatasync) {fsync:>6.0} /s, raw SQLite one-row commits (FULL, WAL, 16 KiB) {commits:>6.0} /s, one conversation {single:>6.0} turns/s  ({:.0}% of the fsync rate, {:.0}% of the one-row commit rate)",
            100.0 * single / fsync,
            100.0 * single / commits
        );
        ratios.push(single / fsync);
        singles.push(single);
    }
    let single = median(singles);
    println!(
        "  median: one conversation {single:.0} turns/s, {:.0}% of the fsync rate (goal >= 70%)",
        100.0 * median(ratios)
    );
    settle(dir.path());
    let traced_single = rt.block_on(turn_loop(1, single_turns, true, warm_up))?;
    println!(
        "  with turn traces (the default): one conversation {traced_single:.0} turns/s ({:.0}% of the last round's fsync rate)",
        100.0 * traced_single / last_fsync
    );
    println!("{conversations} conversations at once, {turns} turns each:");
    settle(dir.path());
    let traced_aggregate = rt.block_on(turn_loop(conversations, turns, true, 0))?;
    settle(dir.path());
    let aggregate = rt.block_on(turn_loop(conversations, turns, false, 0))?;
    println!("  with turn traces (the default)             {traced_aggregate:>9.0} turns/s");
    println!(
        "  turn.traces: false (1 commit a turn)       {aggregate:>9.0} turns/s  (goal >= 50,000)"
    );
    let pg = postgres_loops(&rt, conversations, turns, single_turns, warm_up)?;
    // Every database of the PostgreSQL loops (and of LangGraph's) is dropped at the end.
    let base = pg.as_ref().map(|(base, _)| base.clone());
    let done = |rt: &tokio::runtime::Runtime| match &base {
        Some(base) => rt.block_on(common::drop_databases(base)),
        None => Ok(()),
    };
    let Ok(py) = std::env::var("BENCH_PY") else {
        println!("  (frameworks not run: set BENCH_PY, or use scripts/bench-frameworks)");
        return done(&rt);
    };
    let sqlite = [single, aggregate, traced_single, traced_aggregate];
    compare_with_frameworks(&rt, &py, turns, conversations, sqlite, pg)?;
    done(&rt)
}
