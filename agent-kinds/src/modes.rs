//! Modes, shared by every kind: converse (talk), plan (produce or revise a plan) and build
//! (produce a deliverable). A participant declares the modes it supports (`modes:`, its
//! default first) and what its plans and deliverables are (`plan:`, `deliverable:`: format
//! `markdown` or `json`, a type name, a JSON Schema or the sections a Markdown text must have).
//!
//! ```yaml
//! - id: planner
//!   kind: function
//!   modes: [plan, converse]
//!   plan: { format: markdown, type: launch-plan, sections: [Goals, Steps] }
//! - id: api-builder
//!   kind: http
//!   modes: [build]
//!   deliverable:
//!     format: json
//!     type: api-spec
//!     schema: { type: object, required: [endpoints] }
//! ```
//!
//! [`Outputs::shape`] turns a reply into the document its mode asks for: in plan mode the
//! closing message becomes a `plan.v1`, in build mode a `deliverable.v1` (when a deliverable is
//! declared; otherwise the kind's reply stays as it is, such as a tool's `tool.response.v1`).
//! A reply that does not match the declaration is an error of the turn, with the validation
//! message: nothing is posted and the executor retries as for any failure.

use proto_spec::document::{default_modes, TOOL_REQUEST_SCHEMA};
use proto_spec::{DocFormat, DocumentData, Mode, OutputSpec};
use serde_json::{json, Value};

use super::execute::{Execute, OutMessage, Reply};
use agent_sdk::{AgentContext, AgentError};

/// One declared document: what it is, and its schema compiled.
#[derive(Debug, Clone)]
struct Declared {
    spec: OutputSpec,
    check: Option<jsonschema::Validator>,
}

/// What a participant declares about modes.
#[derive(Debug, Clone)]
pub struct Outputs {
    modes: Vec<Mode>,
    plan: Option<Declared>,
    deliverable: Option<Declared>,
}

impl Default for Outputs {
    fn default() -> Self {
        Outputs {
            modes: Mode::ALL.to_vec(),
            plan: None,
            deliverable: None,
        }
    }
}

fn declared(spec: &Value, key: &str) -> Result<Option<Declared>, String> {
    let Some(v) = spec.get(key) else {
        return Ok(None);
    };
    let out: OutputSpec = serde_json::from_value(v.clone()).map_err(|e| format!("{key}: {e}"))?;
    if out.doc_type.as_deref() == Some("") {
        return Err(format!("{key}.type: a non-empty type name"));
    }
    match out.format {
        DocFormat::Json if !out.sections.is_empty() => {
            return Err(format!(
                "{key}.sections: sections are for markdown; a json document has a schema"
            ))
        }
        DocFormat::Markdown if out.schema.is_some() => {
            return Err(format!(
                "{key}.schema: a schema is for json; a markdown document has sections"
            ))
        }
        _ => {}
    }
    let check = match &out.schema {
        None => None,
        // A schema may come from any scenario (a non-admin's inline sub-conversation too): it
        // reaches nothing (this build resolves no remote or file `$ref`), and its patterns run
        // on the linear-time `regex` engine, so no pattern can make a check take long.
        Some(s) => Some(
            jsonschema::options()
                .with_pattern_options(jsonschema::PatternOptions::regex().size_limit(1 << 20))
                .build(s)
                .map_err(|e| format!("{key}.schema: {e}"))?,
        ),
    };
    Ok(Some(Declared { spec: out, check }))
}

/// What a model is told for the turn's mode: nothing in converse mode; in plan and build mode,
/// to answer with the document alone, in its format (the sections as headings, or JSON that
/// matches the schema).
pub fn instructions(context: &Value) -> Option<String> {
    let out = context.get("output")?;
    let mode = context
        .get("mode")
        .and_then(Value::as_str)
        .unwrap_or("plan");
    let what = if mode == "plan" {
        "a plan"
    } else {
        "the deliverable"
    };
    let kind = out
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("document");
    let mut text =
        format!("You are asked to {mode}: answer with {what} ({kind}) and nothing else.");
    if out.get("format").and_then(Value::as_str) == Some("json") {
        text.push_str(" Write it as one JSON value");
        match out.get("jsonSchema") {
            Some(s) => text.push_str(&format!(" matching this JSON Schema: {s}")),
            None => text.push('.'),
        }
    } else {
        text.push_str(" Write it in Markdown");
        match out.get("sections").and_then(Value::as_array) {
            Some(s) if !s.is_empty() => {
                let names: Vec<&str> = s.iter().filter_map(Value::as_str).collect();
                text.push_str(&format!(
                    ", with these sections as headings: {}.",
                    names.join(", ")
                ));
            }
            _ => text.push('.'),
        }
    }
    Some(text)
}

