//! Conversation trees on a cluster: sub-conversations and forks opened on one node and read
//! on another, and the caps on open conversations counting what other nodes opened.

use std::collections::HashMap;

use jsonrpsee::core::client::ClientT;
use serde_json::{json, Value};
use tests::{test_limits, TestServer};

fn system_of(log: &[agent_sdk::proto::Event], kind: &str) -> Vec<Value> {
    log.iter()
        .filter(|e| e.kind == agent_sdk::proto::EventKind::System)
        .map(|e| e.payload_value())
        .filter(|p| p["type"] == kind)
        .collect()
}

/// Sub-conversations and forks across nodes: an `orchestrate` agent's children, opened on
/// whichever node runs its turn (the node it was created on stops gracefully once the first
/// child started), are each started and finished once, their logs and results are read on the
/// other node, and a fork made on one node of a conversation another node wrote is read on the
/// first with the events up to its seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subconversations_and_forks_work_across_nodes() {
    use agent_sdk::proto::{ConversationStatus, ForkConversationParams};
    use agent_sdk::AgentClient;
    let mut a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    let researcher = |reply: &str| {
        json!({
            "participants": [{"id": "researcher", "kind": "scripted", "replies": [reply]}],
            "policy": {"order": "round_robin", "first": "researcher"},
            "stop": {"maxTurns": 1}
        })
    };
    let scenario = json!({
        "participants": [
            {"id": "asker", "kind": "scripted", "replies": ["tea"]},
            {"id": "planner", "kind": "orchestrate", "steps": [
                {"scenario": researcher("tea came from China"), "as": "origin", "input": "Where did {{$.input.text}} come from?"},
                {"scenario": researcher("it went west by sea"), "as": "route", "input": "Given: {{$.steps.origin.text}}. How did it travel?"},
            ]},
        ],
        "policy": {"order": "round_robin", "first": "asker"},
        "stop": {"maxTurns": 2},
        "turn": {"timeout": "30s"}
    });
    let on_a = a.sdk("admin", None).await;
    tests::create_scenario(&on_a, "tree", scenario).await;
    let on_b = b.sdk("admin", None).await;
    tests::log_until(&on_b, "tree", "a child started", |log| {
        !system_of(log, "subconversation_started").is_empty()
    })
    .await;
    a.stop().await;
    tests::wait_for(&on_b, "tree", "the end", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    let log = tests::full_log(&on_b, "tree").await;
    let started = system_of(&log, "subconversation_started");
    let finished = system_of(&log, "subconversation_finished");
    assert_eq!(started.len(), 2, "each child started once: {started:?}");
    assert_eq!(finished.len(), 2, "each child finished once: {finished:?}");
    assert_eq!(finished[0]["result"]["text"], "tea came from China");
    assert_eq!(finished[1]["result"]["text"], "it went west by sea");
    let answers: Vec<_> = log
        .iter()
        .filter(|e| e.author == "planner" && e.kind == agent_sdk::proto::EventKind::Message)
        .collect();
    assert_eq!(answers.len(), 1, "one answer from the planner");
    assert_eq!(answers[0].payload_value()["text"], "it went west by sea");
    for child in &started {
        let id = child["child"].as_str().expect("the child's id");
        let child_log = tests::full_log(&on_b, id).await;
        let seqs: Vec<u64> = child_log.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
        assert!(child_log.iter().any(|e| e.author == "researcher"));
    }

    // A fork made on one node of a conversation written through another.
    let c = b.another_node().await;
    let on_c = c.sdk("admin", None).await;
    let at = log.len() as u64 - 1;
    on_c.fork_conversation(ForkConversationParams {
        conversation_id: "tree".into(),
        at_seq: at,
        new_conversation_id: Some("tree-fork".into()),
    })
    .await
    .expect("fork on another node");
    let forked = tests::full_log(&on_b, "tree-fork").await;
    let copied: Vec<_> = forked
        .iter()
        .take(at as usize)
        .map(|e| (e.seq, e.payload_value()))
        .collect();
    let original: Vec<_> = log
        .iter()
        .take(at as usize)
        .map(|e| (e.seq, e.payload_value()))
        .collect();
    assert_eq!(copied.len(), at as usize);
    assert_eq!(
        copied, original,
        "the fork starts with the events up to its seq"
    );
    assert!(
        forked
            .iter()
            .any(|e| e.payload_value()["type"] == "forked_from"),
        "{forked:?}"
    );
}

