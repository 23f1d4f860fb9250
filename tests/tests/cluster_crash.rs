//! Three `orchestrator serve` processes on one PostgreSQL database, on 127.0.0.1: a random node
//! is killed with SIGKILL every moment and started again, while a scripted (internal) agent and
//! push replicas of an external agent attached to different nodes take turns, and writers append
//! through one node and retry every append through another with the same key. After every kill:
//! every acknowledged event is in the log at its seq, seq is dense, no `clientRequestId` twice,
//! exactly one decision and at most one reply per turn; in the end every conversation reaches
//! its stop condition. (That each turn's work runs on one node at a time is checked in
//! `cluster.rs`, where the test can count the agent's runs.)
//!
//! `CLUSTER_KILLS` sets the number of kills (default 30); `scripts/soak-cluster` runs 1,000.
//! The binary is `ORCHESTRATOR_BIN`, or the `orchestrator` built beside this test.

use std::sync::Arc;
use std::time::Duration;

use agent_sdk::proto::*;
use agent_sdk::{AgentClient, WsJsonRpcClient};
use rand::Rng;
use tests::procs::{
    connect, create_named, duet_library, push_executor, token, Acked, Ext, Logs, Node,
};

const NODES: usize = 3;
const CONVERSATIONS: usize = 3;
const WRITERS: usize = 2;

/// A writer: appends to its own conversation through one node and sends every append again,
/// with the same key, through another; both answers must agree.
async fn writer(
    first: WsJsonRpcClient,
    second: WsJsonRpcClient,
    id: String,
    acked: Acked,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let mut i = 0u64;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        i += 1;
        let text = format!("{id} line {i}");
        let p = SendMessageParams {
            conversation_id: id.clone(),
            payload: MessagePayload::text(text.clone()),
            finality: Finality::None,
            turn_hint: None,
            client_request_id: Some(format!("{id}-{i}")),
            after_key: None,
        };
        // A node being killed answers with an error or not at all: try again, same key.
        let mut answers = Vec::new();
        for client in [&first, &second] {
            for _ in 0..200 {
                match tokio::time::timeout(Duration::from_secs(5), client.send_message(p.clone()))
                    .await
                {
                    Ok(Ok(r)) => {
                        answers.push(r.seq);
                        break;
                    }
                    _ => tokio::time::sleep(Duration::from_millis(25)).await,
                }
            }
        }
        assert_eq!(answers.len(), 2, "{id} line {i} was never acknowledged");
        assert_eq!(
            answers[0], answers[1],
            "{id} line {i}: a retry on another node answers the original"
        );
        acked.lock().unwrap().insert((id.clone(), answers[0]), text);
        let pause = rand::rng().random_range(1..20);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// The conversations the clients work in: `duet-{c}` from the `duet` scenario, and a
/// `log-{w}` for each writer.
async fn create_duets_and_logs(admin: &WsJsonRpcClient) {
    for c in 0..CONVERSATIONS {
        create_named(admin, &format!("duet-{c}"), "duet").await;
    }
    for w in 0..WRITERS {
        admin
            .create_conversation(CreateConversationParams {
                conversation_id: Some(format!("log-{w}")),
                participants: Some(vec!["writer".into()]),
                ..Default::default()
            })
            .await
            .expect("create");
    }
}

/// Each writer appends to its `log-{w}` through two nodes (a retry goes to the second) until
/// `stop` is set.
async fn start_writers(
    urls: &[String],
    token: &str,
    acked: &Acked,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let first = connect(&urls[w % NODES], token).await;
        let second = connect(&urls[(w + 1) % NODES], token).await;
        writers.push(tokio::spawn(writer(
            first,
            second,
            format!("log-{w}"),
            acked.clone(),
            stop.clone(),
        )));
    }
    writers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_random_nodes_loses_nothing_acknowledged() {
    let kills = tests::procs::kills("CLUSTER_KILLS", 30);
    let (db, _pg) = tests::postgres_database().await;
    let dir = tempfile::tempdir().unwrap();
    let scenarios = duet_library(dir.path(), "duet");
    let admin_token = token(&db, "admin", true);
    let ext_token = token(&db, "ext", false);
    let writer_token = token(&db, "writer", false);
    let mut nodes: Vec<Node> = (0..NODES).map(|_| Node::new()).collect();
    for n in &mut nodes {
        n.start(&db, &scenarios).await;
    }
    let urls: Vec<String> = nodes.iter().map(Node::url).collect();
    let admin = connect(&urls[0], &admin_token).await;
    create_duets_and_logs(&admin).await;
    let ext = Arc::new(Ext::default());
    let acked = ext.acked.clone();
    // Push replicas of `ext` on two different nodes.
    let mut tasks = Vec::new();
    for url in [&urls[1], &urls[2]] {
        tasks.push(push_executor(connect(url, &ext_token).await, ext.clone()));
    }
    let stop_writing: Arc<std::sync::atomic::AtomicBool> = Arc::default();
    let writers = start_writers(&urls, &writer_token, &acked, &stop_writing).await;
    let ids: Vec<String> = (0..CONVERSATIONS)
        .map(|c| format!("duet-{c}"))
        .chain((0..WRITERS).map(|w| format!("log-{w}")))
        .collect();
    let mut progress = Vec::new();
    let mut logs = Logs::default();
    let began = std::time::Instant::now();
    for round in 0..kills {
        let (pause, victim, down) = {
            let mut r = rand::rng();
            (
                r.random_range(100..600),
                r.random_range(0..NODES),
                r.random_range(0..300),
            )
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        nodes[victim].kill().await;
        tokio::time::sleep(Duration::from_millis(down)).await;
        nodes[victim].start(&db, &scenarios).await;
        let seen = acked.lock().unwrap().clone();
        for id in &ids {
            let closed = logs.check(&admin, id, &seen, round).await;
            assert!(!closed, "round {round}: {id} ended before the kills did");
        }
        progress.push(seen.len());
        if (round + 1) % 25 == 0 {
            // A long soak says how far it got (`--nocapture`).
            println!(
                "{} of {kills} kills in {:.0} s: {} acknowledged events found, {} events checked",
                round + 1,
                began.elapsed().as_secs_f64(),
                seen.len(),
                logs.events()
            );
        }
    }
    let moved = progress.windows(2).filter(|w| w[1] > w[0]).count();
    assert!(
        moved > kills / 2,
        "the clients kept going between kills: {progress:?}"
    );
    stop_writing.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        // A writer's own checks (both answers agree) fail the test here.
        w.await.expect("a writer");
    }
    let duets: Vec<String> = ids[..CONVERSATIONS].to_vec();
    logs.finish_all(&admin, &duets, &ext, kills).await;
    for t in tasks {
        t.abort();
    }
    let seen = acked.lock().unwrap().clone();
    for id in &ids {
        logs.check(&admin, id, &seen, kills).await;
    }
    println!(
        "{kills} kills of {NODES} nodes; {} acknowledged events found; all {CONVERSATIONS} conversations reached their stop condition",
        seen.len()
    );
    for n in &mut nodes {
        n.kill().await;
    }
}
