//! `llm`: a model behind any OpenAI-compatible chat-completions endpoint (OpenAI, OpenRouter,
//! vLLM, llama.cpp's server, Ollama).
//!
//! The system prompt and the assembled context become chat messages: the tail as turns (the
//! agent's own messages as `assistant`, the others' as `user`, prefixed with their author), the
//! other sources as one system message of JSON. Streamed deltas are posted as progress
//! messages (finality `none`, the text so far, at most every 200 ms); the final text closes the
//! turn. With `structured: true` the model is asked for a structured object (`response_text`,
//! `tools_to_invoke`, `create_messages`), which is repaired when slightly off (code fences,
//! text around it, trailing commas) and posted: the text, then each extra message, then one
//! `tool.request.v1` message per tool, addressed to the tool's participant. Every call is traced
//! with the model, token counts, latency and status; 429 and 5xx are retried with backoff.
//!
//! ```yaml
//! - id: assistant
//!   kind: llm
//!   baseUrl: https://api.openai.com/v1
//!   model: gpt-4o-mini
//!   apiKeyEnv: OPENAI_API_KEY
//!   system: You are a careful assistant.
//!   structured: true
//!   tools: [{ name: add, participant: calculator, description: "add two numbers" }]
//! ```

use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use proto_spec::Finality;
use serde::Deserialize;
use serde_json::{json, Value};

use super::execute::{Execute, OutMessage, Reply};
use super::sandbox::Sandbox;
use super::settings::{duration_in, settings};
use agent_sdk::{AgentContext, AgentError};
use proto_spec::document::TOOL_REQUEST_SCHEMA;

/// How often streamed progress is posted, at most.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// A tool the model may ask for, and the participant that runs it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolSpec {
    /// The tool's name, as the model writes it in `tools_to_invoke`.
    pub name: String,
    /// The participant the request is addressed to.
    pub participant: String,
    /// What it does (told to the model).
    #[serde(default)]
    pub description: String,
}

/// The `llm` settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LlmSpec {
    /// The API's base URL, up to `/v1`.
    pub base_url: String,
    /// The model name.
    pub model: String,
    /// The environment variable holding the API key (none: no `Authorization` header).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// The system prompt.
    #[serde(default)]
    pub system: String,
    /// Stream the answer (default true).
    #[serde(default = "yes")]
    pub stream: bool,
    /// Ask for the structured output (`response_text`, `tools_to_invoke`, …).
    #[serde(default)]
    pub structured: bool,
    /// Tools the model may invoke (with `structured`).
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// The most tokens to generate.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// One call's timeout (default 60s; never past the turn's deadline).
    #[serde(default)]
    pub timeout: Option<String>,
    /// Attempts after the first on 429, 5xx or a failed connection (default 2).
    #[serde(default = "two")]
    pub retries: u32,
}

fn yes() -> bool {
    true
}

fn two() -> u32 {
    2
}

/// The `llm` step.
#[derive(Debug, Clone)]
pub struct Llm {
    spec: LlmSpec,
    timeout: Duration,
    client: reqwest::Client,
    sandbox: Sandbox,
}

impl Llm {
    /// From a participant's settings; the error names the setting.
    pub fn from_spec(spec: &Value, sandbox: &Sandbox) -> Result<Llm, String> {
        let spec: LlmSpec = settings(spec, "model")?;
        let url =
            reqwest::Url::parse(&spec.base_url).map_err(|e| format!("baseUrl: not a URL ({e})"))?;
        sandbox
            .check_url(&url)
            .map_err(|e| format!("baseUrl: {e}"))?;
        if let Some(var) = &spec.api_key_env {
            sandbox
                .check_env(var)
                .map_err(|e| format!("apiKeyEnv: {e}"))?;
        }
        if spec.model.trim().is_empty() {
            return Err("model: a model name is required".into());
        }
        if !spec.tools.is_empty() && !spec.structured {
            return Err(
                "tools: tools need structured: true (the model names them in tools_to_invoke)"
                    .into(),
            );
        }
        let timeout = match &spec.timeout {
            Some(t) => duration_in(
                "timeout",
                t,
                Duration::from_millis(1),
                Duration::from_secs(1800),
            )?,
            None => Duration::from_secs(60),
        };
        let client = sandbox
            .http_client(reqwest::Client::builder())
            .map_err(|e| format!("baseUrl: the HTTP client could not be built ({e})"))?;
        Ok(Llm {
            spec,
            timeout,
            client,
            sandbox: sandbox.clone(),
        })
    }

