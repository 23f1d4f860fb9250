//! Speaker policies and stop conditions in the state machine: every order, selector rules,
//! approvals, stops and turn timeouts. Decisions come back from the same `apply` as the message
//! that closes the turn (one transaction), and refolding the log rebuilds the same state.

use orchestrator::engine::scenario::Scenario;
use orchestrator::engine::state::{AppendRequest, Applied, ConvMachine, Draft};
use proto_spec::system::{SystemEvent, TurnTimeout};
use proto_spec::{ErrorCode, EventKind, Finality, ORCHESTRATOR_AUTHOR};
use serde_json::{json, Value};

/// The `turn_timeout` event of `turn`, whose speaker was `speaker`.
fn timeout(turn: u64, speaker: impl Into<String>) -> SystemEvent {
    SystemEvent::TurnTimeout(TurnTimeout {
        turn,
        speaker: speaker.into(),
    })
}

struct Conv {
    state: ConvMachine,
    log: Vec<Draft>,
}

impl Conv {
    fn new(scenario: Value) -> Conv {
        let s = Scenario::parse(&scenario, &agent_kinds::Sandbox::default()).expect("scenario");
        let mut state = ConvMachine::new("c", s.participants.clone());
        let created =
            ConvMachine::created_event_with(&s.participants, None, "admin", s.policy.as_ref());
        let Ok(Applied::Append(log, _)) = state.apply(created) else {
            panic!("create")
        };
        Conv { state, log }
    }

    /// Appends; returns the drafts this append committed.
    fn apply(&mut self, req: AppendRequest) -> Result<Vec<Draft>, ErrorCode> {
        match self.state.apply(req) {
            Ok(Applied::Append(d, _)) => {
                self.log.extend(d.iter().cloned());
                Ok(d)
            }
            Ok(Applied::Duplicate(_)) => Ok(Vec::new()),
            Err(e) => Err(e.code),
        }
    }

    fn say(&mut self, who: &str, payload: Value) -> Result<Vec<Draft>, ErrorCode> {
        self.apply(AppendRequest::new(
            who,
            EventKind::Message,
            Some(Finality::Turn),
            payload,
        ))
    }

    fn text(&mut self, who: &str, text: &str) -> Vec<Draft> {
        self.say(who, json!({"text": text}))
            .unwrap_or_else(|e| panic!("{who}: {e:?}"))
    }

    fn system(&mut self, event: SystemEvent, turn: Option<u64>) -> Result<Vec<Draft>, ErrorCode> {
        self.apply(AppendRequest::system(&event).with_turn(turn))
    }

    fn speaker(&self) -> Option<String> {
        self.state.core.speaker.clone()
    }

    /// Refolding the log gives the same state.
    fn check_refold(&self) {
        let mut again = ConvMachine::new("c", Vec::new());
        for d in &self.log {
            again.observe(d);
        }
        assert_eq!(again.core, self.state.core);
    }
}

fn payload(d: &Draft) -> Value {
    serde_json::from_str(d.payload.get()).unwrap()
}

fn types(ds: &[Draft]) -> Vec<String> {
    ds.iter()
        .map(|d| match d.kind {
            EventKind::System => payload(d)["type"].as_str().unwrap().to_string(),
            _ => format!(
                "{}:{}",
                d.author,
                d.finality.map(|f| f.as_str()).unwrap_or("-")
            ),
        })
        .collect()
}

