//! `http`: an agent that is an HTTP API call.
//!
//! Each turn renders a request from the assembled context, sends it, and maps the response to
//! a message by JSON path. Header values are plain text, or `{env: NAME, prefix?}` read from the
//! environment at each call (secrets never sit in a scenario). Retries with backoff on 429, 5xx
//! and connection failures while the turn's deadline allows; every attempt is traced with its
//! HTTP status.
//!
//! ```yaml
//! - id: weather
//!   kind: http
//!   endpoint: http://127.0.0.1:8080/forecast
//!   method: POST
//!   headers: { Authorization: { env: WEATHER_TOKEN, prefix: "Bearer " } }
//!   body: { city: "{{$.last.data.city}}", question: "Weather in {{$.last.text}}?" }
//!   response: { text: "$.summary", data: "$.forecast" }
//!   timeout: 10s
//!   retries: 2
//! ```
//!
//! In templates, `"{{PATH}}"` alone is replaced by the value at PATH (any JSON type), and
//! `{{PATH}}` inside a longer string by its text. Paths start at `$`, the context object, which
//! also has `last`: the newest message of the tail.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use proto_spec::scenario::{json_path, valid_path};
use serde::Deserialize;
use serde_json::{json, Value};

use super::execute::{Execute, OutMessage, Reply};
use super::sandbox::Sandbox;
use super::settings::{duration_in, settings};
use agent_sdk::{AgentContext, AgentError};

/// A header value: text, or read from the environment.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum HeaderValue {
    /// Plain text (for what is not secret).
    Text(String),
    /// `{env: NAME, prefix?}`: the variable's value, after the prefix.
    Env {
        /// The environment variable.
        env: String,
        /// Text before the value, such as `Bearer `.
        #[serde(default)]
        prefix: String,
    },
}

/// How the response becomes a message.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResponseMap {
    /// The path of the message's text (default: the whole body, as text).
    #[serde(default)]
    pub text: Option<String>,
    /// The path of the message's data (default: none).
    #[serde(default)]
    pub data: Option<String>,
    /// The message's schema.
    #[serde(default)]
    pub schema: Option<String>,
}

/// The `http` settings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpSpec {
    /// The URL (http or https).
    pub endpoint: String,
    /// `GET`, `POST`, `PUT`, `PATCH` or `DELETE` (default `POST`).
    #[serde(default = "default_method")]
    pub method: String,
    /// Request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, HeaderValue>,
    /// The JSON body template (none for `GET`).
    #[serde(default)]
    pub body: Option<Value>,
    /// The response mapping.
    #[serde(default)]
    pub response: ResponseMap,
    /// One attempt's timeout, such as `10s` (default 30 s; never past the turn's deadline).
    #[serde(default)]
    pub timeout: Option<String>,
    /// Attempts after the first, on 429, 5xx or a failed connection (default 2).
    #[serde(default = "default_retries")]
    pub retries: u32,
}

fn default_method() -> String {
    "POST".into()
}

fn default_retries() -> u32 {
    2
}

/// The `http` step.
#[derive(Debug, Clone)]
pub struct Http {
    spec: HttpSpec,
    method: reqwest::Method,
    timeout: Duration,
    client: reqwest::Client,
    sandbox: Sandbox,
}

/// Writes milliseconds in the largest unit that divides them (`250ms`, `30s`, `5m`, `2h`).
pub use proto_spec::scenario::show_ms;

/// Checks that every `{{PATH}}` of a template is a JSON path from `$`; the error names `field`.
pub fn check_template(field: &str, v: &Value) -> Result<(), String> {
    let mut paths = Vec::new();
    template_paths(v, &mut paths);
    match paths.iter().find(|p| !valid_path(p)) {
        Some(bad) => Err(format!("{field}: {{{{{bad}}}}} is not a JSON path from $")),
        None => Ok(()),
    }
}

fn template_paths(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => {
            let mut rest = s.as_str();
            while let Some(i) = rest.find("{{") {
                let Some(j) = rest[i..].find("}}") else { break };
                out.push(rest[i + 2..i + j].trim().to_string());
                rest = &rest[i + j + 2..];
            }
        }
        Value::Array(a) => a.iter().for_each(|x| template_paths(x, out)),
        Value::Object(o) => o.values().for_each(|x| template_paths(x, out)),
        _ => {}
    }
}

