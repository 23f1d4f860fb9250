//! `a2a`: a remote A2A agent as a participant.
//!
//! ```yaml
//! - id: remote
//!   kind: a2a
//!   url: http://127.0.0.1:9999/   # where its Agent Card is (/.well-known/agent-card.json)
//!   stream: true                  # SendStreamingMessage when the card says it streams
//!   timeout: 60s
//! ```
//!
//! The Agent Card is read on the participant's first turn and checked: it must offer a JSON-RPC
//! interface of A2A 1.x (the version of the official `a2a-sdk` 1.x). Each turn sends the
//! messages since this participant last spoke as one A2A message (`contextId`: the
//! conversation; `messageId`: the conversation and turn, so a retried turn is the same message
//! to the remote agent). Streamed status and artifact updates are posted as progress (finality
//! `none`); the answer, when the remote task is `input-required` or `completed`, is the reply
//! with finality `turn`, its data naming the remote task (`data.a2a`). The next turn continues
//! an `input-required` task by its id. A task that fails, is rejected or canceled, or an
//! answer that is not A2A, is the turn's error.

use std::time::Duration;

use async_trait::async_trait;
use proto_spec::{Finality, MessagePayload};
use serde::Deserialize;
use serde_json::{json, Value};

use super::execute::{Execute, OutMessage, Reply};
use super::sandbox::Sandbox;
use super::settings::{duration_in, settings};
use agent_sdk::{AgentContext, AgentError};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct A2aSpec {
    url: String,
    #[serde(default = "yes")]
    stream: bool,
    #[serde(default)]
    timeout: Option<String>,
}

fn yes() -> bool {
    true
}

/// What the Agent Card says, once checked.
#[derive(Debug, Clone)]
struct Card {
    name: String,
    endpoint: reqwest::Url,
    streaming: bool,
}

/// The `a2a` kind.
#[derive(Debug)]
pub struct A2a {
    base: reqwest::Url,
    stream: bool,
    timeout: Duration,
    http: reqwest::Client,
    card: tokio::sync::OnceCell<Card>,
    sandbox: Sandbox,
}

impl A2a {
    /// From a participant's settings; the error names the setting.
    pub fn from_spec(spec: &Value, sandbox: &Sandbox) -> Result<A2a, String> {
        let spec: A2aSpec = settings(spec, "url")?;
        let mut base =
            reqwest::Url::parse(&spec.url).map_err(|e| format!("url: not a URL ({e})"))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err("url: http or https".into());
        }
        sandbox.check_url(&base).map_err(|e| format!("url: {e}"))?;
        if !base.path().ends_with('/') {
            base.set_path(&format!("{}/", base.path()));
        }
        let timeout = match &spec.timeout {
            Some(t) => duration_in(
                "timeout",
                t,
                Duration::from_millis(1),
                Duration::from_secs(3600),
            )?,
            None => Duration::from_secs(60),
        };
        let http = sandbox
            .http_client(reqwest::Client::builder().connect_timeout(Duration::from_secs(10)))
            .map_err(|e| format!("url: {e}"))?;
        Ok(A2a {
            sandbox: sandbox.clone(),
            base,
            stream: spec.stream,
            timeout,
            http,
            card: tokio::sync::OnceCell::new(),
        })
    }

    /// Reads and checks the Agent Card (once).
    async fn card(&self) -> Result<&Card, AgentError> {
        self.card
            .get_or_try_init(|| async {
                let at = self
                    .base
                    .join(".well-known/agent-card.json")
                    .map_err(|e| e.to_string())?;
                let r = self
                    .http
                    .get(at.clone())
                    .timeout(self.timeout)
                    .send()
                    .await
                    .map_err(|e| format!("could not read the agent card at {at}: {e}"))?;
                if !r.status().is_success() {
                    return Err(format!(
                        "could not read the agent card at {at}: HTTP {}",
                        r.status()
                    ));
                }
                let card: Value = r
                    .json()
                    .await
                    .map_err(|e| format!("the agent card at {at} is not JSON: {e}"))?;
                let card = check_card(&card, &at)?;
                // The card names where to talk: held to the same allow-list as the card's URL.
                self.sandbox
                    .check_url(&card.endpoint)
                    .map_err(|e| format!("the agent card of {:?}: {e}", card.name))?;
                Ok(card)
            })
            .await
            .map_err(Into::into)
    }
}

