//! Each tenant's quotas: open conversations, appends a second, connections and tokens held,
//! each reached and refused with `TenantQuotaExceeded` (-32033, `data: {quota, limit, used}`)
//! while another tenant carries on; set over the protocol (`setTenantQuotas`, `PUT
//! /tenants/{name}/quotas`) and with `orchestrator tenant quota` on the database of a running
//! server, which holds to it within a second; held across the nodes of a cluster. (Model tokens
//! a day: `llm_kind.rs`.)

use serde_json::{json, Value};
use tests::{RawWs, TestServer};

const QUOTA: i64 = -32033;

async fn ws(server: &TestServer, token: &str) -> RawWs {
    let mut ws = server.raw().await;
    ws.authenticate(token).await;
    ws
}

/// Sets `tenant`'s quotas as the operator; the tenant as answered.
async fn set_quotas(server: &TestServer, operator: &str, tenant: &str, quotas: Value) -> Value {
    let r = ws(server, operator)
        .await
        .call(
            1,
            "setTenantQuotas",
            json!({"tenant": tenant, "quotas": quotas}),
        )
        .await;
    assert_eq!(r["result"]["name"], tenant, "{r}");
    r["result"].clone()
}

fn refused(r: &Value, quota: &str, limit: u64) {
    assert_eq!(r["error"]["code"], QUOTA, "{r}");
    let data = &r["error"]["data"];
    assert_eq!(data["quota"], quota, "{r}");
    assert_eq!(data["limit"], limit, "{r}");
    assert!(data["used"].as_u64().is_some_and(|u| u >= limit), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_conversations_and_tokens_are_held_to_the_tenants_quota() {
    let server = TestServer::start().await;
    let operator = server.tenant_token("default", "ops", false, true);
    let acme = server.tenant_token("acme", "boss", true, false);
    let globex = server.tenant_token("globex", "chief", true, false);
    let shown = set_quotas(
        &server,
        &operator,
        "acme",
        json!({"openConversations": 2, "tokens": 2}),
    )
    .await;
    assert_eq!(shown["quotas"]["openConversations"], 2, "{shown}");
    // Only an operator sets them.
    let r = ws(&server, &acme)
        .await
        .call(
            1,
            "setTenantQuotas",
            json!({"tenant": "acme", "quotas": {}}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32002, "{r}");

    let mut a = ws(&server, &acme).await;
    let create = |id: &str| json!({"conversationId": id, "participants": ["boss"]});
    for id in ["a1", "a2"] {
        let r = a.call(1, "createConversation", create(id)).await;
        assert_eq!(r["result"]["conversationId"], id, "{r}");
    }
    let r = a.call(2, "createConversation", create("a3")).await;
    refused(&r, "openConversations", 2);
    // globex carries on.
    let mut g = ws(&server, &globex).await;
    for id in ["g1", "g2", "g3"] {
        let r = g.call(1, "createConversation", create(id)).await;
        assert_eq!(r["result"]["conversationId"], id, "{r}");
    }
    // One closed, one more fits.
    let r = a
        .call(
            3,
            "sendMessage",
            json!({"conversationId": "a1", "payload": {"text": "bye"}, "finality": "conversation"}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let r = a.call(4, "createConversation", create("a3")).await;
    assert_eq!(r["result"]["conversationId"], "a3", "{r}");

    // Tokens: acme holds one (boss); one more fits, a third does not.
    let mint = |agent: &str| json!({"agentId": agent});
    let r = a.call(5, "createToken", mint("x1")).await;
    assert!(r["result"]["token"].is_string(), "{r}");
    let r = a.call(6, "createToken", mint("x2")).await;
    refused(&r, "tokens", 2);
    let r = g.call(2, "createToken", mint("x2")).await;
    assert!(r["result"]["token"].is_string(), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_a_second_and_connections_are_held_to_the_tenants_quota() {
    let server = TestServer::start().await;
    let operator = server.tenant_token("default", "ops", false, true);
    let acme = server.tenant_token("acme", "alice", true, false);
    let globex = server.tenant_token("globex", "alice", true, false);
    set_quotas(
        &server,
        &operator,
        "acme",
        json!({"appendsPerSecond": 5, "connections": 2}),
    )
    .await;
    let (mut a, mut g) = (ws(&server, &acme).await, ws(&server, &globex).await);
    for c in [&mut a, &mut g] {
        let r = c
            .call(
                100,
                "createConversation",
                json!({"conversationId": "c1", "participants": ["alice"]}),
            )
            .await;
        assert!(r.get("result").is_some(), "{r}");
    }
    // Twenty appends at once: acme's first five go in, then they are refused; globex's all go.
    let say = |i: u64| json!({"conversationId": "c1", "payload": {"text": format!("m{i}")}, "finality": "none"});
    let mut acme_refused = Vec::new();
    for i in 0..20 {
        let r = a.call(i, "sendMessage", say(i)).await;
        if r.get("error").is_some() {
            acme_refused.push(r);
        }
        let r = g.call(i, "sendMessage", say(i)).await;
        assert!(r.get("result").is_some(), "globex refused: {r}");
    }
    assert!(acme_refused.len() >= 5, "{acme_refused:?}");
    refused(&acme_refused[0], "appendsPerSecond", 5);
    // Over HTTP: 429 with the same error.
    let addr = server.running().local_addr().to_string();
    let bearer = format!("Authorization: Bearer {acme}\r\nContent-Type: application/json\r\n");
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let answer = tests::http_raw(
            &addr,
            "POST /conversations/c1/messages",
            &bearer,
            r#"{"payload":{"text":"hi"},"finality":"none"}"#,
        )
        .await;
        statuses.push(answer.split(' ').nth(1).unwrap_or("").to_string());
        if answer.starts_with("HTTP/1.1 429") {
            assert!(answer.contains("TenantQuotaExceeded"), "{answer}");
        }
    }
    assert!(statuses.iter().any(|s| s == "429"), "{statuses:?}");

    // Connections: acme holds two (a, and g is globex's), a third is refused, globex opens more.
    let second = ws(&server, &acme).await;
    let mut third = server.raw().await;
    let r = third.call(1, "authenticate", json!({"token": acme})).await;
    refused(&r, "connections", 2);
    let _more: Vec<RawWs> = futures::future::join_all((0..3).map(|_| ws(&server, &globex))).await;
    // One closed: a place again.
    drop(second);
    let until = tokio::time::Instant::now() + tests::WAIT;
    loop {
        let r = third.call(2, "authenticate", json!({"token": acme})).await;
        if r.get("result").is_some() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "no place came back: {r}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `orchestrator tenant quota` on the database of a running server: in force within a second,
/// and `tenant show` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_set_on_the_database_holds_in_the_running_server() {
    let server = TestServer::start().await;
    let acme = server.tenant_token("acme", "boss", true, false);
    let dir = tempfile::tempdir().unwrap();
    let db = server.db.clone();
    let o = tests::procs::run_in(
        dir.path(),
        &[
            "tenant",
            "quota",
            "acme",
            "--open-conversations",
            "1",
            "--db",
            &db,
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = tests::procs::run_in(
        dir.path(),
        &["tenant", "show", "acme", "--json", "--db", &db],
    );
    let shown: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(shown["quotas"], json!({"openConversations": 1}), "{shown}");
    let mut a = ws(&server, &acme).await;
    let r = a
        .call(
            1,
            "createConversation",
            json!({"conversationId": "one", "participants": ["alice"]}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let until = tokio::time::Instant::now() + tests::WAIT;
    for n in 2.. {
        let r = a
            .call(n, "createConversation", json!({"participants": ["alice"]}))
            .await;
        if r.get("error").is_some() {
            refused(&r, "openConversations", 1);
            break;
        }
        assert!(tokio::time::Instant::now() < until, "the quota never held");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// On a cluster a quota is the cluster's: connections held on one node count on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_holds_across_the_nodes_of_a_cluster() {
    let first = TestServer::on_postgres(tests::test_limits(), Default::default()).await;
    let second = first.another_node().await;
    let operator = first.tenant_token("default", "ops", false, true);
    let acme = first.tenant_token("acme", "alice", false, false);
    set_quotas(&first, &operator, "acme", json!({"connections": 2})).await;
    let _one = ws(&first, &acme).await;
    let _two = ws(&first, &acme).await;
    // The second node learns of the quota and of the first node's two connections within a
    // second or two of exchanges.
    let until = tokio::time::Instant::now() + tests::WAIT;
    loop {
        let mut third = second.raw().await;
        let r = third.call(1, "authenticate", json!({"token": acme})).await;
        if r.get("error").is_some() {
            refused(&r, "connections", 2);
            break;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "the other node never held the quota"
        );
        drop(third);
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Stored bytes: counted in the database once the quota is set, this node's commits added; an
/// append that would pass it is refused while another tenant carries on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_stored_bytes_are_held_to_its_quota() {
    let server = TestServer::start().await;
    let operator = server.tenant_token("default", "ops", false, true);
    let acme = server.tenant_token("acme", "alice", true, false);
    let globex = server.tenant_token("globex", "alice", true, false);
    let (mut a, mut g) = (ws(&server, &acme).await, ws(&server, &globex).await);
    for c in [&mut a, &mut g] {
        let r = c
            .call(
                1,
                "createConversation",
                json!({"conversationId": "c1", "participants": ["alice"]}),
            )
            .await;
        assert!(r.get("result").is_some(), "{r}");
    }
    set_quotas(&server, &operator, "acme", json!({"storedBytes": 4000})).await;
    let text = "x".repeat(300);
    let say = |i: u64| json!({"conversationId": "c1", "payload": {"text": text}, "finality": "none", "clientRequestId": format!("k{i}")});
    let until = tokio::time::Instant::now() + tests::WAIT;
    let mut stored = 0;
    for i in 0.. {
        let r = a.call(i, "sendMessage", say(i)).await;
        if r.get("error").is_some() {
            refused(&r, "storedBytes", 4000);
            break;
        }
        stored += 1;
        assert!(tokio::time::Instant::now() < until, "never refused");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Refused within the quota's reach (a second's appends may land before it is counted).
    assert!((5..60).contains(&stored), "{stored} appends of 300 bytes");
    for i in 0..20 {
        let r = g.call(i, "sendMessage", say(i)).await;
        assert!(r.get("result").is_some(), "globex refused: {r}");
    }
}
