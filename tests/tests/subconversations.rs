//! Sub-conversations: an `orchestrate` agent runs steps in sequence and in parallel, each a
//! child conversation linked to its parent in the log; the depth and fan-out limits refuse
//! runaway trees; a child that times out is reported as the step's failure; approval
//! checkpoints between steps go on or stop.

use agent_sdk::proto::*;
use agent_sdk::{AgentClient, ClientError};
use orchestrator::engine::config::Limits;
use serde_json::{json, Value};
use tests::{create_scenario, full_log, wait_for, TestServer};

fn system_of(log: &[Event], kind: &str) -> Vec<Value> {
    log.iter()
        .filter(|e| e.kind == EventKind::System)
        .map(|e| e.payload_value())
        .filter(|p| p["type"] == kind)
        .collect()
}

/// The planner's first message.
fn planner_said(log: &[Event]) -> Value {
    log.iter()
        .find(|e| e.author == "planner" && e.kind == EventKind::Message)
        .map(|e| e.payload_value())
        .expect("the planner spoke")
}

/// The planner's last message.
fn planner_said_last(log: &[Event]) -> Value {
    log.iter()
        .rev()
        .find(|e| e.author == "planner" && e.kind == EventKind::Message)
        .map(|e| e.payload_value())
        .expect("the planner spoke")
}

fn last_message(log: &[Event]) -> Value {
    log.iter()
        .rev()
        .find(|e| e.kind == EventKind::Message)
        .map(|e| e.payload_value())
        .unwrap_or(Value::Null)
}

/// A child scenario: one scripted researcher answers once, then it stops (max_turns).
fn researcher(reply: &str) -> Value {
    json!({
        "participants": [{"id": "researcher", "kind": "scripted", "replies": [reply]}],
        "policy": {"order": "round_robin", "first": "researcher"},
        "stop": {"maxTurns": 1}
    })
}

/// A parent: `asker` says the topic, then `planner` runs `steps`; it stops after two turns.
fn parent(steps: Value) -> Value {
    json!({
        "participants": [
            {"id": "asker", "kind": "scripted", "replies": ["tea"]},
            {"id": "planner", "kind": "orchestrate", "steps": steps},
        ],
        "policy": {"order": "round_robin", "first": "asker"},
        "stop": {"maxTurns": 2},
        "turn": {"timeout": "30s"}
    })
}

