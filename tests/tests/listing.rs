//! `listConversations` a page at a time: newest activity first, an opaque cursor, a limit of
//! at most 1,000, each filter (status, participant, scenario, metadata, created or updated
//! after, a text query), what a principal may read only, over JSON-RPC and `GET
//! /conversations`; and an answer that stays within the answer limit whatever the
//! conversations' size.

use jsonrpsee::core::client::ClientT;
use jsonrpsee::ws_client::WsClient;
use serde_json::{json, Value};
use tests::{on_postgres, TestServer, P};

async fn list(c: &WsClient, params: Value) -> Value {
    c.request("listConversations", P(params))
        .await
        .expect("listConversations")
}

fn ids(page: &Value) -> Vec<String> {
    page["conversations"]
        .as_array()
        .expect("conversations")
        .iter()
        .map(|c| c["conversationId"].as_str().expect("id").to_string())
        .collect()
}

/// Every page for `params`: the ids in order, and how many pages.
async fn every_page(c: &WsClient, params: Value) -> (Vec<String>, usize) {
    let (mut all, mut pages, mut p) = (Vec::new(), 0, params);
    loop {
        let page = list(c, p.clone()).await;
        pages += 1;
        all.extend(ids(&page));
        match page["nextCursor"].as_str() {
            Some(cursor) => p["cursor"] = json!(cursor),
            None => return (all, pages),
        }
        assert!(pages < 100, "the pages never end");
    }
}

