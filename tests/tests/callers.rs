//! A library scenario's `caller` participant: whoever creates a conversation from it speaks as
//! it (their id takes its place in the participants and the policy), and any agent may create
//! one, not only an admin; every other top-level creation stays an admin's. Two agents who start
//! the same scenario each get a conversation of their own that the other cannot read.

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
    let created: Value = alice
        .request(
            "createConversation",
            P(json!({"conversationId": "a1", "scenarioName": "helpdesk"})),
        )
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
    let _: Value = admin
        .request(
            "createConversation",
            P(json!({"conversationId": "p1", "scenarioName": "plain"})),
        )
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