#[test]
fn round_robin_passes_the_turn_in_participant_order_in_the_same_append() {
    let mut c = Conv::new(
        json!({"participants": ["a", "b", "c"], "policy": {"order": "round_robin", "first": "b"}}),
    );
    assert_eq!(types(&c.log), ["created", "next_speaker"]);
    assert_eq!(c.speaker().as_deref(), Some("b"));
    assert_eq!(
        c.say("a", json!({"text": "me first"})).err(),
        Some(ErrorCode::NotYourTurn)
    );
    let ds = c.text("b", "hello");
    assert_eq!(
        types(&ds),
        ["b:turn", "next_speaker"],
        "the decision commits with the message"
    );
    assert_eq!(payload(&ds[1])["speaker"], "c");
    assert_eq!(payload(&ds[1])["turn"], 2);
    c.text("c", "hi");
    assert_eq!(c.speaker().as_deref(), Some("a"));
    c.text("a", "hey");
    assert_eq!(c.speaker().as_deref(), Some("b"));
    c.check_refold();
}

#[test]
fn sequence_gives_each_speaker_its_place_then_ends() {
    let mut c = Conv::new(
        json!({"participants": ["a", "b"], "policy": {"order": "sequence", "sequence": ["a", "b", "a"]}}),
    );
    assert_eq!(c.speaker().as_deref(), Some("a"));
    c.text("a", "one");
    assert_eq!(c.speaker().as_deref(), Some("b"));
    c.text("b", "two");
    assert_eq!(c.speaker().as_deref(), Some("a"));
    let ds = c.text("a", "three");
    assert_eq!(types(&ds), ["a:turn", "orchestrator:conversation"]);
    assert_eq!(payload(&ds[1])["data"]["reason"], "sequence_done");
    assert!(c.state.core.closed);
    c.check_refold();
}

#[test]
fn addressed_follows_to_then_mentions_then_round_robin() {
    let mut c =
        Conv::new(json!({"participants": ["a", "b", "c"], "policy": {"order": "addressed"}}));
    c.say("a", json!({"text": "over to you", "to": ["c"]}))
        .unwrap();
    assert_eq!(c.speaker().as_deref(), Some("c"));
    c.text("c", "thanks, @a: what do you think?");
    assert_eq!(c.speaker().as_deref(), Some("a"));
    c.text("a", "nobody in particular");
    assert_eq!(c.speaker().as_deref(), Some("b"));
    c.check_refold();
}

#[test]
fn selector_rules_route_before_the_order() {
    let mut c = Conv::new(json!({
        "participants": ["llm", "calc", "web", "user"],
        "policy": {"order": "round_robin", "first": "llm", "rules": [
            {"when": {"schema": "tool.request.v1", "match": [{"path": "$.data.tool", "op": "eq", "value": "calc"}]}, "next": "calc"},
            {"when": {"tags": ["search"], "match": [{"path": "$.data.query", "op": "exists"}]}, "next": "web"},
            {"when": {"author": "calc"}, "next": "llm"}
        ]}
    }));
    c.say(
        "llm",
        json!({"text": "2+2?", "schema": "tool.request.v1", "data": {"tool": "calc"}}),
    )
    .unwrap();
    assert_eq!(c.speaker().as_deref(), Some("calc"));
    c.text("calc", "4");
    assert_eq!(c.speaker().as_deref(), Some("llm"), "rule on the author");
    c.say(
        "llm",
        json!({"text": "look it up", "tags": ["search"], "data": {"query": "rust"}}),
    )
    .unwrap();
    assert_eq!(c.speaker().as_deref(), Some("web"));
    c.text("web", "found it");
    assert_eq!(
        c.speaker().as_deref(),
        Some("user"),
        "no rule: round robin after web"
    );
    c.check_refold();

    let mut only = Conv::new(
        json!({"participants": ["a", "b"], "policy": {"order": "rules", "rules": [{"when": {"match": [{"path": "$.text", "op": "contains", "value": "b?"}]}, "next": "b"}]}}),
    );
    only.text("a", "b?");
    assert_eq!(only.speaker().as_deref(), Some("b"));
    let ds = only.text("b", "done");
    assert_eq!(
        payload(ds.last().unwrap())["data"]["reason"],
        "no_rule_matched"
    );
}

