//! The protocol's conformance kit: language-neutral vectors (`vectors/*.json`) and a runner
//! that checks any server against them, over its WebSocket JSON-RPC endpoint and its HTTP
//! routes, and reports per capability tier (core, scenarios, push executors, HTTP).
//!
//! A vector file is `{tier, title, description, cases: [{name, steps, why?}]}`. Each case
//! runs on connections of its own (one per name in `as`: `alice`, or `alice#2` for a second
//! connection with alice's token), opened and authenticated when first used, with fresh
//! conversation ids (`${conv}`, `${conv2}`, …) and the agents' ids as variables (`${alice}`
//! is the id alice's token authenticates as). What a step may do is [`step`]'s to say; what
//! must come back is a pattern (see [`pattern`]).

pub mod conn;
pub mod pattern;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::conn::Conn;
use crate::pattern::{at, check, fill, Vars};

/// The vector files built into the runner, by file name.
pub const EMBEDDED: &[(&str, &str)] = &[
    (
        "core-methods.json",
        include_str!("../vectors/core-methods.json"),
    ),
    (
        "core-errors.json",
        include_str!("../vectors/core-errors.json"),
    ),
    ("core-log.json", include_str!("../vectors/core-log.json")),
    (
        "core-subscriptions.json",
        include_str!("../vectors/core-subscriptions.json"),
    ),
    ("scenarios.json", include_str!("../vectors/scenarios.json")),
    ("push.json", include_str!("../vectors/push.json")),
    ("http.json", include_str!("../vectors/http.json")),
];

/// The capability tiers, in the order the report lists them.
pub const TIERS: &[&str] = &["core", "scenarios", "push", "http"];

/// One vector file.
#[derive(Debug, Clone, Deserialize)]
pub struct VectorFile {
    /// `core`, `scenarios`, `push` or `http`.
    pub tier: String,
    /// What the file covers.
    pub title: String,
    /// The file's name (set when loaded).
    #[serde(skip)]
    pub file: String,
    /// Its cases.
    pub cases: Vec<Case>,
}

/// One case: steps run in order on connections of its own.
#[derive(Debug, Clone, Deserialize)]
pub struct Case {
    /// What it checks.
    pub name: String,
    /// The protocol's rule it checks (PROTOCOL.md's section), for the report.
    #[serde(default)]
    pub why: Option<String>,
    /// The steps.
    pub steps: Vec<Value>,
}

/// Parses vector files: (file name, text).
pub fn parse(files: &[(&str, &str)]) -> Result<Vec<VectorFile>, String> {
    files
        .iter()
        .map(|(name, text)| {
            let mut v: VectorFile =
                serde_json::from_str(text).map_err(|e| format!("{name}: {e}"))?;
            if !TIERS.contains(&v.tier.as_str()) {
                return Err(format!("{name}: unknown tier {:?}", v.tier));
            }
            v.file = (*name).to_string();
            Ok(v)
        })
        .collect()
}

/// The vector files of a directory (`*.json`).
pub fn load_dir(dir: &std::path::Path) -> Result<Vec<VectorFile>, String> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "json") {
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            files.push((name.unwrap_or_default(), text));
        }
    }
    files.sort();
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(n, t)| (n.as_str(), t.as_str()))
        .collect();
    parse(&refs)
}

/// What to check, and where.
#[derive(Debug, Clone)]
pub struct Config {
    /// The server's WebSocket endpoint (`ws://host:port/rpc`).
    pub url: String,
    /// Its HTTP base (`http://host:port`).
    pub http: String,
    /// Tokens by role: `admin` (an admin's), and agents' (`alice`, `bob`, `carol`).
    pub tokens: BTreeMap<String, String>,
    /// The vectors.
    pub vectors: Vec<VectorFile>,
    /// Only these tiers (all when empty).
    pub tiers: Vec<String>,
    /// Only cases whose name contains this.
    pub only: Option<String>,
    /// How long one step may wait for what it expects.
    pub step_timeout: Duration,
}

