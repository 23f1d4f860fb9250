//! A turn taken again from the log at start runs with the scenario library in place: an
//! `orchestrate` participant whose turn was open when the server stopped opens its next
//! sub-conversation by scenario name at once. (The server used to load its library just after
//! the turns were handed out again, so such a turn could fail with "no scenario named …".)

use std::sync::Arc;
use std::time::Duration;

use orchestrator::engine::auth::Identity;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous};
use proto_spec::{CreateConversationParams, EventKind, TailParams};
use serde_json::{json, Value};

fn library() -> Vec<(String, Value)> {
    let tree = json!({
        "participants": [
            {"id": "asker", "kind": "scripted", "replies": ["plan it"]},
            {"id": "planner", "kind": "orchestrate", "steps": [
                {"call": "leaf", "as": "a", "input": "first: {{$.input.text}}"}
            ]}
        ],
        "policy": {"order": "round_robin", "first": "asker"},
        "stop": {"maxTurns": 2},
        "turn": {"timeout": "60s"}
    });
    // Nobody answers in a leaf: the planner's turn stays open.
    let leaf = json!({
        "participants": ["ext"],
        "policy": {"order": "round_robin", "first": "ext"},
        "stop": {"maxTurns": 1}
    });
    vec![("tree".into(), tree), ("leaf".into(), leaf)]
}

fn open(db: &std::path::Path, scenarios: Vec<(String, Value)>) -> Arc<Orchestrator> {
    let store = Arc::new(SqliteStore::open(db, Synchronous::Full).expect("store"));
    let options = orchestrator::host::Options {
        scenarios,
        ..Default::default()
    };
    options.start(store).expect("open")
}

/// The tree's log, once `ready` holds for it.
async fn wait_for(
    orch: &Orchestrator,
    ready: impl Fn(&[proto_spec::Event]) -> bool,
) -> Vec<proto_spec::Event> {
    let admin = Identity::new("admin", true);
    for _ in 0..500 {
        let log = orch
            .tail(
                &admin,
                TailParams {
                    conversation_id: "tree".into(),
                    since_seq: 0,
                    limit: None,
                },
            )
            .await
            .expect("tail")
            .events;
        if ready(&log) {
            return log;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the tree did not get there in 10 s");
}

fn count(log: &[proto_spec::Event], kind: &str) -> usize {
    log.iter()
        .filter(|e| e.payload_value()["type"] == kind)
        .count()
}

fn planner_messages(log: &[proto_spec::Event]) -> Vec<Value> {
    log.iter()
        .filter(|e| e.author == "planner" && e.kind == EventKind::Message)
        .map(|e| e.payload_value())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_taken_again_at_start_finds_the_scenario_library() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("tree.db");

    // The planner opens its child and waits for it; the server stops.
    let orch = open(&db, library());
    orch.create_conversation(
        &Identity::new("admin", true),
        CreateConversationParams {
            conversation_id: Some("tree".into()),
            scenario_name: Some("tree".into()),
            ..Default::default()
        },
    )
    .await
    .expect("create");
    wait_for(&orch, |log| count(log, "subconversation_started") == 1).await;
    orch.shutdown().await;
    drop(orch);

    // Opened again with its library: the planner's turn is taken again from the log, finds its
    // child by name and waits for it; it does not fail for want of the scenario.
    let orch = open(&db, library());
    // The turn is handed out again at once, and a failure would be posted within milliseconds
    // (the last part shows both).
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let log = wait_for(&orch, |_| true).await;
    assert!(
        planner_messages(&log).is_empty(),
        "the planner answered without its child: {:?}",
        planner_messages(&log)
    );
    assert_eq!(count(&log, "subconversation_started"), 1, "one child");
    orch.shutdown().await;
    drop(orch);

    // Without the library (what the first moments of a server that loads it later look like),
    // the same turn fails: the case the library being in place from the start avoids.
    let orch = open(&db, Vec::new());
    let log = wait_for(&orch, |log| !planner_messages(log).is_empty()).await;
    let said = planner_messages(&log)[0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(said.contains("no scenario named \"leaf\""), "{said}");
    orch.shutdown().await;
}