    fn messages(&self, me: &str, context: &Value) -> Vec<Value> {
        let mut system = self.spec.system.clone();
        if self.spec.structured {
            let tools: Vec<Value> = self
                .spec
                .tools
                .iter()
                .map(|t| json!({"name": t.name, "description": t.description}))
                .collect();
            system.push_str(&format!(
                "\n\nAnswer with one JSON object: {{\"response_text\": string, \"tools_to_invoke\": [{{\"tool\": name, \"args\": object}}], \"create_messages\": [{{\"text\": string}}]}}. Tools you may invoke: {}.",
                Value::Array(tools)
            ));
        }
        if let Some(ask) = crate::modes::instructions(context) {
            system.push_str("\n\n");
            system.push_str(&ask);
        }
        let mut out = vec![json!({"role": "system", "content": system.trim()})];
        let mut sources = context.clone();
        if let Some(o) = sources.as_object_mut() {
            for own in ["tail", "mode", "output"] {
                o.remove(own);
            }
            if !o.is_empty() {
                out.push(
                    json!({"role": "system", "content": format!("Context sources:\n{sources}")}),
                );
            }
        }
        for m in context["tail"].as_array().into_iter().flatten() {
            let text = m["text"].as_str().unwrap_or_default();
            let author = m["author"].as_str().unwrap_or_default();
            if author == me {
                out.push(json!({"role": "assistant", "content": text}));
            } else {
                let mut content = format!("{author}: {text}");
                if let Some(d) = m.get("data") {
                    content.push_str(&format!("\n(data: {d})"));
                }
                out.push(json!({"role": "user", "content": content}));
            }
        }
        out
    }

    fn key(&self) -> Result<Option<String>, AgentError> {
        match &self.spec.api_key_env {
            None => Ok(None),
            Some(var) => self
                .sandbox
                .read_env(var)
                .map(Some)
                .map_err(|e| format!("llm: the API key: {e}").into()),
        }
    }

    /// One call; the final text and usage. Streams progress into the turn.
    async fn call(&self, ctx: &AgentContext, body: &Value) -> Result<Outcome, CallError> {
        let url = format!(
            "{}/chat/completions",
            self.spec.base_url.trim_end_matches('/')
        );
        let mut req = self
            .client
            .post(&url)
            .timeout(self.timeout.min(ctx.remaining()))
            .json(body);
        if let Some(k) = self.key().map_err(CallError::Fatal)? {
            req = req.bearer_auth(k);
        }
        let resp = req.send().await.map_err(|e| {
            if e.is_connect() || e.is_timeout() {
                CallError::Retry(None, format!("llm: {url} could not be reached: {e}"))
            } else {
                CallError::Fatal(format!("llm: the request to {url} failed: {e}").into())
            }
        })?;
        let status = resp.status();
        if !status.is_success() {
            let text = resp.text().await.unwrap_or_default();
            return Err(self.refused(status, &text));
        }
        // A server may answer a streaming request with one JSON body; read it as such.
        let event_stream = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        if !self.spec.stream || !event_stream {
            let v: Value = resp.json().await.map_err(|e| {
                CallError::Fatal(format!("llm: the answer is not JSON: {e}").into())
            })?;
            let text = v["choices"][0]["message"]["content"]
                .as_str()
                .ok_or_else(|| {
                    CallError::Fatal("llm: the answer has no choices[0].message.content".into())
                })?
                .to_string();
            return Ok(Outcome {
                text,
                usage: v.get("usage").cloned(),
                status: status.as_u16(),
            });
        }
        self.read_stream(ctx, resp).await
    }

