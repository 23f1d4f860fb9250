//! Writes held to an earlier write (`ExecutorClient::hold_writes_to`, what lets an executor inside the
//! server run its agent without waiting for the attempt's `turn_start`): refused while that
//! write is not in the log, appended after it once it is; the write the condition names trails
//! (it commits alone when nothing comes to join it, and is answered).

mod common;

use agent_sdk::{AgentClient, ClientError, ExecutorClient};
use orchestrator::engine::auth::Identity;
use orchestrator::engine::config::Limits;
use orchestrator::host::client::InProcessClient;
use proto_spec::{
    CreateConversationParams, ErrorCode, EventKind, Finality, MessagePayload, SendMessageParams,
    SendTraceParams, TailParams,
};
use serde_json::json;

fn trace(key: &str) -> SendTraceParams {
    SendTraceParams {
        conversation_id: "c".into(),
        payload: json!({"type": "turn_start"}),
        turn: None,
        client_request_id: Some(key.into()),
        finality: None,
        after_key: None,
    }
}

fn message(key: &str) -> SendMessageParams {
    SendMessageParams {
        conversation_id: "c".into(),
        payload: MessagePayload::text("hello"),
        finality: Finality::None,
        turn_hint: None,
        client_request_id: Some(key.into()),
        after_key: None,
    }
}

fn code(e: ClientError) -> Option<ErrorCode> {
    e.code()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_write_lands_only_after_the_write_it_is_held_to() {
    let dir = tempfile::tempdir().expect("tempdir");
    let orch = common::open(&dir, Limits::default()).await;
    let alice = InProcessClient::new(orch.clone(), Identity::new("alice", false));
    let held = alice
        .hold_writes_to("c", "t1.a1.x0")
        .expect("inside the server, on one node");

    // Held to a write that is not in the log: refused, nothing appended.
    let refused = held
        .send_message(message("t1.a1.m1"))
        .await
        .expect_err("held to a write not in the log");
    assert_eq!(code(refused), Some(ErrorCode::InvalidParams));
    // The same key written by another agent does not stand for alice's.
    let bob = InProcessClient::new(orch.clone(), Identity::new("bob", false));
    bob.send_trace(trace("t1.a1.x0"))
        .await
        .expect("bob's trace");
    let refused = held
        .send_message(message("t1.a1.m1"))
        .await
        .expect_err("bob's key is not alice's");
    assert_eq!(code(refused), Some(ErrorCode::InvalidParams));

    // The write it names, then the held one, queued in that order without waiting in between
    // (as an executor does): both land, in that order.
    let (start, reply) = tokio::join!(
        held.send_trace(trace("t1.a1.x0")),
        held.send_message(message("t1.a1.m1"))
    );
    let (start, reply) = (start.expect("the trace"), reply.expect("the reply"));
    assert_eq!(reply.seq, start.seq + 1);
    // Writes into another conversation are not held.
    orch.create_conversation(
        &Identity::new("admin", true),
        CreateConversationParams {
            conversation_id: Some("d".into()),
            participants: Some(vec!["alice".into()]),
            ..Default::default()
        },
    )
    .await
    .expect("create d");
    let elsewhere = held
        .send_message(SendMessageParams {
            conversation_id: "d".into(),
            ..message("d1")
        })
        .await;
    assert!(elsewhere.is_ok(), "{elsewhere:?}");

    // A trailing write with nothing to join it is committed alone, and answered.
    let alone = alice
        .hold_writes_to("c", "t2.a1.x0")
        .expect("held")
        .send_trace(trace("t2.a1.x0"))
        .await
        .expect("a trailing write alone");
    assert_eq!(alone.seq, reply.seq + 1);

    let log = alice
        .tail(TailParams {
            conversation_id: "c".into(),
            since_seq: 0,
            limit: None,
        })
        .await
        .expect("tail")
        .events;
    let mine: Vec<(u64, EventKind, Option<String>)> = log
        .iter()
        .filter(|e| e.author == "alice")
        .map(|e| (e.seq, e.kind, e.client_request_id.clone()))
        .collect();
    assert_eq!(
        mine,
        vec![
            (start.seq, EventKind::Trace, Some("t1.a1.x0".into())),
            (reply.seq, EventKind::Message, Some("t1.a1.m1".into())),
            (alone.seq, EventKind::Trace, Some("t2.a1.x0".into())),
        ]
    );
    orch.shutdown().await;
}
