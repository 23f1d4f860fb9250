//! Scenarios: reading and checking [`ScenarioSpec`]s (inline in `createConversation`, or from
//! YAML files), and compiling them into the [`TurnPolicy`] the state machine follows.
//!
//! A scenario is checked completely before anything is created; a bad one is refused with
//! `-32602`, the path of the offending field and the reason (in the message and in
//! `error.data`).

use std::ops::RangeInclusive;
use std::time::Duration;

use crate::engine::kinds::AgentKinds;
use proto_spec::scenario::{
    valid_path, MatchOp, MatchSpec, OnTimeout, Order, ParticipantObject, ParticipantSpec,
    PolicySpec, ScenarioSpec,
};
use proto_spec::{ErrorCode, RpcError};
use serde_json::{json, Map, Value};

use crate::engine::state::TurnPolicy;

/// A checked scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    /// The scenario as given (kept in the `created` event).
    pub spec: ScenarioSpec,
    /// The agents that take part, in order.
    pub participants: Vec<String>,
    /// The policy (`None`: no order and no stop condition).
    pub policy: Option<TurnPolicy>,
}

fn bad(path: &str, why: impl Into<String>) -> RpcError {
    let why = why.into();
    RpcError::new(ErrorCode::InvalidParams, format!("scenario{path}: {why}"))
        .with_data(json!({"path": format!("scenario{path}"), "reason": why}))
}

/// The range of `turn.timeout`, in milliseconds (10 ms to 24 h).
pub const TURN_TIMEOUT_MS: RangeInclusive<u64> = 10..=86_400_000;
/// The range of `stop.idleTimeout`, in milliseconds (100 ms to 30 days).
pub const IDLE_TIMEOUT_MS: RangeInclusive<u64> = 100..=2_592_000_000;
/// The range of `stop.maxDuration`, in milliseconds (100 ms to 365 days).
pub const MAX_DURATION_MS: RangeInclusive<u64> = 100..=31_536_000_000;

/// The kinds a participant may have whose agent runs code, reads the environment or reaches
/// the network on the server's behalf: only an admin's scenario or the server's library may
/// declare them (docs/security.md). `scripted` only posts its fixed replies.
pub fn runs_code(kind: &str) -> bool {
    kind != "scripted"
}

/// Reads a duration: milliseconds as a number, or text such as `500ms`, `30s`, `5m`, `1h`.
/// A value too large to represent is an error.
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
        "ms" => Some(n),
        "s" | "" => n.checked_mul(1000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        "d" => n.checked_mul(86_400_000),
        other => return Err(format!("unknown unit {other:?} (ms, s, m, h, d)")),
    };
    ms.map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// Reads the duration at `path`, which must lie in `range` (milliseconds).
fn duration_ms(
    v: &Option<Value>,
    path: &str,
    range: RangeInclusive<u64>,
) -> Result<Option<u64>, RpcError> {
    match v {
        None => Ok(None),
        Some(v) => {
            let d = parse_duration(v).map_err(|e| bad(path, e))?;
            let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
            if !range.contains(&ms) {
                return Err(bad(
                    path,
                    format!(
                        "{v} is out of range ({} to {})",
                        proto_spec::scenario::show_ms(*range.start()),
                        proto_spec::scenario::show_ms(*range.end())
                    ),
                ));
            }
            Ok(Some(ms))
        }
    }
}

/// The internal kinds this server runs, and the settings each takes.
const KINDS: &[(&str, &[&str])] = &[
    ("scripted", &["replies"]),
    ("process", &["command", "context"]),
    (
        "http",
        &[
            "endpoint", "method", "headers", "body", "response", "timeout", "retries", "context",
        ],
    ),
    ("tool", &["builtins", "mcp", "context"]),
    (
        "llm",
        &[
            "baseUrl",
            "model",
            "apiKeyEnv",
            "system",
            "stream",
            "structured",
            "tools",
            "temperature",
            "maxTokens",
            "timeout",
            "retries",
            "context",
        ],
    ),
    ("orchestrate", &["steps", "reply", "close", "context"]),
    ("function", &["source", "timeout", "memoryMb", "context"]),
    ("a2a", &["url", "stream", "timeout", "context"]),
];