impl Config {
    /// The HTTP base of a WebSocket URL: `ws://h:p/rpc` → `http://h:p`.
    pub fn http_of(url: &str) -> String {
        let base = url
            .replacen("wss://", "https://", 1)
            .replacen("ws://", "http://", 1);
        base.strip_suffix("/rpc").unwrap_or(&base).to_string()
    }
}

/// How one case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Everything came back as the vector says.
    Pass,
    /// The step (0-based) and what went wrong.
    Fail(usize, String),
    /// Not run, and why (a role with no token).
    Skip(String),
}

/// One case's result.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// Its tier.
    pub tier: String,
    /// Its file.
    pub file: String,
    /// Its name.
    pub name: String,
    /// How it ended.
    pub outcome: Outcome,
    /// How long it took.
    pub elapsed: Duration,
}

/// Every case's result.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// In the order run.
    pub results: Vec<CaseResult>,
}

impl Report {
    /// (passed, failed, skipped) of a tier.
    pub fn tier(&self, tier: &str) -> (usize, usize, usize) {
        let mut counts = (0, 0, 0);
        for r in self.results.iter().filter(|r| r.tier == tier) {
            match r.outcome {
                Outcome::Pass => counts.0 += 1,
                Outcome::Fail(..) => counts.1 += 1,
                Outcome::Skip(_) => counts.2 += 1,
            }
        }
        counts
    }

    /// The cases that failed.
    pub fn failures(&self) -> Vec<&CaseResult> {
        self.results
            .iter()
            .filter(|r| matches!(r.outcome, Outcome::Fail(..)))
            .collect()
    }

    /// The report for people: a line per case, then a line per tier.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for r in &self.results {
            let (mark, note) = match &r.outcome {
                Outcome::Pass => ("pass", String::new()),
                Outcome::Fail(step, why) => ("FAIL", format!("\n       step {}: {why}", step + 1)),
                Outcome::Skip(why) => ("skip", format!(" ({why})")),
            };
            let _ = writeln!(out, "{mark} {:<9} {} — {}{note}", r.tier, r.file, r.name);
        }
        let _ = writeln!(out);
        for tier in TIERS {
            let (p, f, s) = self.tier(tier);
            if p + f + s == 0 {
                continue;
            }
            let verdict = if f == 0 && p > 0 {
                "conforms"
            } else if f > 0 {
                "DOES NOT CONFORM"
            } else {
                "not checked"
            };
            let _ = writeln!(
                out,
                "{tier:<9} {verdict}: {p} passed, {f} failed, {s} skipped"
            );
        }
        out
    }

    /// The report as JSON: `{tiers: {name: {passed, failed, skipped}}, cases: [...]}`.
    pub fn to_json(&self) -> Value {
        let tiers: serde_json::Map<String, Value> = TIERS
            .iter()
            .map(|t| {
                let (p, f, s) = self.tier(t);
                (
                    (*t).to_string(),
                    json!({"passed": p, "failed": f, "skipped": s}),
                )
            })
            .collect();
        let cases: Vec<Value> = self
            .results
            .iter()
            .map(|r| {
                let (outcome, detail) = match &r.outcome {
                    Outcome::Pass => ("pass", Value::Null),
                    Outcome::Fail(step, why) => ("fail", json!({"step": step + 1, "why": why})),
                    Outcome::Skip(why) => ("skip", json!(why)),
                };
                json!({"tier": r.tier, "file": r.file, "name": r.name, "outcome": outcome,
                       "detail": detail, "ms": r.elapsed.as_millis() as u64})
            })
            .collect();
        json!({"tiers": tiers, "cases": cases})
    }
}

