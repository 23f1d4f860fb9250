//! Every example scenario under `examples/scenarios/` runs to its end on the real server.

use std::time::Duration;

use agent_sdk::proto::*;
use agent_sdk::{AgentClient, WsJsonRpcClient};
use orchestrator::scenario::Scenario;
use serde_json::Value;
use tests::{full_log, wait_for, TestServer, WAIT};

fn example(name: &str) -> Value {
    let path = format!(
        "{}/../examples/scenarios/{name}.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("example file");
    let v: Value = serde_norway::from_str(&text).expect("yaml");
    Scenario::parse(&v).expect("a valid scenario");
    v
}

async fn start(server: &TestServer, id: &str, scenario: Value) -> WsJsonRpcClient {
    let admin = server.sdk("admin", None).await;
    tests::create_scenario(&admin, id, scenario).await;
    admin
}

async fn closed_log(admin: &WsJsonRpcClient, id: &str) -> Vec<Event> {
    wait_for(admin, id, "the close", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    full_log(admin, id).await
}

fn said(log: &[Event]) -> Vec<String> {
    log.iter()
        .filter(|e| e.kind == EventKind::Message)
        .map(|e| {
            format!(
                "{}: {}",
                e.author,
                e.payload_value()["text"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_round_robin_debate_runs_to_its_stop_word() {
    let server = TestServer::start().await;
    let admin = start(&server, "debate", example("debate")).await;
    let log = closed_log(&admin, "debate").await;
    let lines = said(&log);
    let speakers: Vec<&str> = lines.iter().map(|l| l.split(':').next().unwrap()).collect();
    assert_eq!(
        speakers,
        [
            "moderator",
            "proponent",
            "opponent",
            "moderator",
            "proponent",
            "opponent",
            "moderator",
            "orchestrator"
        ]
    );
    assert_eq!(
        log.last().unwrap().payload_value()["data"]["reason"],
        "on_text"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_routing_sends_the_turn_to_the_tool_by_a_selector_rule() {
    let server = TestServer::start().await;
    let admin = start(&server, "tools", example("tool-routing")).await;
    let log = closed_log(&admin, "tools").await;
    assert_eq!(
        said(&log),
        [
            "user: What is 6 times 7?",
            "assistant: calc: 6 * 7",
            "calc: 42",
            "assistant: 6 times 7 is 42. DONE",
            "orchestrator: The conversation ended: on text."
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_waits_for_the_external_approver() {
    let server =
        TestServer::with_options(Default::default(), Default::default(), Default::default()).await;
    // alice is the external approver: give the test's alice token to the scenario's alice.
    let admin = start(&server, "approval", example("approval")).await;
    let alice = server.sdk("alice", None).await;
    // The writer drafts, then the turn comes to alice for approval.
    let until = tokio::time::Instant::now() + WAIT;
    let s = loop {
        let s = alice.get_conversation("approval").await.expect("snapshot");
        if s.speaker.as_deref() == Some("alice") {
            break s;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "no approval requested: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(s.guidance.status, GuidanceStatus::MaySpeak);
    alice
        .send_message(SendMessageParams {
            conversation_id: "approval".into(),
            payload: MessagePayload::text("approve"),
            finality: Finality::Turn,
            turn_hint: Some(TurnHint { turn: s.turn }),
            client_request_id: None,
        })
        .await
        .expect("approve");
    let log = closed_log(&admin, "approval").await;
    assert_eq!(
        said(&log),
        [
            "writer: Draft: Release 1.2 ships on Friday.",
            "alice: approve",
            "publisher: Published. TERMINATE",
            "orchestrator: The conversation ended: on text."
        ]
    );
    let types: Vec<String> = log
        .iter()
        .filter(|e| e.kind == EventKind::System)
        .map(|e| e.payload_value()["type"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(types.contains(&"approval_requested".to_string()));
}