#[test]
fn approvals_hand_the_turn_to_the_approver_first() {
    let scenario = json!({"participants": ["writer", "critic", "alice"],
        "policy": {"order": "round_robin", "first": "writer", "approvals": [{"before": "critic", "approver": "alice"}]}});
    // Approve: the critic speaks.
    let mut c = Conv::new(scenario.clone());
    let ds = c.text("writer", "draft");
    assert_eq!(
        types(&ds),
        ["writer:turn", "approval_requested", "next_speaker"]
    );
    assert_eq!(payload(&ds[1])["for"], "critic");
    assert_eq!(c.speaker().as_deref(), Some("alice"));
    assert_eq!(
        c.say("critic", json!({"text": "let me"})).err(),
        Some(ErrorCode::NotYourTurn)
    );
    let ds = c
        .say(
            "alice",
            json!({"text": "ok", "data": {"decision": "approve"}}),
        )
        .unwrap();
    assert_eq!(payload(&ds[1])["speaker"], "critic");
    assert_eq!(payload(&ds[1])["approval"], "approved");
    c.text("critic", "tighten the intro");
    assert_eq!(
        c.speaker().as_deref(),
        Some("alice"),
        "round robin after the critic"
    );
    c.check_refold();
    // Reject: the critic is skipped.
    let mut c = Conv::new(scenario);
    c.text("writer", "draft");
    let ds = c.text("alice", "reject: not now");
    assert_eq!(payload(&ds[1])["speaker"], "alice");
    assert_eq!(payload(&ds[1])["approval"], "rejected");
    assert_eq!(payload(&ds[1])["skipped"], "critic");
    c.check_refold();
}

#[test]
fn stop_conditions_close_with_the_orchestrators_message() {
    let mut c = Conv::new(
        json!({"participants": ["a", "b"], "policy": {"order": "round_robin"}, "stop": {"onText": "TERMINATE"}}),
    );
    c.text("a", "hello");
    let ds = c.text("b", "we are done. TERMINATE");
    assert_eq!(types(&ds), ["b:turn", "orchestrator:conversation"]);
    assert_eq!(ds[1].author, ORCHESTRATOR_AUTHOR);
    assert_eq!(payload(&ds[1])["data"]["reason"], "on_text");
    assert_eq!(
        c.say("a", json!({"text": "wait"})).err(),
        Some(ErrorCode::ConversationClosed)
    );
    c.check_refold();

    let mut c = Conv::new(
        json!({"participants": ["a", "b"], "policy": {"order": "round_robin"}, "stop": {"maxTurns": 3}}),
    );
    c.text("a", "1");
    c.text("b", "2");
    let ds = c.text("a", "3");
    assert_eq!(payload(ds.last().unwrap())["data"]["reason"], "max_turns");
    assert!(c.state.core.closed);

    for (event, reason) in [
        (SystemEvent::IdleTimeout, "idle_timeout"),
        (SystemEvent::MaxDuration, "max_duration"),
    ] {
        let kind = event.type_name();
        let mut c = Conv::new(
            json!({"participants": ["a", "b"], "stop": {"idleTimeout": "1s", "maxDuration": "1h"}}),
        );
        let ds = c.system(event, None).unwrap();
        assert_eq!(
            types(&ds),
            [kind.to_string(), "orchestrator:conversation".to_string()]
        );
        assert_eq!(payload(&ds[1])["data"]["reason"], reason);
        c.check_refold();
    }
}

