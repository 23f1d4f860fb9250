//! `listConversations` at scale: `BENCH_CONVERSATIONS` conversations in one tenant (default
//! 1,000,000), on SQLite and, when `BENCH_PG` names a server, on PostgreSQL: the first page
//! (100, newest activity first) as an admin and as a participant, a page narrowed by a text
//! query that matches few (it looks at its budget of 20,000 and answers short), and the first
//! page after a restart (the order built again); each as p50 and p99 of `BENCH_READS` reads
//! (default 200), the answer serialized as the wire carries it. Then every conversation is
//! closed and the server started again: the same pages over closed conversations (which a
//! PostgreSQL node leaves in the database and reads a page at a time). Beside it, the
//! reference: the same store's raw read of 100 conversation ids by its primary key, newest
//! first.
//!
//! ```text
//! cargo bench --workspace --bench listing
//! BENCH_PG=postgres://postgres@127.0.0.1:5432/postgres cargo bench --workspace --bench listing
//! ```

#[allow(dead_code)]
mod common;
use common::env;

use std::sync::Arc;
use std::time::Instant;

use orchestrator::engine::auth::Identity;
use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::Synchronous;
use proto_spec::{ListConversationsParams, MessagePayload};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn open(db: &str) -> anyhow::Result<Arc<Orchestrator>> {
    let store = orchestrator::engine::store::open(db, Synchronous::Normal)?;
    // One admin creates them all: no cap on its open conversations.
    let limits = Limits {
        max_open_per_agent: 0,
        ..Limits::default()
    };
    Ok(Orchestrator::open(store, limits)?)
}

/// p50 and p99 of `reads` pages for `p` as `who`, in milliseconds (the answer serialized).
async fn pages(
    orch: &Orchestrator,
    who: &Identity,
    p: &ListConversationsParams,
    reads: usize,
) -> anyhow::Result<(f64, f64, usize)> {
    let mut ms = Vec::with_capacity(reads);
    let mut shown = 0;
    for _ in 0..reads {
        let t = Instant::now();
        let page = orch.list_conversations(who, p.clone()).await?;
        let wire = serde_json::to_vec(&page)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        shown = page.conversations.len();
        anyhow::ensure!(!wire.is_empty());
    }
    ms.sort_by(f64::total_cmp);
    Ok((ms[reads / 2], ms[(reads * 99 / 100).min(reads - 1)], shown))
}

/// Every measure on one store, printed.
async fn measure(backend: &str, db: &str, n: usize, reads: usize) -> anyhow::Result<()> {
    let t = Instant::now();
    let orch = open(db)?;
    common::create_conversations(std::slice::from_ref(&orch), n, 1).await?;
    println!(
        "{backend}: {n} conversations created in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let admin = Identity::new("admin", true);
    let agent = Identity::new("agent-0", false);
    let first = ListConversationsParams::default();
    let rare = ListConversationsParams {
        query: Some("conv-99999".into()),
        ..Default::default()
    };
    for (what, who, p) in [
        ("first page, admin", &admin, &first),
        ("first page, a participant", &agent, &first),
        ("a query that matches few", &admin, &rare),
    ] {
        let (p50, p99, shown) = pages(&orch, who, p, reads).await?;
        println!("{backend}: {what}: p50 {p50:.2} ms, p99 {p99:.2} ms ({shown} shown; goal p99 <= 20 ms)");
    }
    orch.shutdown().await;
    drop(orch);
    let t = Instant::now();
    let orch = open(db)?;
    orch.writer().swept().await;
    let opened = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let page = orch.list_conversations(&admin, first.clone()).await?;
    let after = t.elapsed().as_secs_f64() * 1e3;
    println!(
        "{backend}: after a restart ({opened:.1} s to hold every open conversation): the first page in {after:.1} ms ({} shown)",
        page.conversations.len()
    );
    let (p50, p99, _) = pages(&orch, &admin, &first, reads).await?;
    println!("{backend}: after a restart, then: p50 {p50:.2} ms, p99 {p99:.2} ms");
    close_all(&orch, n).await?;
    orch.shutdown().await;
    drop(orch);
    let orch = open(db)?;
    orch.writer().swept().await;
    let t = Instant::now();
    let page = orch.list_conversations(&admin, first.clone()).await?;
    println!(
        "{backend}: every one closed, after a restart: the first page in {:.1} ms ({} shown)",
        t.elapsed().as_secs_f64() * 1e3,
        page.conversations.len()
    );
    for (what, who, p) in [
        (
            "every one closed, after a restart: first page, admin",
            &admin,
            &first,
        ),
        (
            "every one closed, after a restart: first page, a participant",
            &agent,
            &first,
        ),
        (
            "every one closed, after a restart: a query that matches few",
            &admin,
            &rare,
        ),
    ] {
        let (p50, p99, shown) = pages(&orch, who, p, reads).await?;
        println!("{backend}: {what}: p50 {p50:.2} ms, p99 {p99:.2} ms ({shown} shown)");
    }
    orch.shutdown().await;
    Ok(())
}

/// Closes conversations `conv-0` … `conv-{n-1}` (a message of `agent-0` that ends each).
async fn close_all(orch: &Arc<Orchestrator>, n: usize) -> anyhow::Result<()> {
    use futures::stream::{FuturesUnordered, StreamExt};
    let t = Instant::now();
    let agent = Identity::new("agent-0", false);
    let mut sent = FuturesUnordered::new();
    for i in 0..n {
        let mut p = common::message(&format!("conv-{i}"), MessagePayload::text("bye"));
        p.finality = proto_spec::Finality::Conversation;
        let (orch, agent) = (orch.clone(), agent.clone());
        sent.push(async move { orch.send_message(&agent, p).await });
    }
    while let Some(r) = sent.next().await {
        r?;
    }
    println!(
        "{n} conversations closed in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The reference: 100 conversation ids newest first, by the primary key, straight from SQLite.
fn sqlite_reference(db: &str, reads: usize) -> anyhow::Result<(f64, f64)> {
    let conn = rusqlite::Connection::open(db)?;
    let mut st = conn.prepare("SELECT id FROM conversations ORDER BY num DESC LIMIT 100")?;
    let mut ms = Vec::with_capacity(reads);
    for _ in 0..reads {
        let t = Instant::now();
        let ids: Vec<String> = st
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        anyhow::ensure!(ids.len() == 100);
    }
    ms.sort_by(f64::total_cmp);
    Ok((ms[reads / 2], ms[(reads * 99 / 100).min(reads - 1)]))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n = env("BENCH_CONVERSATIONS", 1_000_000) as usize;
    let reads = env("BENCH_READS", 200) as usize;
    println!("listConversations over {n} conversations in one tenant, {reads} reads each");
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("listing.db").display().to_string();
    if env("BENCH_SQLITE", 1) == 1 {
        measure("SQLite", &db, n, reads).await?;
        let (p50, p99) = sqlite_reference(&db, reads)?;
        println!("SQLite reference, 100 ids by primary key: p50 {p50:.3} ms, p99 {p99:.3} ms");
    }
    match std::env::var("BENCH_PG") {
        Ok(base) => {
            let url = common::fresh_database(&base, "listing").await?;
            measure("PostgreSQL", &url, n, reads).await?;
            common::drop_databases(&base).await?;
        }
        Err(_) => println!("PostgreSQL: not measured (set BENCH_PG)"),
    }
    Ok(())
}
