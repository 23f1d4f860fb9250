//! A database from before tenants is migrated into the default tenant.

use orchestrator::engine::auth;
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous};
use orchestrator::engine::store::{Principals, TokenRecord, DEFAULT_TENANT};

/// A database from before tenants (schema version 5): migrating it puts everything in the
/// default tenant, and its tokens go on speaking for the same agents.
#[test]
fn a_database_from_before_tenants_is_migrated_into_the_default_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let token = auth::create_token(
        &SqliteStore::open(&path, Synchronous::Normal).unwrap(),
        "alice",
        true,
    )
    .unwrap();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "DROP TABLE tenant_usage; DROP TABLE tenants; ALTER TABLE tokens DROP COLUMN tenant; \
             ALTER TABLE tokens DROP COLUMN operator; PRAGMA user_version = 5;",
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path, Synchronous::Normal).unwrap();
    let found = store.find_token(&auth::hash_token(&token)).unwrap();
    assert_eq!(
        found,
        Some(TokenRecord {
            tenant: DEFAULT_TENANT.into(),
            agent_id: "alice".into(),
            admin: true,
            operator: false,
            expires_ms: None,
        })
    );
    let tenants: Vec<String> = store
        .list_tenants()
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(tenants, [DEFAULT_TENANT]);
}