/// 250 conversations `c000`…`c249` (even: alice and bob, team red; odd: carol, team blue),
/// the first ten closed, then five from the library's `helpdesk`; the time between the 200th
/// and the 201st.
async fn many(server: &TestServer) -> String {
    let admin = server.client("admin").await;
    let mut between = String::new();
    for i in 0..250 {
        if i == 200 {
            // A millisecond apart from what came before.
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            between = chrono::Utc::now().to_rfc3339();
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        let (who, team) = if i % 2 == 0 {
            (json!(["alice", "bob"]), "red")
        } else {
            (json!(["carol"]), "blue")
        };
        let _: Value = admin
            .request(
                "createConversation",
                P(json!({"conversationId": format!("c{i:03}"), "participants": who, "metadata": {"n": i, "team": team}})),
            )
            .await
            .expect("create");
    }
    for i in 0..10 {
        let author = if i % 2 == 0 { "alice" } else { "carol" };
        let c = server.client(author).await;
        let _: Value = c
            .request(
                "sendMessage",
                P(json!({"conversationId": format!("c{i:03}"), "payload": {"text": "bye"}, "finality": "conversation"})),
            )
            .await
            .expect("close");
    }
    server.set_library(vec![(
        "helpdesk",
        json!({"participants": [{"id": "peer", "external": true, "caller": true}, {"id": "desk", "external": true}]}),
    )]);
    let alice = server.client("alice").await;
    for _ in 0..5 {
        let _: Value = alice
            .request("createConversation", P(json!({"scenarioName": "helpdesk"})))
            .await
            .expect("from the library");
    }
    between
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pages_come_newest_first_and_every_filter_narrows_them() {
    let server = TestServer::start().await;
    let between = many(&server).await;
    let admin = server.client("admin").await;

    // Pages of 100: every conversation once, newest activity first.
    let (all, pages) = every_page(&admin, json!({"limit": 100})).await;
    assert_eq!((all.len(), pages), (255, 3));
    let unique: std::collections::BTreeSet<&String> = all.iter().collect();
    assert_eq!(unique.len(), 255, "a conversation listed twice");
    // The ten closed last had the latest activity, so they come first (newest first).
    let first = list(&admin, json!({"limit": 20})).await;
    let times: Vec<&str> = first["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["lastEventAt"].as_str().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    // The default page is 100.
    assert_eq!(ids(&list(&admin, json!({})).await).len(), 100);

    let count = |p: Value| {
        let admin = &admin;
        async move { every_page(admin, p).await.0 }
    };
    let closed = count(json!({"status": "closed"})).await;
    assert_eq!(closed.len(), 10, "{closed:?}");
    assert_eq!(count(json!({"status": "open"})).await.len(), 245);
    assert_eq!(count(json!({"status": "active"})).await.len(), 245);
    assert!(count(json!({"status": "paused"})).await.is_empty());
    assert_eq!(count(json!({"participant": "carol"})).await.len(), 125);
    assert_eq!(count(json!({"metadata": {"team": "red"}})).await.len(), 125);
    assert_eq!(
        count(json!({"metadata": {"team": "red", "n": 4}})).await,
        ["c004"]
    );
    assert_eq!(count(json!({"scenario": "helpdesk"})).await.len(), 5);
    let mut found = count(json!({"query": "C01"})).await;
    // A library conversation's new id (32 hex digits) may hold `c01` too.
    found.retain(|id| id.len() != 32);
    found.sort();
    assert_eq!(
        found,
        (10..20).map(|i| format!("c0{i}")).collect::<Vec<_>>()
    );
    assert_eq!(
        count(json!({"query": "\"team\":\"blue\""})).await.len(),
        125
    );
    let newer = count(json!({"createdAfter": between})).await;
    assert_eq!(
        newer.len(),
        55,
        "the last 50 and the library's 5: {newer:?}"
    );
    // The library's are named by a new id (32 hex digits), which may start with `c` too.
    assert!(newer
        .iter()
        .all(|id| id.as_str() >= "c200" || id.len() == 32));
    // Updated after a time: what was made or moved since (the last 50, the ten closed, the
    // library's five).
    let recent = count(json!({"updatedAfter": between})).await;
    assert_eq!(recent.len(), 65, "{recent:?}");

    // A participant lists what it may read only.
    let carol = server.client("carol").await;
    let (hers, _) = every_page(&carol, json!({"limit": 1000})).await;
    assert_eq!(hers.len(), 125);
}

/// Every page of each of `asked` (an admin's), then of carol's own.
async fn pages_of(server: &TestServer, asked: &[Value]) -> Vec<(Vec<String>, usize)> {
    let (admin, carol) = (server.client("admin").await, server.client("carol").await);
    let mut all = Vec::new();
    for p in asked {
        all.push(every_page(&admin, p.clone()).await);
    }
    all.push(every_page(&carol, json!({"limit": 9})).await);
    all
}

/// After a restart the pages are the same. On PostgreSQL, where a node holds the open
/// conversations only, the closed ones come from the database a page at a time, and a page
/// takes in those it shows, not every closed one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_closed_ones_come_page_by_page_in_the_same_order() {
    let mut server = TestServer::start().await;
    let between = many(&server).await;
    let asked = [
        json!({"limit": 7}),
        json!({"status": "closed", "limit": 3}),
        json!({"participant": "carol", "limit": 50}),
        json!({"metadata": {"team": "red"}, "status": "closed"}),
        json!({"query": "c00", "limit": 4}),
        json!({"updatedAfter": between, "limit": 6}),
        json!({"createdAfter": between, "limit": 4}),
        json!({"scenario": "helpdesk", "limit": 2}),
    ];
    // Another tenant's c001, closed last (the newest of all): never in this tenant's pages.
    let acme = server.tenant_token("acme", "admin", true, false);
    let acme_carol = server.tenant_token("acme", "carol", false, false);
    let _: Value = server
        .client_with(&acme)
        .await
        .request("createConversation", P(json!({"conversationId": "c001", "participants": ["carol"], "metadata": {"team": "red"}})))
        .await
        .expect("create in acme");
    let _: Value = server
        .client_with(&acme_carol)
        .await
        .request("sendMessage", P(json!({"conversationId": "c001", "payload": {"text": "bye"}, "finality": "conversation"})))
        .await
        .expect("close in acme");
    let before = pages_of(&server, &asked).await;
    assert_eq!(before[1].0.len(), 10, "the ten closed: {:?}", before[1]);
    server.restart().await;
    let theirs = every_page(&server.client_with(&acme).await, json!({})).await;
    assert_eq!(theirs, (vec!["c001".to_string()], 1));
    let closed: Vec<String> = (0..10).map(|i| format!("c{i:03}")).collect();
    if on_postgres() {
        assert!(
            closed.iter().all(|id| !server.holds(id)),
            "held after a start"
        );
    }
    let admin = server.client("admin").await;
    let first = ids(&list(&admin, json!({"status": "closed", "limit": 3})).await);
    assert_eq!(first, before[1].0[..3]);
    if on_postgres() {
        let held: std::collections::BTreeSet<&String> =
            closed.iter().filter(|id| server.holds(id)).collect();
        assert_eq!(
            held,
            first.iter().collect(),
            "taken in: what the page showed"
        );
    }
    assert_eq!(pages_of(&server, &asked).await, before);
}

/// A PostgreSQL database from before closed conversations had their place in lists recorded
/// (schema version 9): the migration records it for those already closed, and the pages read
/// after it are those read before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_database_from_before_closed_places_lists_the_same_after_migrating() {
    let mut server = TestServer::on_postgres(Default::default(), Default::default()).await;
    let between = many(&server).await;
    let asked = [
        json!({"status": "closed", "limit": 4}),
        json!({"updatedAfter": between, "limit": 6}),
        json!({"scenario": "helpdesk"}),
    ];
    let before = pages_of(&server, &asked).await;
    let db = tests::pg::connect(&server.db).await.expect("a connection");
    db.batch_execute(
        "DROP INDEX conversations_closed_listed; \
         ALTER TABLE conversations DROP COLUMN active_ms, DROP COLUMN created_ms, DROP COLUMN scenario; \
         CREATE INDEX conversations_closed ON conversations (num) WHERE closed; \
         DELETE FROM orchestrator_schema WHERE version > 9;",
    )
    .await
    .expect("back to version 9");
    server.restart().await;
    let placed: i64 = db
        .query_one(
            "SELECT count(*) FROM conversations WHERE closed AND active_ms > 0 AND created_ms > 0",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(placed, 10, "every closed one placed by the migration");
    assert_eq!(pages_of(&server, &asked).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pages_are_refused_and_http_lists_the_same() {
    let server = TestServer::start().await;
    many(&server).await;
    let admin = server.client("admin").await;
    for bad in [
        json!({"limit": 0}),
        json!({"limit": 1001}),
        json!({"cursor": "not a cursor"}),
        json!({"status": "asleep"}),
        json!({"createdAfter": "yesterday"}),
        json!({"tenant": "acme"}),
    ] {
        let r = admin
            .request::<Value, _>("listConversations", P(bad.clone()))
            .await;
        let err = r.expect_err("refused").to_string();
        assert!(
            err.contains("-32602") || err.contains("-32002") || err.contains("InvalidParams"),
            "{bad}: {err}"
        );
    }
    let addr = server.running().local_addr().to_string();
    let bearer = format!("Authorization: Bearer {}\r\n", server.token("admin"));
    let answer = tests::http_raw(
        &addr,
        "GET /conversations?limit=3&status=closed&metadata=team:red",
        &bearer,
        "",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body: Value = serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(ids(&body).len(), 3, "{body}");
    assert!(body["nextCursor"].is_string(), "{body}");
    let next = format!(
        "GET /conversations?limit=3&status=closed&metadata=team:red&cursor={}",
        body["nextCursor"].as_str().unwrap()
    );
    let answer = tests::http_raw(&addr, &next, &bearer, "").await;
    let body: Value = serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(ids(&body).len(), 2, "five closed red ones in all: {body}");
    assert!(body.get("nextCursor").is_none(), "{body}");
}

/// Big conversations (many participants each) and a small answer limit: a page of 1,000 asked
/// for comes back shorter, within the limit, and the next page goes on from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_stays_within_the_limit_whatever_the_conversations() {
    let limits = orchestrator::engine::config::Limits {
        max_frame_bytes: 16 * 1024,
        max_participants: 200,
        ..tests::test_limits()
    };
    let server = TestServer::with_limits(limits.clone()).await;
    let admin = server.client("admin").await;
    let crowd: Vec<String> = (0..150)
        .map(|i| format!("participant-number-{i:04}"))
        .collect();
    for i in 0..120 {
        let _: Value = admin
            .request(
                "createConversation",
                P(json!({"conversationId": format!("big{i:03}"), "participants": crowd})),
            )
            .await
            .expect("create");
    }
    let mut p = json!({"limit": 1000});
    let mut seen = 0;
    for _ in 0..50 {
        let page: Value = admin
            .request("listConversations", P(p.clone()))
            .await
            .expect("a page within the limit");
        let size = page.to_string().len();
        assert!(size <= limits.max_response_bytes(), "{size} bytes");
        let n = ids(&page).len();
        assert!(n > 0 && n < 120, "{n} in one page");
        seen += n;
        match page["nextCursor"].as_str() {
            Some(c) => p["cursor"] = json!(c),
            None => break,
        }
    }
    assert_eq!(seen, 120);
}
