//! Runs the example binary against a real server, in both modes, and checks that it answers.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use tests::{TestServer, P, WAIT};

async fn answers_in(mode: &str) {
    let server = TestServer::start().await;
    let mut agent = tokio::process::Command::new(env!("CARGO_BIN_EXE_partner-agent"))
        .arg(mode)
        .env("ORCHESTRATOR_URL", server.url())
        .env("ORCHESTRATOR_TOKEN", server.token("bob"))
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start the example agent");
    // Give it time to connect (push mode: to register).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let admin = server.client("admin").await;
    let scenario = json!({"participants": ["alice", "bob"], "policy": {"order": "round_robin", "first": "alice"}});
    let _: Value = jsonrpsee::core::client::ClientT::request(
        &admin,
        "createConversation",
        P(json!({"conversationId": "demo", "scenario": scenario})),
    )
    .await
    .expect("create");
    let alice = server.client("alice").await;
    let _: Value = jsonrpsee::core::client::ClientT::request(
        &alice,
        "sendMessage",
        P(json!({"conversationId": "demo", "payload": {"text": "hello"}, "finality": "turn"})),
    )
    .await
    .expect("post");
    let r: Value = jsonrpsee::core::client::ClientT::request(
        &alice,
        "getUpdatesOrGuidance",
        P(json!({"conversationId": "demo", "sinceSeq": 4, "timeoutMs": WAIT.as_millis() as u64})),
    )
    .await
    .expect("updates");
    assert_eq!(r["messages"][0]["author"], "bob", "{r}");
    assert_eq!(r["messages"][0]["payload"]["text"], "You said: hello");
    assert_eq!(r["guidance"]["status"], "may_speak");
    agent.kill().await.expect("stop the agent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_agent_answers_in_push_mode() {
    answers_in("push").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_agent_answers_in_pull_mode() {
    answers_in("pull").await;
}
