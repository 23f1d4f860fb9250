//! `orchestrate`: steps described as data, each one or more sub-conversations, with optional
//! approval checkpoints between them.
//!
//! ```yaml
//! - id: planner
//!   kind: orchestrate
//!   steps:
//!     - parallel:
//!         - { call: research, as: history, input: "The history of {{$.input.text}}" }
//!         - { call: research, as: trade, input: "The trade in {{$.input.text}}" }
//!     - approve: { by: editor, text: "Research is in. Approve to write the report." }
//!     - { call: write, as: report, input: "{{$.steps.history.text}}\n\n{{$.steps.trade.text}}" }
//!   reply: "{{$.steps.report.text}}"
//! ```
//!
//! A `call` names a scenario the server knows (or gives one inline as `scenario:`); its `input`
//! is a template (paths from `$`, as in the `http` kind) over `input` (the message that started the run), `steps` (each finished
//! step's result by its `as` name: `text`, `data`, `author`, `child`, `status`, and `plan` or
//! `deliverable` when the step's result was one: `{{$.steps.spec.deliverable.content}}`) and `context`
//! (the participant's assembled context). `parallel` opens its calls at once and waits for all.
//! `approve` ends the turn with a message to the approver (give the scenario `order:
//! addressed`, so the turn goes there); the approver's answer (approve/yes/lgtm, or
//! `data.decision`) decides, and the next turn goes on from there or stops.
//!
//! The agent keeps no state: each turn reads its progress back from the log. Every child's id
//! comes from the run, the step and the call, so a step run again after a crash finds its
//! children (finished or not) instead of opening new ones.

use async_trait::async_trait;
use proto_spec::scenario::approved;
use proto_spec::{Event, EventKind, Finality, TailParams};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::execute::{Execute, OutMessage, Reply};
use super::http::{check_template, render};
use super::settings::settings;
use agent_sdk::sub::{Finished, SubConversation};
use agent_sdk::{AgentContext, AgentError};