/// Checks the inline scenarios of an `orchestrate` participant's steps, so that a bad child
/// is refused with the parent, naming its path.
fn check_inline_children(
    i: usize,
    config: &Map<String, Value>,
    kinds: &dyn AgentKinds,
) -> Result<(), RpcError> {
    let Some(steps) = config.get("steps").and_then(Value::as_array) else {
        return Ok(());
    };
    let mut inline = Vec::new();
    for (s, step) in steps.iter().enumerate() {
        if let Some(v) = step.get("scenario") {
            inline.push((format!(".participants[{i}].steps[{s}].scenario"), v));
        }
        for (j, call) in step
            .get("parallel")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            if let Some(v) = call.get("scenario") {
                inline.push((
                    format!(".participants[{i}].steps[{s}].parallel[{j}].scenario"),
                    v,
                ));
            }
        }
    }
    for (path, v) in inline {
        if let Err(e) = Scenario::parse(v, kinds) {
            let inner = e
                .data
                .as_ref()
                .and_then(|d| d.get("path"))
                .and_then(Value::as_str)
                .unwrap_or("scenario")
                .trim_start_matches("scenario")
                .to_string();
            let reason = e
                .data
                .as_ref()
                .and_then(|d| d.get("reason"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or(e.message);
            return Err(bad(&format!("{path}{inner}"), reason));
        }
    }
    Ok(())
}

/// A participant's settings as its kind reads them: its own, and what it declares about modes
/// (`modes`, `plan`, `deliverable`).
fn settings_of(f: &ParticipantObject) -> Map<String, Value> {
    let mut spec = f.config.clone();
    if let Some(k) = &f.kind {
        spec.insert("kind".into(), json!(k));
    }
    for (key, v) in [
        ("modes", f.modes.as_ref().map(|m| json!(m))),
        ("plan", f.plan.as_ref().map(|p| json!(p))),
        ("deliverable", f.deliverable.as_ref().map(|d| json!(d))),
    ] {
        if let Some(v) = v {
            spec.insert(key.into(), v);
        }
    }
    spec
}

/// The modes of each participant that does not support every mode, its default first.
fn modes_of(spec: &ScenarioSpec) -> std::collections::BTreeMap<String, Vec<proto_spec::Mode>> {
    let mut out = std::collections::BTreeMap::new();
    for p in &spec.participants {
        let modes = match p {
            ParticipantSpec::Id(_) => continue,
            ParticipantSpec::Full(f) => f
                .modes
                .clone()
                .unwrap_or_else(|| proto_spec::document::default_modes(f.kind.as_deref()).to_vec()),
        };
        if modes != proto_spec::Mode::ALL {
            out.insert(p.id().to_string(), modes);
        }
    }
    out
}

fn check_participant(
    i: usize,
    f: &ParticipantObject,
    kinds: &dyn AgentKinds,
) -> Result<(), RpcError> {
    let (kind, external, config) = (f.kind.as_deref(), f.external, &f.config);
    let at = |f: &str| format!(".participants[{i}]{f}");
    let named = |msg: String| {
        let (field, why) = msg.split_once(": ").unwrap_or(("", msg.as_str()));
        let path = if field.is_empty() {
            String::new()
        } else {
            format!(".{field}")
        };
        bad(&at(&path), why.to_string())
    };
    // What it declares about modes, whatever its kind (an external participant's too).
    kinds
        .check_outputs(&Value::Object(settings_of(f)), kind)
        .map_err(named)?;
    if f.caller && kind.is_some() {
        return Err(bad(
            &at(".caller"),
            "only an external participant can be the caller (the creator speaks as it)",
        ));
    }
    match (kind, external) {
        (Some(_), true) => {
            return Err(bad(
                &at(".external"),
                "a participant is either external or of an internal kind",
            ))
        }
        (None, _) => {
            if let Some(k) = config.keys().next() {
                return Err(bad(
                    &at(&format!(".{k}")),
                    "an external participant takes no settings",
                ));
            }
            return Ok(());
        }
        (Some(_), false) => {}
    }
    let kind = kind.unwrap_or_default();
    let Some((_, fields)) = KINDS.iter().find(|(k, _)| *k == kind) else {
        let known: Vec<&str> = KINDS.iter().map(|(k, _)| *k).collect();
        return Err(bad(
            &at(".kind"),
            format!(
                "{kind:?} is not a kind this server runs ({})",
                known.join(", ")
            ),
        ));
    };
    for k in config.keys() {
        if !fields.contains(&k.as_str()) {
            return Err(bad(
                &at(&format!(".{k}")),
                format!("unknown setting for kind {kind} ({})", fields.join(", ")),
            ));
        }
    }
    if kind != "scripted" {
        // The kind checks its own settings; its message starts with the setting's path.
        kinds
            .check_agent(&Value::Object(settings_of(f)))
            .map_err(named)?;
    }
    if kind == "orchestrate" {
        check_inline_children(i, config, kinds)?;
    }
    if kind == "scripted" {
        let replies = config.get("replies").and_then(Value::as_array);
        match replies {
            Some(r) if !r.is_empty() && r.iter().all(Value::is_string) => {}
            _ => {
                return Err(bad(
                    &at(".replies"),
                    "a scripted participant needs a non-empty list of texts",
                ))
            }
        }
    }
    Ok(())
}

impl Scenario {
    /// Parses and checks a scenario given as JSON (inline, or read from YAML), its participants
    /// held to `kinds` (the kinds this server runs, and what they may reach). Nothing the
    /// scenario holds runs here; a `function`'s source is compiled, within a short time limit,
    /// so call this off the async threads when the scenario may hold one.
    pub fn parse(v: &Value, kinds: &dyn AgentKinds) -> Result<Scenario, RpcError> {
        Scenario::check(Scenario::spec_of(v)?, kinds)
    }

    /// [`Scenario::parse`] for a conversation `creator` creates: a participant marked `caller`
    /// becomes the creator ([`ScenarioSpec::bind_caller`]) before the scenario is checked, so
    /// the creator's id is held to the same rules as every participant's.
    pub fn parse_for(
        v: &Value,
        creator: &str,
        kinds: &dyn AgentKinds,
    ) -> Result<Scenario, RpcError> {
        let spec = Scenario::spec_of(v)?;
        if let Some(role) = spec.caller() {
            let taken = spec
                .participants
                .iter()
                .position(|p| p.id() == creator && p.id() != role);
            if let Some(i) = taken {
                return Err(bad(
                    &format!(".participants[{i}].id"),
                    format!("{creator:?} creates the conversation, so it takes the caller's place ({role:?}), and cannot also be this participant"),
                ));
            }
        }
        Scenario::check(spec.bind_caller(creator), kinds)
    }

    /// The scenario's structure read from JSON; an error names the field it failed at.
    fn spec_of(v: &Value) -> Result<ScenarioSpec, RpcError> {
        let spec: ScenarioSpec = serde_path_to_error::deserialize(v.clone()).map_err(|e| {
            // The field it failed at, as the checks below name theirs (`.stop.maxTurns`).
            let path = match e.path().to_string() {
                p if p == "." => String::new(),
                p if p.starts_with('[') => p,
                p => format!(".{p}"),
            };
            bad(&path, e.into_inner().to_string())
        })?;
        Ok(spec)
    }

    /// Parses and checks a scenario file's text (YAML, which includes JSON).
    pub fn from_yaml(text: &str, kinds: &dyn AgentKinds) -> Result<Scenario, RpcError> {
        let v: Value =
            serde_norway::from_str(text).map_err(|e| bad("", format!("not valid YAML: {e}")))?;
        Scenario::parse(&v, kinds)
    }

    /// The participants the server runs (`kind` set), with their index and kind.
    pub fn internal(&self) -> impl Iterator<Item = (usize, &str, &str)> {
        self.spec
            .participants
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((i, p.id(), p.kind()?)))
    }

    /// Checks a parsed scenario.
    pub fn check(spec: ScenarioSpec, kinds: &dyn AgentKinds) -> Result<Scenario, RpcError> {
        let participants = check_participants(&spec, kinds)?;
        let turn = spec.turn.clone().unwrap_or_default();
        let stop = spec.stop.clone().unwrap_or_default();
        let timeout_ms = duration_ms(&turn.timeout, ".turn.timeout", TURN_TIMEOUT_MS)?;
        if turn.on_timeout.is_some() && timeout_ms.is_none() {
            return Err(bad(".turn.onTimeout", "needs turn.timeout"));
        }
        let idle_timeout_ms =
            duration_ms(&stop.idle_timeout, ".stop.idleTimeout", IDLE_TIMEOUT_MS)?;
        let max_duration_ms =
            duration_ms(&stop.max_duration, ".stop.maxDuration", MAX_DURATION_MS)?;
        if stop.max_turns == Some(0) {
            return Err(bad(".stop.maxTurns", "must be at least 1"));
        }
        if stop.on_text.as_deref() == Some("") {
            return Err(bad(".stop.onText", "must not be empty"));
        }
        let mut policy = TurnPolicy {
            order: None,
            speakers: participants.clone(),
            sequence: Vec::new(),
            first: participants[0].clone(),
            rules: Vec::new(),
            approvals: Vec::new(),
            timeout_ms,
            on_timeout: turn.on_timeout.unwrap_or(OnTimeout::Skip),
            max_turns: stop.max_turns,
            on_text: stop.on_text.clone(),
            idle_timeout_ms,
            max_duration_ms,
            agents: internal_agents(&spec),
            traces: turn.traces.unwrap_or(true),
            authority: None,
            modes: modes_of(&spec),
        };
        match &spec.policy {
            None if timeout_ms.is_some() => {
                return Err(bad(
                    ".turn.timeout",
                    "a turn timeout needs a speaker policy",
                ));
            }
            None => {}
            Some(p) => {
                let known = |id: &str| participants.iter().any(|q| q == id);
                check_order(p, &known, &mut policy)?;
                check_rules(p, &known)?;
                check_approvals(p, &known)?;
                policy.sequence = p.sequence.clone();
                policy.rules = p.rules.clone();
                policy.approvals = p.approvals.clone();
            }
        }
        let has_policy = policy.order.is_some()
            || policy.max_turns.is_some()
            || policy.on_text.is_some()
            || policy.idle_timeout_ms.is_some()
            || policy.max_duration_ms.is_some()
            || !policy.agents.is_empty()
            || !policy.modes.is_empty();
        Ok(Scenario {
            spec,
            participants,
            policy: has_policy.then_some(policy),
        })
    }
}

