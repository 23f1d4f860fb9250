//! Plans and deliverables keep their numbering across a restart: the store marks the messages
//! that may be documents, recovery reads their payloads (and no other message's), and a database
//! of schema version 3, from before the mark, is marked when it is migrated.

use std::sync::Arc;

use orchestrator::engine::auth::Identity;
use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous};
use proto_spec::{CreateConversationParams, Finality, SendMessageParams};
use serde_json::json;

/// Opens the database, posts a plan of type `launch`, and returns the version it was given.
async fn post_plan(path: &std::path::Path, create: bool) -> u64 {
    let store = SqliteStore::open(path, Synchronous::Normal).unwrap();
    let orch = Orchestrator::open(Arc::new(store), Limits::default()).unwrap();
    if create {
        orch.create_conversation(
            &Identity::new("admin", true),
            CreateConversationParams {
                conversation_id: Some("c".into()),
                participants: Some(vec!["alice".into()]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    }
    let alice = Identity::new("alice", false);
    for text in ["chatter that mentions no document", "more"] {
        orch.send_message(&alice, SendMessageParams::text("c", text, Finality::None))
            .await
            .unwrap();
    }
    let plan = json!({"text": "p", "schema": "plan.v1",
        "data": {"type": "launch", "format": "markdown", "content": "# Plan"}});
    let r = orch
        .send_message(
            &alice,
            SendMessageParams {
                conversation_id: "c".into(),
                payload: serde_json::from_value(plan).unwrap(),
                finality: Finality::None,
                turn_hint: None,
                client_request_id: None,
                after_key: None,
            },
        )
        .await
        .unwrap();
    let events = orch
        .tail(
            &alice,
            proto_spec::TailParams {
                conversation_id: "c".into(),
                since_seq: r.seq - 1,
                limit: None,
            },
        )
        .await
        .unwrap()
        .events;
    orch.shutdown().await;
    events[0].payload_value()["data"]["version"]
        .as_u64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_go_on_after_a_restart_and_after_migrating_from_version_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    assert_eq!(post_plan(&path, true).await, 1);
    assert_eq!(post_plan(&path, false).await, 2, "after a restart");
    let marked = |path: &std::path::Path| -> i64 {
        let conn = rusqlite::Connection::open(path).unwrap();
        conn.query_row(
            "SELECT count(*) FROM events WHERE doc IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(marked(&path), 2, "only the plans are marked");
    // Back to schema version 3: no mark. Migrating marks the plans written before.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "ALTER TABLE events DROP COLUMN doc; DROP TABLE tenant_usage; DROP TABLE tenants; ALTER TABLE tokens DROP COLUMN tenant; \
             ALTER TABLE tokens DROP COLUMN operator; PRAGMA user_version = 3;",
        )
            .unwrap();
    }
    assert_eq!(post_plan(&path, false).await, 3, "after migrating");
    assert_eq!(marked(&path), 3);
}