/// The caps on open conversations hold across nodes for what each node has seen: children a
/// node opened count on the other, and one closed on a node makes room on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caps_on_open_conversations_count_what_other_nodes_opened() {
    use agent_sdk::proto::{
        ConversationStatus, CreateConversationParams, ErrorCode, Finality, MessagePayload,
        SendMessageParams,
    };
    use agent_sdk::AgentClient;
    let limits = orchestrator::engine::config::Limits {
        max_tree: 2,
        ..test_limits()
    };
    let a = TestServer::on_postgres(limits, HashMap::new()).await;
    let b = a.another_node().await;
    a.create("root", &["alice", "bob"]).await;
    let open = |id: &'static str| CreateConversationParams {
        conversation_id: Some(id.into()),
        participants: Some(vec!["alice".into(), "bob".into()]),
        parent_conversation_id: Some("root".into()),
        ..Default::default()
    };
    let alice_a = a.sdk("alice", None).await;
    let alice_b = b.sdk("alice", None).await;
    alice_a.create_conversation(open("one")).await.expect("one");
    alice_a.create_conversation(open("two")).await.expect("two");
    // B holds both (named, so met at once; otherwise from A's notification).
    let admin_b = b.sdk("admin", None).await;
    admin_b.get_conversation("two").await.expect("two on B");
    let e = alice_b
        .create_conversation(open("three"))
        .await
        .expect_err("the tree is full on B too");
    assert_eq!(e.code(), Some(ErrorCode::SubconversationLimit));
    // Closed on A: room on B once B has seen it.
    a.sdk("bob", None)
        .await
        .send_message(SendMessageParams {
            conversation_id: "one".into(),
            payload: MessagePayload::text("done"),
            finality: Finality::Conversation,
            turn_hint: None,
            client_request_id: None,
            after_key: None,
        })
        .await
        .expect("closed on A");
    tests::wait_for(&admin_b, "one", "B sees it closed", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    alice_b
        .create_conversation(open("three"))
        .await
        .expect("room on B");
}

/// A sub-conversation opened through a node that has not met its parent: the parent was created
/// through another node after this one started, and nothing here has named it yet. The node
/// loads the parent before it checks who may open a child of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_is_opened_through_a_node_that_has_not_met_its_parent() {
    use agent_sdk::proto::CreateConversationParams;
    use agent_sdk::AgentClient;
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    let alice_b = b.sdk("alice", None).await;
    let admin_a = a.client("admin").await;
    for i in 0..20 {
        let parent = format!("unmet-{i}");
        // Created through A, and at once a child of it asked through B: B hears of the parent
        // from A's notice only after it has the request.
        let _: Value = admin_a
            .request(
                "createConversation",
                tests::P(json!({"conversationId": parent, "participants": ["alice", "bob"]})),
            )
            .await
            .expect("the parent through A");
        let child = format!("{parent}-child");
        alice_b
            .create_conversation(CreateConversationParams {
                conversation_id: Some(child.clone()),
                participants: Some(vec!["alice".into(), "bob".into()]),
                parent_conversation_id: Some(parent.clone()),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{child} through B: {e:?}"));
        let started = system_of(
            &tests::full_log(&a.sdk("admin", None).await, &parent).await,
            "subconversation_started",
        );
        assert_eq!(started.len(), 1, "{parent}: {started:?}");
        assert_eq!(started[0]["child"], child.as_str());
    }
}

/// A deletion through one node reaches the others: a subscriber on node B is told, B answers
/// `ConversationNotFound` after, and appends through B racing the deletion are each either
/// acknowledged before it (and deleted with it) or refused: the database keeps no event of the
/// deleted conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_on_one_node_reaches_the_others_and_races_no_append() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    a.create("d", &["alice", "bob"]).await;
    let alice_b = b.client("alice").await;
    let mut sub = b.raw().await;
    sub.authenticate(b.token("bob")).await;
    let opened = sub.subscribe(1, "d", 0).await;
    assert!(opened["result"].is_number(), "{opened}");
    let appends = async {
        let mut answers = Vec::new();
        for i in 0..300 {
            let r: Result<Value, _> = alice_b
                .request(
                    "sendMessage",
                    tests::P(json!({"conversationId": "d", "payload": {"text": format!("m{i}")}, "finality": "none"})),
                )
                .await;
            let refused = r.is_err();
            answers.push(r);
            if refused {
                break;
            }
        }
        answers
    };
    let deleting = async {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        let admin = a.client("admin").await;
        let r: Value = admin
            .request(
                "deleteConversation",
                tests::P(json!({"conversationId": "d"})),
            )
            .await
            .expect("delete");
        r
    };
    let (answers, deleted) = tokio::join!(appends, deleting);
    assert_eq!(deleted, json!({"deleted": ["d"]}));
    let last = answers.last().expect("some appends");
    match last
        .as_ref()
        .expect_err("appends end refused once the deletion landed")
    {
        jsonrpsee::core::ClientError::Call(e) => assert_eq!(e.code(), -32003, "{e:?}"),
        other => panic!("{other}"),
    }
    // Every append before the last was acknowledged (and went with the conversation).
    assert!(answers[..answers.len() - 1].iter().all(|r| r.is_ok()));
    // Node B is told: its subscriber, and its reads.
    let ended = loop {
        let frame = sub.recv().await;
        if frame["params"]["error"].is_object() {
            break frame;
        }
    };
    assert_eq!(ended["params"]["error"]["code"], -32003, "{ended}");
    tests::eventually("node B lets go of d", || !b.holds("d")).await;
    let gone: Result<Value, _> = alice_b
        .request(
            "tail",
            tests::P(json!({"conversationId": "d", "sinceSeq": 0})),
        )
        .await;
    assert!(gone.is_err(), "{gone:?}");
    let db = tests::pg::connect(&a.db).await.expect("a connection");
    let orphans: i64 = db
        .query_one(
            "SELECT count(*) FROM events WHERE conv NOT IN (SELECT num FROM conversations)",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(orphans, 0, "events of the deleted conversation were kept");
}