/// Strips a Markdown code fence around JSON (` ```json … ``` `), as models often add one.
fn unfence(text: &str) -> &str {
    let t = text.trim();
    let Some(rest) = t.strip_prefix("```") else {
        return t;
    };
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

/// The headings of a Markdown text, without their `#`s, lower-cased.
fn headings(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix('#'))
        .map(|h| h.trim_start_matches('#').trim().to_lowercase())
        .collect()
}

impl Outputs {
    /// Reads `modes`, `plan` and `deliverable` from a participant's spec (`kind` picks the
    /// default modes); the error starts with the setting it is about.
    pub fn from_spec(spec: &Value, kind: Option<&str>) -> Result<Outputs, String> {
        let modes = match spec.get("modes") {
            None => default_modes(kind).to_vec(),
            Some(v) => {
                let modes: Vec<Mode> = serde_json::from_value(v.clone())
                    .map_err(|e| format!("modes: {e} (converse, plan, build)"))?;
                if modes.is_empty() {
                    return Err("modes: at least one mode".into());
                }
                if let Some(m) = modes
                    .iter()
                    .enumerate()
                    .find_map(|(i, m)| modes[..i].contains(m).then_some(m))
                {
                    return Err(format!("modes: {m} is listed twice"));
                }
                modes
            }
        };
        let plan = declared(spec, "plan")?;
        let deliverable = declared(spec, "deliverable")?;
        for (key, mode, d) in [
            ("plan", Mode::Plan, &plan),
            ("deliverable", Mode::Build, &deliverable),
        ] {
            if d.is_some() && !modes.contains(&mode) {
                return Err(format!(
                    "{key}: declared, but modes does not include {mode}"
                ));
            }
        }
        Ok(Outputs {
            modes,
            plan,
            deliverable,
        })
    }

    /// The modes, the default first.
    pub fn modes(&self) -> &[Mode] {
        &self.modes
    }

    /// An error unless the turn's mode is one of the declared ones (the server refuses to ask
    /// for another; this holds for agents run against an older server too).
    pub fn check_mode(&self, ctx: &AgentContext) -> Result<(), AgentError> {
        if self.modes.contains(&ctx.mode) {
            return Ok(());
        }
        Err(format!("{} does not support mode {}", ctx.agent_id, ctx.mode).into())
    }

    /// The document a mode produces (a plan always; a deliverable when declared), with its
    /// type name filled in.
    fn document(&self, mode: Mode) -> Option<(&'static str, OutputSpec, Option<&Declared>)> {
        let (schema, default_type, d) = match mode {
            Mode::Converse => return None,
            Mode::Plan => (proto_spec::PLAN_SCHEMA, "plan", self.plan.as_ref()),
            Mode::Build => (
                proto_spec::DELIVERABLE_SCHEMA,
                "deliverable",
                Some(self.deliverable.as_ref()?),
            ),
        };
        let mut spec = d.map(|d| d.spec.clone()).unwrap_or_default();
        spec.doc_type = Some(spec.type_or(default_type).to_string());
        Some((schema, spec, d))
    }

    /// Puts the mode (`mode`) and the document asked for (`output`: `schema`, `format`,
    /// `type`, and the declared `sections` or JSON Schema as `jsonSchema`) into the context
    /// a kind is given.
    pub fn describe(&self, mode: Mode, context: &mut Value) {
        let Some(o) = context.as_object_mut() else {
            return;
        };
        o.insert("mode".into(), json!(mode));
        if let Some((schema, spec, _)) = self.document(mode) {
            let mut out = json!({
                "schema": schema,
                "format": spec.format,
                "type": spec.doc_type,
            });
            if !spec.sections.is_empty() {
                out["sections"] = json!(spec.sections);
            }
            if let Some(s) = spec.schema {
                out["jsonSchema"] = s;
            }
            o.insert("output".into(), out);
        }
    }

