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
        .stderr(Stdio::piped())
        .env_remove("ORCHESTRATOR_LOG")
        .kill_on_drop(true)
        .spawn()
        .expect("start the example agent");
    // What it logs (at info by default).
    let logged = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let mut stderr = agent.stderr.take().expect("stderr");
    let into = logged.clone();
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = stderr.read(&mut buf).await {
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
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
    tests::eventually("the agent logs its reply", || {
        logged.lock().unwrap().contains("replied")
    })
    .await;
    let logs = logged.lock().unwrap().clone();
    for line in ["connected", "agent=\"bob\"", "took turn", "turn=2"] {
        assert!(logs.contains(line), "{line:?} not in its logs:\n{logs}");
    }
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

#[test]
fn the_example_agent_explains_its_command_line() {
    let bin = env!("CARGO_BIN_EXE_partner-agent");
    let help = std::process::Command::new(bin)
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for word in ["push", "pull", "ORCHESTRATOR_URL", "ORCHESTRATOR_TOKEN"] {
        assert!(text.contains(word), "{word} not in --help:\n{text}");
    }
    let no_token = std::process::Command::new(bin)
        .env_remove("ORCHESTRATOR_TOKEN")
        .output()
        .unwrap();
    assert_eq!(no_token.status.code(), Some(1));
    let err = String::from_utf8_lossy(&no_token.stderr);
    assert!(err.contains("ORCHESTRATOR_TOKEN is not set"), "{err}");
    let unreachable = std::process::Command::new(bin)
        .env("ORCHESTRATOR_TOKEN", "oct_x")
        .env("ORCHESTRATOR_URL", "ws://127.0.0.1:1/rpc")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&unreachable.stderr);
    assert!(
        err.contains("could not connect to ws://127.0.0.1:1/rpc"),
        "{err}"
    );
    let bad = std::process::Command::new(bin)
        .arg("sideways")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
