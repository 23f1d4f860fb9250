//! The scenario library as clients see it (`listScenarios`, `GET /scenarios`), and the A2A
//! adapter checking its setup against it at start: it refuses to start, with a sentence that
//! says how to mint the right token, unless its token is an admin's and an external participant
//! of every scenario it exposes.

use jsonrpsee::core::client::ClientT;
use serde_json::{json, Value};
use tests::procs::{binary, free_port};
use tests::{TestServer, P};

/// A server whose library holds `approval`: alice (external) and a scripted writer.
async fn with_library() -> TestServer {
    let server = TestServer::start().await;
    server
        .running()
        .orchestrator()
        .set_scenarios(vec![(
            "approval".into(),
            json!({
                "description": "A writer drafts, a person approves.",
                "participants": [
                    "alice",
                    {"id": "writer", "kind": "scripted", "replies": ["a secret draft"]}
                ],
                "policy": {"order": "round_robin", "first": "alice"}
            }),
        )])
        .unwrap();
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

/// The A2A adapter started with `token` for `scenario`: the running process and its port, or
/// its exit status and stderr when it refused to start.
async fn start_adapter(
    server: &TestServer,
    token: &str,
    scenario: &str,
) -> Result<(tokio::process::Child, u16), (i32, String)> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let bin = binary().with_file_name("orchestrator-a2a");
    let port = free_port();
    let mut child = tokio::process::Command::new(bin)
        .args(["--url", &server.url(), "--scenario", scenario])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("ORCHESTRATOR_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the A2A adapter's binary (cargo build --workspace)");
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    tokio::time::timeout(tests::WAIT, stdout.read_line(&mut first))
        .await
        .expect("the adapter starts or stops in time")
        .unwrap();
    if first.contains("listening") {
        return Ok((child, port));
    }
    let status = tokio::time::timeout(tests::WAIT, child.wait())
        .await
        .expect("the adapter stops in time")
        .unwrap();
    let mut err = String::new();
    let mut stderr = child.stderr.take().unwrap();
    stderr.read_to_string(&mut err).await.unwrap();
    Err((status.code().unwrap_or(-1), err))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_a2a_adapter_refuses_a_setup_it_cannot_serve_and_says_how_to_fix_it() {
    let server = with_library().await;
    let store = tests::open_store(&server.db);
    let mint = |agent: &str, admin: bool| {
        orchestrator::engine::auth::create_token(store.as_ref(), agent, admin).unwrap()
    };
    let alice_admin = mint("alice", true);
    let carol_admin = mint("carol", true);
    let cases = [
        (
            server.token("alice").to_string(),
            "approval",
            "not an admin",
        ),
        (alice_admin.clone(), "nope", "no scenario named \"nope\""),
        (
            carol_admin,
            "approval",
            "does not take part in scenario \"approval\"",
        ),
    ];
    for (token, scenario, says) in cases {
        let Err((code, err)) = start_adapter(&server, &token, scenario).await else {
            panic!("{says}: the adapter started");
        };
        assert_ne!(code, 0);
        assert!(err.contains(says), "{says}: {err}");
        assert!(
            err.contains("orchestrator token create") || err.contains("--scenarios"),
            "{says}: the error says how to fix it: {err}"
        );
    }
    assert!(
        start_adapter(&server, &alice_admin, "approval")
            .await
            .is_ok(),
        "alice, an admin and the scenario's external participant, serves it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_peer_asked_to_approve_sees_what_it_approves_and_what_others_said() {
    let server = TestServer::start().await;
    server
        .running()
        .orchestrator()
        .set_scenarios(vec![(
            "review".into(),
            json!({
                "participants": [
                    "alice",
                    {"id": "writer", "kind": "scripted", "replies": ["Draft: Release 1.2 ships on Friday."]},
                    {"id": "editor", "kind": "scripted", "replies": ["Edited: Friday, 10:00 UTC."]},
                    {"id": "publisher", "kind": "scripted", "replies": ["Published."]}
                ],
                "policy": {
                    "order": "round_robin",
                    "first": "alice",
                    "approvals": [{"before": "publisher", "approver": "alice"}]
                }
            }),
        )])
        .unwrap();
    let store = tests::open_store(&server.db);
    let alice = orchestrator::engine::auth::create_token(store.as_ref(), "alice", true).unwrap();
    let (_adapter, port) = start_adapter(&server, &alice, "review")
        .await
        .expect("the adapter starts");
    let send = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "Please write the release note."}]}
    }})
    .to_string();
    let answer = tests::http_raw(
        &format!("127.0.0.1:{port}"),
        "POST /review/",
        "Content-Type: application/json\r\nA2A-Version: 1.0\r\n",
        &send,
    )
    .await;
    let body: Value = serde_json::from_str(
        answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b)
            .unwrap_or_default(),
    )
    .unwrap_or_else(|e| panic!("{e}: {answer}"));
    let status = &body["result"]["task"]["status"];
    assert_eq!(status["state"], "TASK_STATE_INPUT_REQUIRED", "{body}");
    let texts: Vec<&str> = status["message"]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["text"].as_str())
        .collect();
    assert_eq!(texts[0], "Edited: Friday, 10:00 UTC.", "{body}");
    assert_eq!(
        texts[1], "writer: Draft: Release 1.2 ships on Friday.",
        "{body}"
    );
    assert!(
        texts[2].starts_with("Approval requested: publisher speaks next only if you approve"),
        "{body}"
    );
    assert_eq!(status["message"]["metadata"]["approvalFor"], "publisher");
}
