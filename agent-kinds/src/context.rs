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

use agent_sdk::{AgentContext, AgentError};

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
    /// The most tokens the assembled messages may take; the oldest go first.
    #[serde(default)]
    pub budget: Option<Budget>,
}

/// A token budget for the assembled context.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Budget {
    /// The most tokens.
    pub tokens: usize,
    /// How to count: `o200k_base` (GPT-4o and later), `cl100k_base` (GPT-4, GPT-3.5), or
    /// `approx` (4 characters a token, for models whose tokenizer is not known). An `llm`
    /// participant picks it from its model when this is absent.
    #[serde(default)]
    pub tokenizer: Option<Tokenizer>,
}

/// A way to count tokens.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Tokenizer {
    /// OpenAI's o200k_base (GPT-4o, GPT-4.1, o-series).
    O200kBase,
    /// OpenAI's cl100k_base (GPT-4, GPT-3.5).
    Cl100kBase,
    /// Four characters a token.
    Approx,
}

impl Tokenizer {
    /// The tokenizer of a model, when it is known.
    pub fn for_model(model: &str) -> Tokenizer {
        let m = model.rsplit('/').next().unwrap_or(model);
        if m.starts_with("gpt-4o")
            || m.starts_with("gpt-4.1")
            || m.starts_with("gpt-5")
            || m.starts_with('o') && m[1..].starts_with(|c: char| c.is_ascii_digit())
        {
            Tokenizer::O200kBase
        } else if m.starts_with("gpt-4") || m.starts_with("gpt-3.5") {
            Tokenizer::Cl100kBase
        } else {
            Tokenizer::Approx
        }
    }

    /// How many tokens `text` takes.
    pub fn count(self, text: &str) -> usize {
        match self {
            Tokenizer::O200kBase => tiktoken_rs::o200k_base_singleton()
                .encode_ordinary(text)
                .len(),
            Tokenizer::Cl100kBase => tiktoken_rs::cl100k_base_singleton()
                .encode_ordinary(text)
                .len(),
            Tokenizer::Approx => text.chars().count().div_ceil(4),
        }
    }
}

fn default_tail() -> usize {
    DEFAULT_TAIL
}

