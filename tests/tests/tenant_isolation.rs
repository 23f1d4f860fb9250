//! Two tenants on one server: nothing crosses from one to the other. Both have an agent
//! `alice` and a conversation `c1`; every method, route and stream that names a conversation is
//! tried by tenant B's principals (an agent, its admin) against a conversation of tenant A's,
//! and answers exactly as for one that does not exist; an operator names another tenant's
//! conversation as `TENANT/ID`, reads and pauses it, and writes only in its own tenant.

use serde_json::{json, Value};
use tests::{RawWs, TestServer};

/// A server with tenants `acme` and `globex`, each with an admin and an agent `alice`, and a
/// conversation `c1` in each (and in the default tenant) with `alice` taking part.
struct Two {
    server: TestServer,
    acme_admin: String,
    acme_alice: String,
    globex_admin: String,
    globex_alice: String,
    operator: String,
}

async fn two_tenants() -> Two {
    let server = TestServer::start().await;
    let two = Two {
        acme_admin: server.tenant_token("acme", "boss", true, false),
        acme_alice: server.tenant_token("acme", "alice", false, false),
        globex_admin: server.tenant_token("globex", "chief", true, false),
        globex_alice: server.tenant_token("globex", "alice", false, false),
        operator: server.tenant_token("default", "ops", false, true),
        server,
    };
    for admin in [&two.acme_admin, &two.globex_admin] {
        let mut ws = two.ws(admin).await;
        let r = ws
            .call(
                1,
                "createConversation",
                json!({"conversationId": "c1", "participants": ["alice", "bob"]}),
            )
            .await;
        assert_eq!(r["result"]["conversationId"], "c1", "{r}");
    }
    two.server.create("c1", &["alice", "bob"]).await;
    // A conversation only acme has.
    let r = two
        .ws(&two.acme_admin)
        .await
        .call(
            1,
            "createConversation",
            json!({"conversationId": "secret", "participants": ["alice", "bob"]}),
        )
        .await;
    assert_eq!(r["result"]["conversationId"], "secret", "{r}");
    two
}

impl Two {
    async fn ws(&self, token: &str) -> RawWs {
        let mut ws = self.server.raw().await;
        ws.authenticate(token).await;
        ws
    }
}

/// Every method that names a conversation, an admin's included, with its other params.
fn methods() -> Vec<(&'static str, Value)> {
    let mut all = tests::conversation_methods();
    all.extend([
        ("pauseConversation", json!({})),
        ("resumeConversation", json!({})),
        ("forkConversation", json!({"atSeq": 1})),
    ]);
    all
}

