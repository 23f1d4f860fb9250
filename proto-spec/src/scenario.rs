//! Scenarios as data (DESIGN §8): who takes part, who speaks next, when to stop, how long a turn
//! may take. The same structure is read from YAML files and from `createConversation`'s inline
//! `scenario`; [`Selector`] is shared with the agents' declared context sources.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScenarioSpec {
    /// A name for people (and for `scenarioName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What it is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The participants, in order (the order `round_robin` follows).
    pub participants: Vec<ParticipantSpec>,
    /// Who speaks next; absent: every participant may speak at any time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicySpec>,
    /// When the orchestrator closes the conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopSpec>,
    /// Per-turn limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnSpec>,
}

impl ScenarioSpec {
    /// The id of the participant marked `caller`, if any (the first, when a scenario that was
    /// not checked marks several).
    pub fn caller(&self) -> Option<&str> {
        self.participants.iter().find_map(|p| match p {
            ParticipantSpec::Full(f) if f.caller => Some(f.id.as_str()),
            _ => None,
        })
    }

    /// The scenario as `agent` starts it: its caller participant's id replaced by `agent` in
    /// the participant list and wherever the policy names a participant (`first`, `sequence`,
    /// a rule's `next` and `when.author`, an approval's `before` and `approver`). The caller's
    /// mark is kept, so the `created` event says which participant the creator took. A
    /// scenario without a caller comes back as it was.
    pub fn bind_caller(mut self, agent: &str) -> ScenarioSpec {
        let Some(role) = self.caller().map(str::to_string) else {
            return self;
        };
        let swap = |id: &mut String| {
            if *id == role {
                *id = agent.to_string();
            }
        };
        for p in &mut self.participants {
            match p {
                ParticipantSpec::Id(id) => swap(id),
                ParticipantSpec::Full(f) => swap(&mut f.id),
            }
        }
        if let Some(policy) = &mut self.policy {
            if let Some(first) = &mut policy.first {
                swap(first);
            }
            policy.sequence.iter_mut().for_each(swap);
            for rule in &mut policy.rules {
                swap(&mut rule.next);
                if let Some(author) = &mut rule.when.author {
                    swap(author);
                }
            }
            for approval in &mut policy.approvals {
                swap(&mut approval.before);
                swap(&mut approval.approver);
            }
        }
        self
    }
}

/// A participant: an id alone (external), or an object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum ParticipantSpec {
    /// Just the agent id: an external participant.
    Id(String),
    /// An agent with its kind and configuration.
    Full(ParticipantObject),
}

/// A participant described in full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParticipantObject {
    /// The agent id.
    pub id: String,
    /// An internal kind (`scripted`, …); absent for an external participant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Speaks from outside the server (WebSocket, MCP, A2A).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub external: bool,
    /// The external participant whoever creates a conversation from this scenario speaks as:
    /// the creator's agent id takes its place in the conversation (see
    /// [`ScenarioSpec::bind_caller`]). At most one per scenario. A scenario of the server's
    /// library that names one may be started by any agent, not only an admin.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub caller: bool,
    /// The modes it supports, its default first; absent: the kind's own (every mode, except
    /// `tool` and `orchestrate`, which build only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modes: Option<Vec<crate::Mode>>,
    /// What its plans are: format, type, schema or sections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Box<crate::OutputSpec>>,
    /// What its deliverables are: format, type, schema or sections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliverable: Option<Box<crate::OutputSpec>>,
    /// The kind's own settings (`replies` for `scripted`, …).
    #[serde(flatten)]
    pub config: Map<String, Value>,
}

impl ParticipantSpec {
    /// The agent id.
    pub fn id(&self) -> &str {
        match self {
            ParticipantSpec::Id(id) => id,
            ParticipantSpec::Full(p) => &p.id,
        }
    }

    /// The internal kind, if any.
    pub fn kind(&self) -> Option<&str> {
        match self {
            ParticipantSpec::Id(_) => None,
            ParticipantSpec::Full(p) => p.kind.as_deref(),
        }
    }
}

/// How the next speaker is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Order {
    /// The participant after the one who closed the turn, in participant order.
    RoundRobin,
    /// The speakers of `sequence`, once each, in order; then the conversation ends.
    Sequence,
    /// The participant the message addresses (`to`, or an `@id` mention in the text); round
    /// robin when it addresses nobody.
    Addressed,
    /// Only `rules` decide; when none matches, the conversation ends.
    Rules,
}

/// The speaker policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicySpec {
    /// The order.
    pub order: Order,
    /// Who takes turn 1 (default: the first participant, or the first of `sequence`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first: Option<String>,
    /// The speakers of a `sequence` order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sequence: Vec<String>,
    /// Selector rules, tried in order before the order itself: the first that matches the
    /// message closing a turn names the next speaker.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleSpec>,
    /// Human checkpoints: before `before` speaks, `approver` must approve.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalSpec>,
}

/// One selector rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleSpec {
    /// What the closing message must look like.
    pub when: Selector,
    /// Who speaks next when it does.
    pub next: String,
}

