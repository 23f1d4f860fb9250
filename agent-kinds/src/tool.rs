//! `tool`: answers `tool.request.v1` messages with `tool.response.v1`, from built-in Rust
//! functions registered by name or from tools on MCP servers (stdio or streamable HTTP).
//!
//! The request is the newest `tool.request.v1` message of the conversation (the default
//! context declares it as `request`); its data is `{tool, args, requestId?}`. The response is
//! addressed to the request's author, carries `{requestSeq, requestId, tool, status, output}`
//! or `{…, status: "error", error}`, and closes the turn. A tool's failure is an answer
//! (`status: error`), not the agent's failure.
//!
//! ```yaml
//! - id: tools
//!   kind: tool
//!   builtins: [calculator]
//!   mcp:
//!     - command: ["python3", "tools_server.py"]
//!     - url: http://127.0.0.1:7310/mcp
//! ```

use std::sync::Arc;

use async_trait::async_trait;
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::{RoleClient, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::Mutex;

use super::context::{ContextSpec, Fetch, SourceSpec};
use super::execute::{Execute, OutMessage, Reply};
use super::sandbox::Sandbox;
use agent_sdk::{AgentContext, AgentError};
use proto_spec::document::TOOL_REQUEST_SCHEMA;

/// The schema of a tool response message.
pub const TOOL_RESPONSE: &str = "tool.response.v1";

/// A built-in function: arguments in, output or an error message out.
pub type Builtin = fn(&Value) -> Result<Value, String>;

/// The built-in functions, by name.
pub fn builtin(name: &str) -> Option<Builtin> {
    match name {
        "calculator" => Some(calculator),
        "echo" => Some(|args| Ok(args.clone())),
        _ => None,
    }
}

/// `calculator`: `{op: add|sub|mul|div, a, b}`, or `{expression: "2 + 3 * 4"}` (numbers, `+ - * /`,
/// parentheses).
fn calculator(args: &Value) -> Result<Value, String> {
    if let Some(expr) = args.get("expression").and_then(Value::as_str) {
        return eval(expr).map(|v| json!(v));
    }
    let num = |k: &str| {
        args.get(k)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("calculator: {k} must be a number"))
    };
    let (a, b) = (num("a")?, num("b")?);
    let v = match args.get("op").and_then(Value::as_str).unwrap_or("add") {
        "add" => a + b,
        "sub" => a - b,
        "mul" => a * b,
        "div" if b == 0.0 => return Err("calculator: division by zero".into()),
        "div" => a / b,
        other => {
            return Err(format!(
                "calculator: unknown op {other:?} (add, sub, mul, div)"
            ))
        }
    };
    Ok(json!(v))
}

/// Evaluates `+ - * /` with parentheses over numbers.
fn eval(expr: &str) -> Result<f64, String> {
    struct P<'a> {
        s: &'a [u8],
        i: usize,
    }
    impl P<'_> {
        fn ws(&mut self) {
            while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
        }
        fn expr(&mut self) -> Result<f64, String> {
            let mut v = self.term()?;
            loop {
                self.ws();
                match self.s.get(self.i) {
                    Some(b'+') => {
                        self.i += 1;
                        v += self.term()?;
                    }
                    Some(b'-') => {
                        self.i += 1;
                        v -= self.term()?;
                    }
                    _ => return Ok(v),
                }
            }
        }
        fn term(&mut self) -> Result<f64, String> {
            let mut v = self.atom()?;
            loop {
                self.ws();
                match self.s.get(self.i) {
                    Some(b'*') => {
                        self.i += 1;
                        v *= self.atom()?;
                    }
                    Some(b'/') => {
                        self.i += 1;
                        let d = self.atom()?;
                        if d == 0.0 {
                            return Err("division by zero".into());
                        }
                        v /= d;
                    }
                    _ => return Ok(v),
                }
            }
        }
        fn atom(&mut self) -> Result<f64, String> {
            self.ws();
            match self.s.get(self.i) {
                Some(b'(') => {
                    self.i += 1;
                    let v = self.expr()?;
                    self.ws();
                    if self.s.get(self.i) != Some(&b')') {
                        return Err("missing )".into());
                    }
                    self.i += 1;
                    Ok(v)
                }
                Some(b'-') => {
                    self.i += 1;
                    Ok(-self.atom()?)
                }
                _ => {
                    let start = self.i;
                    while self.i < self.s.len()
                        && (self.s[self.i].is_ascii_digit() || self.s[self.i] == b'.')
                    {
                        self.i += 1;
                    }
                    std::str::from_utf8(&self.s[start..self.i])
                        .ok()
                        .and_then(|t| t.parse().ok())
                        .ok_or_else(|| format!("a number was expected at {start}"))
                }
            }
        }
    }
    let mut p = P {
        s: expr.as_bytes(),
        i: 0,
    };
    let v = p.expr().map_err(|e| format!("calculator: {e}"))?;
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("calculator: unexpected text at {}", p.i));
    }
    Ok(v)
}