    /// The error for an answer that is not a success: retried on 429 and 5xx.
    fn refused(&self, status: reqwest::StatusCode, text: &str) -> CallError {
        let detail = serde_json::from_str::<Value>(text)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| text.chars().take(300).collect());
        let msg = match status.as_u16() {
            401 | 403 => format!("llm: the endpoint refused the API key ({status}): {detail}"),
            404 => format!(
                "llm: model {:?} or the endpoint was not found ({status}): {detail}",
                self.spec.model
            ),
            _ => format!("llm: the endpoint answered {status}: {detail}"),
        };
        if status.as_u16() == 429 || status.is_server_error() {
            CallError::Retry(Some(status.as_u16()), msg)
        } else {
            CallError::Status(status.as_u16(), msg)
        }
    }

    /// Reads a streamed answer (server-sent events), posting the text so far as progress.
    async fn read_stream(
        &self,
        ctx: &AgentContext,
        resp: reqwest::Response,
    ) -> Result<Outcome, CallError> {
        let status = resp.status();
        let mut text = String::new();
        let mut usage = None;
        let mut buf = String::new();
        let mut last_progress = Instant::now();
        let mut progress_len = 0;
        let mut stream = resp.bytes_stream();
        'read: while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| {
                CallError::Retry(Some(status.as_u16()), format!("llm: the stream broke: {e}"))
            })?;
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(i) = buf.find('\n') {
                let line = buf[..i].trim().to_string();
                buf.drain(..=i);
                let Some(data) = line.strip_prefix("data:") else {
                    continue;
                };
                let data = data.trim();
                if data == "[DONE]" {
                    break 'read;
                }
                let Ok(v) = serde_json::from_str::<Value>(data) else {
                    continue;
                };
                if let Some(d) = v["choices"][0]["delta"]["content"].as_str() {
                    text.push_str(d);
                }
                if v.get("usage").is_some_and(|u| !u.is_null()) {
                    usage = v.get("usage").cloned();
                }
            }
            if !self.spec.structured
                && text.len() > progress_len
                && last_progress.elapsed() >= PROGRESS_EVERY
            {
                let _ = ctx.say(text.clone(), Finality::None).await;
                progress_len = text.len();
                last_progress = Instant::now();
            }
        }
        Ok(Outcome {
            text,
            usage,
            status: status.as_u16(),
        })
    }
}

struct Outcome {
    text: String,
    usage: Option<Value>,
    status: u16,
}

enum CallError {
    /// Worth another attempt (429, 5xx, unreachable).
    Retry(Option<u16>, String),
    /// An HTTP answer that another attempt will not change.
    Status(u16, String),
    /// Anything else.
    Fatal(AgentError),
}

/// Reads a structured answer, repairing common slips: code fences, text around the
/// object, trailing commas.
pub fn parse_structured(text: &str) -> Result<Value, String> {
    let mut t = text.trim();
    if let Some(rest) = t.strip_prefix("```") {
        t = rest.trim_start_matches(|c: char| c.is_ascii_alphabetic());
        t = t.trim_end().trim_end_matches("```");
    }
    let (start, end) = match (t.find('{'), t.rfind('}')) {
        (Some(s), Some(e)) if e > s => (s, e),
        _ => {
            return Err(format!(
                "no JSON object in the model's answer: {}",
                text.chars().take(200).collect::<String>()
            ))
        }
    };
    let candidate = &t[start..=end];
    if let Ok(v) = serde_json::from_str::<Value>(candidate) {
        return Ok(v);
    }
    // Drop commas before a closing bracket, outside strings.
    let mut out = String::with_capacity(candidate.len());
    let mut in_str = false;
    let mut escaped = false;
    let chars: Vec<char> = candidate.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        if in_str {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
            }
            continue;
        }
        if c == '"' {
            in_str = true;
        }
        if c == ',' {
            let next = chars[i + 1..].iter().find(|x| !x.is_whitespace());
            if matches!(next, Some('}') | Some(']')) {
                continue;
            }
        }
        out.push(c);
    }
    serde_json::from_str(&out).map_err(|e| format!("the model's JSON could not be repaired: {e}"))
}

#[async_trait]
impl Execute for Llm {
    fn kind(&self) -> &'static str {
        "llm"
    }

    async fn execute(&self, ctx: &AgentContext, context: Value) -> Result<Reply, AgentError> {
        let mut body = json!({
            "model": self.spec.model,
            "messages": self.messages(&ctx.agent_id, &context),
            "stream": self.spec.stream,
        });
        if self.spec.stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        if self.spec.structured {
            body["response_format"] = json!({"type": "json_object"});
        }
        if let Some(t) = self.spec.temperature {
            body["temperature"] = json!(t);
        }
        if let Some(m) = self.spec.max_tokens {
            body["max_tokens"] = json!(m);
        }
        let mut attempt = 0u32;
        let outcome = loop {
            let started = Instant::now();
            let r = self.call(ctx, &body).await;
            let (status, error) = match &r {
                Ok(o) => (Some(o.status), None),
                Err(CallError::Retry(s, m)) => (*s, Some(m.clone())),
                Err(CallError::Status(s, m)) => (Some(*s), Some(m.clone())),
                Err(CallError::Fatal(e)) => (None, Some(e.to_string())),
            };
            let usage = r
                .as_ref()
                .ok()
                .and_then(|o| o.usage.clone())
                .unwrap_or(Value::Null);
            let _ = ctx
                .post_trace(json!({
                    "type": "llm_call",
                    "model": self.spec.model,
                    "attempt": attempt + 1,
                    "status": status,
                    "latencyMs": started.elapsed().as_millis() as u64,
                    "promptTokens": usage["prompt_tokens"],
                    "completionTokens": usage["completion_tokens"],
                    "error": error,
                }))
                .await;
            match r {
                Ok(o) => break o,
                Err(CallError::Retry(_, msg)) => {
                    let backoff = Duration::from_millis(250 * (1 << attempt.min(6)));
                    if attempt >= self.spec.retries || backoff >= ctx.remaining() {
                        return Err(msg.into());
                    }
                    tokio::time::sleep(backoff).await;
                    attempt += 1;
                }
                Err(CallError::Status(_, msg)) => return Err(msg.into()),
                Err(CallError::Fatal(e)) => return Err(e),
            }
        };
        if !self.spec.structured {
            return Ok(Reply {
                messages: vec![OutMessage::text(outcome.text)],
            });
        }
        self.structured_reply(ctx, &outcome.text)
    }
}