/// Checks an Agent Card: a name, and a JSON-RPC interface of A2A 1.x.
fn check_card(card: &Value, at: &reqwest::Url) -> Result<Card, String> {
    let name = card
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("the agent card at {at} has no name"))?;
    let interfaces = card
        .get("supportedInterfaces")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let jsonrpc = interfaces.iter().find(|i| {
        i.get("protocolBinding").and_then(Value::as_str) == Some("JSONRPC")
            && i.get("protocolVersion")
                .and_then(Value::as_str)
                .is_none_or(|v| v.starts_with("1."))
    });
    let Some(url) = jsonrpc.and_then(|i| i.get("url")).and_then(Value::as_str) else {
        return Err(format!(
            "the agent card of {name:?} at {at} offers no JSON-RPC interface of A2A 1.x (supportedInterfaces: {})",
            json!(interfaces)
        ));
    };
    let endpoint = at
        .join(url)
        .map_err(|e| format!("the agent card of {name:?}: interface url {url:?}: {e}"))?;
    let streaming = card
        .pointer("/capabilities/streaming")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(Card {
        name: name.to_string(),
        endpoint,
        streaming,
    })
}

/// The text of an A2A message's (or artifact's) parts.
fn parts_text(v: Option<&Value>) -> String {
    v.and_then(|m| m.get("parts"))
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("")
        })
        .unwrap_or_default()
}

/// Where the remote task stands after the events seen so far.
#[derive(Debug, Default)]
struct Progress {
    task_id: Option<String>,
    context_id: Option<String>,
    state: Option<String>,
    /// The latest status message's text.
    status_text: String,
    /// The artifacts' text so far.
    artifacts: String,
    /// A direct message answer (no task).
    message: Option<String>,
}

impl Progress {
    /// Takes one result (`task`, `message`, `statusUpdate`, `artifactUpdate`); the text to post
    /// as progress, if any.
    fn take(&mut self, result: &Value) -> Option<String> {
        if let Some(t) = result.get("task") {
            self.task_id = t.get("id").and_then(Value::as_str).map(str::to_string);
            self.context_id = t
                .get("contextId")
                .and_then(Value::as_str)
                .map(str::to_string);
            self.status(t.get("status"));
            for a in t
                .get("artifacts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                self.artifacts.push_str(&parts_text(Some(a)));
            }
            return None;
        }
        if let Some(m) = result.get("message") {
            self.message = Some(parts_text(Some(m)));
            return None;
        }
        if let Some(u) = result.get("statusUpdate") {
            if let Some(id) = u.get("taskId").and_then(Value::as_str) {
                self.task_id = Some(id.to_string());
            }
            if let Some(id) = u.get("contextId").and_then(Value::as_str) {
                self.context_id = Some(id.to_string());
            }
            self.status(u.get("status"));
            return (!self.settled() && !self.status_text.is_empty())
                .then(|| self.status_text.clone());
        }
        if let Some(u) = result.get("artifactUpdate") {
            let text = parts_text(u.get("artifact"));
            self.artifacts.push_str(&text);
            return (!text.is_empty()).then_some(text);
        }
        None
    }

    fn status(&mut self, status: Option<&Value>) {
        let Some(s) = status else { return };
        if let Some(state) = s.get("state").and_then(Value::as_str) {
            self.state = Some(state.to_string());
        }
        let text = parts_text(s.get("message"));
        if !text.is_empty() {
            self.status_text = text;
        }
    }

    fn settled(&self) -> bool {
        self.message.is_some()
            || matches!(
                self.state.as_deref(),
                Some(
                    "TASK_STATE_INPUT_REQUIRED"
                        | "TASK_STATE_COMPLETED"
                        | "TASK_STATE_FAILED"
                        | "TASK_STATE_REJECTED"
                        | "TASK_STATE_CANCELED"
                        | "TASK_STATE_AUTH_REQUIRED"
                )
            )
    }