async fn closed(admin: &dyn AgentClient, id: &str) -> Vec<Event> {
    wait_for(admin, id, "the end", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    full_log(admin, id).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_in_sequence_each_take_the_result_of_the_last() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    create_scenario(
        &admin,
        "seq",
        parent(json!([
            {"scenario": researcher("tea came from China"), "as": "origin", "input": "Where did {{$.input.text}} come from?"},
            {"scenario": researcher("it went west by sea"), "as": "route", "input": "Given: {{$.steps.origin.text}}. How did it travel?"},
        ])),
    )
    .await;
    let log = closed(&admin, "seq").await;
    let started = system_of(&log, "subconversation_started");
    let finished = system_of(&log, "subconversation_finished");
    assert_eq!(started.len(), 2);
    assert_eq!(finished.len(), 2);
    // In sequence: the second starts after the first finished.
    let at = |kind: &str, child: &Value| {
        log.iter()
            .position(|e| {
                let p = e.payload_value();
                p["type"] == kind && p["child"] == *child
            })
            .unwrap()
    };
    assert!(
        at("subconversation_finished", &started[0]["child"])
            < at("subconversation_started", &started[1]["child"])
    );
    assert_eq!(finished[0]["status"], "stopped");
    assert_eq!(finished[0]["reason"], "max_turns");
    assert_eq!(finished[0]["result"]["text"], "tea came from China");
    assert_eq!(finished[0]["result"]["author"], "researcher");

    // The planner answers with the last step's result, and every result in data.
    let answer = planner_said(&log);
    assert_eq!(answer["text"], "it went west by sea");
    assert_eq!(answer["schema"], "orchestrate.result.v1");
    assert_eq!(
        answer["data"]["results"]["origin"]["text"],
        "tea came from China"
    );

    // Each child records its parent and opens with its input, written by the agent that
    // opened it (the planner).
    let second = started[1]["child"].as_str().unwrap().to_string();
    let snap = admin.get_conversation(&second).await.unwrap();
    assert_eq!(snap.parent_conversation_id.as_deref(), Some("seq"));
    let child_log = full_log(&admin, &second).await;
    let created = child_log[0].payload_value();
    assert_eq!(created["parent"]["conversationId"], "seq");
    assert_eq!(created["parent"]["depth"], 1);
    assert_eq!(child_log[1].author, "planner");
    assert_eq!(
        child_log[1].payload_value()["text"],
        "Given: tea came from China. How did it travel?"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_children_are_open_at_once_and_whoever_takes_part_above_may_follow_them() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    let bob = server.sdk("bob", None).await;
    let carol = server.sdk("carol", None).await;
    // Each child waits for bob (external), so both must be open before either can finish.
    let child = json!({
        "participants": ["bob"],
        "policy": {"order": "round_robin", "first": "bob"},
        "stop": {"maxTurns": 1}
    });
    let mut scenario = parent(json!([
        {"parallel": [
            {"scenario": child, "as": "left", "input": "left side of {{$.input.text}}"},
            {"scenario": child, "as": "right", "input": "right side of {{$.input.text}}"},
        ]}
    ]));
    scenario["participants"]
        .as_array_mut()
        .unwrap()
        .push(json!("alice"));
    scenario["policy"]["order"] = json!("sequence");
    scenario["policy"]["sequence"] = json!(["asker", "planner"]);
    create_scenario(&admin, "par", scenario).await;

    let log = tests::log_until(&admin, "par", "two children started", |log| {
        system_of(log, "subconversation_started").len() == 2
    })
    .await;
    assert!(system_of(&log, "subconversation_finished").is_empty());
    let children: Vec<String> = system_of(&log, "subconversation_started")
        .iter()
        .map(|s| s["child"].as_str().unwrap().to_string())
        .collect();
    // alice takes part in the parent: she may read its children; carol may not.
    let alice = server.sdk("alice", None).await;
    let snap = alice
        .get_conversation(&children[0])
        .await
        .expect("alice reads a child");
    assert_eq!(snap.parent_conversation_id.as_deref(), Some("par"));
    let refused = carol.get_conversation(&children[0]).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::ConversationNotFound));
    // ... and lists them (the console's tree and sidebar come from this list); carol does not.
    let listed = |r: ListConversationsResult| -> Vec<String> {
        r.conversations
            .into_iter()
            .map(|c| c.conversation_id)
            .collect()
    };
    let alices = listed(
        alice
            .list_conversations(Default::default())
            .await
            .expect("alice lists"),
    );
    for id in children.iter().chain([&"par".to_string()]) {
        assert!(alices.contains(id), "{id} in alice's list {alices:?}");
    }
    let carols = listed(
        carol
            .list_conversations(Default::default())
            .await
            .expect("carol lists"),
    );
    assert!(carols.is_empty(), "{carols:?}");

    for c in &children {
        let input = full_log(&bob, c).await[1].payload_value()["text"]
            .as_str()
            .unwrap()
            .to_string();
        bob.send_message(SendMessageParams {
            conversation_id: c.clone(),
            payload: MessagePayload::text(format!("bob on the {input}")),
            finality: Finality::Turn,
            turn_hint: None,
            client_request_id: None,
            after_key: None,
        })
        .await
        .expect("bob answers");
    }
    let log = closed(&admin, "par").await;
    let answer = planner_said(&log);
    assert_eq!(
        answer["text"],
        "bob on the left side of tea\n\nbob on the right side of tea"
    );
}

