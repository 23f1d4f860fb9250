//! PostgreSQL crashes under appends (an immediate shutdown: no checkpoint, recovery from its WAL
//! at the next start): while it is down every append is refused with the clear
//! "database is unavailable" answer; once it is back the node goes on without a restart, every
//! append retried with its key lands once, and every acknowledged event is in the log at its
//! seq. (On SQLite the same is shown under a simulated power loss: `orchestrator/tests/power_loss.rs`.)

use std::collections::HashMap;
use std::time::Duration;

use jsonrpsee::core::client::ClientT;
use serde_json::{json, Value};
use tests::pg::TestPostgres;
use tests::{test_limits, ws_log as log, TestServer, P};

const WRITERS: usize = 3;
const EACH: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_loses_nothing_acknowledged_and_the_node_goes_on() {
    let mut pg = TestPostgres::start_own()
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL could not be started: {e}"));
    let url = pg.fresh_database().await.expect("a database");
    let node = TestServer::on_url(url, None, test_limits(), HashMap::new()).await;
    for w in 0..WRITERS {
        node.create(&format!("w{w}"), &["alice"]).await;
    }
    let (acked_tx, mut acked_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let client = node.client("alice").await;
        let acked = acked_tx.clone();
        writers.push(tokio::spawn(async move {
            let conv = format!("w{w}");
            let mut refused = Vec::new();
            for i in 0..EACH {
                let key = format!("w{w}-{i}");
                // Each append is retried with its key until it is answered (bounded: 60 s).
                for attempt in 0..600 {
                    let r: Result<Value, _> = client
                        .request(
                            "sendMessage",
                            P(json!({"conversationId": conv, "payload": {"text": key}, "finality": "none", "clientRequestId": key})),
                        )
                        .await;
                    match r {
                        Ok(v) => {
                            let seq = v["seq"].as_u64().expect("seq");
                            acked.send((conv.clone(), seq, key.clone())).unwrap();
                            break;
                        }
                        Err(e) => {
                            refused.push(e.to_string());
                            assert!(attempt < 599, "{key} never landed: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }
            refused
        }));
    }
    drop(acked_tx);
    // Crash the database once a third of the appends are acknowledged.
    let mut acked: Vec<(String, u64, String)> = Vec::new();
    while acked.len() < WRITERS * EACH / 3 {
        acked.push(acked_rx.recv().await.expect("an acknowledgement"));
    }
    pg.crash().expect("crash");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    pg.restart().await.expect("restart");
    let mut refusals = Vec::new();
    for w in writers {
        refusals.extend(w.await.expect("writer"));
    }
    while let Some(a) = acked_rx.recv().await {
        acked.push(a);
    }
    assert_eq!(acked.len(), WRITERS * EACH);
    assert!(
        !refusals.is_empty(),
        "no append was refused while the database was down"
    );
    for r in &refusals {
        assert!(
            r.contains("the database is unavailable") || r.contains("nothing was written"),
            "an append refused with an unclear answer: {r}"
        );
    }
    // Every acknowledged append is in the log once, at its seq; seq is dense.
    let reader = node.client("alice").await;
    for w in 0..WRITERS {
        let conv = format!("w{w}");
        let events = log(&reader, &conv).await;
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e["seq"].as_u64(), Some(i as u64 + 1), "{conv} is not dense");
        }
        let texts: Vec<&str> = events
            .iter()
            .filter(|e| e["kind"] == "message")
            .filter_map(|e| e["payload"]["text"].as_str())
            .collect();
        assert_eq!(texts.len(), EACH, "{conv}: {texts:?}");
        for (c, seq, key) in acked.iter().filter(|a| a.0 == conv) {
            let e = &events[*seq as usize - 1];
            assert_eq!(e["payload"]["text"], json!(key), "{c} seq {seq}");
        }
    }
    println!(
        "database crash: {} appends acknowledged, 0 lost, {} refusals while it was down",
        acked.len(),
        refusals.len()
    );
}
