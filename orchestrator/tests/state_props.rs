//! Property tests of the per-conversation state machine over random request sequences.

use std::collections::HashMap;

use orchestrator::engine::state::{AppendRequest, Applied, ConvMachine, Draft};
use proptest::prelude::*;
use proto_spec::system::{ChangedBy, NextSpeaker, SystemEvent};
use proto_spec::{ErrorCode, EventKind, Finality, ORCHESTRATOR_AUTHOR};
use serde_json::json;

fn by_admin() -> ChangedBy {
    ChangedBy { by: "admin".into() }
}

#[derive(Debug, Clone)]
enum Op {
    Message {
        author: usize,
        finality: Option<Finality>,
        text: usize,
        hint: Option<i64>,
        key: Option<usize>,
    },
    Trace {
        author: usize,
        finality: Option<Finality>,
        turn: Option<i64>,
        text: usize,
        key: Option<usize>,
    },
    System {
        kind: usize,
        turn: Option<i64>,
    },
}

const AGENTS: [&str; 3] = ["alice", "bob", "mallory"]; // mallory does not take part

fn finality() -> impl Strategy<Value = Option<Finality>> {
    prop_oneof![
        Just(None),
        Just(Some(Finality::None)),
        Just(Some(Finality::None)),
        Just(Some(Finality::Turn)),
        Just(Some(Finality::Turn)),
        Just(Some(Finality::Conversation)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let author = prop_oneof![Just(0usize), Just(0), Just(1), Just(1), Just(2)];
    let rel = proptest::option::of(-2i64..=1);
    let key = proptest::option::of(0usize..4);
    prop_oneof![
        6 => (author.clone(), finality(), 0usize..3, rel.clone(), key.clone())
            .prop_map(|(author, finality, text, hint, key)| Op::Message { author, finality, text, hint, key }),
        3 => (author, prop_oneof![9 => Just(None), 1 => finality()], rel.clone(), 0usize..3, key)
            .prop_map(|(author, finality, turn, text, key)| Op::Trace { author, finality, turn, text, key }),
        2 => (0usize..4, rel).prop_map(|(kind, turn)| Op::System { kind, turn }),
    ]
}

fn rel_turn(current: u64, rel: Option<i64>) -> Option<u64> {
    rel.map(|r| (current as i64 + r).max(0) as u64)
}

fn build(op: &Op, state: &ConvMachine) -> AppendRequest {
    let turn = state.core.turn;
    match op {
        Op::Message {
            author,
            finality,
            text,
            hint,
            key,
        } => AppendRequest::new(
            AGENTS[*author],
            EventKind::Message,
            *finality,
            json!({"text": format!("m{text}")}),
        )
        .with_turn_hint(rel_turn(turn, *hint))
        .with_client_request_id(key.map(|k| format!("k{k}"))),
        Op::Trace {
            author,
            finality,
            turn: t,
            text,
            key,
        } => AppendRequest::new(
            AGENTS[*author],
            EventKind::Trace,
            *finality,
            json!({"type": format!("t{text}")}),
        )
        .with_turn(rel_turn(turn, *t))
        .with_client_request_id(key.map(|k| format!("k{k}"))),
        Op::System { kind, turn: t } => {
            let event = match kind {
                0 => SystemEvent::NextSpeaker(NextSpeaker::new("alice", 0)),
                1 => SystemEvent::NextSpeaker(NextSpeaker::new("bob", 0)),
                2 => SystemEvent::Paused(by_admin()),
                _ => SystemEvent::Resumed(by_admin()),
            };
            AppendRequest::system(&event).with_turn(rel_turn(turn, *t))
        }
    }
}

fn code(r: &Result<Applied, proto_spec::RpcError>) -> Option<ErrorCode> {
    r.as_ref().err().map(|e| e.code)
}

/// What every append must satisfy: seq dense from the head, nothing after the close, finality
/// only on messages, traces and system events in the open turn, only the speaker speaks.
fn check_append(
    before: &ConvMachine,
    state: &ConvMachine,
    req: &AppendRequest,
    drafts: &[Draft],
    res: &proto_spec::AppendResult,
    participants: &[String],
) -> Result<(), TestCaseError> {
    prop_assert!(!drafts.is_empty());
    // Seq dense and strictly increasing.
    for (i, d) in drafts.iter().enumerate() {
        prop_assert_eq!(d.seq, before.core.head + 1 + i as u64);
    }
    prop_assert_eq!(res.seq, drafts[0].seq);
    prop_assert!(!res.duplicate);
    prop_assert_eq!(state.core.head, drafts.last().unwrap().seq);
    // Nothing after finality conversation.
    prop_assert!(!before.core.closed, "appended to a closed conversation");
    for d in drafts {
        // Only messages carry finality.
        prop_assert!(d.kind == EventKind::Message || d.finality.is_none());
        prop_assert!(d.kind != EventKind::Message || d.finality.is_some());
        // No trace or system event for a closed turn: it lands in the open turn.
        if d.kind != EventKind::Message {
            prop_assert_eq!(d.turn, before.core.turn);
        }
        // The author is a participant, or the orchestrator for system events.
        prop_assert!(participants.contains(&d.author) || d.author == ORCHESTRATOR_AUTHOR);
    }
    let d = &drafts[0];
    if d.kind == EventKind::Message {
        // A stale turnHint never appends; only the speaker speaks.
        if let Some(h) = req.turn_hint {
            prop_assert_eq!(h, before.core.turn);
        }
        if let Some(s) = &before.core.speaker {
            prop_assert_eq!(s, &d.author);
        }
        prop_assert!(!before.core.paused);
        match d.finality {
            Some(Finality::Turn) => prop_assert_eq!(state.core.turn, before.core.turn + 1),
            Some(Finality::Conversation) => prop_assert!(state.core.closed),
            _ => prop_assert_eq!(state.core.turn, before.core.turn),
        }
    }
    Ok(())
}

/// Whether the outcome of `req` is the one the rules give: a retried key answers the original
/// result, a reused key with another body is refused, and each refusal has its code.
fn check_outcome(
    before: &ConvMachine,
    req: &AppendRequest,
    result: &Result<Applied, proto_spec::RpcError>,
    known: Option<([u8; 16], u64, u64)>,
    participants: &[String],
) -> Result<(), TestCaseError> {
    // Idempotency: a retried key returns the original result, whatever happened since;
    // the same key with another body is IdempotencyKeyReused.
    let finality_ok = match req.kind {
        EventKind::Message => req.finality.is_some(),
        _ => req.finality.is_none(),
    };
    let is_member = participants.contains(&req.author) || req.author == ORCHESTRATOR_AUTHOR;
    if let (Some((hash, seq, turn)), true, true) = (known, finality_ok, is_member) {
        if hash == req.hash {
            match result {
                Ok(Applied::Duplicate(r)) => {
                    prop_assert_eq!((r.seq, r.turn, r.duplicate), (seq, turn, true));
                }
                other => prop_assert!(false, "retry not recognised: {:?}", other),
            }
        } else {
            prop_assert_eq!(code(result), Some(ErrorCode::IdempotencyKeyReused));
        }
        return Ok(());
    }
    if !finality_ok {
        prop_assert_eq!(code(result), Some(ErrorCode::InvalidFinality));
        return Ok(());
    }
    if !is_member {
        // A conversation one does not take part in is answered as one that does not exist.
        prop_assert_eq!(code(result), Some(ErrorCode::ConversationNotFound));
        return Ok(());
    }
    if before.core.closed {
        prop_assert_eq!(code(result), Some(ErrorCode::ConversationClosed));
        return Ok(());
    }
    match req.kind {
        EventKind::Message => {
            if before.core.paused {
                prop_assert_eq!(code(result), Some(ErrorCode::ConversationPaused));
            } else if req.turn_hint.is_some_and(|h| h != before.core.turn) {
                prop_assert_eq!(code(result), Some(ErrorCode::TurnMismatch));
            } else if before
                .core
                .speaker
                .as_deref()
                .is_some_and(|s| s != req.author)
            {
                prop_assert_eq!(code(result), Some(ErrorCode::NotYourTurn));
            } else {
                prop_assert!(result.is_ok());
            }
        }
        _ => match req.turn {
            Some(t) if t < before.core.turn => {
                prop_assert_eq!(code(result), Some(ErrorCode::TurnClosed))
            }
            Some(t) if t > before.core.turn => {
                prop_assert_eq!(code(result), Some(ErrorCode::TurnMismatch))
            }
            _ => prop_assert!(result.is_ok()),
        },
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_invariant_holds(ops in proptest::collection::vec(op(), 1..80)) {
        let participants = vec!["alice".to_string(), "bob".to_string()];
        let mut state = ConvMachine::new("c", participants.clone());
        let created = ConvMachine::created_event(&participants, None, "admin");
        let mut log: Vec<Draft> = match state.apply(created) {
            Ok(Applied::Append(d, _)) => d,
            other => panic!("create failed: {other:?}"),
        };
        // What each (author, key) first appended, with its request hash.
        let mut keys: HashMap<(String, String), ([u8; 16], u64, u64)> = HashMap::new();

        for op in &ops {
            let req = build(op, &state);
            let before = state.clone();
            let result = state.apply(req.clone());
            let key = req.client_request_id.clone().map(|k| (req.author.clone(), k));
            let known = key.as_ref().and_then(|k| keys.get(k)).copied();

            match &result {
                Err(_) | Ok(Applied::Duplicate(_)) => {
                    // A refusal or a retry leaves the state as it was.
                    prop_assert_eq!(&state.core, &before.core);
                    prop_assert_eq!(state.idempotency_keys(), before.idempotency_keys());
                }
                Ok(Applied::Append(drafts, res)) => {
                    check_append(&before, &state, &req, drafts, res, &participants)?;
                    prop_assert!(known.is_none(), "a known key appended again");
                    if let Some(k) = key.clone() {
                        keys.insert(k, (req.hash, res.seq, res.turn));
                    }
                    log.extend(drafts.iter().cloned());
                }
            }

            check_outcome(&before, &req, &result, known, &participants)?;
            // The machine remembers exactly the (author, key) pairs that appended.
            prop_assert_eq!(state.idempotency_keys(), keys.len());
        }

        // The log is dense from 1, and folding it again rebuilds the same state (recovery).
        for (i, d) in log.iter().enumerate() {
            prop_assert_eq!(d.seq, i as u64 + 1);
        }
        let mut rebuilt = ConvMachine::new("c", Vec::new());
        for d in &log {
            rebuilt.observe(d);
        }
        prop_assert_eq!(&rebuilt.core, &state.core);
        prop_assert_eq!(rebuilt.participants(), state.participants());
        prop_assert_eq!(rebuilt.idempotency_keys(), state.idempotency_keys());
    }
}

/// A conversation of alice and bob, created.
fn alice_and_bob() -> ConvMachine {
    let participants = vec!["alice".to_string(), "bob".to_string()];
    let mut s = ConvMachine::new("c", participants.clone());
    s.apply(ConvMachine::created_event(&participants, None, "admin"))
        .unwrap();
    s
}

#[test]
fn guidance_follows_the_log() {
    let mut s = alice_and_bob();
    assert_eq!(
        s.guidance("alice").status,
        proto_spec::GuidanceStatus::MaySpeak
    );
    s.apply(AppendRequest::system(&SystemEvent::NextSpeaker(
        NextSpeaker::new("bob", 1),
    )))
    .unwrap();
    let g = s.guidance("alice");
    assert_eq!(g.status, proto_spec::GuidanceStatus::Wait);
    assert_eq!(g.reason.as_deref(), Some("not_your_turn"));
    assert_eq!(g.speaker.as_deref(), Some("bob"));
    s.apply(AppendRequest::system(&SystemEvent::Paused(by_admin())))
        .unwrap();
    // A second pause (two admins at once) appends nothing and answers the latest seq.
    let head = s.core.head;
    match s.apply(AppendRequest::system(&SystemEvent::Paused(by_admin()))) {
        Ok(Applied::Duplicate(r)) => assert_eq!(r.seq, head),
        other => panic!("a second pause appended: {other:?}"),
    }
    assert_eq!(s.guidance("bob").reason.as_deref(), Some("paused"));
    s.apply(AppendRequest::system(&SystemEvent::Resumed(by_admin())))
        .unwrap();
    assert_eq!(
        s.guidance("bob").status,
        proto_spec::GuidanceStatus::MaySpeak
    );
    let close = AppendRequest::new(
        "bob",
        EventKind::Message,
        Some(Finality::Conversation),
        json!({"text": "bye"}),
    );
    s.apply(close).unwrap();
    assert_eq!(
        s.guidance("alice").status,
        proto_spec::GuidanceStatus::Closed
    );
}

#[test]
fn a_turn_closing_message_and_its_decision_append_together() {
    let mut s = alice_and_bob();
    let mut req = AppendRequest::new(
        "alice",
        EventKind::Message,
        Some(Finality::Turn),
        json!({"text": "hi"}),
    );
    req.follow_ups
        .push(SystemEvent::NextSpeaker(NextSpeaker::new("bob", 2)));
    match s.apply(req).unwrap() {
        Applied::Append(drafts, res) => {
            assert_eq!(drafts.len(), 2);
            assert_eq!((drafts[0].seq, drafts[0].turn), (2, 1));
            assert_eq!(
                (drafts[1].seq, drafts[1].turn, drafts[1].kind),
                (3, 2, EventKind::System)
            );
            assert_eq!(res.seq, 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.core.speaker.as_deref(), Some("bob"));
}

#[test]
fn a_write_held_to_its_turn_start_lands_only_after_it() {
    let mut s = alice_and_bob();
    let reply = |key: &str| {
        AppendRequest::new(
            "alice",
            EventKind::Message,
            Some(Finality::Turn),
            json!({"text": "hi"}),
        )
        .with_turn_hint(Some(1))
        .with_client_request_id(Some(key.into()))
        .with_after(Some("t1.a1.x0".into()))
    };
    let start = |author: &str| {
        AppendRequest::new(
            author,
            EventKind::Trace,
            None,
            json!({"type": "turn_start"}),
        )
        .with_turn(Some(1))
        .with_client_request_id(Some("t1.a1.x0".into()))
    };
    // Its turn_start is not in the log: refused, and nothing moved.
    let head = s.core.head;
    let refused = s.apply(reply("t1.a1.m1"));
    assert_eq!(
        code(&refused),
        Some(ErrorCode::InvalidParams),
        "{refused:?}"
    );
    assert_eq!(s.core.head, head);
    // Another author's key of the same name does not stand for alice's.
    s.apply(start("bob")).unwrap();
    let refused = s.apply(reply("t1.a1.m1"));
    assert_eq!(
        code(&refused),
        Some(ErrorCode::InvalidParams),
        "{refused:?}"
    );
    // Once alice's turn_start is ahead of it (in the log, or earlier in the same batch), it
    // lands, after it.
    s.apply(start("alice")).unwrap();
    match s.apply(reply("t1.a1.m1")).unwrap() {
        Applied::Append(drafts, res) => {
            assert_eq!(res.seq, head + 3);
            assert_eq!(drafts[0].kind, EventKind::Message);
        }
        other => panic!("{other:?}"),
    }
    // Its retry answers the original, as any keyed write.
    match s.apply(reply("t1.a1.m1")).unwrap() {
        Applied::Duplicate(res) => assert_eq!(res.seq, head + 3),
        other => panic!("{other:?}"),
    }
}