async fn open_child(
    client: &dyn AgentClient,
    parent: &str,
    id: &str,
) -> Result<CreateConversationResult, ClientError> {
    client
        .create_conversation(CreateConversationParams {
            conversation_id: Some(id.into()),
            scenario: Some(json!({
                "participants": ["alice", "bob"],
                "policy": {"order": "round_robin", "first": "bob"}
            })),
            parent_conversation_id: Some(parent.into()),
            input: Some(MessagePayload::text("go")),
            ..Default::default()
        })
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_and_fan_out_limits_refuse_runaway_trees_with_their_own_error() {
    let limits = Limits {
        max_depth: 2,
        max_children: 2,
        ..tests::test_limits()
    };
    let server = TestServer::with_limits(limits).await;
    let admin = server.sdk("admin", None).await;
    let alice = server.sdk("alice", None).await;
    let carol = server.sdk("carol", None).await;
    server.create("root", &["alice", "bob"]).await;

    // Only admins create top-level conversations; a non-participant opens no child.
    let e = alice
        .create_conversation(CreateConversationParams {
            participants: Some(vec!["alice".into()]),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::Forbidden));
    let e = open_child(&carol, "root", "c-x").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::ConversationNotFound));

    // Depth: root (0) → d1 (1) → d2 (2) → d3 refused.
    open_child(&alice, "root", "d1").await.expect("depth 1");
    open_child(&alice, "d1", "d2").await.expect("depth 2");
    let e = open_child(&alice, "d2", "d3").await.unwrap_err();
    let ClientError::Rpc(e) = e else {
        panic!("{e}")
    };
    assert_eq!(e.code, ErrorCode::SubconversationLimit);
    assert_eq!(e.code.code(), -32031);
    assert!(e.message.contains("at most 2 deep"), "{}", e.message);
    assert_eq!(e.data.as_ref().unwrap()["limit"], "depth");
    assert!(
        admin.get_conversation("d3").await.is_err(),
        "nothing created"
    );

    // Fan-out: root has d1 open; one more, then refused; closing one makes room.
    open_child(&alice, "root", "f2")
        .await
        .expect("second child");
    let e = open_child(&alice, "root", "f3").await.unwrap_err();
    let ClientError::Rpc(e) = e else {
        panic!("{e}")
    };
    assert_eq!(e.code, ErrorCode::SubconversationLimit);
    assert_eq!(e.data.as_ref().unwrap()["limit"], "fanOut");
    let bob = server.sdk("bob", None).await;
    close_by_bob(&bob, "f2", "done here").await;
    open_child(&alice, "root", "f3").await.expect("room again");

    // The parent's log tells the story: started ×3 (d1, f2, f3), finished ×1 (f2, completed).
    let log = full_log(&admin, "root").await;
    let started: Vec<Value> = system_of(&log, "subconversation_started")
        .iter()
        .map(|s| s["child"].clone())
        .collect();
    assert_eq!(started, [json!("d1"), json!("f2"), json!("f3")]);
    let finished = system_of(&log, "subconversation_finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["status"], "completed");
    assert_eq!(finished[0]["result"]["text"], "done here");
    // A retried creation of the same child is ConversationExists and changes nothing.
    let e = open_child(&alice, "root", "f3").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::ConversationExists));
    assert_eq!(
        system_of(&full_log(&admin, "root").await, "subconversation_started").len(),
        3
    );
}

