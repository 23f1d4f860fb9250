//! Scenarios on the running server: timers from logged times (also across a restart), pause and
//! resume, and a bad scenario refused with the field it is about.

use std::time::Duration;

use agent_sdk::proto::*;
use agent_sdk::{AgentClient, ClientError, WsJsonRpcClient};
use serde_json::{json, Value};
use tests::{full_log as log_of, wait_for as wait_until, TestServer};

async fn create(admin: &WsJsonRpcClient, id: &str, scenario: Value) {
    tests::create_scenario(admin, id, scenario).await
}

fn system_types(log: &[Event]) -> Vec<String> {
    log.iter()
        .filter(|e| e.kind == EventKind::System)
        .map(|e| e.payload_value()["type"].as_str().unwrap_or("").to_string())
        .collect()
}

fn stop_reason(log: &[Event]) -> Value {
    let last = log.last().expect("events");
    assert_eq!(last.author, ORCHESTRATOR_AUTHOR);
    assert_eq!(last.finality, Some(Finality::Conversation));
    last.payload_value()["data"]["reason"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn turn_timeouts_skip_end_and_retry_on_the_server() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    for on in ["skip", "end", "retry"] {
        let id = format!("timeout-{on}");
        create(&admin, &id, json!({"participants": ["alice", "bob"], "policy": {"order": "round_robin"}, "turn": {"timeout": "300ms", "onTimeout": on}})).await;
        let s = wait_until(&admin, &id, "the timeout", |s| {
            s.turn >= 2 || s.status == ConversationStatus::Closed
        })
        .await;
        let log = log_of(&admin, &id).await;
        assert!(
            system_types(&log).contains(&"turn_timeout".to_string()),
            "{log:?}"
        );
        match on {
            "skip" => assert_eq!(s.speaker.as_deref(), Some("bob")),
            "retry" => assert_eq!(s.speaker.as_deref(), Some("alice")),
            _ => assert_eq!(stop_reason(&log), "turn_timeout"),
        }
    }
    // An answer in time stops the timer.
    create(&admin, "answered", json!({"participants": ["alice", "bob"], "policy": {"order": "round_robin"}, "turn": {"timeout": "2s", "onTimeout": "end"}})).await;
    let alice = server.sdk("alice", None).await;
    alice
        .send_message(SendMessageParams {
            conversation_id: "answered".into(),
            payload: MessagePayload::text("in time"),
            finality: Finality::Turn,
            turn_hint: Some(TurnHint { turn: 1 }),
            client_request_id: None,
            after_key: None,
        })
        .await
        .expect("answer");
    let log = log_of(&admin, "answered").await;
    assert!(!system_types(&log).contains(&"turn_timeout".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_timeout_and_max_duration_close_the_conversation() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    create(
        &admin,
        "idle",
        json!({"participants": ["alice", "bob"], "stop": {"idleTimeout": "300ms"}}),
    )
    .await;
    create(
        &admin,
        "max",
        json!({"participants": ["alice", "bob"], "stop": {"maxDuration": "600ms"}}),
    )
    .await;
    let alice = server.sdk("alice", None).await;
    // Keep "max" busy: it closes anyway; "idle" closes after its quiet time.
    for i in 0..20 {
        let r = alice
            .send_message(SendMessageParams {
                conversation_id: "max".into(),
                payload: MessagePayload::text(format!("busy {i}")),
                finality: Finality::None,
                turn_hint: None,
                client_request_id: None,
                after_key: None,
            })
            .await;
        if matches!(&r, Err(ClientError::Rpc(e)) if e.code == ErrorCode::ConversationClosed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (id, reason) in [("idle", "idle_timeout"), ("max", "max_duration")] {
        wait_until(&admin, id, "the close", |s| {
            s.status == ConversationStatus::Closed
        })
        .await;
        assert_eq!(stop_reason(&log_of(&admin, id).await), reason);
    }
}

/// Milliseconds since the epoch of a wire timestamp (RFC 3339).
fn ms(ts: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(ts)
        .unwrap_or_else(|e| panic!("timestamp {ts}: {e}"))
        .timestamp_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_deadline_comes_from_the_log_across_a_restart() {
    let mut server = TestServer::start().await;
    {
        let admin = server.sdk("admin", None).await;
        create(&admin, "restart", json!({"participants": ["alice", "bob"], "policy": {"order": "round_robin"}, "turn": {"timeout": "1h"}})).await;
    }
    server.restart().await;
    let admin = server.sdk("admin", None).await;
    let log = log_of(&admin, "restart").await;
    let named = log
        .iter()
        .find(|e| {
            matches!(SystemEvent::parse(e.payload.get()), Some(SystemEvent::NextSpeaker(n)) if n.turn == 1)
        })
        .expect("turn 1's next_speaker");
    // The deadline the restarted server gives is the logged one: the time of the event that
    // named the speaker plus the timeout, not the restart plus the timeout.
    let snapshot = admin.get_conversation("restart").await.expect("snapshot");
    assert_eq!(snapshot.turn, 1);
    let deadline = snapshot.guidance.deadline.expect("a deadline");
    assert_eq!(ms(&deadline) - ms(&named.ts), 3_600_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_and_resume() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    let alice = server.sdk("alice", None).await;
    create(
        &admin,
        "p",
        json!({"participants": ["alice", "bob"], "policy": {"order": "round_robin"}}),
    )
    .await;
    let not_admin = alice.pause_conversation("p").await.unwrap_err();
    assert_eq!(not_admin.code(), Some(ErrorCode::Forbidden));
    let paused = admin.pause_conversation("p").await.expect("pause");
    assert_eq!(
        admin
            .pause_conversation("p")
            .await
            .expect("pause again")
            .seq,
        paused.seq
    );
    let s = alice.get_conversation("p").await.unwrap();
    assert_eq!(s.status, ConversationStatus::Paused);
    assert_eq!(s.guidance.status, GuidanceStatus::Wait);
    assert_eq!(s.guidance.reason.as_deref(), Some("paused"));
    let msg = || SendMessageParams {
        conversation_id: "p".into(),
        payload: MessagePayload::text("hello"),
        finality: Finality::Turn,
        turn_hint: None,
        client_request_id: None,
        after_key: None,
    };
    assert_eq!(
        alice.send_message(msg()).await.unwrap_err().code(),
        Some(ErrorCode::ConversationPaused)
    );
    admin.resume_conversation("p").await.expect("resume");
    let s = alice.get_conversation("p").await.unwrap();
    assert_eq!(s.guidance.status, GuidanceStatus::MaySpeak);
    alice
        .send_message(msg())
        .await
        .expect("speaks after resume");
    let log = log_of(&admin, "p").await;
    let types = system_types(&log);
    assert!(types.contains(&"paused".to_string()) && types.contains(&"resumed".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_scenario_is_refused_with_its_field_and_nothing_is_created() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    let e = admin
        .create_conversation(CreateConversationParams {
            conversation_id: Some("bad".into()),
            scenario: Some(json!({"participants": ["alice"], "policy": {"order": "round_robin", "first": "zed"}})),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let ClientError::Rpc(e) = e else {
        panic!("{e:?}")
    };
    assert_eq!(e.code, ErrorCode::InvalidParams);
    assert_eq!(e.data.as_ref().unwrap()["path"], "scenario.policy.first");
    assert_eq!(
        admin.get_conversation("bad").await.unwrap_err().code(),
        Some(ErrorCode::ConversationNotFound)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripted_participants_run_inside_the_server_until_a_stop_condition() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    create(
        &admin,
        "review",
        json!({
            "name": "review",
            "participants": [
                {"id": "writer", "kind": "scripted", "replies": ["draft v1", "draft v2"]},
                {"id": "critic", "kind": "scripted", "replies": ["tighten the intro", "TERMINATE"]}
            ],
            "policy": {"order": "round_robin", "first": "writer"},
            "stop": {"onText": "TERMINATE", "maxTurns": 20}
        }),
    )
    .await;
    wait_until(&admin, "review", "the end", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    let log = log_of(&admin, "review").await;
    let said: Vec<(String, String)> = log
        .iter()
        .filter(|e| e.kind == EventKind::Message)
        .map(|e| {
            (
                e.author.clone(),
                e.payload_value()["text"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert_eq!(
        said[..4],
        [
            ("writer".to_string(), "draft v1".to_string()),
            ("critic".to_string(), "tighten the intro".to_string()),
            ("writer".to_string(), "draft v2".to_string()),
            ("critic".to_string(), "TERMINATE".to_string()),
        ]
    );
    assert_eq!(stop_reason(&log), "on_text");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_scenarios_are_created_by_name() {
    let server = TestServer::start().await;
    let orch = server.running().orchestrator();
    orch.set_scenarios(vec![(
        "pair".into(),
        json!({"participants": ["alice", "bob"], "policy": {"order": "round_robin", "first": "bob"}}),
    )])
    .expect("scenarios");
    assert!(orch
        .set_scenarios(vec![("broken".into(), json!({"participants": []}))])
        .is_err());
    let admin = server.sdk("admin", None).await;
    admin
        .create_conversation(CreateConversationParams {
            conversation_id: Some("named".into()),
            scenario_name: Some("pair".into()),
            ..Default::default()
        })
        .await
        .expect("create by name");
    let s = admin.get_conversation("named").await.unwrap();
    assert_eq!(s.speaker.as_deref(), Some("bob"));
    let e = admin
        .create_conversation(CreateConversationParams {
            conversation_id: Some("unknown".into()),
            scenario_name: Some("nope".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    let ClientError::Rpc(e) = e else {
        panic!("{e:?}")
    };
    assert_eq!(e.code, ErrorCode::InvalidParams);
    assert_eq!(e.data.unwrap()["known"], json!(["pair"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_starts_a_new_conversation_from_a_prefix_and_leaves_the_original() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    let alice = server.sdk("alice", None).await;
    let bob = server.sdk("bob", None).await;
    create(
        &admin,
        "orig",
        json!({"participants": ["alice", "bob"], "policy": {"order": "round_robin"}}),
    )
    .await;
    let say = |who: &WsJsonRpcClient, conv: &str, text: &str| {
        let (who, p) = (
            who.clone(),
            SendMessageParams {
                conversation_id: conv.into(),
                payload: MessagePayload::text(text),
                finality: Finality::Turn,
                turn_hint: None,
                client_request_id: None,
                after_key: None,
            },
        );
        async move { who.send_message(p).await }
    };
    say(&alice, "orig", "one").await.unwrap();
    let two = say(&bob, "orig", "two").await.unwrap();
    say(&alice, "orig", "three").await.unwrap();
    let original = log_of(&admin, "orig").await;
    // Fork right after bob's message (and the decision committed with it).
    let at = two.seq + 1;
    let forked = admin
        .fork_conversation(ForkConversationParams {
            conversation_id: "orig".into(),
            at_seq: at,
            new_conversation_id: Some("alt".into()),
        })
        .await
        .expect("fork");
    assert_eq!(forked.conversation_id, "alt");
    let copy = log_of(&admin, "alt").await;
    assert_eq!(copy.len() as u64, at + 1);
    for (a, b) in original.iter().zip(&copy).take(at as usize) {
        assert_eq!(
            (a.seq, a.kind, &a.author, a.turn, a.finality),
            (b.seq, b.kind, &b.author, b.turn, b.finality)
        );
        assert_eq!(a.payload.get(), b.payload.get());
    }
    let marker = copy.last().unwrap().payload_value();
    assert_eq!(
        marker,
        json!({"type": "forked_from", "from": "orig", "atSeq": at})
    );
    // The fork goes its own way: alice's turn again there, with other words.
    let s = alice.get_conversation("alt").await.unwrap();
    assert_eq!(s.speaker.as_deref(), Some("alice"));
    say(&alice, "alt", "three, differently").await.unwrap();
    assert_eq!(
        log_of(&admin, "orig").await.len(),
        original.len(),
        "the original is untouched"
    );
    // Errors: a seq out of range, an existing id, not an admin.
    for (who, at_seq, new_id, code) in [
        (&admin, 999, None, ErrorCode::InvalidParams),
        (&admin, 1, Some("alt"), ErrorCode::ConversationExists),
        (&alice, 1, None, ErrorCode::Forbidden),
    ] {
        let p = ForkConversationParams {
            conversation_id: "orig".into(),
            at_seq,
            new_conversation_id: new_id.map(str::to_string),
        };
        let e = who.fork_conversation(p).await.unwrap_err();
        assert_eq!(e.code(), Some(code));
    }
}
