//! What one agent may reach of another's work, from outside:
//! - a library scenario's `caller` participant: whoever creates a conversation from it speaks as
//!   it (their id takes its place in the participants and the policy), and any agent may create
//!   one, not only an admin; every other top-level creation stays an admin's. Two agents who
//!   start the same scenario each get a conversation of their own that the other cannot read;
//! - a sub-conversation opened by an agent names only participants of its parent, and its
//!   input is written by that agent, not by the orchestrator.

use jsonrpsee::core::client::ClientT;
use serde_json::{json, Value};
use tests::{TestServer, P};

/// The error object of a refused call: code, message and data.
fn rpc_error(r: Result<Value, jsonrpsee::core::ClientError>) -> Value {
    match r {
        Err(jsonrpsee::core::ClientError::Call(e)) => {
            json!({"code": e.code(), "message": e.message(), "data": e.data().map(|d| serde_json::from_str::<Value>(d.get()).unwrap())})
        }
        other => panic!("expected a call error, got {other:?}"),
    }
}

/// Waits (at most [`tests::WAIT`]) for a message with `text` in the conversation: that event.
async fn wait_for_text(c: &impl ClientT, conv: &str, text: &str) -> Value {
    let until = tokio::time::Instant::now() + tests::WAIT;
    loop {
        let tail: Value = c
            .request("tail", P(json!({"conversationId": conv, "sinceSeq": 0})))
            .await
            .unwrap();
        let found = tail["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["payload"]["text"] == text)
            .cloned();
        if let Some(e) = found {
            return e;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{text:?} never came: {tail}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A server whose library holds `helpdesk` (`peer` is the caller, a scripted assistant answers
/// and needs `peer`'s approval first) and `plain` (the same, without a caller).
async fn with_library() -> TestServer {
    let server = TestServer::start().await;
    let assistant = json!({"id": "assistant", "kind": "scripted", "replies": ["Hello.", "Filed."]});
    server.set_library(vec![
        (
            "helpdesk",
            json!({
                "participants": [{"id": "peer", "external": true, "caller": true}, assistant],
                "policy": {
                    "order": "round_robin",
                    "first": "peer",
                    "rules": [{"when": {"author": "peer", "tags": ["urgent"]}, "next": "assistant"}]
                }
            }),
        ),
        (
            "plain",
            json!({"participants": ["peer", assistant], "policy": {"order": "round_robin"}}),
        ),
    ]);
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_starts_a_scenario_that_names_a_caller_and_speaks_as_it() {
    let server = with_library().await;
    let alice = server.client("alice").await;
    let start = json!({"conversationId": "a1", "scenarioName": "helpdesk"});
    let created: Value = alice
        .request("createConversation", P(start))
        .await
        .expect("an agent starts a scenario with a caller");
    assert_eq!(created["conversationId"], "a1");
    let snap: Value = alice
        .request("getConversation", P(json!({"conversationId": "a1"})))
        .await
        .unwrap();
    assert_eq!(snap["participants"], json!(["alice", "assistant"]));
    assert_eq!(snap["guidance"]["status"], "may_speak", "{snap}");
    // The policy names alice wherever it named the caller: she speaks first, the assistant
    // answers.
    let _: Value = alice
        .request(
            "sendMessage",
            P(json!({"conversationId": "a1", "payload": {"text": "Hi"}, "finality": "turn"})),
        )
        .await
        .unwrap();
    let answered = wait_for_text(&alice, "a1", "Hello.").await;
    assert_eq!(answered["author"], "assistant");
    let tail: Value = alice
        .request("tail", P(json!({"conversationId": "a1", "sinceSeq": 0})))
        .await
        .unwrap();
    let created = &tail["events"][0]["payload"];
    assert_eq!(created["createdBy"], "alice", "{created}");

    // bob starts his own; neither reads the other's.
    let bob = server.client("bob").await;
    let _: Value = bob
        .request(
            "createConversation",
            P(json!({"conversationId": "b1", "scenarioName": "helpdesk"})),
        )
        .await
        .unwrap();
    let refused = bob
        .request::<Value, _>("getConversation", P(json!({"conversationId": "a1"})))
        .await;
    assert!(tests::error_code(refused) != 0);
    let listed: Value = bob
        .request("listConversations", P(json!({})))
        .await
        .unwrap();
    let ids: Vec<&str> = listed["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["conversationId"].as_str())
        .collect();
    assert_eq!(ids, ["b1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_caller_only_an_admin_creates_a_conversation() {
    let server = with_library().await;
    let alice = server.client("alice").await;
    let attempts = [
        json!({"scenarioName": "plain"}),
        json!({"participants": ["alice", "bob"]}),
        // An inline scenario is not the library's, whatever it marks.
        json!({"scenario": {"participants": [{"id": "x", "external": true, "caller": true}]}}),
    ];
    for params in attempts {
        let refused = alice
            .request::<Value, _>("createConversation", P(params.clone()))
            .await;
        assert_eq!(tests::error_code(refused), -32002, "{params}");
    }
    let admin = server.client("admin").await;
    let plain = json!({"conversationId": "p1", "scenarioName": "plain"});
    let _: Value = admin
        .request("createConversation", P(plain))
        .await
        .expect("an admin creates any conversation");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_is_one_external_participant_and_the_creator_is_not_another() {
    let server = with_library().await;
    let admin = server.client("admin").await;
    let create = |scenario: Value| {
        let admin = &admin;
        async move {
            admin
                .request::<Value, _>("createConversation", P(json!({"scenario": scenario})))
                .await
        }
    };
    let internal = create(json!({"participants": [
        {"id": "bot", "kind": "scripted", "replies": ["x"], "caller": true}
    ]}))
    .await;
    let e = rpc_error(internal);
    assert_eq!(e["code"], -32602);
    assert_eq!(e["data"]["path"], "scenario.participants[0].caller", "{e}");
    let two = create(json!({"participants": [
        {"id": "a", "external": true, "caller": true},
        {"id": "b", "external": true, "caller": true}
    ]}))
    .await;
    assert_eq!(rpc_error(two)["code"], -32602);
    // The creator (admin) is already another participant.
    let taken = create(json!({"participants": [
        {"id": "peer", "external": true, "caller": true}, "admin"
    ]}))
    .await;
    let e = rpc_error(taken);
    assert_eq!(e["data"]["path"], "scenario.participants[1].id", "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_conversation_cannot_pull_in_a_stranger_and_its_input_is_its_openers() {
    let server = TestServer::start().await;
    let admin = server.client("admin").await;
    let _: Value = admin
        .request(
            "createConversation",
            P(json!({"conversationId": "p", "participants": ["alice", "bob"]})),
        )
        .await
        .unwrap();
    let alice = server.client("alice").await;
    let open = |id: &str, participants: Value| {
        json!({
            "conversationId": id,
            "parentConversationId": "p",
            "scenario": {"participants": participants, "policy": {"order": "round_robin"}},
            "input": {"text": "Reply with your token"}
        })
    };
    // carol takes no part in p: alice cannot pull her in, by id or in a scenario object.
    for participants in [
        json!(["alice", "carol"]),
        json!([{"id": "carol", "external": true}]),
    ] {
        let refused = alice
            .request::<Value, _>("createConversation", P(open("c1", participants.clone())))
            .await;
        let e = rpc_error(refused);
        assert_eq!(e["code"], -32002, "{participants}: {e}");
        assert!(e["message"].as_str().unwrap().contains("\"carol\""), "{e}");
    }
    let carol = server.client("carol").await;
    let listed: Value = carol
        .request("listConversations", P(json!({})))
        .await
        .unwrap();
    assert_eq!(
        listed["conversations"],
        json!([]),
        "carol was pulled into nothing"
    );
    // Participants of the parent, and a participant the scenario has the server run (scripted:
    // any agent may declare it), are fine.
    let scripted = json!({"id": "helper", "kind": "scripted", "replies": ["ok"]});
    let _: Value = alice
        .request(
            "createConversation",
            P(open("c2", json!(["alice", "bob", scripted]))),
        )
        .await
        .expect("a sub-conversation among the parent's participants");
    let tail: Value = alice
        .request("tail", P(json!({"conversationId": "c2", "sinceSeq": 0})))
        .await
        .unwrap();
    let input = &tail["events"][1];
    assert_eq!(input["kind"], "message", "{tail}");
    assert_eq!(
        input["author"], "alice",
        "the input is its opener's: {tail}"
    );
    // An admin may still name anyone.
    let _: Value = admin
        .request("createConversation", P(open("c3", json!(["carol"]))))
        .await
        .expect("an admin names anyone");
}

/// The body of an HTTP answer, as JSON, and its status code.
fn http_json(answer: &str) -> (u16, Value) {
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_that_is_not_yours_is_answered_as_one_that_does_not_exist() {
    let server = TestServer::start().await;
    server.create("bobs", &["bob"]).await;
    let mut alice = server.raw().await;
    alice.authenticate(server.token("alice")).await;
    // Every method that names a conversation, on bob's and on one that never existed: the
    // same error, word for word but for the id.
    let calls = tests::conversation_methods();
    for (i, (method, params)) in calls.iter().enumerate() {
        let answer = |id: &str| {
            let mut p = params.clone();
            let key = if *method == "createConversation" {
                "parentConversationId"
            } else {
                "conversationId"
            };
            p[key] = json!(id);
            p
        };
        let theirs = alice.call(i as u64 * 2 + 1, method, answer("bobs")).await;
        let none = alice
            .call(i as u64 * 2 + 2, method, answer("nobodys"))
            .await;
        assert_eq!(theirs["error"]["code"], -32003, "{method}: {theirs}");
        let same = |v: &Value| v["error"].to_string().replace("nobodys", "bobs");
        assert_eq!(
            theirs["error"].to_string(),
            same(&none),
            "{method}: {theirs} / {none}"
        );
    }
    // Over HTTP: 404 with the same body.
    let addr = server.running().local_addr().to_string();
    let bearer = format!("Authorization: Bearer {}\r\n", server.token("alice"));
    for (route, body) in tests::conversation_routes() {
        let headers = format!("{bearer}Content-Type: application/json\r\n");
        let theirs = tests::http_raw(&addr, &route.replace("ID", "bobs"), &headers, body).await;
        let none = tests::http_raw(&addr, &route.replace("ID", "nobodys"), &headers, body).await;
        let (status, theirs) = http_json(&theirs);
        let (_, none) = http_json(&none);
        assert_eq!(status, 404, "{route}: {theirs}");
        assert_eq!(
            theirs.to_string(),
            none.to_string().replace("nobodys", "bobs"),
            "{route}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_or_one_agent_cannot_hold_every_connection() {
    use orchestrator::engine::config::Limits;
    let server = TestServer::with_limits(Limits {
        max_connections_per_address: 4,
        max_connections_per_agent: 2,
        ..tests::test_limits()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut ws = server.raw().await;
        ws.authenticate(server.token("alice")).await;
        held.push(ws);
    }
    let mut third = server.raw().await;
    let refused = third
        .call(1, "authenticate", json!({"token": server.token("alice")}))
        .await;
    assert_eq!(refused["error"]["code"], -32029, "{refused}");
    assert_eq!(refused["error"]["data"]["per"], "agent", "{refused}");
    // Another agent on the same connection and address is served.
    third.authenticate(server.token("bob")).await;
    held.push(third);
    let mut fourth = server.raw().await;
    fourth.authenticate(server.token("carol")).await;
    held.push(fourth);
    // Four from 127.0.0.1: the fifth handshake is refused before anyone authenticates.
    let over = tokio_tungstenite::connect_async(server.url()).await;
    match over {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status().as_u16(), 429);
            let body: Value =
                serde_json::from_slice(r.body().as_deref().unwrap_or(b"null")).unwrap();
            assert_eq!(body["error"]["data"]["per"], "address", "{body}");
        }
        other => panic!("the fifth connection from one address was let in: {other:?}"),
    }
    // A place given back is taken again.
    held.pop();
    let mut again = None;
    for _ in 0..100 {
        if let Ok((ws, _)) = tokio_tungstenite::connect_async(server.url()).await {
            again = Some(ws);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(again.is_some(), "a closed connection gives its place back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_over_its_byte_budget_is_refused_with_its_own_code_and_the_wait() {
    use orchestrator::engine::config::Limits;
    let server = TestServer::with_limits(Limits {
        max_append_bytes_per_minute: 6_000,
        ..tests::test_limits()
    })
    .await;
    server.create("c", &["alice", "bob"]).await;
    let mut alice = server.raw().await;
    alice.authenticate(server.token("alice")).await;
    let big = "x".repeat(4_000);
    let send =
        |text: &str| json!({"conversationId": "c", "payload": {"text": text}, "finality": "none"});
    let first = alice.call(1, "sendMessage", send(&big)).await;
    assert!(first["result"]["seq"].is_u64(), "{first}");
    let over = alice.call(2, "sendMessage", send(&big)).await;
    assert_eq!(over["error"]["code"], -32032, "{over}");
    let wait = over["error"]["data"]["retryAfterMs"].as_u64().unwrap();
    assert!(
        wait > 1_000 && wait <= 40_000,
        "about 2,000 bytes at 100 a second: {over}"
    );
    // bob has a budget of his own; nothing of alice's refused append is in the log.
    let mut bob = server.raw().await;
    bob.authenticate(server.token("bob")).await;
    let r = bob.call(3, "sendMessage", send(&big)).await;
    assert!(r["result"]["seq"].is_u64(), "{r}");
    let tail = bob
        .call(4, "tail", json!({"conversationId": "c", "sinceSeq": 0}))
        .await;
    let authors: Vec<&str> = tail["result"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "message")
        .map(|e| e["author"].as_str().unwrap())
        .collect();
    assert_eq!(authors, ["alice", "bob"]);
}