    /// The reply, or why there is none.
    fn answer(self, agent: &str) -> Result<Reply, AgentError> {
        let text = match (&self.message, self.state.as_deref()) {
            (Some(m), _) => m.clone(),
            (None, Some("TASK_STATE_INPUT_REQUIRED" | "TASK_STATE_COMPLETED")) => {
                if self.status_text.is_empty() {
                    self.artifacts.clone()
                } else if self.artifacts.is_empty()
                    || self.state.as_deref() == Some("TASK_STATE_INPUT_REQUIRED")
                {
                    self.status_text.clone()
                } else {
                    format!("{}\n\n{}", self.artifacts, self.status_text)
                }
            }
            (None, Some(state)) => {
                return Err(format!(
                    "the remote agent {agent} ended its task {} in {state}: {}",
                    self.task_id.as_deref().unwrap_or("?"),
                    self.status_text
                )
                .into())
            }
            (None, None) => {
                return Err(format!("the remote agent {agent} answered no task or message").into())
            }
        };
        let mut m = OutMessage::text(text);
        m.data = Some(json!({"a2a": {
            "agent": agent,
            "taskId": self.task_id,
            "contextId": self.context_id,
            "state": self.state,
        }}));
        Ok(Reply { messages: vec![m] })
    }
}

/// The messages since this participant last spoke, as the text to send.
fn what_to_send(context: &Value, me: &str) -> (String, Option<String>) {
    let tail = context
        .get("tail")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let last_mine = tail
        .iter()
        .rposition(|m| m.get("author").and_then(Value::as_str) == Some(me));
    // An input-required task of the last turn goes on.
    let open_task = last_mine.and_then(|i| {
        let a = tail[i].pointer("/data/a2a")?;
        (a.get("state").and_then(Value::as_str) == Some("TASK_STATE_INPUT_REQUIRED"))
            .then(|| a.get("taskId").and_then(Value::as_str).map(str::to_string))
            .flatten()
    });
    let since = last_mine.map_or(0, |i| i + 1);
    let new: Vec<&Value> = tail[since..].iter().collect();
    let text = match new.as_slice() {
        [one] => one
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        many => many
            .iter()
            .map(|m| {
                format!(
                    "{}: {}",
                    m.get("author").and_then(Value::as_str).unwrap_or("?"),
                    m.get("text").and_then(Value::as_str).unwrap_or("")
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
    };
    (text, open_task)
}

#[async_trait]
impl Execute for A2a {
    fn kind(&self) -> &'static str {
        "a2a"
    }

    async fn execute(&self, ctx: &AgentContext, context: Value) -> Result<Reply, AgentError> {
        let card = self.card().await?;
        let (text, task_id) = what_to_send(&context, &ctx.agent_id);
        let mut message = json!({
            "messageId": format!("{}.t{}", ctx.conversation_id, ctx.turn),
            "contextId": ctx.conversation_id,
            "role": "ROLE_USER",
            "parts": [{"text": text}],
        });
        if let Some(t) = task_id {
            message["taskId"] = json!(t);
        }
        // The mode the turn asks for, and the document it asks for, travel as the message's
        // metadata; the answer is shaped into the declared plan or deliverable afterwards.
        if let Some(mode) = context
            .get("mode")
            .filter(|m| m.as_str() != Some("converse"))
        {
            message["metadata"] = json!({"mode": mode, "output": context.get("output")});
        }
        let streaming = self.stream && card.streaming;
        let method = if streaming {
            "SendStreamingMessage"
        } else {
            "SendMessage"
        };
        let body =
            json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": {"message": message}});
        let timeout = self
            .timeout
            .min(ctx.remaining().max(Duration::from_millis(1)));
        let mut r = self
            .http
            .post(card.endpoint.clone())
            .header("A2A-Version", "1.0")
            .json(&body)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| format!("the remote agent {} at {}: {e}", card.name, card.endpoint))?;
        if !r.status().is_success() {
            return Err(format!(
                "the remote agent {} answered HTTP {}",
                card.name,
                r.status()
            )
            .into());
        }
        let mut progress = Progress::default();
        let rpc_result = |v: Value| -> Result<Value, AgentError> {
            if let Some(e) = v.get("error") {
                return Err(format!("the remote agent {} refused: {e}", card.name).into());
            }
            v.get("result").cloned().ok_or_else(|| {
                format!("the remote agent {} answered no result: {v}", card.name).into()
            })
        };
        if !streaming {
            let v: Value = r
                .json()
                .await
                .map_err(|e| format!("the remote agent {}: not JSON: {e}", card.name))?;
            progress.take(&rpc_result(v)?);
            return progress.answer(&card.name);
        }
        // Server-sent events: each `data:` line is one JSON-RPC response.
        let mut buf = String::new();
        while let Some(chunk) = r
            .chunk()
            .await
            .map_err(|e| format!("the remote agent {}: the stream broke: {e}", card.name))?
        {
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find('\n') {
                let line: String = buf.drain(..=end).collect();
                let Some(data) = line.trim_end().strip_prefix("data:") else {
                    continue;
                };
                let v: Value = serde_json::from_str(data.trim())
                    .map_err(|e| format!("the remote agent {}: a bad event: {e}", card.name))?;
                if let Some(update) = progress.take(&rpc_result(v)?) {
                    ctx.post(MessagePayload::text(update), Finality::None)
                        .await?;
                }
            }
            if progress.settled() {
                break;
            }
        }
        progress.answer(&card.name)
    }

    /// A remote agent's document is the text it answered (its `data` holds the task's state).
    fn document_content(&self, m: &OutMessage) -> Result<Option<Value>, AgentError> {
        Ok(Some(Value::String(m.text.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_card_must_offer_json_rpc_of_a2a_1() {
        let at = reqwest::Url::parse("http://127.0.0.1:1/.well-known/agent-card.json").unwrap();
        let good = json!({"name": "echo", "supportedInterfaces": [{"url": "http://127.0.0.1:1/", "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}], "capabilities": {"streaming": true}});
        let c = check_card(&good, &at).unwrap();
        assert!(c.streaming);
        assert_eq!(c.endpoint.as_str(), "http://127.0.0.1:1/");
        let grpc = json!({"name": "g", "supportedInterfaces": [{"url": "x", "protocolBinding": "GRPC", "protocolVersion": "1.0"}]});
        assert!(check_card(&grpc, &at)
            .unwrap_err()
            .contains("no JSON-RPC interface"));
        let old = json!({"name": "o", "supportedInterfaces": [{"url": "x", "protocolBinding": "JSONRPC", "protocolVersion": "0.3"}]});
        assert!(check_card(&old, &at).is_err());
        assert!(check_card(&json!({}), &at).unwrap_err().contains("no name"));
    }

    #[test]
    fn streamed_updates_are_progress_and_input_required_is_the_answer() {
        let mut p = Progress::default();
        assert_eq!(p.take(&json!({"task": {"id": "t1", "contextId": "c", "status": {"state": "TASK_STATE_SUBMITTED"}}})), None);
        let working = json!({"statusUpdate": {"taskId": "t1", "status": {"state": "TASK_STATE_WORKING", "message": {"parts": [{"text": "thinking"}]}}}});
        assert_eq!(p.take(&working).as_deref(), Some("thinking"));
        let asks = json!({"statusUpdate": {"taskId": "t1", "status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {"parts": [{"text": "echo: hi"}]}}}});
        assert_eq!(p.take(&asks), None);
        assert!(p.settled());
        let reply = p.answer("echo").unwrap();
        assert_eq!(reply.messages[0].text, "echo: hi");
        assert_eq!(
            reply.messages[0].data.as_ref().unwrap()["a2a"]["taskId"],
            "t1"
        );
        let mut failed = Progress::default();
        failed.take(&json!({"task": {"id": "t2", "status": {"state": "TASK_STATE_FAILED", "message": {"parts": [{"text": "boom"}]}}}}));
        assert!(failed
            .answer("echo")
            .unwrap_err()
            .to_string()
            .contains("TASK_STATE_FAILED: boom"));
    }
}