impl Llm {
    /// The messages of a structured answer (repaired): its text, the
    /// messages it creates, and a `tool.request.v1` to each declared tool it asks for.
    fn structured_reply(&self, ctx: &AgentContext, answer: &str) -> Result<Reply, AgentError> {
        let v = parse_structured(answer).map_err(|e| format!("llm: {e}"))?;
        let mut messages = Vec::new();
        if let Some(t) = v["response_text"].as_str().filter(|t| !t.is_empty()) {
            messages.push(OutMessage::text(t));
        }
        for m in v["create_messages"].as_array().into_iter().flatten() {
            if let Some(t) = m["text"].as_str() {
                let mut out = OutMessage::text(t);
                out.data = m.get("data").cloned();
                messages.push(out);
            }
        }
        for (i, call) in v["tools_to_invoke"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let name = call["tool"].as_str().unwrap_or_default();
            let Some(tool) = self.spec.tools.iter().find(|t| t.name == name) else {
                return Err(format!(
                    "llm: the model asked for tool {name:?}, which is not declared"
                )
                .into());
            };
            let mut out = OutMessage::text(format!("{} {}", tool.name, call["args"]));
            out.schema = Some(TOOL_REQUEST_SCHEMA.into());
            out.data = Some(json!({
                "tool": tool.name,
                "args": call.get("args").cloned().unwrap_or(json!({})),
                "requestId": format!("{}-t{}-{i}", ctx.conversation_id, ctx.turn),
            }));
            out.to = vec![tool.participant.clone()];
            messages.push(out);
        }
        if messages.is_empty() {
            return Err(
                "llm: the structured answer had no response_text, messages or tools".into(),
            );
        }
        Ok(Reply { messages })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_answers_are_repaired() {
        let v = parse_structured("```json\n{\"response_text\": \"hi\", \"tools_to_invoke\": [{\"tool\": \"add\", \"args\": {\"a\": 1,}},],}\n```").unwrap();
        assert_eq!(v["response_text"], "hi");
        assert_eq!(v["tools_to_invoke"][0]["args"], json!({"a": 1}));
        let v = parse_structured("Sure! {\"response_text\": \"a, }\"} hope that helps").unwrap();
        assert_eq!(v["response_text"], "a, }");
        assert!(parse_structured("no json here").is_err());
    }

    #[test]
    fn settings_are_checked_with_the_field_named() {
        assert!(Llm::from_spec(
            &json!({"kind": "llm", "baseUrl": "http://127.0.0.1:1/v1", "model": "m"}),
            &crate::sandbox::loopback()
        )
        .is_ok());
        let e = Llm::from_spec(
            &json!({"baseUrl": "nope", "model": "m"}),
            &crate::sandbox::loopback(),
        )
        .unwrap_err();
        assert!(e.starts_with("baseUrl:"), "{e}");
        let e = Llm::from_spec(
            &json!({"baseUrl": "http://x/v1"}),
            &crate::sandbox::loopback(),
        )
        .unwrap_err();
        assert!(e.starts_with("model:"), "{e}");
        let e = Llm::from_spec(&json!({"baseUrl": "http://x/v1", "model": "m", "tools": [{"name": "a", "participant": "b"}]}), &crate::sandbox::loopback()).unwrap_err();
        assert!(e.starts_with("tools:"), "{e}");
        let e = Llm::from_spec(
            &json!({"baseUrl": "http://x/v1", "model": "m", "temprature": 1}),
            &crate::sandbox::loopback(),
        )
        .unwrap_err();
        assert!(e.starts_with("temprature:"), "{e}");
    }
}
