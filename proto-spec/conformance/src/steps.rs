//! One case run step by step: each step of a vector (send, raw frame, burst, notification,
//! quiet, HTTP) on the connections it names, its answers matched against the step's patterns.

use super::*;

pub(crate) async fn run_case(
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