#[test]
fn turn_timeouts_skip_end_or_retry() {
    let base = |on: &str| json!({"participants": ["a", "b"], "policy": {"order": "round_robin"}, "turn": {"timeout": "1s", "onTimeout": on}});
    // skip: the turn passes on.
    let mut c = Conv::new(base("skip"));
    assert_eq!(payload(&c.log[1])["timeoutMs"], 1000);
    let ds = c.system(timeout(1, "a"), Some(1)).unwrap();
    assert_eq!(types(&ds), ["turn_timeout", "next_speaker"]);
    assert_eq!(c.speaker().as_deref(), Some("b"));
    assert_eq!(c.state.core.turn, 2);
    // A late answer for the timed-out turn is refused; a second timeout for it too.
    assert_eq!(
        c.apply(
            AppendRequest::new(
                "a",
                EventKind::Message,
                Some(Finality::Turn),
                json!({"text": "late"})
            )
            .with_turn_hint(Some(1))
        )
        .err(),
        Some(ErrorCode::TurnMismatch)
    );
    assert_eq!(
        c.system(timeout(1, "a"), Some(1)).err(),
        Some(ErrorCode::TurnClosed)
    );
    c.check_refold();
    // end: the conversation closes.
    let mut c = Conv::new(base("end"));
    let ds = c.system(timeout(1, "a"), Some(1)).unwrap();
    assert_eq!(
        payload(ds.last().unwrap())["data"]["reason"],
        "turn_timeout"
    );
    assert!(c.state.core.closed);
    // retry: the same speaker, a new turn.
    let mut c = Conv::new(base("retry"));
    c.system(timeout(1, "a"), Some(1)).unwrap();
    assert_eq!(c.speaker().as_deref(), Some("a"));
    assert_eq!(c.state.core.turn, 2);
    c.check_refold();
}

#[test]
fn an_approval_inside_a_sequence_keeps_the_sequence_going() {
    let mut c = Conv::new(json!({"participants": ["w", "p", "r", "alice"],
        "policy": {"order": "sequence", "sequence": ["w", "p", "r"], "approvals": [{"before": "p", "approver": "alice"}]}}));
    c.text("w", "draft");
    assert_eq!(c.speaker().as_deref(), Some("alice"));
    c.text("alice", "approve");
    assert_eq!(c.speaker().as_deref(), Some("p"));
    c.text("p", "published");
    assert_eq!(
        c.speaker().as_deref(),
        Some("r"),
        "the sequence goes on after the approved speaker"
    );
    let ds = c.text("r", "reviewed");
    assert_eq!(
        payload(ds.last().unwrap())["data"]["reason"],
        "sequence_done"
    );
    c.check_refold();
    // Rejected: the sequence skips the speaker.
    let mut c = Conv::new(json!({"participants": ["w", "p", "r", "alice"],
        "policy": {"order": "sequence", "sequence": ["w", "p", "r"], "approvals": [{"before": "p", "approver": "alice"}]}}));
    c.text("w", "draft");
    c.text("alice", "reject");
    assert_eq!(c.speaker().as_deref(), Some("r"));
    c.check_refold();
}

/// Times out the current turn the way the timer does.
fn time_out(c: &mut Conv) -> Vec<Draft> {
    let turn = c.state.core.turn;
    let speaker = c.speaker().unwrap_or_default();
    c.system(timeout(turn, speaker), Some(turn)).unwrap()
}