/// Runs every case of the configuration, one after another.
pub async fn run(config: &Config) -> Result<Report, String> {
    // The id each token authenticates as (and a token that does not work fails here, once).
    let mut ids = BTreeMap::new();
    for (role, token) in &config.tokens {
        let deadline = Instant::now() + config.step_timeout;
        let mut c = Conn::open(&config.url, config.step_timeout).await?;
        let id = c
            .request("authenticate", Some(json!({ "token": token })))
            .await?;
        let answer = c.answer(id, deadline).await?;
        let agent = at(&answer, "result.agentId")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("the {role} token does not authenticate: {answer}"))?;
        ids.insert(role.clone(), agent.to_string());
        c.close().await;
    }
    let run_id = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    );
    let mut report = Report::default();
    let mut n = 0;
    for file in &config.vectors {
        if !config.tiers.is_empty() && !config.tiers.contains(&file.tier) {
            continue;
        }
        for case in &file.cases {
            if config
                .only
                .as_ref()
                .is_some_and(|o| !case.name.contains(o.as_str()))
            {
                continue;
            }
            n += 1;
            let started = Instant::now();
            let outcome = run_case(config, &ids, &format!("conf-{run_id}-{n}"), case).await;
            report.results.push(CaseResult {
                tier: file.tier.clone(),
                file: file.file.clone(),
                name: case.name.clone(),
                outcome,
                elapsed: started.elapsed(),
            });
        }
    }
    Ok(report)
}

async fn run_case(
    config: &Config,
    ids: &BTreeMap<String, String>,
    prefix: &str,
    case: &Case,
) -> Outcome {
    // Every role a case names needs a token.
    let text = serde_json::to_string(&case.steps).unwrap_or_default();
    for role in ["admin", "alice", "bob", "carol"] {
        let named =
            text.contains(&format!("\"as\":\"{role}")) || text.contains(&format!("${{{role}}}"));
        if named && !ids.contains_key(role) {
            return Outcome::Skip(format!("needs a token for {role} (--token {role}=…)"));
        }
    }
    let mut vars: Vars = HashMap::new();
    for (role, id) in ids {
        vars.insert(role.clone(), json!(id));
    }
    vars.insert("conv".into(), json!(prefix));
    for i in 2..=9 {
        vars.insert(format!("conv{i}"), json!(format!("{prefix}-{i}")));
    }
    let mut run = CaseRun {
        config,
        vars,
        conns: HashMap::new(),
    };
    let mut outcome = Outcome::Pass;
    for (i, s) in case.steps.iter().enumerate() {
        if let Err(why) = run.step(s).await {
            outcome = Outcome::Fail(i, why);
            break;
        }
    }
    for c in run.conns.values_mut() {
        if !c.closed {
            c.close().await;
        }
    }
    outcome
}

struct CaseRun<'a> {
    config: &'a Config,
    vars: Vars,
    conns: HashMap<String, Conn>,
}

fn str_field<'v>(step: &'v Value, key: &str) -> Option<&'v str> {
    step.get(key).and_then(Value::as_str)
}

fn ms(step: &Value, key: &str, default: Duration) -> Duration {
    step.get(key)
        .and_then(Value::as_u64)
        .map(Duration::from_millis)
        .unwrap_or(default)
}