impl Default for ContextSpec {
    fn default() -> Self {
        ContextSpec {
            tail: DEFAULT_TAIL,
            sources: Vec::new(),
            budget: None,
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
        // The error names the field it failed at (`context.tail`), as the checks below do.
        let spec: ContextSpec = serde_path_to_error::deserialize(v.clone()).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            match path.as_str() {
                "." => format!("context: {inner}"),
                p if p.starts_with('[') => format!("context{p}: {inner}"),
                p => format!("context.{p}: {inner}"),
            }
        })?;
        let mut seen = std::collections::HashSet::new();
        for (i, s) in spec.sources.iter().enumerate() {
            if s.name.is_empty() || ["tail", "mode", "output"].contains(&s.name.as_str()) {
                return Err(format!(
                    "context.sources[{i}].name: a name other than \"tail\", \"mode\" and \"output\" (the pipeline's own) is required"
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
    let mut context = Value::Object(out);
    if let Some(b) = &spec.budget {
        let own = ctx.conversation_id.clone();
        let of = |name: &str| {
            spec.sources
                .iter()
                .find(|s| s.name == name)
                .and_then(|s| s.conversation.clone())
                .unwrap_or_else(|| own.clone())
        };
        trim(
            &mut context,
            b.tokens,
            b.tokenizer.unwrap_or(Tokenizer::Approx),
            &own,
            &of,
        );
    }
    Ok(context)
}

/// Removes messages until the context fits `budget` tokens (each message counted as its JSON,
/// wherever it appears). Sources go first, oldest first (those read from other conversations
/// before this one's); then the tail, oldest first, which always keeps its newest message.
pub fn trim(
    context: &mut Value,
    budget: usize,
    tokenizer: Tokenizer,
    own: &str,
    conversation_of: &dyn Fn(&str) -> String,
) {
    let Some(obj) = context.as_object_mut() else {
        return;
    };
    let count = |m: &Value| tokenizer.count(&m.to_string());
    let mut total: usize = obj
        .values()
        .map(|v| match v {
            Value::Array(a) => a.iter().map(count).sum(),
            Value::Null => 0,
            one => count(one),
        })
        .sum();
    if total <= budget {
        return;
    }
    // Source messages, other conversations' first, oldest first.
    struct Candidate {
        /// From this conversation (kept longest).
        mine: bool,
        seq: u64,
        source: String,
        tokens: usize,
    }
    let mut candidates: Vec<Candidate> = Vec::new();
    for (name, v) in obj.iter() {
        if name == "tail" {
            continue;
        }
        let mine = conversation_of(name) == own;
        let items: Vec<&Value> = match v {
            Value::Array(a) => a.iter().collect(),
            Value::Null => Vec::new(),
            one => vec![one],
        };
        for m in items {
            candidates.push(Candidate {
                mine,
                seq: m["seq"].as_u64().unwrap_or(0),
                source: name.clone(),
                tokens: count(m),
            });
        }
    }
    candidates.sort_by_key(|c| (c.mine, c.seq));
    for Candidate {
        seq,
        source: name,
        tokens,
        ..
    } in candidates
    {
        if total <= budget {
            return;
        }
        if let Some(v) = obj.get_mut(&name) {
            match v {
                Value::Array(a) => {
                    if let Some(i) = a.iter().position(|m| m["seq"].as_u64() == Some(seq)) {
                        a.remove(i);
                    }
                }
                one => *one = Value::Null,
            }
            total -= tokens;
        }
    }
    if let Some(Value::Array(tail)) = obj.get_mut("tail") {
        while total > budget && tail.len() > 1 {
            total -= count(&tail.remove(0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(seq: u64, text: &str) -> Value {
        json!({"seq": seq, "author": "a", "turn": 1, "text": text})
    }

    #[test]
    fn trimming_drops_the_oldest_and_keeps_the_newest() {
        let words = "lorem ipsum dolor sit amet ".repeat(4);
        let mut c = json!({
            "tail": [msg(3, &words), msg(4, &words), msg(5, &words)],
            "latest": msg(5, &words),
            "notes": [msg(1, &words), msg(2, &words)],
        });
        let one = Tokenizer::O200kBase.count(&msg(3, &words).to_string());
        let of = |name: &str| {
            if name == "notes" {
                "other".to_string()
            } else {
                "c1".to_string()
            }
        };
        // Six messages in all. Room for four: the sources go first, the other conversation's
        // oldest first.
        trim(&mut c, one * 4, Tokenizer::O200kBase, "c1", &of);
        assert_eq!(c["notes"], json!([]));
        assert_eq!(c["latest"], msg(5, &words));
        assert_eq!(c["tail"].as_array().unwrap().len(), 3);
        // Room for two: the last source, then the tail's oldest.
        trim(&mut c, one * 2, Tokenizer::O200kBase, "c1", &of);
        assert_eq!(c["latest"], Value::Null);
        assert_eq!(c["tail"], json!([msg(4, &words), msg(5, &words)]));
        // No room at all: the tail keeps its newest message.
        trim(&mut c, 0, Tokenizer::O200kBase, "c1", &of);
        assert_eq!(c["tail"], json!([msg(5, &words)]));
        // Known models get their tokenizer; others are approximated.
        assert_eq!(Tokenizer::for_model("gpt-4o-mini"), Tokenizer::O200kBase);
        assert_eq!(
            Tokenizer::for_model("openai/gpt-4-turbo"),
            Tokenizer::Cl100kBase
        );
        assert_eq!(Tokenizer::for_model("llama3.1"), Tokenizer::Approx);
        assert!(Tokenizer::O200kBase.count("hello world") <= 3);
    }

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
        let err = ContextSpec::from_value(&json!({"tail": -1})).unwrap_err();
        assert!(err.starts_with("context.tail: "), "{err}");
        let err = ContextSpec::from_value(
            &json!({"sources": [{"name": "a", "select": {"match": [{"path": "data", "op": "exists"}]}}]}),
        )
        .unwrap_err();
        assert!(err.contains("JSON path"), "{err}");
    }
}