/// Renders a template against `scope`.
pub fn render(template: &Value, scope: &Value) -> Value {
    match template {
        Value::String(s) => {
            let t = s.trim();
            if t.starts_with("{{") && t.ends_with("}}") && t.matches("{{").count() == 1 {
                let path = t[2..t.len() - 2].trim();
                return json_path(scope, path).cloned().unwrap_or(Value::Null);
            }
            let mut out = String::new();
            let mut rest = s.as_str();
            while let Some(i) = rest.find("{{") {
                let Some(j) = rest[i..].find("}}") else { break };
                out.push_str(&rest[..i]);
                let path = rest[i + 2..i + j].trim();
                match json_path(scope, path) {
                    Some(Value::String(x)) => out.push_str(x),
                    Some(Value::Null) | None => {}
                    Some(other) => out.push_str(&other.to_string()),
                }
                rest = &rest[i + j + 2..];
            }
            out.push_str(rest);
            Value::String(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| render(x, scope)).collect()),
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, x)| (k.clone(), render(x, scope)))
                .collect(),
        ),
        other => other.clone(),
    }
}

impl Http {
    /// From a participant's settings; the error names the setting.
    pub fn from_spec(spec: &Value, sandbox: &Sandbox) -> Result<Http, String> {
        let spec: HttpSpec = settings(spec, "endpoint")?;
        let url = reqwest::Url::parse(&spec.endpoint)
            .map_err(|e| format!("endpoint: not a URL ({e})"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("endpoint: an http or https URL".into());
        }
        sandbox
            .check_url(&url)
            .map_err(|e| format!("endpoint: {e}"))?;
        for (name, value) in &spec.headers {
            if let HeaderValue::Env { env, .. } = value {
                sandbox
                    .check_env(env)
                    .map_err(|e| format!("headers.{name}.env: {e}"))?;
            }
        }
        let method = match spec.method.to_ascii_uppercase().as_str() {
            "GET" => reqwest::Method::GET,
            "POST" => reqwest::Method::POST,
            "PUT" => reqwest::Method::PUT,
            "PATCH" => reqwest::Method::PATCH,
            "DELETE" => reqwest::Method::DELETE,
            other => {
                return Err(format!(
                    "method: {other:?} is not GET, POST, PUT, PATCH or DELETE"
                ))
            }
        };
        let timeout = match &spec.timeout {
            Some(t) => duration_in(
                "timeout",
                t,
                Duration::from_millis(1),
                Duration::from_secs(600),
            )?,
            None => Duration::from_secs(30),
        };
        if let Some(b) = &spec.body {
            check_template("body", b)?;
        }
        for (k, p) in [
            ("response.text", &spec.response.text),
            ("response.data", &spec.response.data),
        ] {
            if let Some(p) = p {
                if !valid_path(p) {
                    return Err(format!("{k}: {p:?} is not a JSON path from $"));
                }
            }
        }
        let client = sandbox
            .http_client(reqwest::Client::builder())
            .map_err(|e| format!("endpoint: the HTTP client could not be built ({e})"))?;
        Ok(Http {
            spec,
            method,
            timeout,
            client,
            sandbox: sandbox.clone(),
        })
    }

    fn headers(&self) -> Result<reqwest::header::HeaderMap, AgentError> {
        let mut map = reqwest::header::HeaderMap::new();
        for (name, value) in &self.spec.headers {
            let text = match value {
                HeaderValue::Text(t) => t.clone(),
                HeaderValue::Env { env, prefix } => {
                    let v = self
                        .sandbox
                        .read_env(env)
                        .map_err(|e| format!("http: header {name}: {e}"))?;
                    format!("{prefix}{v}")
                }
            };
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| format!("http: header name {name:?}: {e}"))?;
            let value = reqwest::header::HeaderValue::from_str(&text)
                .map_err(|e| format!("http: header {name} has a value that is not valid: {e}"))?;
            map.insert(name, value);
        }
        Ok(map)
    }
}

