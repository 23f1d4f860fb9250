//! Declared context sources: what an agent sees when it takes a turn.
//!
//! A participant declares named sources, each a selector over this conversation or another one
//! the agent may read (`schema`, `tags`, `author`, JSON-path `match`) and a fetch (`latest`,
//! `recent: N`, `all`). [`assemble`] reads the log and builds one object: every source under its
//! name, and the conversation's tail (its last `tail` messages) under `tail`, always.
//!
//! ```yaml
//! context:
//!   tail: 10
//!   sources:
//!     - name: requests
//!       select: { schema: tool.request.v1 }
//!       fetch: latest
//!     - name: research
//!       conversation: research-notes
//!       select: { tags: [finding], author: researcher }
//!       fetch: { recent: 5 }
//! ```

use std::collections::HashMap;

use proto_spec::scenario::Selector;
use proto_spec::{Event, EventKind, TailParams};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::{AgentContext, AgentError};

/// How many of the conversation's last messages `tail` holds when a declaration names none.
pub const DEFAULT_TAIL: usize = 20;

/// A participant's context declaration.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContextSpec {
    /// How many of this conversation's last messages go under `tail`.
    #[serde(default = "default_tail")]
    pub tail: usize,
    /// The named sources.
    #[serde(default)]
    pub sources: Vec<SourceSpec>,
}

fn default_tail() -> usize {
    DEFAULT_TAIL
}

impl Default for ContextSpec {
    fn default() -> Self {
        ContextSpec {
            tail: DEFAULT_TAIL,
            sources: Vec::new(),
        }
    }
}

/// One named source.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SourceSpec {
    /// The key it is assembled under (not `tail`).
    pub name: String,
    /// Another conversation to read (the agent must take part in it); this one when absent.
    #[serde(default)]
    pub conversation: Option<String>,
    /// Which messages.
    #[serde(default)]
    pub select: Selector,
    /// How many of them.
    #[serde(default)]
    pub fetch: Fetch,
}

/// How many selected messages a source takes.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Fetch {
    /// The newest one (the source is that message, or null).
    #[default]
    Latest,
    /// The newest N, oldest first.
    Recent(usize),
    /// All of them, oldest first.
    All,
}

impl ContextSpec {
    /// Reads a declaration; the error names the field.
    pub fn from_value(v: &Value) -> Result<ContextSpec, String> {
        let spec: ContextSpec =
            serde_json::from_value(v.clone()).map_err(|e| format!("context: {e}"))?;
        let mut seen = std::collections::HashSet::new();
        for (i, s) in spec.sources.iter().enumerate() {
            if s.name.is_empty() || s.name == "tail" {
                return Err(format!(
                    "context.sources[{i}].name: a name other than \"tail\" is required"
                ));
            }
            if !seen.insert(s.name.as_str()) {
                return Err(format!(
                    "context.sources[{i}].name: {:?} is declared twice",
                    s.name
                ));
            }
            if let Some(bad) = s
                .select
                .matches
                .iter()
                .find(|m| !proto_spec::scenario::valid_path(&m.path))
            {
                return Err(format!(
                    "context.sources[{i}].select.match: {:?} is not a JSON path from $",
                    bad.path
                ));
            }
        }
        Ok(spec)
    }
}

/// A message as the context shows it.
pub fn view(e: &Event) -> Value {
    let p = e.payload_value();
    let mut v = json!({
        "seq": e.seq,
        "author": e.author,
        "turn": e.turn,
        "text": p.get("text").cloned().unwrap_or(Value::Null),
    });
    for key in ["data", "schema", "tags", "to"] {
        if let Some(x) = p.get(key) {
            v[key] = x.clone();
        }
    }
    v
}

/// Every message of a conversation, in order.
async fn messages_of(ctx: &AgentContext, conversation: &str) -> Result<Vec<Event>, AgentError> {
    let mut out = Vec::new();
    let mut cursor = 0;
    loop {
        let page = ctx
            .client
            .tail(TailParams {
                conversation_id: conversation.to_string(),
                since_seq: cursor,
                limit: None,
            })
            .await?;
        let Some(last) = page.events.last() else {
            break;
        };
        cursor = last.seq;
        out.extend(
            page.events
                .into_iter()
                .filter(|e| e.kind == EventKind::Message),
        );
        if cursor >= page.latest_seq {
            break;
        }
    }
    Ok(out)
}

/// Builds the context object a declaration asks for, from the log.
pub async fn assemble(ctx: &AgentContext, spec: &ContextSpec) -> Result<Value, AgentError> {
    let mut logs: HashMap<String, Vec<Event>> = HashMap::new();
    logs.insert(
        ctx.conversation_id.clone(),
        messages_of(ctx, &ctx.conversation_id).await?,
    );
    for s in &spec.sources {
        if let Some(c) = &s.conversation {
            if !logs.contains_key(c) {
                logs.insert(c.clone(), messages_of(ctx, c).await?);
            }
        }
    }
    let mut out = serde_json::Map::new();
    let own = &logs[&ctx.conversation_id];
    let skip = own.len().saturating_sub(spec.tail);
    out.insert(
        "tail".into(),
        Value::Array(own[skip..].iter().map(view).collect()),
    );
    for s in &spec.sources {
        let log = &logs[s.conversation.as_ref().unwrap_or(&ctx.conversation_id)];
        let selected: Vec<&Event> = log
            .iter()
            .filter(|e| s.select.matches(&e.author, &e.payload_value()))
            .collect();
        let value = match s.fetch {
            Fetch::Latest => selected.last().map(|e| view(e)).unwrap_or(Value::Null),
            Fetch::Recent(n) => {
                let skip = selected.len().saturating_sub(n);
                Value::Array(selected[skip..].iter().map(|e| view(e)).collect())
            }
            Fetch::All => Value::Array(selected.iter().map(|e| view(e)).collect()),
        };
        out.insert(s.name.clone(), value);
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations_parse_and_bad_ones_name_the_field() {
        let spec = ContextSpec::from_value(&json!({
            "tail": 5,
            "sources": [
                {"name": "req", "select": {"schema": "tool.request.v1"}, "fetch": "latest"},
                {"name": "notes", "conversation": "c2", "select": {"tags": ["x"], "author": "bob"}, "fetch": {"recent": 3}},
                {"name": "everything", "fetch": "all"}
            ]
        }))
        .unwrap();
        assert_eq!(spec.tail, 5);
        assert_eq!(spec.sources[1].fetch, Fetch::Recent(3));
        assert_eq!(spec.sources[2].fetch, Fetch::All);
        let err = ContextSpec::from_value(&json!({"sources": [{"name": "tail"}]})).unwrap_err();
        assert!(err.contains("sources[0].name"), "{err}");
        let err = ContextSpec::from_value(&json!({"sources": [{"name": "a"}, {"name": "a"}]}))
            .unwrap_err();
        assert!(err.contains("declared twice"), "{err}");
        let err = ContextSpec::from_value(&json!({"tial": 3})).unwrap_err();
        assert!(err.contains("tial"), "{err}");
        let err = ContextSpec::from_value(
            &json!({"sources": [{"name": "a", "select": {"match": [{"path": "data", "op": "exists"}]}}]}),
        )
        .unwrap_err();
        assert!(err.contains("JSON path"), "{err}");
    }
}