/// One approval checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalSpec {
    /// The participant whose turns need approval.
    pub before: String,
    /// Who approves: their message `approve` (or `data.decision: "approve"`) gives the turn to
    /// `before`; `reject` skips it.
    pub approver: String,
}

/// Stop conditions.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StopSpec {
    /// Close after this many turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u64>,
    /// Close when nothing was appended for this long (`30s`, `5m`, or milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Value>,
    /// Close this long after creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration: Option<Value>,
    /// Close when a message closing a turn contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_text: Option<String>,
}

/// What happens when a turn's time is up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    /// The turn passes to the next speaker.
    #[default]
    Skip,
    /// The conversation closes.
    End,
    /// The same speaker gets a new turn.
    Retry,
}

/// Per-turn limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TurnSpec {
    /// How long a turn may take (`60s`, or milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Value>,
    /// What happens then (default `skip`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
    /// Whether the server's executors write `turn_start`/`turn_end` traces for the agents it
    /// runs (default true; failures are traced either way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces: Option<bool>,
}

/// Selects events: every given criterion must hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Selector {
    /// The message's `schema`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// A plan's or deliverable's type (its `data.type`).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub doc_type: Option<String>,
    /// Tags the message must all carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// The event's author.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// Conditions on JSON paths of the payload.
    #[serde(default, rename = "match", skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<MatchSpec>,
}

/// A condition on one JSON path of the payload (`$.data.tool`, `$.tags[0]`, `$.text`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MatchSpec {
    /// The path, from `$` (the payload).
    pub path: String,
    /// The comparison.
    pub op: MatchOp,
    /// The operand (not for `exists`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
}

/// Comparisons of [`MatchSpec`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MatchOp {
    /// Equal.
    Eq,
    /// Not equal (also when the path is absent).
    Ne,
    /// A string containing the text, or an array containing the value.
    Contains,
    /// An array (or string) containing any of the values of an array operand.
    ContainsAny,
    /// The path is present (and not null).
    Exists,
}

/// Resolves a path such as `$.data.items[0].name` in `v`.
pub fn json_path<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let rest = path.strip_prefix('$')?;
    let mut cur = v;
    let mut chars = rest;
    while !chars.is_empty() {
        if let Some(r) = chars.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            cur = cur.get(&r[..end])?;
            chars = &r[end..];
        } else if let Some(r) = chars.strip_prefix('[') {
            let end = r.find(']')?;
            let idx: usize = r[..end].trim().parse().ok()?;
            cur = cur.get(idx)?;
            chars = &r[end + 1..];
        } else {
            return None;
        }
    }
    Some(cur)
}

/// Whether `path` is one [`json_path`] can read.
pub fn valid_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('$') else {
        return false;
    };
    let mut chars = rest;
    while !chars.is_empty() {
        if let Some(r) = chars.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end == 0 {
                return false;
            }
            chars = &r[end..];
        } else if let Some(r) = chars.strip_prefix('[') {
            let Some(end) = r.find(']') else { return false };
            if r[..end].trim().parse::<usize>().is_err() {
                return false;
            }
            chars = &r[end + 1..];
        } else {
            return false;
        }
    }
    true
}

fn contains(hay: &Value, needle: &Value) -> bool {
    match (hay, needle) {
        (Value::String(h), Value::String(n)) => h.contains(n.as_str()),
        (Value::Array(items), n) => items.contains(n),
        _ => false,
    }
}

impl MatchSpec {
    /// Whether the payload satisfies this condition.
    pub fn holds(&self, payload: &Value) -> bool {
        let found = json_path(payload, &self.path).filter(|v| !v.is_null());
        let value = self.value.as_ref().unwrap_or(&Value::Null);
        match self.op {
            MatchOp::Exists => found.is_some(),
            MatchOp::Eq => found == Some(value),
            MatchOp::Ne => found != Some(value),
            MatchOp::Contains => found.is_some_and(|f| contains(f, value)),
            MatchOp::ContainsAny => match (found, value) {
                (Some(f), Value::Array(any)) => any.iter().any(|n| contains(f, n)),
                _ => false,
            },
        }
    }
}

impl Selector {
    /// Whether an event by `author` with this payload is selected.
    pub fn matches(&self, author: &str, payload: &Value) -> bool {
        if self.author.as_deref().is_some_and(|a| a != author) {
            return false;
        }
        if let Some(schema) = &self.schema {
            if payload.get("schema").and_then(Value::as_str) != Some(schema) {
                return false;
            }
        }
        if let Some(t) = &self.doc_type {
            if payload.pointer("/data/type").and_then(Value::as_str) != Some(t) {
                return false;
            }
        }
        if !self.tags.is_empty() {
            let tags = payload.get("tags").and_then(Value::as_array);
            let has = |t: &String| tags.is_some_and(|ts| ts.iter().any(|x| x.as_str() == Some(t)));
            if !self.tags.iter().all(has) {
                return false;
            }
        }
        self.matches.iter().all(|m| m.holds(payload))
    }
}

