//! The scenario library as clients see it (`listScenarios`, `GET /scenarios`): names,
//! descriptions, participants and the kind of those the server runs, for admins only. (The A2A
//! adapter's check of its setup against it: `adapters/a2a/tests/setup.rs`.)

use jsonrpsee::core::client::ClientT;
use serde_json::{json, Value};
use tests::{TestServer, P};

/// A server whose library holds `approval`: alice (external) and a scripted writer.
async fn with_library() -> TestServer {
    let server = TestServer::start().await;
    server.set_library(vec![(
        "approval",
        json!({
            "description": "A writer drafts, a person approves.",
            "participants": [
                "alice",
                {"id": "writer", "kind": "scripted", "replies": ["a secret draft"]}
            ],
            "policy": {"order": "round_robin", "first": "alice"}
        }),
    )]);
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_library_lists_names_participants_and_kinds_for_admins_only() {
    let server = with_library().await;
    let admin = server.client("admin").await;
    let r: Value = admin.request("listScenarios", P(json!({}))).await.unwrap();
    assert_eq!(
        r,
        json!({"scenarios": [{
            "name": "approval",
            "description": "A writer drafts, a person approves.",
            "participants": [{"id": "alice"}, {"id": "writer", "kind": "scripted"}]
        }]})
    );
    let alice = server.client("alice").await;
    let refused = alice
        .request::<Value, _>("listScenarios", P(json!({})))
        .await;
    assert_eq!(tests::error_code(refused), -32002);
    // Over HTTP too; a participant's settings never show.
    let addr = server.running().local_addr().to_string();
    let get = |agent: &str| {
        let header = format!("Authorization: Bearer {}\r\n", server.token(agent));
        let addr = addr.clone();
        async move { tests::http_raw(&addr, "GET /scenarios", &header, "").await }
    };
    let ok = get("admin").await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(
        ok.contains("\"writer\"") && !ok.contains("secret draft"),
        "{ok}"
    );
    let forbidden = get("alice").await;
    assert!(forbidden.starts_with("HTTP/1.1 403"), "{forbidden}");
}