impl CaseRun<'_> {
    /// The connection `name` (`alice`, `alice#2`), opened (and authenticated, unless the step
    /// says `"authenticate": false`) when first used.
    async fn conn(&mut self, name: &str, step: &Value) -> Result<&mut Conn, String> {
        if !self.conns.contains_key(name) {
            let role = name.split('#').next().unwrap_or(name);
            let mut c = Conn::open(&self.config.url, self.config.step_timeout).await?;
            if step.get("authenticate") != Some(&Value::Bool(false)) {
                let token = self
                    .config
                    .tokens
                    .get(role)
                    .ok_or_else(|| format!("no token for {role}"))?;
                let deadline = Instant::now() + self.config.step_timeout;
                let id = c
                    .request("authenticate", Some(json!({ "token": token })))
                    .await?;
                let answer = c.answer(id, deadline).await?;
                if answer.get("error").is_some() {
                    return Err(format!("{role} could not authenticate: {answer}"));
                }
            }
            self.conns.insert(name.to_string(), c);
        }
        self.conns
            .get_mut(name)
            .ok_or_else(|| format!("no connection {name}"))
    }

    fn save(&mut self, step: &Value, from: &Value) -> Result<(), String> {
        if let Some(Value::Object(saves)) = step.get("save") {
            for (var, path) in saves {
                let path = path.as_str().ok_or("save paths are strings")?;
                let v =
                    at(from, path).ok_or_else(|| format!("nothing at {path} to save in {from}"))?;
                self.vars.insert(var.clone(), v.clone());
            }
        }
        Ok(())
    }

    fn expect(&self, step: &Value, answer: &Value) -> Result<(), String> {
        match step.get("expect") {
            Some(e) => {
                let e = fill(e, &self.vars)?;
                check(&e, Some(answer), "")
            }
            // No expectation: any result, but not an error.
            None if answer.get("error").is_some() => Err(format!("refused: {answer}")),
            None => Ok(()),
        }
    }

    /// One step. Its kind is the first of these keys it has: `send` (a method, with `params`;
    /// the answer matched against `expect`, else any result), `raw` (a frame sent as it is; the
    /// next answer matched), `burst` (`count` requests at once; `expectSome` must match one
    /// answer, `expectAll` every one), `notification` (the next notification must match),
    /// `skipTo` (notifications are read until one matches), `quiet` (no notification, or none
    /// matching `matching`, for that many ms), `anyOf` (the first of several connections to get
    /// a notification matching `notification`, others passed over; `saveConn` names it,
    /// `saveOther` the other), `close`, `sleep` and `http`. `save` keeps values of what came back: `{"var": "result.seq"}`.
    async fn step(&mut self, step: &Value) -> Result<(), String> {
        let timeout = ms(step, "within", self.config.step_timeout);
        let deadline = Instant::now() + timeout;
        if let Some(req) = step.get("http") {
            return self.http(step, req, deadline).await;
        }
        if let Some(ms) = step.get("sleep").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            return Ok(());
        }
        if let Some(Value::Array(names)) = step.get("anyOf") {
            return self.any_of(step, names, deadline).await;
        }
        let name = fill(&json!(str_field(step, "as").unwrap_or("admin")), &self.vars)?;
        let name = name.as_str().unwrap_or("admin").to_string();
        if step.get("close").is_some() {
            self.conn(&name, step).await?.close().await;
            self.conns.remove(&name);
            return Ok(());
        }
        if let Some(method) = str_field(step, "send") {
            let params = step
                .get("params")
                .map(|p| fill(p, &self.vars))
                .transpose()?;
            let c = self.conn(&name, step).await?;
            let id = c.request(method, params).await?;
            let answer = c.answer(id, deadline).await?;
            self.expect(step, &answer)
                .map_err(|e| format!("{method}: {e}"))?;
            return self.save(step, &answer);
        }
        if let Some(raw) = step.get("raw") {
            let raw = fill(raw, &self.vars)?;
            let text = match raw {
                Value::String(s) => s,
                other => other.to_string(),
            };
            let c = self.conn(&name, step).await?;
            c.send_text(text).await?;
            let answer = c.stray_answer(deadline).await?;
            self.expect(step, &answer)?;
            return self.save(step, &answer);
        }
        if let Some(burst) = step.get("burst") {
            return self.burst(step, &name, burst, deadline).await;
        }
        if let Some(p) = step.get("notification") {
            let p = fill(p, &self.vars)?;
            let c = self.conn(&name, step).await?;
            let note = c
                .notification(deadline)
                .await?
                .ok_or_else(|| format!("no notification within {timeout:?}; expected {p}"))?;
            check(&p, Some(&note), "")?;
            return self.save(step, &note);
        }
        if let Some(p) = step.get("skipTo") {
            let p = fill(p, &self.vars)?;
            let c = self.conn(&name, step).await?;
            loop {
                let note = c
                    .notification(deadline)
                    .await?
                    .ok_or_else(|| format!("no notification matching {p} within {timeout:?}"))?;
                if check(&p, Some(&note), "").is_ok() {
                    return self.save(step, &note);
                }
            }
        }
        if let Some(quiet) = step.get("quiet").and_then(Value::as_u64) {
            // No notification (matching `matching`, when given) for that long.
            let matching = step
                .get("matching")
                .map(|m| fill(m, &self.vars))
                .transpose()?;
            let c = self.conn(&name, step).await?;
            let until = Instant::now() + Duration::from_millis(quiet);
            while let Some(note) = c.notification(until).await? {
                if matching
                    .as_ref()
                    .is_none_or(|m| check(m, Some(&note), "").is_ok())
                {
                    return Err(format!(
                        "expected no notification for {quiet} ms, got {note}"
                    ));
                }
            }
            return Ok(());
        }
        Err(format!("a step of no known kind: {step}"))
    }

    async fn burst(
        &mut self,
        step: &Value,
        name: &str,
        burst: &Value,
        deadline: Instant,
    ) -> Result<(), String> {
        let method = str_field(burst, "send").ok_or("burst needs send")?;
        let count = burst
            .get("count")
            .and_then(Value::as_u64)
            .ok_or("burst needs count")?;
        let params = burst
            .get("params")
            .map(|p| fill(p, &self.vars))
            .transpose()?;
        let some = step
            .get("expectSome")
            .map(|e| fill(e, &self.vars))
            .transpose()?;
        let all = step
            .get("expectAll")
            .map(|e| fill(e, &self.vars))
            .transpose()?;
        let c = self.conn(name, step).await?;
        let mut ids = Vec::new();
        for _ in 0..count {
            ids.push(c.request(method, params.clone()).await?);
        }
        let mut answers = Vec::new();
        for id in ids {
            answers.push(c.answer(id, deadline).await?);
        }
        if let Some(all) = all {
            for (i, a) in answers.iter().enumerate() {
                check(&all, Some(a), &format!("answer {}", i + 1))?;
            }
        }
        if let Some(some) = some {
            if !answers.iter().any(|a| check(&some, Some(a), "").is_ok()) {
                return Err(format!(
                    "none of the {count} answers matches {some}; the last: {}",
                    answers.last().map(Value::to_string).unwrap_or_default()
                ));
            }
        }
        Ok(())
    }

    async fn any_of(
        &mut self,
        step: &Value,
        names: &[Value],
        deadline: Instant,
    ) -> Result<(), String> {
        let names: Vec<String> = names
            .iter()
            .filter_map(|n| n.as_str().map(String::from))
            .collect();
        for n in &names {
            self.conn(n, step).await?;
        }
        let p = fill(
            step.get("notification").ok_or("anyOf needs notification")?,
            &self.vars,
        )?;
        loop {
            for n in &names {
                let c = self.conn(n, step).await?;
                let soon = (Instant::now() + Duration::from_millis(20)).min(deadline);
                // Notifications that do not match (of other conversations) are passed over.
                let Some(note) = c.notification(soon).await? else {
                    continue;
                };
                if check(&p, Some(&note), "").is_ok() {
                    self.save(step, &note)?;
                    if let Some(var) = str_field(step, "saveConn") {
                        self.vars.insert(var.to_string(), json!(n));
                    }
                    if let Some(var) = str_field(step, "saveOther") {
                        let other = names.iter().find(|o| *o != n).cloned().unwrap_or_default();
                        self.vars.insert(var.to_string(), json!(other));
                    }
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no notification on any of {names:?} in time; expected {p}"
                ));
            }
        }
    }

    /// `http`: `{method, path, as?, headers?, body?, sse?}`; the answer is
    /// `{status, headers, body}` (the body parsed as JSON when it is, else text; with
    /// `sse: n`, the first `n` server-sent events as `[{id, data}]`).
    async fn http(&mut self, step: &Value, req: &Value, deadline: Instant) -> Result<(), String> {
        let req = fill(req, &self.vars)?;
        let method = str_field(&req, "method").unwrap_or("GET");
        let path = str_field(&req, "path").ok_or("http needs path")?;
        let url = format!("{}{path}", self.config.http);
        let client = reqwest::Client::new();
        let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
        let mut r = client.request(method, &url);
        if let Some(role) = str_field(&req, "as") {
            let token = self
                .config
                .tokens
                .get(role)
                .ok_or_else(|| format!("no token for {role}"))?;
            r = r.bearer_auth(token);
        }
        if let Some(Value::Object(headers)) = req.get("headers") {
            for (k, v) in headers {
                r = r.header(
                    k,
                    v.as_str()
                        .map(String::from)
                        .unwrap_or_else(|| v.to_string()),
                );
            }
        }
        if let Some(body) = req.get("body") {
            r = r
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        if let Some(raw) = str_field(&req, "rawBody") {
            r = r
                .header("content-type", "application/json")
                .body(raw.to_string());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let resp = tokio::time::timeout(left, r.send())
            .await
            .map_err(|_| format!("no answer from {url} in time"))?
            .map_err(|e| format!("{url}: {e}"))?;
        let status = resp.status().as_u16();
        let headers: serde_json::Map<String, Value> = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), json!(v.to_str().unwrap_or(""))))
            .collect();
        let body = if let Some(n) = req.get("sse").and_then(Value::as_u64) {
            read_sse(resp, n as usize, deadline).await?
        } else {
            let left = deadline.saturating_duration_since(Instant::now());
            let text = tokio::time::timeout(left, resp.text())
                .await
                .map_err(|_| format!("the body of {url} did not arrive in time"))?
                .map_err(|e| e.to_string())?;
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        let answer = json!({"status": status, "headers": headers, "body": body});
        self.expect(step, &answer)
            .map_err(|e| format!("{url}: {e}"))?;
        self.save(step, &answer)
    }
}

