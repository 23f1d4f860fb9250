//! Deleting conversations at scale: `BENCH_CONVERSATIONS` conversations (default 1,000,000),
//! each with a message, on SQLite and, when `BENCH_PG` names a server, on PostgreSQL; then
//! `BENCH_DELETE` of them (default 100,000) deleted through `deleteConversation` by
//! `BENCH_CALLERS` callers at once (default 64). Printed: the time and rate of the deletions,
//! the database's size before and after (SQLite: the file and its WAL, after a checkpoint;
//! PostgreSQL: `pg_database_size` after a `VACUUM`), and its size after as many new
//! conversations as were deleted (the space deleted is used again).
//!
//! ```text
//! cargo bench --workspace --bench lifecycle
//! BENCH_PG=postgres://postgres@127.0.0.1:5432/postgres cargo bench --workspace --bench lifecycle
//! ```

#[allow(dead_code)]
mod common;
use common::env;

use std::sync::Arc;
use std::time::Instant;

use futures::stream::{FuturesUnordered, StreamExt};
use orchestrator::engine::auth::Identity;
use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::Synchronous;
use proto_spec::{ConversationParams, CreateConversationParams, MessagePayload};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn open(db: &str) -> anyhow::Result<Arc<Orchestrator>> {
    let store = orchestrator::engine::store::open(db, Synchronous::Full)?;
    // One agent writes every message: no cap on its open conversations or its bytes.
    let limits = Limits {
        max_open_per_agent: 0,
        max_append_bytes_per_minute: 0,
        ..Limits::default()
    };
    Ok(Orchestrator::open(store, limits)?)
}

/// Conversations `{prefix}{i}` for `i` in `range`, each with one message of `agent-0`.
async fn fill(
    orch: &Arc<Orchestrator>,
    prefix: &str,
    range: std::ops::Range<usize>,
) -> anyhow::Result<()> {
    let admin = Identity::new("admin", true);
    let agent = Identity::new("agent-0", false);
    let mut work = FuturesUnordered::new();
    for i in range {
        let (orch, admin, agent) = (orch.clone(), admin.clone(), agent.clone());
        let id = format!("{prefix}{i}");
        work.push(async move {
            let p = CreateConversationParams {
                conversation_id: Some(id.clone()),
                participants: Some(vec!["agent-0".into()]),
                ..Default::default()
            };
            orch.create_conversation(&admin, p).await?;
            let text = format!(
                "a message of about a hundred bytes for conversation {id}, to be deleted or kept"
            );
            orch.send_message(&agent, common::message(&id, MessagePayload::text(text)))
                .await
        });
        if work.len() >= 1024 {
            if let Some(r) = work.next().await {
                r?;
            }
        }
    }
    while let Some(r) = work.next().await {
        r?;
    }
    Ok(())
}

/// Deletes `conv-0` … `conv-{n-1}`, `callers` at a time; the seconds it took.
async fn delete(orch: &Arc<Orchestrator>, n: usize, callers: usize) -> anyhow::Result<f64> {
    let admin = Identity::new("admin", true);
    let t = Instant::now();
    let mut work = FuturesUnordered::new();
    for i in 0..n {
        let (orch, admin) = (orch.clone(), admin.clone());
        work.push(async move {
            let p = ConversationParams {
                conversation_id: format!("conv-{i}"),
            };
            orch.delete_conversation(&admin, p).await
        });
        if work.len() >= callers {
            if let Some(r) = work.next().await {
                r?;
            }
        }
    }
    while let Some(r) = work.next().await {
        r?;
    }
    Ok(t.elapsed().as_secs_f64())
}

/// The database's size in bytes: the SQLite file and its WAL once checkpointed, or
/// PostgreSQL's database after a VACUUM.
async fn size(db: &str) -> anyhow::Result<u64> {
    if db.starts_with("postgres") {
        let (client, conn) = tokio_postgres::connect(db, tokio_postgres::NoTls).await?;
        let driver = tokio::spawn(conn);
        client.batch_execute("VACUUM").await?;
        let bytes: i64 = client
            .query_one("SELECT pg_database_size(current_database())", &[])
            .await?
            .get(0);
        drop(client);
        driver.await??;
        return Ok(bytes as u64);
    }
    let conn = rusqlite::Connection::open(db)?;
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    let file = |p: String| std::fs::metadata(p).map_or(0, |m| m.len());
    Ok(file(db.to_string()) + file(format!("{db}-wal")))
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Every measure on one store, printed.
async fn measure(
    backend: &str,
    db: &str,
    n: usize,
    gone: usize,
    callers: usize,
) -> anyhow::Result<()> {
    let t = Instant::now();
    let orch = open(db)?;
    fill(&orch, "conv-", 0..n).await?;
    println!(
        "{backend}: {n} conversations of one message each in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    orch.shutdown().await;
    drop(orch);
    let before = size(db).await?;
    let orch = open(db)?;
    orch.writer().swept().await;
    let secs = delete(&orch, gone, callers).await?;
    println!(
        "{backend}: {gone} deleted by {callers} callers in {secs:.1} s ({:.0} deletions/s)",
        gone as f64 / secs
    );
    orch.shutdown().await;
    drop(orch);
    let after = size(db).await?;
    let orch = open(db)?;
    orch.writer().swept().await;
    fill(&orch, "new-", 0..gone).await?;
    orch.shutdown().await;
    drop(orch);
    let refilled = size(db).await?;
    println!(
        "{backend}: size {:.1} MiB before, {:.1} MiB after the deletions, {:.1} MiB after {gone} new conversations",
        mib(before),
        mib(after),
        mib(refilled)
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n = env("BENCH_CONVERSATIONS", 1_000_000) as usize;
    let gone = env("BENCH_DELETE", 100_000) as usize;
    let callers = env("BENCH_CALLERS", 64) as usize;
    anyhow::ensure!(gone <= n, "BENCH_DELETE is more than BENCH_CONVERSATIONS");
    println!("deleting {gone} of {n} conversations");
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("lifecycle.db").display().to_string();
    if env("BENCH_SQLITE", 1) == 1 {
        measure("SQLite", &db, n, gone, callers).await?;
    }
    match std::env::var("BENCH_PG") {
        Ok(base) => {
            let url = common::fresh_database(&base, "lifecycle").await?;
            measure("PostgreSQL", &url, n, gone, callers).await?;
            common::drop_databases(&base).await?;
        }
        Err(_) => println!("PostgreSQL: not measured (set BENCH_PG)"),
    }
    Ok(())
}