#[async_trait]
impl Execute for Http {
    fn kind(&self) -> &'static str {
        "http"
    }

    async fn execute(&self, ctx: &AgentContext, context: Value) -> Result<Reply, AgentError> {
        let mut scope = context;
        let last = scope["tail"].as_array().and_then(|t| t.last()).cloned();
        scope["last"] = last.unwrap_or(Value::Null);
        let body = self.spec.body.as_ref().map(|b| render(b, &scope));
        let headers = self.headers()?;
        let mut attempt = 0u32;
        loop {
            let left = ctx.remaining();
            if left.is_zero() {
                return Err("http: the turn's deadline passed".into());
            }
            let started = std::time::Instant::now();
            let mut req = self
                .client
                .request(self.method.clone(), &self.spec.endpoint)
                .headers(headers.clone())
                .timeout(self.timeout.min(left));
            if let Some(b) = &body {
                req = req.json(b);
            }
            let sent = req.send().await;
            let took_ms = started.elapsed().as_millis() as u64;
            let (status, outcome) = match sent {
                Ok(resp) => {
                    let status = resp.status();
                    let text = resp.text().await.unwrap_or_default();
                    (Some(status.as_u16()), Ok((status, text)))
                }
                Err(e) => (None, Err(e)),
            };
            let _ = ctx
                .post_trace(json!({
                    "type": "http_call",
                    "method": self.method.as_str(),
                    "endpoint": self.spec.endpoint,
                    "attempt": attempt + 1,
                    "status": status,
                    "latencyMs": took_ms,
                }))
                .await;
            let retryable = match &outcome {
                Ok((s, _)) => s.as_u16() == 429 || s.is_server_error(),
                Err(e) => e.is_connect() || e.is_timeout(),
            };
            if retryable && attempt < self.spec.retries {
                let backoff = Duration::from_millis(200 * (1 << attempt.min(6)));
                if backoff < ctx.remaining() {
                    tokio::time::sleep(backoff).await;
                    attempt += 1;
                    continue;
                }
            }
            let (status, text) = outcome.map_err(|e| format!("http: the request failed: {e}"))?;
            if !status.is_success() {
                let excerpt: String = text.chars().take(300).collect();
                return Err(
                    format!("http: {} answered {status}: {excerpt}", self.spec.endpoint).into(),
                );
            }
            return Ok(Reply {
                messages: vec![self.message(&text)?],
            });
        }
    }
}

impl Http {
    fn message(&self, body: &str) -> Result<OutMessage, AgentError> {
        let r = &self.spec.response;
        let parsed: Option<Value> = serde_json::from_str(body).ok();
        let text = match (&r.text, &parsed) {
            (Some(path), Some(v)) => match json_path(v, path) {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => return Err(format!("http: the response has nothing at {path}").into()),
            },
            (Some(path), None) => {
                return Err(
                    format!("http: the response is not JSON, so {path} cannot be read").into(),
                )
            }
            (None, _) => body.to_string(),
        };
        let data = match (&r.data, &parsed) {
            (Some(path), Some(v)) => json_path(v, path).cloned(),
            _ => None,
        };
        let mut m = OutMessage::text(text);
        m.data = data;
        m.schema = r.schema.clone();
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_values_and_text() {
        let scope = json!({"last": {"text": "Paris", "data": {"days": 3}}});
        let t = json!({"city": "{{$.last.text}}", "days": "{{ $.last.data.days }}", "q": "weather in {{$.last.text}} for {{$.last.data.days}} days", "none": "{{$.nothing}}"});
        assert_eq!(
            render(&t, &scope),
            json!({"city": "Paris", "days": 3, "q": "weather in Paris for 3 days", "none": null})
        );
    }

    #[test]
    fn settings_are_checked_with_the_field_named() {
        let ok = Http::from_spec(
            &json!({"kind": "http", "endpoint": "http://127.0.0.1:1/x", "body": {"a": "{{$.last.text}}"}, "timeout": "5s"}),
            &crate::sandbox::loopback(),
        );
        assert!(ok.is_ok());
        let e = Http::from_spec(&json!({"endpoint": "ftp://x"}), &crate::sandbox::loopback())
            .unwrap_err();
        assert!(e.starts_with("endpoint:"), "{e}");
        let e = Http::from_spec(
            &json!({"endpoint": "http://x", "method": "BREW"}),
            &crate::sandbox::loopback(),
        )
        .unwrap_err();
        assert!(e.starts_with("method:"), "{e}");
        let e = Http::from_spec(
            &json!({"endpoint": "http://x", "timeout": "soon"}),
            &crate::sandbox::loopback(),
        )
        .unwrap_err();
        assert!(e.starts_with("timeout:"), "{e}");
        let e = Http::from_spec(
            &json!({"endpoint": "http://x", "body": {"a": "{{last}}"}}),
            &crate::sandbox::loopback(),
        )
        .unwrap_err();
        assert!(e.starts_with("body:"), "{e}");
        let e = Http::from_spec(
            &json!({"endpoint": "http://x", "verb": "GET"}),
            &crate::sandbox::loopback(),
        )
        .unwrap_err();
        assert!(e.starts_with("verb:"), "{e}");
        let e =
            Http::from_spec(&json!({"method": "GET"}), &crate::sandbox::loopback()).unwrap_err();
        assert!(e.starts_with("endpoint:"), "{e}");
    }
}