/// The schema of the message that asks for approval between steps.
pub const CHECKPOINT_SCHEMA: &str = "orchestrate.checkpoint.v1";
/// The schema of the message that ends a run with its result.
pub const RESULT_SCHEMA: &str = "orchestrate.result.v1";
/// The schema of the message that ends a run that failed or was rejected.
pub const FAILED_SCHEMA: &str = "orchestrate.failed.v1";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct OrchestrateSpec {
    steps: Vec<Value>,
    #[serde(default)]
    reply: Option<Value>,
    #[serde(default)]
    close: bool,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CallSpec {
    #[serde(default)]
    call: Option<String>,
    #[serde(default)]
    scenario: Option<Value>,
    #[serde(default, rename = "as")]
    name: Option<String>,
    #[serde(default)]
    input: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ApproveSpec {
    by: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Debug, Clone)]
struct Call {
    name: String,
    child: SubConversation,
    input: Value,
}

#[derive(Debug, Clone)]
enum Step {
    Calls(Vec<Call>),
    Approve { by: String, text: String },
}

/// The `orchestrate` kind.
#[derive(Debug)]
pub struct Orchestrate {
    steps: Vec<Step>,
    reply: Option<Value>,
    close: bool,
}

fn call_of(at: &str, c: CallSpec, default_name: String) -> Result<Call, String> {
    let CallSpec {
        call,
        scenario,
        name,
        input,
    } = c;
    let child = match (call, scenario) {
        (Some(n), None) => SubConversation::named(n),
        (None, Some(s)) if s.is_object() => SubConversation::inline(s),
        (None, Some(_)) => return Err(format!("{at}.scenario: an inline scenario (an object)")),
        (Some(_), Some(_)) => {
            return Err(format!(
                "{at}: give call (a scenario name) or scenario (inline), not both"
            ))
        }
        (None, None) => return Err(format!("{at}: call or scenario is needed")),
    };
    if let Some(i) = &input {
        check_template(&format!("{at}.input"), i)?;
    }
    Ok(Call {
        name: name.unwrap_or(default_name),
        child,
        input: input.unwrap_or_else(|| json!("{{$.input.text}}")),
    })
}

impl Orchestrate {
    /// From a participant's settings; the error names the setting.
    pub fn from_spec(spec: &Value) -> Result<Orchestrate, String> {
        let spec: OrchestrateSpec = settings(spec, "steps")?;
        if spec.steps.is_empty() {
            return Err("steps: at least one step".into());
        }
        let mut steps = Vec::new();
        let mut names = std::collections::HashSet::new();
        for (i, s) in spec.steps.into_iter().enumerate() {
            let at = format!("steps[{i}]");
            let parse = |what: &str| {
                let at = format!("{at}.{what}");
                move |e: serde_json::Error| format!("{at}: {e}")
            };
            let only = |key: &str| -> Result<Value, String> {
                match &s {
                    Value::Object(o) if o.len() == 1 => Ok(o[key].clone()),
                    _ => Err(format!("{at}: a {key} step has {key} and nothing else")),
                }
            };
            let step = if s.get("approve").is_some() {
                let a: ApproveSpec =
                    serde_json::from_value(only("approve")?).map_err(parse("approve"))?;
                if let Some(t) = &a.text {
                    check_template(&format!("{at}.approve.text"), &json!(t))?;
                }
                Step::Approve {
                    text: a.text.unwrap_or_else(|| {
                        format!(
                            "@{}: approve to go on with the next step, or reject to stop.",
                            a.by
                        )
                    }),
                    by: a.by,
                }
            } else if s.get("parallel").is_some() {
                let p: Vec<CallSpec> =
                    serde_json::from_value(only("parallel")?).map_err(parse("parallel"))?;
                if p.is_empty() {
                    return Err(format!("{at}.parallel: at least one call"));
                }
                let calls = p
                    .into_iter()
                    .enumerate()
                    .map(|(j, c)| {
                        call_of(&format!("{at}.parallel[{j}]"), c, format!("step{i}_{j}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Step::Calls(calls)
            } else {
                let c: CallSpec = serde_json::from_value(s.clone()).map_err(|e| {
                    format!("{at}: {e} (each step is a call, a parallel or an approve)")
                })?;
                Step::Calls(vec![call_of(&at, c, format!("step{i}"))?])
            };
            if let Step::Calls(calls) = &step {
                for c in calls {
                    if !names.insert(c.name.clone()) {
                        return Err(format!("{at}: the name {:?} is used twice", c.name));
                    }
                }
            }
            steps.push(step);
        }
        if let Some(r) = &spec.reply {
            check_template("reply", r)?;
        }
        Ok(Orchestrate {
            steps,
            reply: spec.reply,
            close: spec.close,
        })
    }
}

/// Where a run stands, read from the log.
struct Run {
    /// The run's number: the turn it started in.
    id: u64,
    /// The message that started it.
    input: Value,
    /// Approval steps at or before this index are decided (approved).
    approved_through: Option<usize>,
}

/// Every event of this conversation.
async fn whole_log(ctx: &AgentContext) -> Result<Vec<Event>, AgentError> {
    let mut out: Vec<Event> = Vec::new();
    loop {
        let since = out.last().map_or(0, |e| e.seq);
        let page = ctx
            .client
            .tail(TailParams {
                conversation_id: ctx.conversation_id.clone(),
                since_seq: since,
                limit: None,
            })
            .await?;
        let done = page.events.is_empty() || page.latest_seq <= since;
        out.extend(page.events);
        if done || out.last().map_or(0, |e| e.seq) >= page.latest_seq {
            return Ok(out);
        }
    }
}

fn message_view(e: &Event) -> Value {
    let p = e.payload_value();
    json!({"author": e.author, "text": p.get("text").cloned().unwrap_or(json!("")), "data": p.get("data").cloned().unwrap_or(Value::Null)})
}

impl Orchestrate {
    /// Reads where this agent's runs stand: a run waiting on an approval that has been answered
    /// goes on; otherwise a new run starts from the latest message of someone else.
    fn run_from_log(&self, ctx: &AgentContext, log: &[Event]) -> Result<Run, String> {
        let me = ctx.agent_id.as_str();
        let mine_last = log
            .iter()
            .rposition(|e| e.kind == EventKind::Message && e.author == me);
        if let Some(i) = mine_last {
            let cp = &log[i];
            let p = cp.payload_value();
            if p.get("schema").and_then(Value::as_str) == Some(CHECKPOINT_SCHEMA) {
                let data = p.get("data").cloned().unwrap_or(Value::Null);
                let step = data.get("step").and_then(Value::as_u64).unwrap_or(0) as usize;
                let by = data.get("by").and_then(Value::as_str).unwrap_or("");
                let answer = log[i + 1..].iter().find(|e| {
                    e.kind == EventKind::Message
                        && e.author == by
                        && e.finality != Some(Finality::None)
                });
                let Some(answer) = answer else {
                    return Err(format!("{by} did not answer the approval request"));
                };
                if !approved(&answer.payload_value()) {
                    let text = answer.payload_value()["text"]
                        .as_str()
                        .unwrap_or("")
                        .to_string();
                    return Err(format!("{by} did not approve going on ({text:?})"));
                }
                return Ok(Run {
                    id: data.get("run").and_then(Value::as_u64).unwrap_or(ctx.turn),
                    input: data.get("input").cloned().unwrap_or(Value::Null),
                    approved_through: Some(step),
                });
            }
        }
        let trigger = log
            .iter()
            .rev()
            .find(|e| e.kind == EventKind::Message && e.author != me)
            .map(message_view)
            .unwrap_or_else(|| json!({"author": "", "text": "", "data": null}));
        Ok(Run {
            id: ctx.turn,
            input: trigger,
            approved_through: None,
        })
    }
}

/// A finished step as later steps see it (`$.steps.NAME`): its result's text, data, author,
/// child and status, and, when the result was a plan or a deliverable, that document under
/// `plan` or `deliverable` (`type`, `format`, `version`, `content`), so a step can pass what it
/// built to the next by name.
fn result_view(f: &Finished) -> Value {
    let r = f.result.as_ref();
    let mut v = json!({
        "text": f.text(),
        "data": r.and_then(|r| r.data.clone()),
        "author": r.map(|r| r.author.clone()),
        "child": f.child,
        "status": f.status,
    });
    let doc = match r.and_then(|r| r.schema.as_deref()) {
        Some(proto_spec::PLAN_SCHEMA) => Some("plan"),
        Some(proto_spec::DELIVERABLE_SCHEMA) => Some("deliverable"),
        _ => None,
    };
    if let Some(key) = doc {
        v[key] = r.and_then(|r| r.data.clone()).unwrap_or(Value::Null);
    }
    v
}

fn failed(run: &Run, text: String, extra: Value) -> Reply {
    let mut data = json!({"run": run.id});
    if let (Value::Object(d), Value::Object(e)) = (&mut data, extra) {
        d.extend(e);
    }
    let mut m = OutMessage::text(text);
    m.schema = Some(FAILED_SCHEMA.into());
    m.data = Some(data);
    Reply { messages: vec![m] }
}

#[async_trait]
impl Execute for Orchestrate {
    fn kind(&self) -> &'static str {
        "orchestrate"
    }

    async fn execute(&self, ctx: &AgentContext, context: Value) -> Result<Reply, AgentError> {
        let log = whole_log(ctx).await?;
        let run = match self.run_from_log(ctx, &log) {
            Ok(run) => run,
            Err(why) => {
                let run = Run {
                    id: ctx.turn,
                    input: Value::Null,
                    approved_through: None,
                };
                return Ok(failed(
                    &run,
                    format!("Stopped: {why}."),
                    json!({"rejected": true}),
                ));
            }
        };
        let mut results = Map::new();
        let mut last_texts: Vec<String> = Vec::new();
        for (i, step) in self.steps.iter().enumerate() {
            match step {
                Step::Approve { by, text } => {
                    if run.approved_through.is_some_and(|t| i <= t) {
                        continue;
                    }
                    let scope = json!({"input": run.input, "steps": results, "context": context});
                    let text = match render(&json!(text), &scope) {
                        Value::String(s) => s,
                        other => other.to_string(),
                    };
                    let mut m = OutMessage::text(text);
                    m.to = vec![by.clone()];
                    m.schema = Some(CHECKPOINT_SCHEMA.into());
                    m.data = Some(
                        json!({"run": run.id, "step": i, "by": by, "input": run.input, "results": results}),
                    );
                    return Ok(Reply { messages: vec![m] });
                }
                Step::Calls(calls) => {
                    let scope = json!({"input": run.input, "steps": results, "context": context});
                    let mut ids = Vec::with_capacity(calls.len());
                    for (j, c) in calls.iter().enumerate() {
                        let input = match render(&c.input, &scope) {
                            Value::String(s) => s,
                            other => other.to_string(),
                        };
                        let child = c.child.clone().input(input);
                        let key = format!("r{}.s{i}.{j}", run.id);
                        match ctx.open_subconversation(&child, &key).await {
                            Ok(id) => ids.push(id),
                            Err(e) => {
                                return Ok(failed(
                                    &run,
                                    format!("Step {} ({}) could not start: {e}", i + 1, c.name),
                                    json!({"step": i, "failed": c.name, "error": e.to_string()}),
                                ))
                            }
                        }
                    }
                    let done = ctx.wait_subconversations(&ids).await?;
                    last_texts.clear();
                    for (c, f) in calls.iter().zip(&done) {
                        if f.failed() {
                            return Ok(failed(
                                &run,
                                format!(
                                    "Step {} ({}) failed: sub-conversation {} ended without a result; {}.",
                                    i + 1,
                                    c.name,
                                    f.child,
                                    f.describe()
                                ),
                                json!({"step": i, "failed": c.name, "child": f.child, "status": f.status, "reason": f.reason}),
                            ));
                        }
                        results.insert(c.name.clone(), result_view(f));
                        last_texts.push(f.text().to_string());
                    }
                }
            }
        }
        let scope = json!({"input": run.input, "steps": results, "context": context});
        let text = match &self.reply {
            Some(t) => match render(t, &scope) {
                Value::String(s) => s,
                other => other.to_string(),
            },
            None => last_texts.join("\n\n"),
        };
        let mut m = OutMessage::text(text);
        m.schema = Some(RESULT_SCHEMA.into());
        m.data = Some(json!({"run": run.id, "results": results}));
        if self.close {
            m.finality = Some(Finality::Conversation);
        }
        Ok(Reply { messages: vec![m] })
    }
}
