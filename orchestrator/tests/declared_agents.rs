//! No token for an id a scenario declared: recorded when the conversation is created, and
//! filled from the log when a database of schema version 1 is migrated.

use std::sync::Arc;

use orchestrator::engine::auth::{create_token, Identity};
use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous};
use proto_spec::CreateConversationParams;
use serde_json::json;

fn refused(store: &SqliteStore, agent: &str) -> bool {
    match create_token(store, agent, false) {
        Ok(_) => false,
        Err(e) => {
            assert!(e.to_rpc().message.contains("one principal"), "{e}");
            true
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_ids_get_no_token_also_after_migrating_from_version_1() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("d.db");
    {
        let store = SqliteStore::open(&path, Synchronous::Normal).unwrap();
        let orch = Orchestrator::open(Arc::new(store), Limits::default()).unwrap();
        let scenario = json!({"participants": [
            {"id": "writer", "kind": "scripted", "replies": ["v1"]}, "alice"]});
        orch.create_conversation(
            &Identity::new("admin", true),
            CreateConversationParams {
                conversation_id: Some("c".into()),
                scenario: Some(scenario),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        orch.shutdown().await;
    }
    let store = SqliteStore::open(&path, Synchronous::Normal).unwrap();
    assert!(refused(&store, "writer"));
    assert!(
        !refused(&store, "alice"),
        "an external participant may have a token"
    );
    drop(store);
    // Back to schema version 1: the table and index of version 2, the columns of 3 and 4, the
    // tenants of 6 gone.
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "DROP TABLE declared_agents; DROP INDEX tokens_agent; ALTER TABLE tokens DROP COLUMN expires_ms; ALTER TABLE tokens DROP COLUMN last_used_ms; ALTER TABLE events DROP COLUMN doc; \
             DROP TABLE tenant_usage; DROP TABLE tenants; ALTER TABLE tokens DROP COLUMN tenant; ALTER TABLE tokens DROP COLUMN operator; PRAGMA user_version = 1;",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path, Synchronous::Normal).unwrap();
    assert!(refused(&store, "writer"), "filled from the created events");
}
