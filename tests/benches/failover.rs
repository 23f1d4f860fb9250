//! Failover: from the SIGKILL of the node running an internal agent's turn to that turn running
//! again, and answered, on another node.
//!
//! ```text
//! scripts/bench-failover                    # builds the binary, starts a PostgreSQL of its own
//! BENCH_KILLS=50 scripts/bench-failover
//! ```
//! Three `orchestrator serve` processes on one PostgreSQL (the test harness's: the machine's
//! binaries, fsync and `synchronous_commit` on, or `ORCHESTRATOR_TEST_PG`), `BENCH_CONVS`
//! conversations (default 6) in which a scripted `bot` and a `process` agent `worker` take turns;
//! each of the worker's turns takes `BENCH_WORK_MS` (default 500) before it answers, so at any
//! moment most conversations have a worker turn running on some node. Each round reads from the
//! database which node holds a running worker turn (`turn_claims`, with no answer in the log
//! yet), SIGKILLs that node, and measures, for every turn that node held, the time from the
//! kill to the turn's claim held by another node (polled every 10 ms) and to the worker's
//! answer committed (the takeover's run includes the work again). The takeover's run writes no
//! second `turn_start`: it is the same attempt run again, with the same idempotency keys. The killed node is restarted before
//! the next round. At the end the log is checked: at most one answer per turn.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tests::pg::TestPostgres;
use tests::procs::{self, Node};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The `q`-quantile of sorted `v` (nearest rank).
fn quantile(v: &[i64], q: f64) -> i64 {
    if v.is_empty() {
        return 0;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// A worker turn that was running on the killed node.
struct Held {
    conversation: String,
    turn: i64,
}

/// Whether another node than `victim` holds the claim on the turn, and when (ms since the epoch)
/// the worker's answer to it was committed.
async fn progress(
    db: &tokio_postgres::Client,
    h: &Held,
    victim: &str,
) -> Result<(bool, Option<i64>), tokio_postgres::Error> {
    let row = db
        .query_one(
            "SELECT \
               EXISTS (SELECT 1 FROM turn_claims t WHERE t.conversation_id = c.id \
                  AND t.turn = $2 AND t.holder <> $3), \
               (SELECT min(e.ts_ms) FROM events e WHERE e.conv = c.num AND e.author = 'worker' \
                  AND e.kind = 'message' AND e.turn = $2) \
             FROM conversations c WHERE c.id = $1",
            &[&h.conversation, &h.turn, &victim],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// The worker turns `holder` holds and has not answered yet.
async fn held_by(
    db: &tokio_postgres::Client,
    holder: &str,
) -> Result<Vec<Held>, tokio_postgres::Error> {
    let rows = db
        .query(
            "SELECT t.conversation_id, t.turn FROM turn_claims t \
               JOIN conversations c ON c.id = t.conversation_id \
             WHERE t.holder = $1 \
               AND t.lease_until_ms > (extract(epoch from clock_timestamp()) * 1000)::bigint \
               AND EXISTS (SELECT 1 FROM events e WHERE e.conv = c.num AND e.author = 'worker' \
                             AND e.kind = 'trace' AND e.turn = t.turn \
                             AND e.payload::text LIKE '%\"turn_start\"%') \
               AND NOT EXISTS (SELECT 1 FROM events e WHERE e.conv = c.num \
                             AND e.author = 'worker' AND e.kind = 'message' AND e.turn = t.turn)",
            &[&holder],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Held {
            conversation: r.get(0),
            turn: r.get(1),
        })
        .collect())
}

/// Writes the `relay` scenario into `dir`'s `scenarios` folder: a scripted bot and a worker
/// process that takes `work_ms` per turn. Returns the folder.
fn relay_scenario(dir: &std::path::Path, work_ms: u64) -> std::path::PathBuf {
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(&scenarios).expect("the scenario folder");
    let replies: Vec<String> = (1..=5000).map(|i| format!("bot says {i}")).collect();
    let work = format!(
        "cat > /dev/null; sleep {}; echo '{{\"text\": \"worked\"}}'",
        work_ms as f64 / 1000.0
    );
    let scenario = serde_json::json!({
        "name": "relay",
        "participants": [
            {"id": "bot", "kind": "scripted", "replies": replies},
            {"id": "worker", "kind": "process", "command": ["sh", "-c", work]}
        ],
        "policy": {"order": "round_robin", "first": "bot"},
        "turn": {"timeout": "60s"}
    });
    std::fs::write(scenarios.join("relay.json"), scenario.to_string()).expect("the scenario");
    scenarios
}

/// The node holding the most running worker turns: its place, how many, and which.
async fn busiest(db: &tokio_postgres::Client, nodes: &[Node]) -> Option<(usize, usize, Vec<Held>)> {
    let mut victim = None;
    let mut most = 0;
    for (i, n) in nodes.iter().enumerate() {
        let Some(name) = &n.name else { continue };
        let held = held_by(db, name).await.expect("read the claims");
        if held.len() > most {
            most = held.len();
            victim = Some((i, most, held));
        }
    }
    victim
}

/// What became of the turns a killed node held.
struct Takeovers {
    /// For each turn taken over: ms from the kill until another node was seen holding it.
    claimed: Vec<i64>,
    /// And until its answer was committed.
    answered: Vec<i64>,
    /// Turns not answered within 30 s.
    lost: usize,
}

/// Polls every 10 ms, for up to 30 s, until each turn `held` by `victim` (killed at
/// `killed_at`) is claimed by another node and answered.
async fn watch_takeovers(
    db: &tokio_postgres::Client,
    held: Vec<Held>,
    victim: &str,
    killed_at: i64,
) -> Takeovers {
    let mut found = Takeovers {
        claimed: Vec::new(),
        answered: Vec::new(),
        lost: 0,
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    // (turn, when another node was seen holding it)
    let mut pending: Vec<(Held, Option<i64>)> = held.into_iter().map(|h| (h, None)).collect();
    while !pending.is_empty() && tokio::time::Instant::now() < until {
        let mut still = Vec::new();
        for (h, mut claimed) in pending {
            match progress(db, &h, victim).await {
                // Answered before the kill landed: not a failover.
                Ok((_, Some(answer))) if answer <= killed_at => continue,
                Ok((true, answer)) => {
                    claimed = claimed.or(Some(now_ms()));
                    if let (Some(c), Some(answer)) = (claimed, answer) {
                        found.claimed.push(c - killed_at);
                        found.answered.push(answer - killed_at);
                        continue;
                    }
                }
                _ => {}
            }
            still.push((h, claimed));
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    found.lost = pending.len();
    found
}

/// How many worker turns have more than one answer in the log (the run fails on any).
async fn answered_twice(db: &tokio_postgres::Client) -> i64 {
    db.query_one(
        "SELECT count(*) FROM (SELECT conv, turn FROM events \
               WHERE author = 'worker' AND kind = 'message' \
               GROUP BY conv, turn HAVING count(*) > 1) t",
        &[],
    )
    .await
    .expect("check the log")
    .get(0)
}

#[tokio::main]
async fn main() {
    let kills = env("BENCH_KILLS", 20) as usize;
    let convs = env("BENCH_CONVS", 6) as usize;
    let work_ms = env("BENCH_WORK_MS", 500);
    let pg = match TestPostgres::start().await {
        Ok(pg) => pg,
        Err(e) => {
            eprintln!("failover: could not start PostgreSQL: {e}");
            std::process::exit(1);
        }
    };
    let url = pg.fresh_database().await.expect("a database");
    let db = tests::pg::connect(&url).await.expect("connect");

    let dir = tempfile::tempdir().expect("a temporary directory");
    let scenarios = relay_scenario(dir.path(), work_ms);

    let mut nodes: Vec<Node> = (0..3).map(|_| Node::new()).collect();
    for n in &mut nodes {
        n.start(&url, &scenarios).await;
    }
    let admin_token = procs::token(&url, "admin", true);
    let admin = procs::connect(&nodes[0].url(), &admin_token).await;
    for i in 0..convs {
        procs::create_named(&admin, &format!("relay-{i}"), "relay").await;
    }
    drop(admin);
    eprintln!(
        "failover: 3 nodes, {convs} conversations, worker turns of {work_ms} ms, {kills} kills"
    );

    let mut takeover: Vec<i64> = Vec::new();
    let mut answered: Vec<i64> = Vec::new();
    let mut lost = 0usize;
    let mut round = 0usize;
    let mut tries = 0usize;
    while round < kills && tries < kills * 20 {
        tries += 1;
        tokio::time::sleep(Duration::from_millis(150 + (tries as u64 * 37) % 300)).await;
        let Some((i, most, held)) = busiest(&db, &nodes).await else {
            continue;
        };
        nodes[i].kill().await;
        let killed_at = now_ms();
        round += 1;
        let victim_name = nodes[i].name.clone().unwrap_or_default();
        let found = watch_takeovers(&db, held, &victim_name, killed_at).await;
        takeover.extend(found.claimed);
        answered.extend(found.answered);
        lost += found.lost;
        nodes[i].start(&url, &scenarios).await;
        eprintln!(
            "kill {round}: {most} running turn(s) on the killed node; {} taken over so far",
            answered.len()
        );
    }

    let twice = answered_twice(&db).await;
    for n in &mut nodes {
        n.kill().await;
    }
    takeover.sort_unstable();
    answered.sort_unstable();
    println!(
        "failover: {round} kills, {} turns taken over, {lost} not within 30 s, {twice} turns answered twice",
        answered.len()
    );
    println!(
        "  kill → the turn claimed by another node (seen by polling every 10 ms): p50 {} ms, p99 {} ms, max {} ms",
        quantile(&takeover, 0.5),
        quantile(&takeover, 0.99),
        takeover.last().copied().unwrap_or(0)
    );
    println!(
        "  kill → answer committed (includes {work_ms} ms of work): p50 {} ms, p99 {} ms, max {} ms",
        quantile(&answered, 0.5),
        quantile(&answered, 0.99),
        answered.last().copied().unwrap_or(0)
    );
    if twice > 0 || lost > 0 || answered.is_empty() {
        std::process::exit(1);
    }
}