/// A duration as scenarios write it: `2h`, `10m`, `30s` or `250ms`, the largest whole unit.
pub fn show_ms(ms: u64) -> String {
    match ms {
        m if m.is_multiple_of(3_600_000) && m > 0 => format!("{}h", m / 3_600_000),
        m if m.is_multiple_of(60_000) && m > 0 => format!("{}m", m / 60_000),
        m if m.is_multiple_of(1000) && m > 0 => format!("{}s", m / 1000),
        m => format!("{m}ms"),
    }
}

/// Reads an approver's decision from its message: `data.decision`, or text starting with
/// approve/reject (any case). Anything else counts as a rejection.
pub fn approved(payload: &Value) -> bool {
    if let Some(d) = payload.pointer("/data/decision").and_then(Value::as_str) {
        return d.eq_ignore_ascii_case("approve") || d.eq_ignore_ascii_case("approved");
    }
    let text = payload.get("text").and_then(Value::as_str).unwrap_or("");
    let t = text.trim_start().to_ascii_lowercase();
    t.starts_with("approve") || t.starts_with("yes") || t.starts_with("lgtm")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn binding_the_caller_renames_it_wherever_the_scenario_names_a_participant() {
        let spec: ScenarioSpec = serde_json::from_value(json!({
            "participants": [{"id": "peer", "external": true, "caller": true}, "expert"],
            "policy": {
                "order": "rules", "first": "peer", "sequence": ["peer", "expert"],
                "rules": [{"when": {"author": "peer"}, "next": "expert"},
                          {"when": {"author": "expert"}, "next": "peer"}],
                "approvals": [{"before": "expert", "approver": "peer"}]
            }
        }))
        .unwrap();
        assert_eq!(spec.caller(), Some("peer"));
        let bound = spec.clone().bind_caller("acme");
        let v = serde_json::to_value(&bound).unwrap();
        assert_eq!(v["participants"][0]["id"], "acme");
        assert_eq!(v["participants"][0]["caller"], true);
        assert_eq!(v["participants"][1], "expert");
        let policy = &v["policy"];
        assert_eq!(policy["first"], "acme");
        assert_eq!(policy["sequence"], json!(["acme", "expert"]));
        assert_eq!(policy["rules"][0]["when"]["author"], "acme");
        assert_eq!(policy["rules"][0]["next"], "expert");
        assert_eq!(policy["rules"][1]["next"], "acme");
        assert_eq!(
            policy["approvals"][0],
            json!({"before": "expert", "approver": "acme"})
        );
        assert!(!v.to_string().contains("\"peer\""), "{v}");

        let plain: ScenarioSpec =
            serde_json::from_value(json!({"participants": ["a", "b"]})).unwrap();
        assert_eq!(plain.caller(), None);
        assert_eq!(plain.clone().bind_caller("acme"), plain);
    }

    #[test]
    fn paths_and_operators() {
        let p = json!({"text": "call calc", "schema": "tool.request.v1", "tags": ["a", "b"],
                       "data": {"tool": "calc", "args": [1, 2], "none": null}});
        assert_eq!(json_path(&p, "$.data.tool"), Some(&json!("calc")));
        assert_eq!(json_path(&p, "$.data.args[1]"), Some(&json!(2)));
        assert_eq!(json_path(&p, "$.tags[0]"), Some(&json!("a")));
        assert_eq!(json_path(&p, "$.nope.deeper"), None);
        assert!(valid_path("$.data.args[1]") && !valid_path("data.tool") && !valid_path("$..x"));
        let m = |path: &str, op, value: Option<Value>| MatchSpec {
            path: path.into(),
            op,
            value,
        };
        assert!(m("$.data.tool", MatchOp::Eq, Some(json!("calc"))).holds(&p));
        assert!(m("$.data.tool", MatchOp::Ne, Some(json!("web"))).holds(&p));
        assert!(m("$.data.missing", MatchOp::Ne, Some(json!("web"))).holds(&p));
        assert!(m("$.text", MatchOp::Contains, Some(json!("calc"))).holds(&p));
        assert!(m("$.data.args", MatchOp::Contains, Some(json!(2))).holds(&p));
        assert!(m("$.tags", MatchOp::ContainsAny, Some(json!(["z", "b"]))).holds(&p));
        assert!(!m("$.tags", MatchOp::ContainsAny, Some(json!(["z"]))).holds(&p));
        assert!(m("$.data.tool", MatchOp::Exists, None).holds(&p));
        assert!(!m("$.data.none", MatchOp::Exists, None).holds(&p));
        let s = Selector {
            schema: Some("tool.request.v1".into()),
            tags: vec!["a".into()],
            author: Some("llm".into()),
            matches: vec![m("$.data.tool", MatchOp::Eq, Some(json!("calc")))],
            doc_type: None,
        };
        assert!(s.matches("llm", &p));
        assert!(!s.matches("other", &p));
        assert!(!s.matches("llm", &json!({"text": "x"})));
        let plan = json!({"text": "x", "schema": "plan.v1", "data": {"type": "launch"}});
        let by_type = |t: &str| Selector {
            schema: Some("plan.v1".into()),
            doc_type: Some(t.into()),
            ..Selector::default()
        };
        assert!(by_type("launch").matches("planner", &plan));
        assert!(!by_type("budget").matches("planner", &plan));
    }
}
