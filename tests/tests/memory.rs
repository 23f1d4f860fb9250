//! Memory comes back: after a burst of 2,000 WebSocket connections closes, the server's resident
//! memory returns near its level before within seconds. What a connection holds
//! (its send buffer, the WebSocket reader's buffers, its session and tasks) is freed when it
//! closes, and each worker thread of the server, as it goes idle, has the allocator (mimalloc)
//! give the pages freed on it back to the system (`memory-release`).

use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::json;
use tests::procs::{token, Node};
use tokio_tungstenite::tungstenite::Message;

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// `n` connections, each authenticated, 64 opened at a time.
async fn open(url: &str, token: &str, n: usize) -> Vec<Ws> {
    futures::stream::iter(0..n)
        .map(|i| async move {
            let (mut ws, _) = tokio_tungstenite::connect_async(url).await.expect("connect");
            let auth = json!({"jsonrpc": "2.0", "id": i, "method": "authenticate", "params": {"token": token}});
            ws.send(Message::text(auth.to_string())).await.expect("send");
            match ws.next().await {
                Some(Ok(Message::Text(t))) => assert!(t.contains(r#""ok":true"#), "{t}"),
                other => panic!("{other:?}"),
            }
            ws
        })
        .buffer_unordered(64)
        .collect()
        .await
}

/// Closes every connection and waits for the server's side of each.
async fn close(conns: Vec<Ws>) {
    futures::stream::iter(conns)
        .for_each_concurrent(64, |mut ws| async move {
            let _ = ws.close(None).await;
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resident_memory_comes_back_after_a_burst_of_connections() {
    agent_sdk::host::raise_open_files_limit();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("m.db").display().to_string();
    let alice = token(&db, "alice", false);
    let mut node = Node::new();
    node.start_with(
        &db,
        dir.path(),
        &[
            "--max-connections",
            "4096",
            "--max-connections-per-address",
            "4096",
            "--max-connections-per-agent",
            "4096",
        ]
        .map(std::ffi::OsStr::new),
    )
    .await;
    let url = format!("ws://127.0.0.1:{}/rpc", node.port);
    let pid = node.pid();
    // What the first connections allocate for good (thread-local caches, the runtime's
    // structures) is in the level before.
    close(open(&url, &alice, 200).await).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib(pid);
    let conns = open(&url, &alice, 2000).await;
    let peak = rss_kib(pid);
    close(conns).await;
    let closed = Instant::now();
    let grown = peak.saturating_sub(before);
    assert!(
        grown > 4 * 1024,
        "2,000 connections took only {grown} KiB: nothing to measure"
    );
    // Near the level before: at most a quarter of what the burst added is still held.
    let near = before + grown / 4;
    let mut now = rss_kib(pid);
    while now > near && closed.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        now = rss_kib(pid);
    }
    println!(
        "before {before} KiB, with 2,000 connections {peak} KiB, {:.1} s after they closed {now} KiB",
        closed.elapsed().as_secs_f64()
    );
    assert!(
        now <= near,
        "resident memory {now} KiB 10 s after the burst closed: before {before} KiB, peak {peak} KiB"
    );
    node.kill().await;
}

/// An orchestrator stopped and dropped leaves nothing behind: its hub and turn dispatcher are
/// freed with it (they once held each other, keeping the runtime's driver — an epoll and an
/// eventfd — and every conversation's view alive: a fuzzer making a server every 2,000 inputs
/// grew by two descriptors and ~130 KB each time).
#[test]
fn a_stopped_orchestrator_is_freed_whole() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("f.db").display().to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let hub = rt.block_on(async {
        let orch = orchestrator::engine::service::Orchestrator::open(
            tests::open_store(&db),
            tests::test_limits(),
        )
        .expect("open");
        let hub = std::sync::Arc::downgrade(orch.hub());
        orch.shutdown().await;
        hub
    });
    drop(rt);
    assert!(hub.upgrade().is_none(), "the hub outlived its orchestrator");
}
