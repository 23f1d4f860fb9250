//! Agent modes, and the typed documents (plans and deliverables) that plan and build modes
//! produce.
//!
//! A message may ask for a [`Mode`] (`payload.mode`); a participant declares the modes it
//! supports (`modes:`) and the [`OutputSpec`] of its plans and deliverables (`plan:`,
//! `deliverable:`). A plan is a message whose `schema` is [`PLAN_SCHEMA`] and whose `data` is a
//! [`DocumentData`]; a deliverable is the same with [`DELIVERABLE_SCHEMA`]. The orchestrator
//! numbers them: each new document of a type in a conversation is the next `version`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The `schema` of a plan message.
pub const PLAN_SCHEMA: &str = "plan.v1";
/// The `schema` of a deliverable message.
pub const DELIVERABLE_SCHEMA: &str = "deliverable.v1";
/// The `schema` of a message asking a participant to run a tool (an `llm`'s tool call, a `tool`
/// agent's answer to one).
pub const TOOL_REQUEST_SCHEMA: &str = "tool.request.v1";

/// What an agent is asked to do with its turn.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Talk: an ordinary reply.
    Converse,
    /// Produce or revise a plan (a `plan.v1` message).
    Plan,
    /// Produce a deliverable (a `deliverable.v1` message when the participant declares one).
    Build,
}

impl Mode {
    /// Every mode, in order.
    pub const ALL: [Mode; 3] = [Mode::Converse, Mode::Plan, Mode::Build];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Converse => "converse",
            Mode::Plan => "plan",
            Mode::Build => "build",
        }
    }

    /// The `schema` of the document this mode produces (`None` for converse).
    pub fn document_schema(self) -> Option<&'static str> {
        match self {
            Mode::Converse => None,
            Mode::Plan => Some(PLAN_SCHEMA),
            Mode::Build => Some(DELIVERABLE_SCHEMA),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a document is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DocFormat {
    /// Markdown text (`content` is a string).
    #[default]
    Markdown,
    /// JSON (`content` is any JSON value, checked against the declared schema).
    Json,
}

impl DocFormat {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            DocFormat::Markdown => "markdown",
            DocFormat::Json => "json",
        }
    }
}

/// A participant's declaration of its plans or deliverables (`plan:` / `deliverable:` in a
/// scenario).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutputSpec {
    /// `markdown` (the default) or `json`.
    #[serde(default)]
    pub format: DocFormat,
    /// The document's type name (what versions count by and context selects on); `plan` or
    /// `deliverable` when absent.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub doc_type: Option<String>,
    /// For `json`: a JSON Schema the content must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    /// For `markdown`: headings the text must have, in any order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sections: Vec<String>,
}

impl OutputSpec {
    /// The type name, or the mode's default (`plan`, `deliverable`).
    pub fn type_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.doc_type.as_deref().unwrap_or(default)
    }
}

/// The `data` of a plan or deliverable message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DocumentData {
    /// The type name (`plan`, `deliverable`, or the declared one).
    #[serde(rename = "type")]
    pub doc_type: String,
    /// `markdown` or `json`.
    pub format: DocFormat,
    /// 1 for the first document of this schema and type in the conversation, then 2, 3, …
    /// Set by the orchestrator when the message is appended (what a writer sends is replaced).
    #[serde(default)]
    pub version: u64,
    /// The document: a string for `markdown`, any JSON for `json`.
    pub content: Value,
}

impl DocumentData {
    /// Reads a document's data, checking its shape: a type name, a format, and content that
    /// fits the format. The error says what is wrong.
    pub fn parse(data: Option<&Value>) -> Result<DocumentData, String> {
        let data = data.ok_or("a plan or deliverable needs data: {type, format, content}")?;
        let d: DocumentData =
            serde_json::from_value(data.clone()).map_err(|e| format!("data: {e}"))?;
        if d.doc_type.is_empty() {
            return Err("data.type: a non-empty type name".into());
        }
        if d.format == DocFormat::Markdown && !d.content.is_string() {
            return Err("data.content: a markdown document's content is a string".into());
        }
        Ok(d)
    }
}

/// The plan or deliverable a message payload holds, with the mode that produces its kind
/// (`plan` for a plan, `build` for a deliverable); `None` for any other payload.
pub fn document_of(payload: &Value) -> Option<(Mode, DocumentData)> {
    let mode = match payload.get("schema")?.as_str()? {
        PLAN_SCHEMA => Mode::Plan,
        DELIVERABLE_SCHEMA => Mode::Build,
        _ => return None,
    };
    DocumentData::parse(payload.get("data"))
        .ok()
        .map(|d| (mode, d))
}

impl DocumentData {
    /// A heading for people: `plan launch-plan v2 (markdown, plan mode)`.
    pub fn title(&self, mode: Mode) -> String {
        let what = if mode == Mode::Plan {
            "plan"
        } else {
            "deliverable"
        };
        format!(
            "{what} {} v{} ({}, {mode} mode)",
            self.doc_type,
            self.version,
            self.format.as_str()
        )
    }

    /// The content as text: a Markdown document as it is, JSON pretty-printed.
    pub fn text(&self) -> String {
        match &self.content {
            Value::String(s) if self.format == DocFormat::Markdown => s.clone(),
            other => serde_json::to_string_pretty(other).unwrap_or_default(),
        }
    }
}

/// The modes a kind supports when its participant declares none: every mode, except for
/// `tool` and `orchestrate`, which build only (they are called by other agents to do
/// something). The first is the mode of a turn that asks for none.
pub fn default_modes(kind: Option<&str>) -> &'static [Mode] {
    match kind {
        Some("tool" | "orchestrate") => &[Mode::Build],
        _ => &Mode::ALL,
    }
}
