//! Start time over a large log: from opening the store to the first answered read, with
//! `BENCH_CONVERSATIONS` conversations of `BENCH_EVENTS_EACH` events each (default 10,000 × 100:
//! 1M events), on SQLite and, when `BENCH_PG` names a server, on PostgreSQL.
//!
//! ```text
//! cargo bench --workspace --bench start
//! BENCH_PG=postgres://postgres@127.0.0.1:5432/postgres cargo bench --workspace --bench start
//! ```
//! The conversations are created through the orchestrator; their messages are then written
//! straight into the log with SQL (the start is what is measured, not the writing). Also
//! measured: from opening the store until the node holds every open conversation (on
//! PostgreSQL it takes them in after it starts serving; on SQLite it holds them before).

#[allow(dead_code)]
mod common;
use common::env;

use std::sync::Arc;
use std::time::Instant;

use orchestrator::engine::auth::Identity;
use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::Synchronous;
use proto_spec::ConversationParams;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn open(db: &str) -> anyhow::Result<Arc<Orchestrator>> {
    let store = orchestrator::engine::store::open(db, Synchronous::Full)?;
    Ok(Orchestrator::open(store, Limits::default())?)
}

/// How long a start took, in seconds.
struct Started {
    /// Until the first read was answered.
    read: f64,
    /// Until every open conversation was held.
    held: f64,
}

/// Opens `db` and answers one read.
async fn start(db: &str, conversations: usize) -> anyhow::Result<Started> {
    let t = Instant::now();
    let orch = open(db)?;
    let last = format!("conv-{}", conversations - 1);
    let snap = orch
        .get_conversation(
            &Identity::new("admin", true),
            ConversationParams {
                conversation_id: last,
            },
        )
        .await?;
    let read = t.elapsed().as_secs_f64();
    anyhow::ensure!(snap.latest_seq > 1, "the log was not read back");
    orch.writer().swept().await;
    let held = t.elapsed().as_secs_f64();
    orch.shutdown().await;
    Ok(Started { read, held })
}

/// Creates the conversations through the orchestrator.
async fn create(db: &str, conversations: usize) -> anyhow::Result<()> {
    let orch = open(db)?;
    common::create_conversations(std::slice::from_ref(&orch), conversations, 1).await?;
    orch.shutdown().await;
    Ok(())
}

const PAYLOAD: &str =
    r#"{"text":"lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor"}"#;

async fn sqlite(dir: &std::path::Path, conversations: usize, each: u64) -> anyhow::Result<Started> {
    let db = dir.join("start.db").display().to_string();
    create(&db, conversations).await?;
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute(
        "INSERT INTO events (conv, seq, kind, author, turn, finality, payload, ts_ms)
         SELECT c.num, s.seq, 'message', 'agent-0', 1, 'none', ?1, 0
         FROM conversations c,
              (WITH RECURSIVE r(seq) AS (SELECT 2 UNION ALL SELECT seq + 1 FROM r WHERE seq < ?2)
               SELECT seq FROM r) s
         ORDER BY c.num, s.seq",
        rusqlite::params![PAYLOAD, each as i64],
    )?;
    drop(conn);
    start(&db, conversations).await
}

/// The start on PostgreSQL with every conversation open, then with nine in ten closed.
async fn postgres(
    base: &str,
    conversations: usize,
    each: u64,
) -> anyhow::Result<(Started, Started)> {
    let db = common::fresh_database(base, "start").await?;
    create(&db, conversations).await?;
    let (c, conn) = tokio_postgres::connect(&db, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let each = each as i64;
    c.execute(
        "INSERT INTO events (conv, seq, kind, author, turn, finality, payload, ts_ms)
         SELECT c.num, s, 'message', 'agent-0', 1, 'none', $1, 0
         FROM conversations c, generate_series(2, $2::bigint) s",
        &[&PAYLOAD, &each],
    )
    .await?;
    c.batch_execute("VACUUM ANALYZE").await?;
    let all_open = start(&db, conversations).await?;
    // Then nine in ten closed (a message with finality `conversation` each), as a database
    // that has served a while looks: a node takes in the open ones after it starts, the others
    // when named.
    c.execute(
        "INSERT INTO events (conv, seq, kind, author, turn, finality, payload, ts_ms)
         SELECT c.num, $2::bigint + 1, 'message', 'agent-0', 1, 'conversation', $1, 0
         FROM conversations c WHERE c.num % 10 <> 0",
        &[&PAYLOAD, &each],
    )
    .await?;
    c.execute(
        "UPDATE conversations SET closed = true WHERE num % 10 <> 0",
        &[],
    )
    .await?;
    c.batch_execute("VACUUM ANALYZE").await?;
    let mostly_closed = start(&db, conversations).await?;
    Ok((all_open, mostly_closed))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let conversations = env("BENCH_CONVERSATIONS", 10_000) as usize;
    let each = env("BENCH_EVENTS_EACH", 100);
    let total = conversations as u64 * each;
    println!("start time: {conversations} conversations x {each} events = {total} events; from opening the store to the first answered read");
    let dir = tempfile::tempdir()?;
    let s = sqlite(dir.path(), conversations, each).await?;
    println!(
        "SQLite: {:.2} s (goal <= 2 s); every conversation held before serving",
        s.read
    );
    match std::env::var("BENCH_PG") {
        Ok(base) => {
            let (open, closed) = postgres(&base, conversations, each).await?;
            for (what, s) in [
                ("every conversation open", open),
                ("9 in 10 closed (loaded when named)", closed),
            ] {
                println!(
                    "PostgreSQL, {what}: {:.2} s (goal <= 2 s); every open conversation held after {:.2} s",
                    s.read, s.held
                );
            }
            common::drop_databases(&base).await?;
        }
        Err(_) => println!("PostgreSQL: not measured (set BENCH_PG; scripts/bench-cluster does)"),
    }
    Ok(())
}
