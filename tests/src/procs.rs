//! The real `orchestrator` binary as a process (for tests that kill it), and what the crash
//! tests share: tokens made with the binary, clients that reconnect fast, the external agent
//! that records what it was told is durable, and the check of a log against the invariants.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sdk::proto::*;
use agent_sdk::{
    async_trait, Agent, AgentClient, AgentContext, AgentError, TurnOutcome, WsConfig,
    WsJsonRpcClient,
};
use rand::Rng;
use tokio::io::AsyncBufReadExt;

/// What clients were told is durable: (conversation, seq) → text.
pub type Acked = Arc<Mutex<BTreeMap<(String, u64), String>>>;

/// The binary: `ORCHESTRATOR_BIN`, or the `orchestrator` built beside the running test.
pub fn binary() -> std::path::PathBuf {
    if let Some(b) = std::env::var_os("ORCHESTRATOR_BIN") {
        return b.into();
    }
    let exe = std::env::current_exe().expect("the test's path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|dir| dir.join("orchestrator"))
        .expect("the target directory");
    assert!(
        bin.is_file(),
        "{} is not built; run `cargo build --workspace` or set ORCHESTRATOR_BIN",
        bin.display()
    );
    bin
}

/// How many kills a crash test makes: the variable `var`, else `default`.
pub fn kills(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A port free on 127.0.0.1 (a node is started on it again after each kill).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Runs the orchestrator binary with `args` in `dir`, ignoring an `ORCHESTRATOR_DB` the
/// environment names; what it printed and how it ended.
pub fn run_in(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(binary())
        .args(args)
        .current_dir(dir)
        .env_remove("ORCHESTRATOR_DB")
        .output()
        .expect("the orchestrator binary")
}

/// Mints a token with the binary (`token create`).
pub fn token(db: &str, agent: &str, admin: bool) -> String {
    let mut cmd = std::process::Command::new(binary());
    cmd.args(["token", "create", "--agent", agent, "--db", db]);
    if admin {
        cmd.arg("--admin");
    }
    let out = cmd.output().expect("token create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A client of `url` that reconnects quickly after a kill.
pub async fn connect(url: &str, token: &str) -> WsJsonRpcClient {
    let mut c = WsConfig::new(url.to_string(), token);
    c.backoff_min = Duration::from_millis(10);
    c.backoff_max = Duration::from_millis(200);
    WsJsonRpcClient::connect(c).await.expect("connect")
}

/// `orchestrator serve` on a fixed port, started again on the same port after a kill.
#[derive(Debug)]
pub struct Node {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// On PostgreSQL, its name in the turn claims since its last start (`node-…`).
    pub name: Option<String>,
    child: Option<tokio::process::Child>,
    /// What it logged (stderr), line by line, since its last start.
    logged: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Node {
    /// A node on a free port, not started.
    pub fn new() -> Node {
        Node {
            port: free_port(),
            name: None,
            child: None,
            logged: Default::default(),
        }
    }

    /// Starts it on `db` with the scenario library `scenarios`; returns once it listens.
    pub async fn start(&mut self, db: &str, scenarios: &std::path::Path) {
        self.start_with(db, scenarios, &[]).await;
    }

    /// [`Node::start`] with more arguments for `serve`.
    pub async fn start_with(
        &mut self,
        db: &str,
        scenarios: &std::path::Path,
        more: &[&std::ffi::OsStr],
    ) {
        let mut child = tokio::process::Command::new(binary())
            .args(["serve", "--listen", &format!("127.0.0.1:{}", self.port)])
            .args(["--db", db])
            .arg("--scenarios")
            .arg(scenarios)
            .args(more)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start a node");
        let logged = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut stderr = tokio::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
        let into = logged.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = stderr.next_line().await {
                into.lock().unwrap().push(line);
            }
        });
        self.logged = logged;
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the node starts in time")
            .expect("read stdout")
            .expect("a first line");
        assert!(line.contains("listening"), "{line}");
        self.name = line
            .split([' ', ',', ')'])
            .find(|w| w.starts_with("node-"))
            .map(str::to_string);
        self.child = Some(child);
    }

    /// Waits (at most [`crate::WAIT`]) until the node has logged a line containing `what`.
    pub async fn logged(&self, what: &str) -> String {
        let until = tokio::time::Instant::now() + crate::WAIT;
        loop {
            if let Some(l) = self
                .logged
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.contains(what))
            {
                return l.clone();
            }
            assert!(
                tokio::time::Instant::now() < until,
                "the node never logged {what:?}:\n{}",
                self.logged.lock().unwrap().join("\n")
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Sends `signal` to the running process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = self.pid();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal).expect("signal");
    }

    /// The running process's id.
    pub fn pid(&self) -> u32 {
        self.child
            .as_ref()
            .and_then(|c| c.id())
            .expect("a running node")
    }

    /// SIGKILL.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().await.expect("SIGKILL");
        }
    }

    /// Its WebSocket URL.
    pub fn url(&self) -> String {
        format!("ws://127.0.0.1:{}/rpc", self.port)
    }
}

impl Default for Node {
    fn default() -> Self {
        Node::new()
    }
}

/// The external agent of the crash tests: answers its turns after a little work (so that
/// kills land in the middle of turns), records what it was told is durable, and ends the
/// conversation (`onText: FINISH`) once `finish` is set.
#[derive(Debug, Default)]
pub struct Ext {
    /// What it was told is durable.
    pub acked: Acked,
    /// Set once the kills are over.
    pub finish: Arc<std::sync::atomic::AtomicBool>,
}

#[async_trait]
impl Agent for Ext {
    async fn handle_turn(&self, ctx: &AgentContext) -> Result<TurnOutcome, AgentError> {
        let work: u64 = rand::rng().random_range(5..15);
        tokio::time::sleep(Duration::from_millis(work)).await;
        let text = if self.finish.load(std::sync::atomic::Ordering::Relaxed) {
            format!("FINISH at turn {}", ctx.turn)
        } else {
            format!("ext answers turn {}", ctx.turn)
        };
        let r = ctx.say(text.clone(), Finality::Turn).await?;
        if let Ok(mut a) = self.acked.lock() {
            a.insert((ctx.conversation_id.clone(), r.seq), text);
        }
        Ok(TurnOutcome::Posted)
    }
}

/// Writes the scenario library of the crash tests into `dir/scenarios`: `name`, a scripted
/// `bot` and the external `ext` taking turns until `ext` says FINISH. The library's folder.
pub fn duet_library(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let scenarios = dir.join("scenarios");
    std::fs::create_dir_all(&scenarios).expect("the scenario folder");
    let replies: Vec<String> = (1..=5000).map(|i| format!("bot says {i}")).collect();
    let scenario = serde_json::json!({
        "name": name,
        "participants": [{"id": "bot", "kind": "scripted", "replies": replies}, "ext"],
        "policy": {"order": "round_robin", "first": "bot"},
        "stop": {"onText": "FINISH"},
        "turn": {"timeout": "30s"}
    });
    std::fs::write(scenarios.join(format!("{name}.json")), scenario.to_string())
        .expect("write the scenario");
    scenarios
}

/// Creates conversation `id` from the library's scenario `scenario` (as `admin`).
pub async fn create_named(admin: &WsJsonRpcClient, id: &str, scenario: &str) {
    admin
        .create_conversation(CreateConversationParams {
            conversation_id: Some(id.into()),
            scenario_name: Some(scenario.into()),
            ..Default::default()
        })
        .await
        .expect("create");
}

/// The whole log of `id`, page by page.
pub async fn read_log(admin: &WsJsonRpcClient, id: &str) -> Vec<Event> {
    crate::full_log(admin, id).await
}

/// The logs of some conversations as far as they were checked. Each check reads only what was
/// appended since the one before (a soak's logs grow long) and checks it, with what came
/// before, against the log's invariants and what was acknowledged: seq dense with no duplicate,
/// every acknowledged event at its seq, no idempotency key twice, every message that closed a
/// turn followed (in its commit) by the turn's one decision, at most one reply per turn, and
/// every message of [`duet_library`]'s agents (run by executors that trace their turns) after
/// its attempt's `turn_start`.
#[derive(Debug, Default)]
pub struct Logs {
    checked: HashMap<String, Checked>,
}

/// One conversation's log as far as it was checked, and what the checks counted in it.
#[derive(Debug, Default)]
struct Checked {
    log: Vec<Event>,
    keys: HashSet<(String, String)>,
    decisions: HashMap<u64, usize>,
    replies: HashMap<u64, usize>,
    /// (agent, turn) of every `turn_start` so far.
    started: HashSet<(String, u64)>,
}

/// The agents of [`duet_library`]'s scenario: each runs under an executor that writes
/// `turn_start` before anything else of its attempt.
const TRACED: [&str; 2] = ["bot", "ext"];

impl Logs {
    /// Reads what `id`'s log has past what was checked and checks it; whether the conversation
    /// is closed. `acked` must have been taken before the call (what was acknowledged before the
    /// log is read must be in it).
    pub async fn check(
        &mut self,
        admin: &WsJsonRpcClient,
        id: &str,
        acked: &BTreeMap<(String, u64), String>,
        round: usize,
    ) -> bool {
        let c = self.checked.entry(id.to_owned()).or_default();
        let from = c.log.len();
        let mine = acked.range((id.to_owned(), 0)..=(id.to_owned(), u64::MAX));
        // A node shows another node's commit once its notification came (about a millisecond):
        // what was acknowledged through another node just now may need another read or two.
        let acked_head = mine.clone().map(|((_, seq), _)| *seq).max().unwrap_or(0);
        let until = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let page = admin
                .tail(TailParams {
                    conversation_id: id.into(),
                    since_seq: c.log.len() as u64,
                    limit: None,
                })
                .await
                .expect("tail");
            let done = page.events.last().is_none_or(|e| e.seq == page.latest_seq);
            c.log.extend(page.events);
            if !done {
                continue;
            }
            if c.log.len() as u64 >= acked_head || tokio::time::Instant::now() >= until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        c.check_new(id, from, round);
        let log = &c.log;
        for ((_, seq), text) in mine {
            let e = log.get(*seq as usize - 1).unwrap_or_else(|| {
                panic!(
                    "round {round}: acknowledged {id}#{seq} lost (the log ends at {} 5 s later)",
                    log.len()
                )
            });
            assert_eq!(
                e.payload_value()["text"],
                *text,
                "round {round}: {id}#{seq}"
            );
        }
        log.last()
            .is_some_and(|e| e.finality == Some(Finality::Conversation))
    }

    /// Checks the logs of `ids` (the conversations of [`duet_library`]'s scenario); how many
    /// have reached their stop condition (`onText`).
    pub async fn check_all(
        &mut self,
        admin: &WsJsonRpcClient,
        ids: &[String],
        acked: &Acked,
        round: usize,
    ) -> usize {
        let acked = acked.lock().expect("acked").clone();
        let mut closed = 0;
        for id in ids {
            if self.check(admin, id, &acked, round).await {
                let last = self.checked[id]
                    .log
                    .last()
                    .expect("a closed log has events");
                assert_eq!(last.payload_value()["data"]["reason"], "on_text", "{id}");
                closed += 1;
            }
        }
        closed
    }

    /// Tells `ext` to finish, and waits (at most 180 s) until every conversation of `ids` has
    /// reached its stop condition, checking their logs all along.
    pub async fn finish_all(
        &mut self,
        admin: &WsJsonRpcClient,
        ids: &[String],
        ext: &Ext,
        round: usize,
    ) {
        ext.finish.store(true, std::sync::atomic::Ordering::Relaxed);
        let done_by = tokio::time::Instant::now() + Duration::from_secs(180);
        loop {
            let closed = self.check_all(admin, ids, &ext.acked, round).await;
            if closed == ids.len() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < done_by,
                "{closed} of {} conversations reached their stop condition",
                ids.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How many events the checked logs hold.
    pub fn events(&self) -> usize {
        self.checked.values().map(|c| c.log.len()).sum()
    }
}

impl Checked {
    /// Checks the events from index `from` on, with what was counted before them.
    fn check_new(&mut self, id: &str, from: usize, round: usize) {
        let log = &self.log;
        for (i, e) in log.iter().enumerate().skip(from) {
            assert_eq!(
                e.seq,
                i as u64 + 1,
                "round {round}, {id}: seq dense, no duplicate"
            );
            if let Some(k) = &e.client_request_id {
                assert!(
                    self.keys.insert((e.author.clone(), k.clone())),
                    "round {round}, {id}: key {k} twice"
                );
            }
            let p = e.payload_value();
            if e.kind == EventKind::Trace && p["type"] == "turn_start" {
                self.started.insert((e.author.clone(), e.turn));
            }
            if e.kind == EventKind::Message && TRACED.contains(&e.author.as_str()) {
                assert!(
                    self.started.contains(&(e.author.clone(), e.turn)),
                    "round {round}, {id}: {}'s message #{} in turn {} without its turn_start \
                     before it",
                    e.author,
                    e.seq,
                    e.turn
                );
            }
            if e.kind == EventKind::System && p["type"] == "next_speaker" {
                *self.decisions.entry(e.turn).or_default() += 1;
            }
            if e.kind == EventKind::Message && e.finality == Some(Finality::Turn) {
                *self.replies.entry(e.turn).or_default() += 1;
                let next = log.get(i + 1).unwrap_or_else(|| {
                    panic!(
                        "round {round}, {id}: turn {} closed without a decision",
                        e.turn
                    )
                });
                let decided = (next.kind == EventKind::System
                    && next.payload_value()["type"] == "next_speaker"
                    && next.turn == e.turn + 1)
                    || (next.author == ORCHESTRATOR_AUTHOR
                        && next.finality == Some(Finality::Conversation));
                assert!(
                    decided,
                    "round {round}, {id}: turn {} closed without its decision: {next:?}",
                    e.turn
                );
            }
        }
        assert!(
            self.decisions.values().all(|n| *n == 1),
            "round {round}, {id}: one decision per turn: {:?}",
            self.decisions
        );
        assert!(
            self.replies.values().all(|n| *n == 1),
            "round {round}, {id}: at most one reply per turn: {:?}",
            self.replies
        );
    }
}

/// A push executor of `agent` on `client`, on a task of its own.
pub fn push_executor(
    client: WsJsonRpcClient,
    agent: Arc<dyn Agent>,
) -> tokio::task::JoinHandle<()> {
    let exec = executors::ExternalExecutor::new(
        Arc::new(client) as Arc<dyn agent_sdk::ExecutorClient>,
        agent,
        Arc::new(executors::ExecutorCore::default()),
    );
    tokio::spawn(async move {
        let _ = exec.run_push().await;
    })
}
