//! Tenants: `tenant create|list|show` and tokens that belong to one, on a database file (and
//! on PostgreSQL in the suites' second pass); a PostgreSQL database from before tenants migrated
//! into `default` (a SQLite one: `orchestrator/tests/tenants.rs`); `authenticate` and `GET /me`
//! answering the tenant.

use orchestrator::engine::auth;
use orchestrator::engine::store::{TokenRecord, DEFAULT_TENANT};
use serde_json::{json, Value};
use tests::{open_store, TestServer};

use tests::procs::run_in as cli;

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

/// `args` succeeds; its standard output as JSON.
fn json_of(dir: &std::path::Path, args: &[&str]) -> Value {
    let o = cli(dir, args);
    assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

/// `args` fails, saying `why`.
fn refused(dir: &std::path::Path, args: &[&str], why: &str) {
    let o = cli(dir, args);
    assert!(!o.status.success(), "{args:?} succeeded");
    assert!(
        text(&o.stderr).contains(why),
        "{args:?}: {}",
        text(&o.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_made_listed_and_shown_and_each_token_belongs_to_one() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _pg) = tests::test_database(dir.path()).await;
    let db = db.as_str();
    // A new database has the default tenant, with no token yet.
    let tenants = json_of(dir.path(), &["tenant", "list", "--json", "--db", db]);
    assert_eq!(tenants.as_array().map(Vec::len), Some(1), "{tenants}");
    assert_eq!(tenants[0]["name"], DEFAULT_TENANT);
    assert_eq!(tenants[0]["tokens"], 0);

    let made = cli(dir.path(), &["tenant", "create", "acme", "--db", db]);
    assert!(made.status.success(), "{}", text(&made.stderr));
    assert!(text(&made.stdout).contains("tenant acme made"));
    refused(
        dir.path(),
        &["tenant", "create", "acme", "--db", db],
        "exists already",
    );
    for bad in ["Acme", "a/b", "a_b", ""] {
        refused(
            dir.path(),
            &["tenant", "create", bad, "--db", db],
            "lowercase letters, digits and -",
        );
    }

    // Tokens: without --tenant in the default one; in a tenant that exists; none elsewhere.
    for args in [
        vec!["token", "create", "--agent", "alice", "--db", db],
        vec![
            "token", "create", "--agent", "alice", "--tenant", "acme", "--admin", "--db", db,
        ],
    ] {
        let o = cli(dir.path(), &args);
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
        assert!(text(&o.stdout).trim().starts_with("oct_"));
    }
    refused(
        dir.path(),
        &[
            "token", "create", "--agent", "bob", "--tenant", "globex", "--db", db,
        ],
        "no tenant \"globex\"",
    );
    let tokens = json_of(dir.path(), &["token", "list", "--json", "--db", db]);
    let owners: Vec<(&str, &str, bool)> = tokens
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["tenant"].as_str().unwrap(),
                t["agentId"].as_str().unwrap(),
                t["admin"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        owners,
        [("default", "alice", false), ("acme", "alice", true)],
        "{tokens}"
    );
    let table = text(&cli(dir.path(), &["token", "list", "--db", db]).stdout);
    assert!(table.lines().next().unwrap().contains("TENANT"), "{table}");

    let acme = json_of(
        dir.path(),
        &["tenant", "show", "acme", "--json", "--db", db],
    );
    assert_eq!(
        (acme["name"].as_str(), acme["tokens"].as_u64()),
        (Some("acme"), Some(1))
    );
    let table = text(&cli(dir.path(), &["tenant", "list", "--db", db]).stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "a header and two tenants: {table}");
    assert!(
        lines[0].contains("NAME") && lines[0].contains("TOKENS"),
        "{table}"
    );
    let o = cli(dir.path(), &["tenant", "show", "globex", "--db", db]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("no tenant \"globex\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authenticate_and_me_answer_the_tenant() {
    let server = TestServer::start().await;
    let mut ws = server.raw().await;
    let r = ws
        .call(1, "authenticate", json!({"token": server.token("alice")}))
        .await;
    assert_eq!(r["result"]["agentId"], "alice", "{r}");
    assert_eq!(r["result"]["tenant"], DEFAULT_TENANT, "{r}");
    let addr = server.running().local_addr().to_string();
    let bearer = format!("Authorization: Bearer {}\r\n", server.token("alice"));
    let me = tests::http_raw(&addr, "GET /me", &bearer, "").await;
    assert!(me.contains("\"tenant\":\"default\""), "{me}");

    // Another tenant's token: its tenant in both answers.
    let acme = server.tenant_token("acme", "alice", true, false);
    let r = server
        .raw()
        .await
        .call(1, "authenticate", json!({"token": acme}))
        .await;
    assert_eq!(r["result"]["agentId"], "alice", "{r}");
    assert_eq!(r["result"]["tenant"], "acme", "{r}");
    let bearer = format!("Authorization: Bearer {acme}\r\n");
    let me = tests::http_raw(&addr, "GET /me", &bearer, "").await;
    assert!(me.contains("\"tenant\":\"acme\""), "{me}");
}

/// A PostgreSQL database from before tenants (schema version 6): migrating it puts every
/// token in the default tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_database_from_before_tenants_is_migrated_into_the_default_tenant() {
    let (url, _pg) = tests::postgres_database().await;
    let token = auth::create_token(open_store(&url).as_ref(), "alice", false).unwrap();
    let db = tests::pg::connect(&url).await.expect("a connection");
    db.batch_execute(
        "DROP INDEX conversations_closed_listed; \
         ALTER TABLE conversations DROP COLUMN active_ms, DROP COLUMN created_ms, DROP COLUMN scenario; \
         DROP TABLE tenant_usage; DROP TABLE tenants; ALTER TABLE tokens DROP COLUMN tenant, DROP COLUMN operator; \
         DELETE FROM orchestrator_schema WHERE version > 6;",
    )
    .await
    .expect("back to version 6");
    let store = open_store(&url);
    let found = store.find_token(&auth::hash_token(&token)).unwrap();
    assert_eq!(
        found.map(|t| (t.tenant, t.agent_id)),
        Some((DEFAULT_TENANT.to_string(), "alice".to_string()))
    );
    let tenants: Vec<String> = store
        .list_tenants()
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(tenants, [DEFAULT_TENANT]);
}

/// An admin mints a token over the protocol (shown once), lists its tenant's tokens and revokes
/// one, over JSON-RPC and REST; another agent may not; another tenant's tokens are neither
/// listed nor revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_admin_mints_lists_and_revokes_its_tokens() {
    use agent_sdk::AgentClient;
    use proto_spec::{CreateTokenParams, RevokeTokenParams};
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    let made = admin
        .create_token(CreateTokenParams {
            agent_id: "zoe".into(),
            admin: false,
            expires_in: Some(json!("1h")),
            tenant: None,
        })
        .await
        .expect("createToken");
    assert!(made.token.starts_with("oct_"), "{made:?}");
    assert_eq!(made.id, auth::hash_token(&made.token)[..12]);
    assert_eq!(
        (made.tenant.as_str(), made.agent_id.as_str()),
        ("default", "zoe")
    );
    let r = server
        .raw()
        .await
        .call(1, "authenticate", json!({"token": made.token}))
        .await;
    assert_eq!(r["result"]["agentId"], "zoe", "{r}");

    // Another tenant's token is not the tenant admin's to see or revoke.
    let store = open_store(&server.db);
    store.create_tenant("acme").unwrap();
    let record = TokenRecord {
        tenant: "acme".into(),
        agent_id: "zoe".into(),
        admin: false,
        operator: false,
        expires_ms: None,
    };
    let foreign = auth::mint_token(store.as_ref(), &record).unwrap();
    let listed = admin
        .list_tokens(Default::default())
        .await
        .expect("listTokens")
        .tokens;
    assert!(listed
        .iter()
        .any(|t| t.id == made.id && t.expires_ms.is_some()));
    assert!(
        listed.iter().all(|t| t.tenant == DEFAULT_TENANT),
        "{listed:?}"
    );
    let shown = format!("{listed:?}");
    assert!(!shown.contains(&made.token[4..]), "a token shown again");

    refusals(&server, &admin).await;
    // By agent, in the caller's tenant only: zoe of acme keeps her token.
    let by_agent = RevokeTokenParams {
        agent_id: Some("zoe".into()),
        ..RevokeTokenParams::default()
    };
    assert_eq!(admin.revoke_token(by_agent).await.unwrap().revoked, 1);
    let r = server
        .raw()
        .await
        .call(1, "authenticate", json!({"token": made.token}))
        .await;
    assert_eq!(r["error"]["code"], -32001, "revoked: {r}");
    assert!(store
        .find_token(&auth::hash_token(&foreign))
        .unwrap()
        .is_some());

    // REST: POST /tokens (201, the token once), GET /tokens, DELETE /tokens/{id}.
    let addr = server.running().local_addr().to_string();
    let bearer = format!("Authorization: Bearer {}\r\n", server.token("admin"));
    let posted = tests::http_raw(
        &addr,
        "POST /tokens",
        &format!("{bearer}Content-Type: application/json\r\n"),
        r#"{"agentId": "erin", "admin": true}"#,
    )
    .await;
    assert!(posted.starts_with("HTTP/1.1 201"), "{posted}");
    let body: Value = serde_json::from_str(posted.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    let id = body["id"].as_str().unwrap().to_string();
    assert_eq!(body["admin"], true, "{body}");
    let listed = tests::http_raw(&addr, "GET /tokens", &bearer, "").await;
    assert!(
        listed.starts_with("HTTP/1.1 200") && listed.contains(&id),
        "{listed}"
    );
    let deleted = tests::http_raw(&addr, &format!("DELETE /tokens/{id}"), &bearer, "").await;
    assert!(deleted.contains("\"revoked\":1"), "{deleted}");
    let again = tests::http_raw(&addr, &format!("DELETE /tokens/{id}"), &bearer, "").await;
    assert!(again.contains("\"revoked\":0"), "{again}");
    let bob = format!("Authorization: Bearer {}\r\n", server.token("bob"));
    let refused = tests::http_raw(&addr, "GET /tokens", &bob, "").await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
}

/// `createToken`, `listTokens` and `revokeToken` refused: not an admin, a bad agent id, no
/// life, neither selector.
async fn refusals(server: &TestServer, admin: &agent_sdk::WsJsonRpcClient) {
    use agent_sdk::AgentClient;
    use proto_spec::{CreateTokenParams, ErrorCode, RevokeTokenParams};
    let alice = server.sdk("alice", None).await;
    let e = alice
        .list_tokens(Default::default())
        .await
        .expect_err("alice is no admin");
    assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{e}");
    for (agent, expires) in [
        ("a b", None),
        ("orchestrator", None),
        ("dave", Some(json!(0))),
        ("dave", Some(json!("3661d"))),
        ("dave", Some(json!("soon"))),
    ] {
        let p = CreateTokenParams {
            agent_id: agent.into(),
            admin: false,
            expires_in: expires,
            tenant: None,
        };
        let e = admin.create_token(p).await.expect_err("refused");
        assert_eq!(e.code(), Some(ErrorCode::InvalidParams), "{agent}: {e}");
    }
    let e = admin
        .revoke_token(RevokeTokenParams::default())
        .await
        .expect_err("no selector");
    assert_eq!(e.code(), Some(ErrorCode::InvalidParams), "{e}");
}

/// An operator (`token create --operator`) makes and lists tenants and manages any tenant's
/// tokens, over JSON-RPC and REST; a tenant's admin may do neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_makes_tenants_and_manages_any_tenants_tokens() {
    use agent_sdk::AgentClient;
    use proto_spec::{
        CreateTenantParams, CreateTokenParams, ErrorCode, ListTokensParams, RevokeTokenParams,
    };
    let server = TestServer::start().await;
    let args = [
        "token",
        "create",
        "--agent",
        "ops",
        "--operator",
        "--db",
        &server.db,
    ];
    let o = cli(std::path::Path::new("."), &args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let ops_token = text(&o.stdout).trim().to_string();
    let ops =
        agent_sdk::WsJsonRpcClient::connect(agent_sdk::WsConfig::new(server.url(), &ops_token))
            .await
            .expect("the operator connects");

    let made = ops
        .create_tenant(CreateTenantParams {
            name: "acme".into(),
        })
        .await
        .expect("createTenant");
    assert_eq!((made.name.as_str(), made.tokens), ("acme", 0));
    let e = ops
        .create_tenant(CreateTenantParams {
            name: "acme".into(),
        })
        .await
        .expect_err("taken");
    assert_eq!(e.code(), Some(ErrorCode::InvalidParams), "{e}");
    let e = ops
        .create_tenant(CreateTenantParams {
            name: "Ac/me".into(),
        })
        .await
        .expect_err("a bad name");
    assert_eq!(e.code(), Some(ErrorCode::InvalidParams), "{e}");

    // Another tenant's tokens: minted, listed and revoked by the operator alone.
    let in_acme = CreateTokenParams {
        agent_id: "bot".into(),
        tenant: Some("acme".into()),
        ..CreateTokenParams::default()
    };
    let minted = ops.create_token(in_acme.clone()).await.expect("in acme");
    assert_eq!(minted.tenant, "acme");
    let acme = ListTokensParams {
        tenant: Some("acme".into()),
    };
    let listed = ops.list_tokens(acme.clone()).await.unwrap().tokens;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let admin = server.sdk("admin", None).await;
    for e in [
        admin
            .create_token(in_acme)
            .await
            .map(|_| ())
            .expect_err("an admin"),
        admin
            .list_tokens(acme)
            .await
            .map(|_| ())
            .expect_err("an admin"),
        admin
            .list_tenants()
            .await
            .map(|_| ())
            .expect_err("an admin"),
        admin
            .create_tenant(CreateTenantParams {
                name: "globex".into(),
            })
            .await
            .map(|_| ())
            .expect_err("an admin"),
    ] {
        assert_eq!(e.code(), Some(ErrorCode::Forbidden), "{e}");
    }
    let revoke = RevokeTokenParams {
        id: Some(minted.id.clone()),
        tenant: Some("acme".into()),
        ..RevokeTokenParams::default()
    };
    assert_eq!(ops.revoke_token(revoke).await.unwrap().revoked, 1);

    // REST.
    let addr = server.running().local_addr().to_string();
    let bearer = format!("Authorization: Bearer {ops_token}\r\nContent-Type: application/json\r\n");
    let posted = tests::http_raw(&addr, "POST /tenants", &bearer, r#"{"name": "globex"}"#).await;
    assert!(posted.starts_with("HTTP/1.1 201"), "{posted}");
    let listed = tests::http_raw(&addr, "GET /tenants", &bearer, "").await;
    for name in ["\"acme\"", "\"default\"", "\"globex\""] {
        assert!(listed.contains(name), "{listed}");
    }
    let bob = format!("Authorization: Bearer {}\r\n", server.token("bob"));
    let refused = tests::http_raw(&addr, "GET /tenants", &bob, "").await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
}
