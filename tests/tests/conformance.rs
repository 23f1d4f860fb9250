//! The conformance kit (`proto-spec/conformance`) against our server, on the suites' backend:
//! every vector of every tier passes. And against a server that answers every call with an
//! empty result: every case fails, so no vector passes by asserting nothing.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tests::TestServer;
use tokio_tungstenite::tungstenite::Message;

fn config(url: String, http: String, tokens: BTreeMap<String, String>) -> conformance::Config {
    conformance::Config {
        url,
        http,
        tokens,
        vectors: conformance::parse(conformance::EMBEDDED).expect("the vectors parse"),
        tiers: Vec::new(),
        // One case by name while debugging: CONFORMANCE_ONLY=text.
        only: std::env::var("CONFORMANCE_ONLY").ok(),
        step_timeout: Duration::from_secs(10),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn our_server_passes_every_vector_of_every_tier() {
    let server = TestServer::start().await;
    let tokens = ["admin", "alice", "bob", "carol"]
        .iter()
        .map(|r| (r.to_string(), server.token(r).to_string()))
        .collect();
    let report = conformance::run(&config(server.url(), server.http_base(), tokens))
        .await
        .expect("the kit runs");
    let rendered = report.render();
    assert!(report.failures().is_empty(), "{rendered}");
    if std::env::var("CONFORMANCE_ONLY").is_err() {
        for tier in conformance::TIERS {
            let (passed, failed, skipped) = report.tier(tier);
            assert!(
                passed > 0 && failed == 0 && skipped == 0,
                "{tier}: {rendered}"
            );
        }
    }
    let json = report.to_json();
    assert_eq!(json["tiers"]["core"]["failed"], 0);
}

/// A WebSocket server on 127.0.0.1 that authenticates anyone and answers every other call
/// with an empty object.
async fn hollow_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(Message::Text(t))) = ws.next().await {
                    let req: Value = serde_json::from_str(t.as_str()).unwrap_or_default();
                    let result = if req["method"] == "authenticate" {
                        json!({"ok": true, "agentId": "someone", "tenant": "default"})
                    } else {
                        json!({})
                    };
                    let answer = json!({"jsonrpc": "2.0", "id": req["id"], "result": result});
                    if ws.send(Message::text(answer.to_string())).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    format!("ws://{addr}/rpc")
}

#[tokio::test]
async fn a_server_that_answers_nothing_right_fails_every_case() {
    let url = hollow_server().await;
    let tokens = ["admin", "alice", "bob", "carol"]
        .iter()
        .map(|r| (r.to_string(), format!("token-{r}")))
        .collect();
    let mut cfg = config(url.clone(), conformance::Config::http_of(&url), tokens);
    cfg.step_timeout = Duration::from_millis(300);
    let report = conformance::run(&cfg).await.expect("the kit runs");
    for tier in conformance::TIERS {
        let (passed, failed, _) = report.tier(tier);
        assert_eq!(passed, 0, "{tier}: {}", report.render());
        assert!(failed > 0, "{tier}");
    }
}