    /// Shapes a reply for the turn's mode: in plan mode its closing message becomes a plan, in
    /// build mode a deliverable when one is declared, each checked against the declaration.
    /// Earlier messages (progress) stay as they are. An error says why the reply does not fit.
    pub fn shape(
        &self,
        mode: Mode,
        mut reply: Reply,
        exec: Option<&dyn Execute>,
    ) -> Result<Reply, AgentError> {
        let Some((schema, spec, d)) = self.document(mode) else {
            return Ok(reply);
        };
        let what = if mode == Mode::Plan {
            "plan"
        } else {
            "deliverable"
        };
        // The message that closes the turn (the last, or the first with a finality).
        let i = reply
            .messages
            .iter()
            .position(|m| m.finality.is_some_and(|f| f != proto_spec::Finality::None))
            .or(reply.messages.len().checked_sub(1))
            .ok_or_else(|| format!("{mode} mode: the agent produced no {what}"))?;
        let m = &mut reply.messages[i];
        // A tool request hands the turn to a tool on the way to the document: the document
        // comes in a later turn, once the results are in.
        if m.schema.as_deref() == Some(TOOL_REQUEST_SCHEMA) {
            return Ok(reply);
        }
        let content = content_of(m, &spec, exec, schema, what)?;
        check(&spec, d, &content, what)?;
        m.text = match &content {
            Value::String(s) => s.clone(),
            other => serde_json::to_string_pretty(other).unwrap_or_default(),
        };
        m.data = Some(json!(DocumentData {
            doc_type: spec.doc_type.clone().unwrap_or_default(),
            format: spec.format,
            version: 0,
            content,
        }));
        m.schema = Some(schema.to_string());
        Ok(reply)
    }
}

/// The document's content in a reply message: a document the agent made itself, what the kind
/// says its reply holds, the message's `data` (JSON), or its text (Markdown, or JSON text).
fn content_of(
    m: &OutMessage,
    spec: &OutputSpec,
    exec: Option<&dyn Execute>,
    schema: &str,
    what: &str,
) -> Result<Value, AgentError> {
    if m.schema.as_deref() == Some(schema) {
        if let Ok(d) = DocumentData::parse(m.data.as_ref()) {
            return Ok(d.content);
        }
    }
    if let Some(c) = exec.map(|e| e.document_content(m)).transpose()?.flatten() {
        return Ok(match (spec.format, c) {
            (DocFormat::Markdown, Value::String(s)) => Value::String(s),
            (DocFormat::Markdown, other) => Value::String(other.to_string()),
            // Text that is JSON is the JSON; other text stays a string (the schema judges).
            (DocFormat::Json, Value::String(s)) => {
                serde_json::from_str(unfence(&s)).unwrap_or(Value::String(s))
            }
            (DocFormat::Json, c) => c,
        });
    }
    match spec.format {
        DocFormat::Markdown => {
            if m.text.trim().is_empty() {
                return Err(format!("the {what} is empty").into());
            }
            Ok(Value::String(m.text.clone()))
        }
        DocFormat::Json => match &m.data {
            Some(d) if m.schema.is_none() => Ok(d.clone()),
            _ => serde_json::from_str(unfence(&m.text))
                .map_err(|e| format!("the {what} is not JSON: {e}").into()),
        },
    }
}