fn closing_reason(c: &Conv) -> Option<String> {
    c.log
        .iter()
        .find(|d| d.finality == Some(Finality::Conversation))
        .map(|d| {
            payload(d)["data"]["reason"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
}

#[test]
fn turns_ended_by_a_timeout_count_towards_max_turns() {
    // The reproduction of the issue: maxTurns 3 with skip never ended (turn 12 after 2.5 s).
    let mut c = Conv::new(json!({"participants": ["a", "b"],
        "policy": {"order": "round_robin"},
        "stop": {"maxTurns": 3}, "turn": {"timeout": "100ms", "onTimeout": "skip"}}));
    time_out(&mut c);
    c.text("b", "one answer");
    assert!(!c.state.core.closed);
    time_out(&mut c);
    assert!(
        c.state.core.closed,
        "turn 3 ended by its timeout ends the conversation"
    );
    assert_eq!(closing_reason(&c).as_deref(), Some("max_turns"));
    assert_eq!(c.state.core.turn, 4);
    c.check_refold();
}

#[test]
fn a_conversation_nobody_speaks_in_ends_after_two_silent_rounds() {
    for on in ["skip", "retry"] {
        let mut c = Conv::new(json!({"participants": ["a", "b", "c"],
            "policy": {"order": "round_robin"}, "turn": {"timeout": "10ms", "onTimeout": on}}));
        // A message in between starts the count again.
        for _ in 0..5 {
            time_out(&mut c);
        }
        c.text(c.speaker().unwrap().as_str(), "still here");
        let mut timeouts = 0;
        while !c.state.core.closed {
            time_out(&mut c);
            timeouts += 1;
            assert!(
                timeouts <= 6,
                "{on}: still open after {timeouts} silent turns"
            );
        }
        assert_eq!(timeouts, 6, "{on}");
        assert_eq!(closing_reason(&c).as_deref(), Some("no_answer"), "{on}");
        c.check_refold();
    }
}

/// The mode of each `next_speaker` in these drafts (converse when absent).
fn modes_named(ds: &[Draft]) -> Vec<(String, String)> {
    ds.iter()
        .filter_map(|d| match SystemEvent::parse(d.payload.get()) {
            Some(SystemEvent::NextSpeaker(n)) => Some((
                n.speaker,
                n.mode.unwrap_or(proto_spec::Mode::Converse).to_string(),
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn a_mode_asked_goes_through_an_approval_and_a_retry_and_is_refused_when_not_declared() {
    let mut c = Conv::new(json!({
        "participants": ["alice", "judge", {"id": "builder", "external": true, "modes": ["build", "plan"]}],
        "policy": {"order": "sequence", "sequence": ["alice", "builder", "alice"],
                   "approvals": [{"before": "builder", "approver": "judge"}]},
        "turn": {"timeout": "10s", "onTimeout": "retry"}
    }));
    // Asking the builder (behind its checkpoint) to converse is refused, and nothing moves.
    let before = c.state.core.clone();
    let refused = c.say("alice", json!({"text": "talk", "mode": "converse"}));
    assert_eq!(refused.unwrap_err(), ErrorCode::ModeNotSupported);
    assert_eq!(c.state.core, before);
    // Asked to plan: the checkpoint first (the judge converses), then the builder plans.
    let d = c
        .say("alice", json!({"text": "plan it", "mode": "plan"}))
        .unwrap();
    assert_eq!(modes_named(&d), [("judge".into(), "converse".into())]);
    let asked = d
        .iter()
        .find_map(|d| match SystemEvent::parse(d.payload.get()) {
            Some(SystemEvent::ApprovalRequested(a)) => a.mode,
            _ => None,
        });
    assert_eq!(asked, Some(proto_spec::Mode::Plan));
    let d = c.text("judge", "approve");
    assert_eq!(modes_named(&d), [("builder".into(), "plan".into())]);
    assert_eq!(
        c.state.guidance("builder").mode,
        Some(proto_spec::Mode::Plan)
    );
    // Timed out and asked again (through its checkpoint again): the same mode.
    let d = time_out(&mut c);
    assert_eq!(modes_named(&d), [("judge".into(), "converse".into())]);
    let d = c.text("judge", "approve");
    assert_eq!(modes_named(&d), [("builder".into(), "plan".into())]);
    c.check_refold();
    // Its plan, numbered 1; the next plan of the type is 2, another type starts at 1.
    let plan = |t: &str| {
        json!({"text": "p", "schema": "plan.v1",
        "data": {"type": t, "format": "markdown", "content": "# P"}})
    };
    let d = c.say("builder", plan("launch")).unwrap();
    assert_eq!(payload(&d[0])["data"]["version"], 1);
    for (t, v) in [("launch", 2), ("budget", 1)] {
        let d = c
            .apply(AppendRequest::new(
                "alice",
                EventKind::Message,
                Some(Finality::None),
                plan(t),
            ))
            .unwrap();
        assert_eq!(payload(&d[0])["data"]["version"], v);
    }
    c.check_refold();
}
