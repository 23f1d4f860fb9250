//! What the orchestrator's own integration tests share.

use std::sync::Arc;

use orchestrator::engine::auth::Identity;
use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous};
use proto_spec::CreateConversationParams;

/// An orchestrator on a new SQLite database in `dir`, with conversation `c` of alice and bob.
pub async fn open(dir: &tempfile::TempDir, limits: Limits) -> Arc<Orchestrator> {
    let store = SqliteStore::open(dir.path().join("o.db"), Synchronous::Normal).expect("store");
    let orch = Orchestrator::open(Arc::new(store), limits).expect("open");
    orch.create_conversation(
        &Identity::new("admin", true),
        CreateConversationParams {
            conversation_id: Some("c".into()),
            participants: Some(vec!["alice".into(), "bob".into()]),
            ..Default::default()
        },
    )
    .await
    .expect("create");
    orch
}
