//! The A2A adapter's binary against a real server: with an admin's token it checks its setup at
//! start (each exposed scenario on the server, naming a caller participant) and refuses
//! otherwise with a sentence that says how to fix it; a peer, authenticated with its own token,
//! asked to approve sees what it approves and what the others said.

use serde_json::{json, Value};
use tests::procs::free_port;
use tests::TestServer;

/// A server whose library holds `approval`: alice (external, the caller) and a scripted
/// writer; and `nocaller`, the same without a caller.
async fn with_library() -> TestServer {
    let server = TestServer::start().await;
    let writer = json!({"id": "writer", "kind": "scripted", "replies": ["a draft"]});
    server.set_library(vec![
        (
            "approval",
            json!({
                "participants": [{"id": "alice", "external": true, "caller": true}, writer],
                "policy": {"order": "round_robin", "first": "alice"}
            }),
        ),
        (
            "nocaller",
            json!({
                "participants": ["alice", writer],
                "policy": {"order": "round_robin", "first": "alice"}
            }),
        ),
    ]);
    server
}

/// The A2A adapter started for `scenario`, with `token` for its check at start if given: the
/// running process and its port, or its exit status and stderr when it refused to start.
async fn start_adapter(
    server: &TestServer,
    token: Option<&str>,
    scenario: &str,
) -> Result<(tokio::process::Child, u16), (i32, String)> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let bin = env!("CARGO_BIN_EXE_orchestrator-a2a");
    let port = free_port();
    let mut command = tokio::process::Command::new(bin);
    command.env_remove("ORCHESTRATOR_TOKEN");
    if let Some(token) = token {
        command.env("ORCHESTRATOR_TOKEN", token);
    }
    let mut child = command
        .args(["--url", &server.url(), "--scenario", scenario])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the A2A adapter's binary");
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
    let admin = mint("ops", true);
    let cases = [
        (
            server.token("alice").to_string(),
            "approval",
            "not an admin",
            "orchestrator token create",
        ),
        (
            admin.clone(),
            "nope",
            "no scenario named \"nope\"",
            "--scenarios",
        ),
        (
            admin.clone(),
            "nocaller",
            "scenario \"nocaller\" names no caller participant",
            "mark one of its external participants (alice) with `caller: true`",
        ),
    ];
    for (token, scenario, says, fix) in cases {
        let Err((code, err)) = start_adapter(&server, Some(&token), scenario).await else {
            panic!("{says}: the adapter started");
        };
        assert_ne!(code, 0);
        assert!(err.contains(says), "{says}: {err}");
        assert!(
            err.contains(fix),
            "{says}: the error says how to fix it: {err}"
        );
    }
    assert!(
        start_adapter(&server, Some(&admin), "approval")
            .await
            .is_ok(),
        "a scenario with a caller is served"
    );
    assert!(
        start_adapter(&server, None, "nocaller").await.is_ok(),
        "without a token nothing is checked at start"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_a2a_peer_asked_to_approve_sees_what_it_approves_and_what_others_said() {
    let server = TestServer::start().await;
    server.set_library(vec![(
            "review",
            json!({
                "participants": [
                    {"id": "alice", "external": true, "caller": true},
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
        )]);
    let (_adapter, port) = start_adapter(&server, None, "review")
        .await
        .expect("the adapter starts");
    // The peer speaks with a token of its own (not an admin's), as the caller, alice.
    let peer = format!("Bearer {}", server.token("bob"));
    let send = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "Please write the release note."}]}
    }})
    .to_string();
    let answer = tests::http_raw(
        &format!("127.0.0.1:{port}"),
        "POST /review/",
        &format!("Content-Type: application/json\r\nA2A-Version: 1.0\r\nAuthorization: {peer}\r\n"),
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