/// Checks content against its declaration: the JSON Schema, or the Markdown sections.
fn check(
    spec: &OutputSpec,
    d: Option<&Declared>,
    content: &Value,
    what: &str,
) -> Result<(), AgentError> {
    if let Some(v) = d.and_then(|d| d.check.as_ref()) {
        let errors: Vec<String> = v
            .iter_errors(content)
            .take(5)
            .map(|e| {
                let at = e.instance_path().to_string();
                if at.is_empty() {
                    e.to_string()
                } else {
                    format!("at {at}: {e}")
                }
            })
            .collect();
        if !errors.is_empty() {
            return Err(format!(
                "the {what} does not match its schema: {}",
                errors.join("; ")
            )
            .into());
        }
    }
    if !spec.sections.is_empty() {
        let have = headings(content.as_str().unwrap_or_default());
        let missing: Vec<&str> = spec
            .sections
            .iter()
            .filter(|s| !have.contains(&s.trim().to_lowercase()))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "the {what} lacks the section{} {} (a Markdown heading each)",
                if missing.len() == 1 { "" } else { "s" },
                missing.join(", ")
            )
            .into());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Plain;

    #[async_trait::async_trait]
    impl Execute for Plain {
        fn kind(&self) -> &'static str {
            "plain"
        }
        async fn execute(&self, _: &AgentContext, _: Value) -> Result<Reply, AgentError> {
            Ok(Reply::default())
        }
    }

    fn reply(text: &str) -> Reply {
        Reply {
            messages: vec![OutMessage::text(text)],
        }
    }

    #[test]
    fn a_plan_is_markdown_by_default_and_checked_for_its_sections() {
        let o = Outputs::from_spec(
            &json!({"plan": {"type": "launch", "sections": ["Goals", "Steps"]}}),
            Some("function"),
        )
        .unwrap();
        let r = o
            .shape(
                Mode::Plan,
                reply("# Goals\nShip.\n## steps\n1. Build"),
                Some(&Plain),
            )
            .unwrap();
        let m = &r.messages[0];
        assert_eq!(m.schema.as_deref(), Some("plan.v1"));
        assert_eq!(m.data.as_ref().unwrap()["type"], "launch");
        assert_eq!(m.data.as_ref().unwrap()["format"], "markdown");
        let e = o
            .shape(Mode::Plan, reply("# Goals\nShip."), Some(&Plain))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the plan lacks the section Steps (a Markdown heading each)"
        );
    }

    #[test]
    fn a_json_deliverable_is_checked_against_its_schema() {
        let o = Outputs::from_spec(
            &json!({"modes": ["build"], "deliverable": {"format": "json", "type": "spec",
                "schema": {"type": "object", "required": ["endpoints"],
                    "properties": {"endpoints": {"type": "array"}}}}}),
            Some("http"),
        )
        .unwrap();
        let ok = o
            .shape(
                Mode::Build,
                reply("```json\n{\"endpoints\": [\"/a\"]}\n```"),
                Some(&Plain),
            )
            .unwrap();
        assert_eq!(
            ok.messages[0].data.as_ref().unwrap()["content"],
            json!({"endpoints": ["/a"]})
        );
        let e = o
            .shape(Mode::Build, reply("{\"endpoints\": 3}"), Some(&Plain))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("the deliverable does not match its schema: at /endpoints"),
            "{e}"
        );
        let e = o
            .shape(Mode::Build, reply("not json"), Some(&Plain))
            .unwrap_err();
        assert!(
            e.to_string().starts_with("the deliverable is not JSON"),
            "{e}"
        );
        // Converse mode leaves a reply alone; build without a declaration too.
        let plain = Outputs::default();
        assert_eq!(
            plain.shape(Mode::Build, reply("hi"), Some(&Plain)).unwrap(),
            reply("hi")
        );
    }

    #[test]
    fn a_pattern_that_backtracks_badly_is_checked_in_linear_time() {
        let o = Outputs::from_spec(
            &json!({"deliverable": {"format": "json",
                "schema": {"type": "string", "pattern": "^(a+)+$"}}}),
            None,
        )
        .unwrap();
        let hostile = format!("\"{}!\"", "a".repeat(5000));
        let e = o
            .shape(Mode::Build, reply(&hostile), Some(&Plain))
            .unwrap_err();
        assert!(e.to_string().contains("does not match"), "{e}");
    }

    #[test]
    fn a_tool_request_on_the_way_is_not_the_document() {
        let o = Outputs::from_spec(&json!({"deliverable": {"format": "json"}}), None).unwrap();
        let mut asks = OutMessage::text("calling the calculator");
        asks.schema = Some(TOOL_REQUEST_SCHEMA.into());
        let r = Reply {
            messages: vec![asks],
        };
        assert_eq!(o.shape(Mode::Build, r.clone(), Some(&Plain)).unwrap(), r);
    }

    #[test]
    fn declarations_are_checked() {
        let bad = |v: Value| Outputs::from_spec(&v, Some("function")).unwrap_err();
        assert_eq!(bad(json!({"modes": []})), "modes: at least one mode");
        assert_eq!(
            bad(json!({"modes": ["plan", "plan"]})),
            "modes: plan is listed twice"
        );
        assert!(bad(json!({"modes": ["dance"]})).starts_with("modes: unknown variant"));
        assert_eq!(
            bad(json!({"modes": ["converse"], "plan": {}})),
            "plan: declared, but modes does not include plan"
        );
        assert!(bad(json!({"plan": {"format": "json", "sections": ["A"]}}))
            .starts_with("plan.sections:"));
        assert!(
            bad(json!({"deliverable": {"format": "json", "schema": {"type": 5}}}))
                .starts_with("deliverable.schema:")
        );
        assert_eq!(
            Outputs::from_spec(&json!({}), Some("tool"))
                .unwrap()
                .modes(),
            &[Mode::Build]
        );
    }
}
