//! Inline scenarios of `createConversation`: participants, a speaker policy, a turn timeout.
//!
//! This is the subset the executors need (who takes part, who speaks when, how long a turn
//! may take); stop conditions, selector rules, approvals and YAML files extend it. A scenario is
//! checked completely before anything is created; a bad one is refused with `-32602`, the path
//! of the offending field and the reason.

use std::time::Duration;

use proto_spec::{ErrorCode, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::state::TurnPolicy;

/// A parsed scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// The agents that take part, in order.
    pub participants: Vec<String>,
    /// The speaker policy (absent: every participant may speak at any time).
    pub policy: Option<TurnPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    #[serde(default)]
    name: Option<String>,
    participants: Vec<RawParticipant>,
    #[serde(default)]
    policy: Option<RawPolicy>,
    #[serde(default)]
    turn: Option<RawTurn>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawParticipant {
    Id(String),
    Full(FullParticipant),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FullParticipant {
    id: String,
    #[serde(default)]
    external: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    order: String,
    #[serde(default)]
    first: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTurn {
    #[serde(default)]
    timeout: Option<Value>,
}

fn bad(path: &str, why: impl Into<String>) -> RpcError {
    let why = why.into();
    RpcError::new(ErrorCode::InvalidParams, format!("scenario{path}: {why}"))
        .with_data(json!({"path": format!("scenario{path}"), "reason": why}))
}

/// Reads a duration: milliseconds as a number, or text such as `500ms`, `30s`, `5m`, `1h`.
pub fn parse_duration(v: &Value) -> Result<Duration, String> {
    if let Some(ms) = v.as_u64() {
        return Ok(Duration::from_millis(ms));
    }
    let s = v
        .as_str()
        .ok_or("a duration is a number of milliseconds or text such as \"30s\"")?
        .trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as \"30s\""))?;
    let ms = match unit.trim() {
        "ms" => n,
        "s" | "" => n * 1000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        other => return Err(format!("unknown unit {other:?} (ms, s, m, h)")),
    };
    Ok(Duration::from_millis(ms))
}

impl Scenario {
    /// Parses and checks an inline scenario.
    pub fn parse(v: &Value) -> Result<Scenario, RpcError> {
        let raw: Raw = serde_json::from_value(v.clone()).map_err(|e| bad("", e.to_string()))?;
        let _ = raw.name;
        if raw.participants.is_empty() {
            return Err(bad(".participants", "at least one participant is needed"));
        }
        let mut participants = Vec::new();
        for (i, p) in raw.participants.into_iter().enumerate() {
            let id = match p {
                RawParticipant::Id(id) => id,
                RawParticipant::Full(f) => {
                    let _ = f.external;
                    f.id
                }
            };
            if participants.contains(&id) {
                return Err(bad(
                    &format!(".participants[{i}].id"),
                    format!("{id:?} is listed twice"),
                ));
            }
            participants.push(id);
        }
        let timeout_ms = match raw.turn.and_then(|t| t.timeout) {
            Some(t) => {
                let d = parse_duration(&t).map_err(|e| bad(".turn.timeout", e))?;
                if d.is_zero() {
                    return Err(bad(".turn.timeout", "must be more than zero"));
                }
                Some(d.as_millis() as u64)
            }
            None => None,
        };
        let policy = match raw.policy {
            None => None,
            Some(p) => {
                if p.order != "round_robin" {
                    return Err(bad(
                        ".policy.order",
                        format!(
                            "{:?} is not supported by this server (round_robin is)",
                            p.order
                        ),
                    ));
                }
                let first = p.first.unwrap_or_else(|| participants[0].clone());
                if !participants.contains(&first) {
                    return Err(bad(
                        ".policy.first",
                        format!("{first:?} is not a participant"),
                    ));
                }
                Some(TurnPolicy {
                    order: p.order,
                    speakers: participants.clone(),
                    first,
                    timeout_ms,
                })
            }
        };
        if policy.is_none() && timeout_ms.is_some() {
            return Err(bad(
                ".turn.timeout",
                "a turn timeout needs a speaker policy",
            ));
        }
        Ok(Scenario {
            participants,
            policy,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_round_robin_with_timeout() {
        let s = Scenario::parse(&json!({
            "participants": ["a", {"id": "b", "external": true}],
            "policy": {"order": "round_robin", "first": "b"},
            "turn": {"timeout": "2s"}
        }))
        .unwrap();
        assert_eq!(s.participants, vec!["a", "b"]);
        let p = s.policy.unwrap();
        assert_eq!(p.first, "b");
        assert_eq!(p.timeout_ms, Some(2000));
    }

    #[test]
    fn names_the_bad_field() {
        let e = Scenario::parse(
            &json!({"participants": ["a"], "policy": {"order": "round_robin", "first": "z"}}),
        )
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidParams);
        assert_eq!(e.data.unwrap()["path"], "scenario.policy.first");
        let e = Scenario::parse(&json!({"participants": ["a"], "policy": {"order": "round_robin"}, "turn": {"timeout": "2 weeks"}})).unwrap_err();
        assert_eq!(e.data.unwrap()["path"], "scenario.turn.timeout");
        let e = Scenario::parse(&json!({"participants": ["a", "a"]})).unwrap_err();
        assert_eq!(e.data.unwrap()["path"], "scenario.participants[1].id");
        let e = Scenario::parse(&json!({"participants": ["a"], "surprise": 1})).unwrap_err();
        assert!(e.message.contains("surprise"), "{}", e.message);
    }
}