fn naming(method: &str, params: &Value, id: &str) -> Value {
    let mut p = params.clone();
    let key = if method == "createConversation" {
        "parentConversationId"
    } else {
        "conversationId"
    };
    p[key] = json!(id);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_conversation_is_answered_as_one_that_does_not_exist() {
    let two = two_tenants().await;
    for (who, token) in [
        ("globex's alice", &two.globex_alice),
        ("globex's admin", &two.globex_admin),
    ] {
        let mut ws = two.ws(token).await;
        let mut n = 0;
        for (method, params) in methods() {
            for (theirs, none) in [("secret", "nobodys"), ("acme/secret", "acme/nobodys")] {
                n += 2;
                let a = ws.call(n, method, naming(method, &params, theirs)).await;
                let b = ws.call(n + 1, method, naming(method, &params, none)).await;
                // An admin may not fork or pause what does not exist either: the same refusal.
                assert!(a.get("error").is_some(), "{who} {method} {theirs}: {a}");
                assert_eq!(
                    a["error"].to_string(),
                    b["error"].to_string().replace(none, theirs),
                    "{who} {method} {theirs}: {a} / {b}"
                );
                if !(method == "pauseConversation"
                    || method == "resumeConversation"
                    || method == "forkConversation"
                    || method == "createConversation")
                    || token == &two.globex_admin
                {
                    assert_eq!(a["error"]["code"], -32003, "{who} {method}: {a}");
                }
            }
        }
    }
    // Over HTTP: 404 with the same body.
    let addr = two.server.running().local_addr().to_string();
    let bearer = format!(
        "Authorization: Bearer {}\r\nContent-Type: application/json\r\n",
        two.globex_admin
    );
    let mut routes = tests::conversation_routes();
    routes.extend([
        ("POST /conversations/ID/pause", ""),
        ("POST /conversations/ID/resume", ""),
    ]);
    for (route, body) in routes {
        let theirs = tests::http_raw(&addr, &route.replace("ID", "secret"), &bearer, body).await;
        let none = tests::http_raw(&addr, &route.replace("ID", "nobodys"), &bearer, body).await;
        assert!(theirs.starts_with("HTTP/1.1 404"), "{route}: {theirs}");
        let body_of = |a: &str| a.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
        assert_eq!(
            body_of(&theirs),
            body_of(&none).map(|b| b.replace("nobodys", "secret")),
            "{route}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_has_its_own_c1_its_own_alice_and_its_own_lists() {
    let two = two_tenants().await;
    // alice of acme writes in acme's c1: nobody else's c1 has it.
    let mut acme = two.ws(&two.acme_alice).await;
    let r = acme
        .call(
            1,
            "sendMessage",
            json!({"conversationId": "c1", "payload": {"text": "acme only"}, "finality": "none"}),
        )
        .await;
    assert_eq!(r["result"]["seq"], 2, "{r}");
    for (token, has) in [
        (two.acme_alice.as_str(), true),
        (two.globex_alice.as_str(), false),
        (two.server.token("alice"), false),
    ] {
        let tail = two
            .ws(token)
            .await
            .call(1, "tail", json!({"conversationId": "c1", "sinceSeq": 0}))
            .await;
        let events = tail["result"]["events"].as_array().cloned().unwrap();
        assert!(events.iter().all(|e| e["conversationId"] == "c1"), "{tail}");
        let said = events.iter().any(|e| e["payload"]["text"] == "acme only");
        assert_eq!(said, has, "{tail}");
    }
    // Each admin lists its own tenant's conversations, by their ids within it.
    for (token, ids) in [
        (&two.acme_admin, vec!["c1", "secret"]),
        (&two.globex_admin, vec!["c1"]),
    ] {
        let list = two
            .ws(token)
            .await
            .call(1, "listConversations", json!({}))
            .await;
        let got: Vec<&str> = list["result"]["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["conversationId"].as_str().unwrap())
            .collect();
        assert_eq!(got, ids, "{list}");
    }
    // A new conversation id is free in another tenant even when taken in one.
    let r = two
        .ws(&two.globex_admin)
        .await
        .call(
            1,
            "createConversation",
            json!({"conversationId": "secret", "participants": ["alice"]}),
        )
        .await;
    assert_eq!(r["result"]["conversationId"], "secret", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_all_conversations_subscription_sees_its_own_tenant_only() {
    let two = two_tenants().await;
    let globex = two.server.client_with(&two.globex_alice).await;
    let mut all = tests::subscribe(&globex, json!({})).await;
    for (token, text) in [
        (two.acme_alice.as_str(), "to acme"),
        (two.server.token("alice"), "to default"),
        (two.globex_alice.as_str(), "to globex"),
    ] {
        let r = two
            .ws(token)
            .await
            .call(
                1,
                "sendMessage",
                json!({"conversationId": "c1", "payload": {"text": text}, "finality": "none"}),
            )
            .await;
        assert!(r.get("result").is_some(), "{r}");
    }
    // Written last, it comes first: nothing of the others' came before it.
    let first = tests::next_event(&mut all, "globex's own message").await;
    assert_eq!(first["event"]["payload"]["text"], "to globex", "{first}");
    assert_eq!(first["conversationId"], "c1", "{first}");
    // From the start: the backlog of globex's conversations only.
    let mut backlog = tests::subscribe(&globex, json!({"sinceSeq": 0})).await;
    let mut texts = Vec::new();
    for _ in 0..2 {
        let e = tests::next_event(&mut backlog, "the backlog").await;
        texts.push(e["event"]["payload"]["text"].clone());
    }
    assert_eq!(
        texts,
        [Value::Null, json!("to globex")],
        "created, then its message"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reads_and_pauses_another_tenants_conversation_but_writes_in_its_own() {
    let two = two_tenants().await;
    let mut ops = two.ws(&two.operator).await;
    let r = ops
        .call(
            1,
            "getConversation",
            json!({"conversationId": "acme/secret"}),
        )
        .await;
    assert_eq!(r["result"]["conversationId"], "secret", "{r}");
    let r = ops
        .call(
            2,
            "pauseConversation",
            json!({"conversationId": "acme/secret"}),
        )
        .await;
    assert_eq!(r["result"]["seq"], 2, "{r}");
    let r = ops
        .call(
            3,
            "sendMessage",
            json!({"conversationId": "acme/secret", "payload": {"text": "hi"}, "finality": "none"}),
        )
        .await;
    assert_eq!(r["error"]["code"], -32002, "Forbidden: {r}");
    // Its list is of its own tenant.
    let r = ops.call(4, "listConversations", json!({})).await;
    let ids: Vec<&Value> = r["result"]["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["conversationId"])
        .collect();
    assert_eq!(ids, [&json!("c1")], "{r}");
    // A tenant's own principals may use the same form for their own tenant, never another's.
    let mut acme = two.ws(&two.acme_admin).await;
    let r = acme
        .call(
            1,
            "getConversation",
            json!({"conversationId": "acme/secret"}),
        )
        .await;
    assert_eq!(r["result"]["status"], "paused", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turns_go_to_the_executors_of_the_conversations_tenant() {
    use agent_sdk::AgentClient;
    let two = two_tenants().await;
    let acme = two.server.sdk_with(&two.acme_alice).await;
    let globex = two.server.sdk_with(&two.globex_alice).await;
    let push = || proto_spec::RegisterExecutorParams {
        mode: proto_spec::ExecutorMode::Push,
    };
    let mut acme_offers = acme.register_executor(push()).await.expect("register");
    let mut globex_offers = globex.register_executor(push()).await.expect("register");
    // Two turns of globex's alice: both offered to globex's replica (offers go round the
    // replicas of one principal: had the two alices been one, one would have gone to acme's).
    let mut admin = two.ws(&two.globex_admin).await;
    let scenario = json!({
        "participants": [{"id": "alice", "external": true}, {"id": "bob", "external": true}],
        "policy": {"order": "round_robin", "first": "alice"}
    });
    for (i, id) in ["t1", "t2"].iter().enumerate() {
        let r = admin
            .call(
                i as u64 + 1,
                "createConversation",
                json!({"conversationId": id, "scenario": scenario}),
            )
            .await;
        assert_eq!(r["result"]["conversationId"], *id, "{r}");
        let offer = tokio::time::timeout(tests::WAIT, globex_offers.next())
            .await
            .expect("globex's turn in time")
            .expect("an offer");
        assert_eq!(
            (offer.conversation_id.as_str(), offer.agent_id.as_str()),
            (*id, "alice")
        );
        // acme's alice cannot claim what was offered to globex's.
        let stolen = acme
            .claim_turn(proto_spec::ClaimTurnParams {
                claim_id: offer.claim_id.clone(),
            })
            .await;
        assert!(stolen.is_err(), "{stolen:?}");
        let claim = globex
            .claim_turn(proto_spec::ClaimTurnParams {
                claim_id: offer.claim_id,
            })
            .await
            .expect("claimTurn");
        assert!(claim.granted, "{claim:?}");
        assert_eq!(claim.conversation_id, *id);
    }
    let none = tokio::time::timeout(std::time::Duration::ZERO, acme_offers.next()).await;
    assert!(none.is_err(), "acme's replica was offered a turn: {none:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_scenario_agents_and_sub_conversations_stay_in_it() {
    let two = two_tenants().await;
    let mut admin = two.ws(&two.acme_admin).await;
    let scenario = json!({
        "participants": [
            {"id": "alice", "external": true},
            {"id": "helper", "kind": "scripted", "replies": ["done"]}
        ],
        "policy": {"order": "round_robin", "first": "alice"}
    });
    let r = admin
        .call(
            1,
            "createConversation",
            json!({"conversationId": "work", "scenario": scenario}),
        )
        .await;
    assert_eq!(r["result"]["conversationId"], "work", "{r}");
    let mut alice = two.ws(&two.acme_alice).await;
    let r = alice
        .call(
            1,
            "sendMessage",
            json!({"conversationId": "work", "payload": {"text": "go"}, "finality": "turn"}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let acme = two.server.client_with(&two.acme_alice).await;
    let log = tests::ws_log_until(&acme, "work", "the helper's answer", |log: &[Value]| {
        log.iter().any(|e| e["payload"]["text"] == "done")
    })
    .await;
    assert!(log.iter().all(|e| e["conversationId"] == "work"));
    // A sub-conversation: its parent named within the tenant, its start and end there too.
    let r = alice
        .call(
            2,
            "createConversation",
            json!({"conversationId": "child", "parentConversationId": "c1", "participants": ["alice"]}),
        )
        .await;
    assert_eq!(r["result"]["conversationId"], "child", "{r}");
    let snap = alice
        .call(3, "getConversation", json!({"conversationId": "child"}))
        .await;
    assert_eq!(snap["result"]["parentConversationId"], "c1", "{snap}");
    let r = alice
        .call(
            4,
            "sendMessage",
            json!({"conversationId": "child", "payload": {"text": "bye"}, "finality": "conversation"}),
        )
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let parent = tests::ws_log_until(&acme, "c1", "the child's end", |log: &[Value]| {
        log.iter()
            .any(|e| e["payload"]["type"] == "subconversation_finished")
    })
    .await;
    let started = parent
        .iter()
        .find(|e| e["payload"]["type"] == "subconversation_started")
        .expect("started");
    assert_eq!(started["payload"]["child"], "child", "{started}");
    // globex's c1 saw none of it.
    let globex = two
        .ws(&two.globex_alice)
        .await
        .call(1, "tail", json!({"conversationId": "c1", "sinceSeq": 0}))
        .await;
    assert_eq!(globex["result"]["latestSeq"], 1, "{globex}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_lists_and_starts_only_its_own_library_scenarios() {
    let two = two_tenants().await;
    let scenario = |caller: &str| {
        json!({
            "participants": [{"id": caller, "external": true, "caller": true},
                             {"id": "desk", "kind": "scripted", "replies": ["ok"]}],
            "policy": {"order": "round_robin", "first": caller}
        })
    };
    two.server.set_library(vec![
        ("shared", scenario("peer")),
        ("acme/helpdesk", scenario("peer")),
    ]);
    let names = |r: &Value| -> Vec<String> {
        r["result"]["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_string())
            .collect()
    };
    let r = two
        .ws(&two.acme_admin)
        .await
        .call(1, "listScenarios", json!({}))
        .await;
    assert_eq!(names(&r), ["helpdesk"], "{r}");
    let r = two
        .ws(&two.globex_admin)
        .await
        .call(1, "listScenarios", json!({}))
        .await;
    assert!(names(&r).is_empty(), "{r}");
    let r = two
        .ws(two.server.token("admin"))
        .await
        .call(1, "listScenarios", json!({}))
        .await;
    assert_eq!(names(&r), ["shared"], "{r}");
    // acme's alice starts acme's scenario; globex's cannot, and is told of no other.
    let r = two
        .ws(&two.acme_alice)
        .await
        .call(1, "createConversation", json!({"scenarioName": "helpdesk"}))
        .await;
    assert!(r["result"]["conversationId"].is_string(), "{r}");
    for name in ["helpdesk", "shared", "acme/helpdesk"] {
        let r = two
            .ws(&two.globex_alice)
            .await
            .call(1, "createConversation", json!({"scenarioName": name}))
            .await;
        assert_eq!(r["error"]["code"], -32602, "{name}: {r}");
        assert_eq!(r["error"]["data"]["known"], json!([]), "{name}: {r}");
    }
}

/// On a cluster: a tenant's conversation created through one node is its own through another,
/// and another tenant's `c1` there is another conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_hold_across_the_nodes_of_a_cluster() {
    let first = TestServer::on_postgres(tests::test_limits(), Default::default()).await;
    let acme = first.tenant_token("acme", "alice", true, false);
    let globex = first.tenant_token("globex", "alice", true, false);
    let second = first.another_node().await;
    for (token, text) in [(&acme, "acme's"), (&globex, "globex's")] {
        let mut ws = first.raw().await;
        ws.authenticate(token).await;
        let r = ws
            .call(
                1,
                "createConversation",
                json!({"conversationId": "c1", "participants": ["alice"]}),
            )
            .await;
        assert_eq!(r["result"]["conversationId"], "c1", "{r}");
        let mut other = second.raw().await;
        other.authenticate(token).await;
        let r = other
            .call(
                1,
                "sendMessage",
                json!({"conversationId": "c1", "payload": {"text": text}, "finality": "none"}),
            )
            .await;
        assert_eq!(r["result"]["seq"], 2, "{r}");
    }
    for (token, text) in [(&acme, "acme's"), (&globex, "globex's")] {
        let mut ws = first.raw().await;
        ws.authenticate(token).await;
        let tail = ws
            .call(1, "tail", json!({"conversationId": "c1", "sinceSeq": 1}))
            .await;
        let events = tail["result"]["events"].as_array().cloned().unwrap();
        assert_eq!(events.len(), 1, "{tail}");
        assert_eq!(events[0]["payload"]["text"], text, "{tail}");
    }
}