/// Where MCP tools come from.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged, deny_unknown_fields)]
pub enum McpServer {
    /// A server started as a child process, over stdio.
    Stdio {
        /// The program and its arguments.
        command: Vec<String>,
    },
    /// A server over streamable HTTP.
    Http {
        /// Its URL, such as `http://127.0.0.1:7310/mcp`.
        url: String,
    },
}

type Client = RunningService<RoleClient, ()>;

/// The `tool` step.
#[derive(Debug)]
pub struct Tool {
    builtins: Vec<(String, Builtin)>,
    servers: Vec<McpServer>,
    /// Open MCP sessions, by index in `servers`; opened on first use, reopened after a failure.
    sessions: Mutex<Vec<Option<Arc<Client>>>>,
    sandbox: Sandbox,
}

impl Tool {
    /// From a participant's settings; the error names the setting.
    pub fn from_spec(spec: &Value, sandbox: &Sandbox) -> Result<Tool, String> {
        let mut builtins = Vec::new();
        for (i, b) in spec
            .get("builtins")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let name = b.as_str().unwrap_or_default();
            let f = builtin(name).ok_or_else(|| {
                format!("builtins[{i}]: {name:?} is not a built-in tool (calculator, echo)")
            })?;
            builtins.push((name.to_string(), f));
        }
        let servers: Vec<McpServer> = match spec.get("mcp") {
            None => Vec::new(),
            Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
                "mcp: a list of {command: [program, args…]} or {url: …}".to_string()
            })?,
        };
        for (i, s) in servers.iter().enumerate() {
            match s {
                McpServer::Stdio { command } => {
                    if command.is_empty() || command[0].is_empty() {
                        return Err(format!("mcp[{i}].command: the program and its arguments"));
                    }
                }
                McpServer::Http { url } => {
                    let u = reqwest::Url::parse(url)
                        .map_err(|e| format!("mcp[{i}].url: not a URL ({e})"))?;
                    sandbox
                        .check_url(&u)
                        .map_err(|e| format!("mcp[{i}].url: {e}"))?;
                }
            }
        }
        if builtins.is_empty() && servers.is_empty() {
            return Err("builtins: a tool participant needs builtins or mcp servers".into());
        }
        let n = servers.len();
        Ok(Tool {
            builtins,
            servers,
            sessions: Mutex::new(vec![None; n]),
            sandbox: sandbox.clone(),
        })
    }

    /// The context a tool participant reads by default: the newest tool request.
    pub fn default_context() -> ContextSpec {
        ContextSpec {
            tail: 0,
            sources: vec![SourceSpec {
                name: "request".into(),
                conversation: None,
                select: proto_spec::scenario::Selector {
                    schema: Some(TOOL_REQUEST_SCHEMA.into()),
                    ..Default::default()
                },
                fetch: Fetch::Latest,
            }],
            budget: None,
        }
    }

    async fn session(&self, i: usize) -> Result<Arc<Client>, String> {
        let mut sessions = self.sessions.lock().await;
        if let Some(s) = &sessions[i] {
            if !s.is_closed() {
                return Ok(s.clone());
            }
        }
        let client = match &self.servers[i] {
            McpServer::Stdio { command } => {
                // Held like a `process` participant: its own process group (killed with the
                // session), the minimal environment, CPU time and memory limits, the user.
                let cmd = self.sandbox.command(&command[0], &command[1..]);
                let transport = rmcp::transport::TokioChildProcess::new(cmd)
                    .map_err(|e| format!("mcp server {:?} could not start: {e}", command[0]))?;
                ().serve(transport)
                    .await
                    .map_err(|e| format!("mcp server {:?}: {e}", command[0]))?
            }
            McpServer::Http { url } => {
                let client = self.sandbox.mcp_http_client()?;
                let transport = rmcp::transport::StreamableHttpClientTransport::with_client(
                    client,
                    rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                        url.as_str(),
                    ),
                );
                ().serve(transport)
                    .await
                    .map_err(|e| format!("mcp server {url}: {e}"))?
            }
        };
        let client = Arc::new(client);
        sessions[i] = Some(client.clone());
        Ok(client)
    }

    /// Runs a tool: a built-in, or the first MCP server that has it.
    async fn run(&self, name: &str, args: &Value) -> Result<Value, String> {
        if let Some((_, f)) = self.builtins.iter().find(|(n, _)| n == name) {
            return f(args);
        }
        for i in 0..self.servers.len() {
            let client = self.session(i).await?;
            let tools = client
                .list_all_tools()
                .await
                .map_err(|e| format!("mcp: listing tools failed: {e}"))?;
            if !tools.iter().any(|t| t.name == name) {
                continue;
            }
            let arguments = args.as_object().cloned().unwrap_or_default();
            let result = client
                .call_tool(CallToolRequestParams::new(name.to_string()).with_arguments(arguments))
                .await
                .map_err(|e| format!("mcp: calling {name} failed: {e}"))?;
            let text: Vec<String> = result
                .content
                .iter()
                .filter_map(|c| c.as_text().map(|t| t.text.clone()))
                .collect();
            // A tool that returns a plain value gets it wrapped as `{"result": value}` in its
            // structured content (the MCP SDKs do so); the output is the value itself.
            let output = match result.structured_content.clone() {
                Some(Value::Object(o)) if o.len() == 1 && o.contains_key("result") => {
                    o.get("result").cloned().unwrap_or(Value::Null)
                }
                Some(v) => v,
                None => json!(text.join("\n")),
            };
            if result.is_error == Some(true) {
                return Err(format!("{name}: {}", text.join("\n")));
            }
            return Ok(output);
        }
        Err(format!("no tool named {name:?} here"))
    }
}