/// The participants' ids, each usable and listed once, and each participant's settings checked.
fn check_participants(
    spec: &ScenarioSpec,
    kinds: &dyn AgentKinds,
) -> Result<Vec<String>, RpcError> {
    if spec.participants.is_empty() {
        return Err(bad(".participants", "at least one participant is needed"));
    }
    let callers = spec
        .participants
        .iter()
        .filter(|p| matches!(p, ParticipantSpec::Full(f) if f.caller));
    if callers.count() > 1 {
        return Err(bad(
            ".participants",
            "at most one participant may be the caller",
        ));
    }
    let mut participants: Vec<String> = Vec::new();
    for (i, p) in spec.participants.iter().enumerate() {
        let id = p.id().to_string();
        if !crate::engine::auth::valid_id(&id) || id == proto_spec::ORCHESTRATOR_AUTHOR {
            return Err(bad(
                &format!(".participants[{i}].id"),
                format!("{id:?} is not a usable agent id"),
            ));
        }
        if participants.contains(&id) {
            return Err(bad(
                &format!(".participants[{i}].id"),
                format!("{id:?} is listed twice"),
            ));
        }
        if let ParticipantSpec::Full(f) = p {
            check_participant(i, f, kinds)?;
        }
        participants.push(id);
    }
    Ok(participants)
}

/// The participants the server runs, by id, with their kind and settings.
fn internal_agents(spec: &ScenarioSpec) -> std::collections::BTreeMap<String, Value> {
    let mut agents = std::collections::BTreeMap::new();
    for p in &spec.participants {
        if let ParticipantSpec::Full(f) = p {
            if f.kind.is_some() {
                agents.insert(f.id.clone(), Value::Object(settings_of(f)));
            }
        }
    }
    agents
}

mod policy;
use policy::{check_approvals, check_order, check_rules};

#[cfg(test)]
mod tests;
