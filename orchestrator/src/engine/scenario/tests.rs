//! How scenarios are read and checked.
use super::*;

fn parse(v: &Value) -> Result<Scenario, RpcError> {
    Scenario::parse(v, &*crate::engine::config::Limits::default().kinds)
}

fn path_of(v: Value) -> String {
    let e = parse(&v).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidParams);
    e.data.unwrap()["path"].as_str().unwrap().to_string()
}

#[test]
fn parses_a_full_scenario() {
    let s = parse(&json!({
        "name": "review",
        "participants": [{"id": "writer", "kind": "scripted", "replies": ["v1"]}, "critic", {"id": "alice", "external": true}],
        "policy": {"order": "round_robin", "first": "critic",
                   "rules": [{"when": {"schema": "tool.request.v1", "match": [{"path": "$.data.tool", "op": "eq", "value": "calc"}]}, "next": "writer"}],
                   "approvals": [{"before": "critic", "approver": "alice"}]},
        "stop": {"maxTurns": 20, "idleTimeout": "5m", "maxDuration": "1h", "onText": "TERMINATE"},
        "turn": {"timeout": "2s", "onTimeout": "retry"}
    }))
    .unwrap();
    assert_eq!(s.participants, vec!["writer", "critic", "alice"]);
    let p = s.policy.unwrap();
    assert_eq!(p.first, "critic");
    assert_eq!(p.timeout_ms, Some(2000));
    assert_eq!(p.on_timeout, OnTimeout::Retry);
    assert_eq!(p.idle_timeout_ms, Some(300_000));
    assert_eq!(p.max_duration_ms, Some(3_600_000));
}

#[test]
fn names_the_bad_field() {
    assert_eq!(
        path_of(json!({"participants": ["a"], "policy": {"order": "round_robin", "first": "z"}})),
        "scenario.policy.first"
    );
    assert_eq!(
        path_of(
            json!({"participants": ["a"], "policy": {"order": "round_robin"}, "turn": {"timeout": "2 weeks"}})
        ),
        "scenario.turn.timeout"
    );
    assert_eq!(
        path_of(json!({"participants": ["a", "a"]})),
        "scenario.participants[1].id"
    );
    assert_eq!(
        path_of(json!({"participants": [{"id": "a", "kind": "wizard"}]})),
        "scenario.participants[0].kind"
    );
    assert_eq!(
        path_of(json!({"participants": [{"id": "a", "kind": "scripted", "replies": []}]})),
        "scenario.participants[0].replies"
    );
    assert_eq!(
        path_of(json!({"participants": ["a"], "policy": {"order": "sequence"}})),
        "scenario.policy.sequence"
    );
    assert_eq!(
        path_of(
            json!({"participants": ["a"], "policy": {"order": "rules", "rules": [{"when": {"match": [{"path": "data", "op": "eq", "value": 1}]}, "next": "a"}]}})
        ),
        "scenario.policy.rules[0].when.match[0].path"
    );
    assert_eq!(
        path_of(
            json!({"participants": ["a", "b"], "policy": {"order": "round_robin", "approvals": [{"before": "a", "approver": "c"}]}})
        ),
        "scenario.policy.approvals[0].approver"
    );
    assert_eq!(
        path_of(json!({"participants": ["a"], "stop": {"maxTurns": 0}})),
        "scenario.stop.maxTurns"
    );
    let e = parse(&json!({"participants": ["a"], "surprise": 1})).unwrap_err();
    assert!(e.message.contains("surprise"), "{}", e.message);
    // Fields the types refuse are named too, not only those the checks refuse.
    for (bad, path) in [
        (json!({"stop": {"maxTurns": -1}}), "scenario.stop.maxTurns"),
        (
            json!({"turn": {"onTimeout": "explode"}}),
            "scenario.turn.onTimeout",
        ),
        (json!({"stop": {"extra": 1}}), "scenario.stop.extra"),
        (
            json!({"participants": [{"id": 7}]}),
            "scenario.participants[0]",
        ),
        (
            json!({"policy": {"order": "loudest"}}),
            "scenario.policy.order",
        ),
    ] {
        let mut v = json!({"participants": ["a"]});
        v.as_object_mut()
            .unwrap()
            .extend(bad.as_object().unwrap().clone());
        assert_eq!(path_of(v.clone()), path, "{v}");
    }
}

#[test]
fn reads_yaml() {
    let s = Scenario::from_yaml(
        "participants: [a, b]\npolicy:\n  order: round_robin\nstop:\n  maxTurns: 4\n",
        &*crate::engine::config::Limits::default().kinds,
    )
    .unwrap();
    assert_eq!(s.policy.unwrap().max_turns, Some(4));
    assert!(Scenario::from_yaml(
        "participants: [a\n",
        &*crate::engine::config::Limits::default().kinds
    )
    .is_err());
}