#[async_trait]
impl Execute for Tool {
    fn kind(&self) -> &'static str {
        "tool"
    }

    async fn execute(&self, _ctx: &AgentContext, context: Value) -> Result<Reply, AgentError> {
        let request = &context["request"];
        if request.is_null() {
            return Ok(Reply::default());
        }
        let data = &request["data"];
        let name = data["tool"].as_str().unwrap_or_default().to_string();
        let args = data.get("args").cloned().unwrap_or(json!({}));
        let outcome = self.run(&name, &args).await;
        let mut body = json!({
            "requestSeq": request["seq"],
            "requestId": data.get("requestId").cloned().unwrap_or(Value::Null),
            "tool": name,
        });
        let text = match outcome {
            Ok(output) => {
                body["status"] = json!("ok");
                let text = match &output {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                body["output"] = output;
                text
            }
            Err(e) => {
                body["status"] = json!("error");
                body["error"] = json!(e);
                format!("error: {e}")
            }
        };
        let mut m = OutMessage::text(text);
        m.schema = Some(TOOL_RESPONSE.into());
        m.data = Some(body);
        if let Some(author) = request["author"].as_str() {
            m.to = vec![author.to_string()];
        }
        Ok(Reply { messages: vec![m] })
    }

    /// A deliverable is the tool's output; a tool that failed delivers nothing (the turn fails
    /// and is retried).
    fn document_content(&self, m: &OutMessage) -> Result<Option<Value>, AgentError> {
        let Some(data) = m
            .data
            .as_ref()
            .filter(|_| m.schema.as_deref() == Some(TOOL_RESPONSE))
        else {
            return Ok(None);
        };
        if data["status"] == "ok" {
            return Ok(Some(data["output"].clone()));
        }
        Err(format!("the tool failed: {}", data["error"].as_str().unwrap_or("?")).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calculator_evaluates_and_refuses() {
        assert_eq!(
            calculator(&json!({"op": "mul", "a": 6, "b": 7})),
            Ok(json!(42.0))
        );
        assert_eq!(
            calculator(&json!({"expression": "2 + 3 * (4 - 1)"})),
            Ok(json!(11.0))
        );
        assert!(calculator(&json!({"op": "div", "a": 1, "b": 0})).is_err());
        assert!(calculator(&json!({"expression": "2 +"})).is_err());
        assert!(
            Tool::from_spec(&json!({"builtins": ["nope"]}), &crate::sandbox::loopback())
                .unwrap_err()
                .starts_with("builtins[0]")
        );
        assert!(Tool::from_spec(&json!({}), &crate::sandbox::loopback())
            .unwrap_err()
            .starts_with("builtins"));
    }
}
