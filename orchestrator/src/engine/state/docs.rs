//! Modes and documents in the state machine: the mode a message asks for, checked against the
//! agents it asks (`ModeNotSupported`), and plans and deliverables numbered as they are
//! appended (each new one of a type is the next version).

use std::sync::LazyLock;

use memchr::memmem::Finder;
use proto_spec::{
    DocumentData, ErrorCode, Mode, RpcError, DELIVERABLE_SCHEMA, ORCHESTRATOR_AUTHOR, PLAN_SCHEMA,
};
use serde_json::{json, Value};

use super::{to_raw, AppendRequest, ConvMachine};

// Every message passes these tests on the writer's thread, so they are SIMD substring searches
// built once; only a payload that passes is parsed.
static PLAN: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\"plan.v1\""));
static DELIVERABLE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\"deliverable.v1\""));
static MODE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new("\"mode\""));

/// Whether a stored payload may be a plan or a deliverable (a cheap test before parsing; the
/// store marks such messages so that recovery reads them).
pub fn maybe_document(raw: &str) -> bool {
    let b = raw.as_bytes();
    PLAN.find(b).is_some() || DELIVERABLE.find(b).is_some()
}

/// Whether a payload may name a `mode` (a cheap test before parsing).
pub(super) fn may_ask_mode(raw: &str) -> bool {
    MODE.find(raw.as_bytes()).is_some()
}

/// The key versions count by (`plan.v1/TYPE`), if the payload is a plan or deliverable.
fn document_key(payload: &Value) -> Option<String> {
    let schema = payload.get("schema").and_then(Value::as_str)?;
    if schema != PLAN_SCHEMA && schema != DELIVERABLE_SCHEMA {
        return None;
    }
    let t = payload.pointer("/data/type").and_then(Value::as_str)?;
    Some(format!("{schema}/{t}"))
}

/// A committed message's document key and version, if it is a plan or deliverable (`raw`
/// already found to be a possible one: [`maybe_document`]).
pub(super) fn document_version(raw: &str) -> Option<(String, u64)> {
    let payload: Value = serde_json::from_str(raw).ok()?;
    let key = document_key(&payload)?;
    let version = payload.pointer("/data/version").and_then(Value::as_u64)?;
    Some((key, version))
}

fn refuse(code: ErrorCode, message: String, data: Value) -> RpcError {
    RpcError::new(code, message).with_data(data)
}

impl ConvMachine {
    /// The modes `agent` supports, its default first.
    pub fn modes_of(&self, agent: &str) -> &[Mode] {
        self.policy
            .as_ref()
            .map_or(&Mode::ALL, |p| p.modes_of(agent))
    }

    /// `ModeNotSupported` unless `agent` supports `mode`.
    pub(super) fn check_supports(&self, agent: &str, mode: Mode) -> Result<(), RpcError> {
        let modes = self.modes_of(agent);
        if modes.contains(&mode) {
            return Ok(());
        }
        let names: Vec<&str> = modes.iter().map(|m| m.as_str()).collect();
        Err(refuse(
            ErrorCode::ModeNotSupported,
            format!(
                "{agent} does not support mode {mode} (its modes: {})",
                names.join(", ")
            ),
            json!({"agent": agent, "mode": mode, "modes": modes}),
        ))
    }

    /// The mode a participant's message asks for, checked against the participants it is
    /// addressed to; the next speaker is checked once the policy has named it.
    pub(super) fn asked_mode(&self, req: &AppendRequest) -> Result<Option<Mode>, RpcError> {
        if !req.marks.mode || req.author == ORCHESTRATOR_AUTHOR {
            return Ok(None);
        }
        let payload: Value = serde_json::from_str(req.payload.get()).unwrap_or(Value::Null);
        let Some(mode) = payload
            .get("mode")
            .and_then(|m| serde_json::from_value::<Mode>(m.clone()).ok())
        else {
            return Ok(None);
        };
        let to = payload.get("to").and_then(Value::as_array);
        for agent in to.into_iter().flatten().filter_map(Value::as_str) {
            if self.is_participant(agent) {
                self.check_supports(agent, mode)?;
            }
        }
        Ok(Some(mode))
    }

    /// Gives a plan or deliverable its version (the next of its schema and type in this
    /// conversation), after checking its shape; other payloads pass untouched.
    pub(super) fn number_document(&self, req: &mut AppendRequest) -> Result<(), RpcError> {
        if !req.marks.document {
            return Ok(());
        }
        let mut payload: Value = serde_json::from_str(req.payload.get()).unwrap_or(Value::Null);
        let schema = payload.get("schema").and_then(Value::as_str);
        if schema != Some(PLAN_SCHEMA) && schema != Some(DELIVERABLE_SCHEMA) {
            return Ok(());
        }
        let schema = schema.unwrap_or_default().to_string();
        let data = DocumentData::parse(payload.get("data")).map_err(|why| {
            refuse(
                ErrorCode::InvalidParams,
                format!("payload.{why} (a {schema} message)"),
                Value::Null,
            )
        })?;
        let key = format!("{schema}/{}", data.doc_type);
        let version = self.core.doc_versions.get(&key).copied().unwrap_or(0) + 1;
        payload["data"]["version"] = json!(version);
        req.payload = to_raw(&payload);
        Ok(())
    }
}