/// The first `n` events of a server-sent event stream, `[{id, data}]` (data parsed as JSON).
async fn read_sse(resp: reqwest::Response, n: usize, deadline: Instant) -> Result<Value, String> {
    use futures::StreamExt;
    let mut stream = resp.bytes_stream();
    let mut buf = String::new();
    let mut events = Vec::new();
    while events.len() < n {
        let chunk = tokio::time::timeout_at(deadline, stream.next())
            .await
            .map_err(|_| format!("{} of {n} server-sent events arrived in time", events.len()))?
            .ok_or_else(|| format!("the stream ended after {} of {n} events", events.len()))?
            .map_err(|e| e.to_string())?;
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let block: String = buf.drain(..end + 2).collect();
            let mut id = Value::Null;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = json!(v.trim());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            if !data.is_empty() {
                let data = serde_json::from_str(&data).unwrap_or(Value::String(data));
                events.push(json!({"id": id, "data": data}));
            }
        }
    }
    events.truncate(n);
    Ok(Value::Array(events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_vector_file_is_built_in_and_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("vectors");
        let on_disk = load_dir(&dir).expect("the vectors parse");
        let built_in = parse(EMBEDDED).expect("the built-in vectors parse");
        let names = |v: &[VectorFile]| {
            v.iter()
                .map(|f| f.file.clone())
                .collect::<std::collections::BTreeSet<_>>()
        };
        assert_eq!(
            names(&on_disk),
            names(&built_in),
            "EMBEDDED lists every file of vectors/"
        );
        for tier in TIERS {
            assert!(
                built_in.iter().any(|f| f.tier == *tier),
                "a vector file for {tier}"
            );
        }
    }
}
