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
mod steps;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::conn::Conn;
use crate::pattern::{at, check, fill, Vars};
use crate::steps::run_case;

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