/// The code and `data.limit` of a refusal.
fn refused(r: Result<CreateConversationResult, ClientError>) -> (ErrorCode, Value) {
    match r {
        Err(ClientError::Rpc(e)) => (e.code, e.data.unwrap_or(Value::Null)["limit"].clone()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Closes conversation `id` with a final message from bob.
async fn close_by_bob(bob: &dyn AgentClient, id: &str, text: &str) {
    bob.send_message(SendMessageParams {
        conversation_id: id.into(),
        payload: MessagePayload::text(text),
        finality: Finality::Conversation,
        turn_hint: None,
        client_request_id: None,
        after_key: None,
    })
    .await
    .unwrap();
}

/// The caps on open conversations: sub-conversations open in one tree, at every depth, and
/// conversations one agent created and has not closed. Each refusal has its own `data.limit`,
/// closing one makes room, and the counts are the log's: a restart finds them as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tree_and_per_agent_caps_count_open_conversations_across_depths_and_restarts() {
    let mut limits = tests::test_limits();
    (limits.max_tree, limits.max_open_per_agent) = (3, 5);
    let mut server = TestServer::with_limits(limits).await;
    let admin = server.sdk("admin", None).await;
    let alice = server.sdk("alice", None).await;
    let bob = server.sdk("bob", None).await;
    server.create("t1", &["alice", "bob"]).await;
    server.create("t2", &["alice", "bob"]).await;

    // Three open in t1's tree, at depths 1, 2 and 3: a fourth anywhere in it is refused (the
    // tree's cap is checked before the depth).
    open_child(&alice, "t1", "a").await.expect("a");
    open_child(&alice, "a", "b").await.expect("b");
    open_child(&alice, "b", "c").await.expect("c");
    let log = full_log(&admin, "c").await;
    assert_eq!(
        log[0].payload_value()["parent"],
        json!({"conversationId": "b", "depth": 3, "root": "t1"}),
        "a child records its tree"
    );
    for (parent, id) in [("a", "d"), ("t1", "e"), ("c", "f")] {
        let r = open_child(&bob, parent, id).await;
        let (code, limit) = refused(r);
        assert_eq!(code, ErrorCode::SubconversationLimit, "{id}");
        assert_eq!(code.code(), -32031);
        assert_eq!(limit, "tree", "{id}");
        assert!(admin.get_conversation(id).await.is_err(), "nothing created");
    }
    let e = open_child(&bob, "a", "d").await.unwrap_err();
    let ClientError::Rpc(e) = e else {
        panic!("{e}")
    };
    assert_eq!(e.data.as_ref().unwrap()["root"], "t1");
    assert_eq!(e.data.as_ref().unwrap()["open"], 3);
    assert!(e.message.contains("at most 3"), "{}", e.message);
    // Another tree is not held by t1's.
    open_child(&alice, "t2", "x").await.expect("x");
    open_child(&alice, "t2", "y").await.expect("y");

    // alice has five open (a, b, c, x, y): her sixth is refused with RateLimited, bob's is not.
    let (code, limit) = refused(open_child(&alice, "t2", "z").await);
    assert_eq!(code, ErrorCode::RateLimited);
    assert_eq!(limit, "openConversations");
    open_child(&bob, "t2", "z").await.expect("bob's first");

    // Closing one makes room in its tree and for its creator.
    close_by_bob(&bob, "c", "done").await;
    open_child(&alice, "a", "d")
        .await
        .expect("room in t1 and for alice");
    let (code, _) = refused(open_child(&alice, "t2", "w").await);
    assert_eq!(code, ErrorCode::RateLimited);

    // After a restart the counts are what the log says: t1's tree is full again (a, b, d) and
    // alice has five open (a, b, d, x, y).
    server.restart().await;
    let alice = server.sdk("alice", None).await;
    let bob = server.sdk("bob", None).await;
    let (code, limit) = refused(open_child(&bob, "t1", "g").await);
    assert_eq!(
        (code, limit),
        (ErrorCode::SubconversationLimit, json!("tree"))
    );
    let (code, limit) = refused(open_child(&alice, "t2", "w").await);
    assert_eq!(
        (code, limit),
        (ErrorCode::RateLimited, json!("openConversations"))
    );
    close_by_bob(&bob, "x", "done").await;
    open_child(&alice, "t2", "w").await.expect("room for alice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_times_out_fails_its_step_and_the_planner_says_so() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    // bob never answers: the child's turn times out and it ends.
    let silent = json!({
        "participants": ["bob"],
        "policy": {"order": "round_robin", "first": "bob"},
        "turn": {"timeout": "300ms", "onTimeout": "end"}
    });
    create_scenario(
        &admin,
        "fail",
        parent(json!([
            {"scenario": silent, "as": "silent"},
            {"scenario": researcher("never reached"), "as": "after"},
        ])),
    )
    .await;
    let log = closed(&admin, "fail").await;
    let finished = system_of(&log, "subconversation_finished");
    assert_eq!(finished.len(), 1, "the second step never starts");
    assert_eq!(finished[0]["status"], "stopped");
    assert_eq!(finished[0]["reason"], "turn_timeout");
    assert_eq!(finished[0]["result"], Value::Null);
    let answer = planner_said(&log);
    assert_eq!(answer["schema"], "orchestrate.failed.v1");
    assert_eq!(answer["data"]["failed"], "silent");
    assert_eq!(answer["data"]["reason"], "turn_timeout");
    assert!(
        answer["text"].as_str().unwrap().contains("turn timeout"),
        "{answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_over_the_fan_out_limit_reports_the_limit() {
    let limits = Limits {
        max_children: 1,
        ..tests::test_limits()
    };
    let server = TestServer::with_limits(limits).await;
    let admin = server.sdk("admin", None).await;
    // Each child waits for bob, who never answers: the first is still open when the second is
    // asked for.
    let waits =
        json!({"participants": ["bob"], "policy": {"order": "round_robin", "first": "bob"}});
    create_scenario(
        &admin,
        "wide",
        parent(json!([
            {"parallel": [
                {"scenario": waits, "as": "one"},
                {"scenario": waits, "as": "two"},
            ]}
        ])),
    )
    .await;
    let log = closed(&admin, "wide").await;
    let answer = planner_said(&log);
    assert_eq!(answer["schema"], "orchestrate.failed.v1");
    assert_eq!(answer["data"]["failed"], "two");
    let text = answer["text"].as_str().unwrap();
    assert!(
        text.contains("could not start") && text.contains("at most 1 at once"),
        "{text}"
    );
    assert_eq!(system_of(&log, "subconversation_started").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_between_steps_goes_on_when_approved_and_stops_when_rejected() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    let alice = server.sdk("alice", None).await;
    for (id, answer) in [("yes", "approve, go on"), ("no", "reject: not convincing")] {
        create_scenario(
            &admin,
            id,
            json!({
                "participants": [
                    {"id": "asker", "kind": "scripted", "replies": ["tea"]},
                    {"id": "planner", "kind": "orchestrate", "steps": [
                        {"scenario": researcher("notes on tea"), "as": "notes"},
                        {"approve": {"by": "alice", "text": "Notes: {{$.steps.notes.text}}. Write it up?"}},
                        {"scenario": researcher("the report"), "as": "report"},
                    ]},
                    "alice"
                ],
                "policy": {"order": "addressed", "first": "asker"},
                "stop": {"maxTurns": 4},
                "turn": {"timeout": "30s"}
            }),
        )
        .await;
        wait_for(&alice, id, "alice's turn", |s| {
            s.guidance.status == GuidanceStatus::MaySpeak && s.speaker.as_deref() == Some("alice")
        })
        .await;
        let log = full_log(&alice, id).await;
        let ask = last_message(&log);
        assert_eq!(ask["text"], "Notes: notes on tea. Write it up?");
        assert_eq!(ask["schema"], "orchestrate.checkpoint.v1");
        assert_eq!(ask["to"], json!(["alice"]));
        alice
            .send_message(SendMessageParams {
                conversation_id: id.into(),
                payload: MessagePayload {
                    to: vec!["planner".into()],
                    ..MessagePayload::text(answer)
                },
                finality: Finality::Turn,
                turn_hint: None,
                client_request_id: None,
                after_key: None,
            })
            .await
            .expect("alice answers");
        let log = closed(&admin, id).await;
        let last = planner_said_last(&log);
        let started = system_of(&log, "subconversation_started").len();
        if id == "yes" {
            assert_eq!(last["text"], "the report");
            assert_eq!(started, 2);
            assert_eq!(last["data"]["results"]["notes"]["text"], "notes on tea");
        } else {
            assert_eq!(last["schema"], "orchestrate.failed.v1");
            assert!(
                last["text"]
                    .as_str()
                    .unwrap()
                    .contains("alice did not approve"),
                "{last}"
            );
            assert_eq!(started, 1, "the step after a rejection never starts");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_steps_and_bad_children_are_refused_with_the_parent_naming_the_field() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    let refused = |steps: Value| {
        let admin = admin.clone();
        async move {
            let e = admin
                .create_conversation(CreateConversationParams {
                    conversation_id: Some("bad".into()),
                    scenario: Some(parent(steps)),
                    ..Default::default()
                })
                .await
                .unwrap_err();
            let ClientError::Rpc(e) = e else {
                panic!("{e}")
            };
            assert_eq!(e.code, ErrorCode::InvalidParams);
            e.data.unwrap()["path"].as_str().unwrap().to_string()
        }
    };
    // An inline child that is not a valid scenario: the path goes into the child.
    let path =
        refused(json!([{"scenario": {"participants": [{"id": "x", "kind": "nope"}]}}])).await;
    assert_eq!(
        path,
        "scenario.participants[1].steps[0].scenario.participants[0].kind"
    );
    // A step that is none of call, parallel, approve; a template path not from $.
    let path = refused(json!([{"call": "research", "parallel": []}])).await;
    assert!(path.starts_with("scenario.participants[1]"), "{path}");
    let path = refused(json!([{"call": "research", "input": "{{input.text}}"}])).await;
    assert_eq!(path, "scenario.participants[1].steps[0].input");
    // A function whose source does not compile.
    let e = admin
        .create_conversation(CreateConversationParams {
            scenario: Some(json!({
                "participants": [{"id": "f", "kind": "function", "source": "function handler( {"}],
                "policy": {"order": "round_robin", "first": "f"}
            })),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let ClientError::Rpc(e) = e else {
        panic!("{e}")
    };
    assert_eq!(e.data.unwrap()["path"], "scenario.participants[0].source");
    assert!(e.message.contains("SyntaxError"), "{}", e.message);
    assert!(
        admin.get_conversation("bad").await.is_err(),
        "nothing was created"
    );
}
