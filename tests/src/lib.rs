//! End-to-end tests across crates, and the shared test harness.
//!
//! The harness starts the real server on `127.0.0.1:0` over a fresh database, mints tokens, and
//! hands out clients: the jsonrpsee WebSocket client for what a library would send, and a raw
//! WebSocket for what a library would never send. Every wait is bounded.
//!
//! The backend is SQLite unless `ORCHESTRATOR_TEST_BACKEND=postgres`: then every server gets a
//! new database on the PostgreSQL `ORCHESTRATOR_TEST_PG` names, or on one the harness starts for
//! it ([`pg::TestPostgres`]). `scripts/test` runs the suites both ways.
//!
//! # Layout
//! - `tests/rpc.rs`: methods, subscriptions and access over WebSocket.
//! - `tests/malformed.rs`: invalid input and limits, each with its own error.
//! - `tests/restart.rs`: durability and recovery across a restart.
//! - `tests/fanout.rs`: slow subscribers resumed from the log.
//! - `python/`: black-box clients in Python against the release binary.

pub mod certs;
pub mod cluster;
pub mod pg;
pub mod procs;
pub mod proxy;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agent_sdk::{Agent, WsConfig, WsJsonRpcClient};
use futures::{SinkExt, StreamExt};
use jsonrpsee::core::client::ClientT;
use jsonrpsee::core::traits::ToRpcParams;
use jsonrpsee::ws_client::{WsClient, WsClientBuilder};
use orchestrator::engine::config::Limits;
use orchestrator::engine::store::sqlite::Synchronous;
use orchestrator::engine::turns::TurnConfig;
use orchestrator::transport::server::{self, RunningServer};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// The bound on any single wait in the tests.
pub const WAIT: Duration = Duration::from_secs(10);

/// Object params for the jsonrpsee client.
#[derive(Debug, Clone)]
pub struct P(pub Value);

impl ToRpcParams for P {
    fn to_rpc_params(self) -> Result<Option<Box<serde_json::value::RawValue>>, serde_json::Error> {
        serde_json::value::to_raw_value(&self.0).map(Some)
    }
}

/// Internal agents by id.
#[derive(Clone, Default)]
pub struct Agents(pub HashMap<String, Arc<dyn Agent>>);

impl std::fmt::Debug for Agents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// A running server over its own database, with tokens for `admin` (an admin), `alice`,
/// `bob` and `carol`.
#[derive(Debug)]
pub struct TestServer {
    /// The running server (None while stopped).
    pub server: Option<RunningServer>,
    /// The database: a SQLite file or a PostgreSQL URL.
    pub db: String,
    /// Tokens by agent id.
    pub tokens: std::collections::HashMap<String, String>,
    /// The limits it runs with.
    pub limits: Limits,
    /// How turns are handed out.
    pub turn_config: TurnConfig,
    /// Agents run inside the server (started again after each restart).
    pub agents: Agents,
    _dir: tempfile::TempDir,
    /// The PostgreSQL started for this server alone (when no shared one is named).
    _pg: Option<pg::TestPostgres>,
}

/// Which backend the suites run on (`ORCHESTRATOR_TEST_BACKEND`: `sqlite`, the default, or
/// `postgres`).
pub fn on_postgres() -> bool {
    match std::env::var("ORCHESTRATOR_TEST_BACKEND").as_deref() {
        Ok("postgres") => true,
        Ok("sqlite") | Err(_) => false,
        Ok(other) => panic!("ORCHESTRATOR_TEST_BACKEND={other}: expected sqlite or postgres"),
    }
}

/// A fresh database for one test server on the backend the suites run on: a SQLite file in
/// `dir`, or a new PostgreSQL database (with the server started for it, when
/// `ORCHESTRATOR_TEST_PG` names none).
pub async fn test_database(dir: &std::path::Path) -> (String, Option<pg::TestPostgres>) {
    if !on_postgres() {
        return (dir.join("test.db").display().to_string(), None);
    }
    postgres_database().await
}

/// A new PostgreSQL database, whatever the suites' backend: on `ORCHESTRATOR_TEST_PG`, or on a
/// server started for it (returned, to be kept while it is used). Fails with the reason when
/// there can be none.
pub async fn postgres_database() -> (String, Option<pg::TestPostgres>) {
    let server = match std::env::var("ORCHESTRATOR_TEST_PG") {
        Ok(_) => None,
        Err(_) => Some(
            pg::TestPostgres::start()
                .await
                .unwrap_or_else(|e| panic!("PostgreSQL could not be started: {e}")),
        ),
    };
    let url = match &server {
        Some(pg) => pg.fresh_database().await,
        None => {
            pg::fresh_database(&std::env::var("ORCHESTRATOR_TEST_PG").unwrap_or_default()).await
        }
    }
    .unwrap_or_else(|e| panic!("a PostgreSQL database for the test: {e}"));
    (url, server)
}

/// Opens the store a test server runs on.
pub fn open_store(db: &str) -> Arc<dyn orchestrator::engine::store::Store> {
    orchestrator::engine::store::open(db, Synchronous::Normal).expect("open store")
}

/// The environment variables the tests' scenarios read (`--agent-env`).
pub const TEST_ENV: &[&str] = &[
    "KINDS_TEST_WEATHER_TOKEN",
    "LLM_KIND_TEST_KEY",
    "LLM_KIND_TEST_BAD_KEY",
    "KINDS_TEST_NOT_SET",
    "LLM_KIND_TEST_WRONG",
];

/// The default limits, with agents allowed to reach loopback (where the tests' stand-ins for
/// LLM endpoints, HTTP APIs and A2A agents listen) and to read [`TEST_ENV`]; every test client
/// comes from one address and a few agents, so the shares of connections and the byte budget
/// are off unless a test sets them (`tests/tests/isolation.rs`).
pub fn test_limits() -> Limits {
    Limits {
        max_connections_per_address: 100_000,
        max_connections_per_agent: 100_000,
        max_append_bytes_per_minute: 0,
        kinds: Arc::new(
            agent_kinds::Sandbox::default()
                .allowing(agent_kinds::NetRule::Loopback)
                .with_env(TEST_ENV.iter().map(|s| s.to_string())),
        ),
        ..Limits::default()
    }
}

impl TestServer {
    /// Starts a server with [`test_limits`].
    pub async fn start() -> TestServer {
        TestServer::with_limits(test_limits()).await
    }

    /// Starts a server with these limits.
    pub async fn with_limits(limits: Limits) -> TestServer {
        TestServer::with_options(limits, TurnConfig::default(), HashMap::new()).await
    }

    /// Starts a server with a turn configuration and internal agents.
    pub async fn with_options(
        limits: Limits,
        turn_config: TurnConfig,
        agents: HashMap<String, Arc<dyn Agent>>,
    ) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let (db, pg) = test_database(dir.path()).await;
        TestServer::on_database(db, pg, dir, limits, turn_config, agents).await
    }

    /// Starts a server on a PostgreSQL database of its own (whatever the suites' backend), the
    /// first node of a cluster ([`TestServer::another_node`]).
    pub async fn on_postgres(
        limits: Limits,
        agents: HashMap<String, Arc<dyn Agent>>,
    ) -> TestServer {
        let (db, pg) = postgres_database().await;
        TestServer::on_url(db, pg, limits, agents).await
    }

    /// A server on the PostgreSQL database at `url` (keeping `pg`, the server it is on, when
    /// the harness started it).
    pub async fn on_url(
        url: String,
        pg: Option<pg::TestPostgres>,
        limits: Limits,
        agents: HashMap<String, Arc<dyn Agent>>,
    ) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        TestServer::on_database(url, pg, dir, limits, TurnConfig::default(), agents).await
    }

    /// Another node on this server's (PostgreSQL) database, with the same tokens, limits and
    /// agents.
    pub async fn another_node(&self) -> TestServer {
        self.another_node_via(self.db.clone()).await
    }

    /// Another node, reaching the same database at `url` (through a proxy, say).
    pub async fn another_node_via(&self, url: String) -> TestServer {
        self.node(url, self.agents.clone()).await
    }

    /// Another node on this server's database, running these internal agents instead.
    pub async fn another_node_with(&self, agents: HashMap<String, Arc<dyn Agent>>) -> TestServer {
        self.node(self.db.clone(), Agents(agents)).await
    }

    async fn node(&self, url: String, agents: Agents) -> TestServer {
        let mut node = TestServer {
            server: None,
            db: url,
            tokens: self.tokens.clone(),
            limits: self.limits.clone(),
            turn_config: self.turn_config.clone(),
            agents,
            _dir: tempfile::tempdir().expect("tempdir"),
            _pg: None,
        };
        node.boot().await;
        node
    }

    async fn on_database(
        db: String,
        pg: Option<pg::TestPostgres>,
        dir: tempfile::TempDir,
        limits: Limits,
        turn_config: TurnConfig,
        agents: HashMap<String, Arc<dyn Agent>>,
    ) -> TestServer {
        let store = open_store(&db);
        let mut tokens = std::collections::HashMap::new();
        for (agent, admin) in [
            ("admin", true),
            ("alice", false),
            ("bob", false),
            ("carol", false),
        ] {
            let t = orchestrator::engine::auth::create_token(store.as_ref(), agent, admin)
                .expect("token");
            tokens.insert(agent.to_string(), t);
        }
        let mut ts = TestServer {
            server: None,
            db,
            tokens,
            limits,
            turn_config,
            agents: Agents(agents),
            _dir: dir,
            _pg: pg,
        };
        ts.boot().await;
        ts
    }

    async fn boot(&mut self) {
        let store = open_store(&self.db);
        let options = orchestrator::host::Options {
            limits: self.limits.clone(),
            turn_config: self.turn_config.clone(),
            agents: self.agents.0.clone(),
            ..Default::default()
        };
        let orch = options.start(store).expect("open orchestrator");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        self.server = Some(server::start(orch, listener).await.expect("start"));
    }

    /// Stops the server gracefully.
    pub async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            tokio::time::timeout(WAIT, s.stop())
                .await
                .expect("stop in time");
        }
    }

    /// Stops and starts again on the same database (on a new port).
    pub async fn restart(&mut self) {
        self.stop().await;
        self.boot().await;
    }

    /// The running server's view of conversation `id`.
    pub fn view(&self, id: &str) -> std::sync::Arc<orchestrator::engine::hub::ConvView> {
        self.running()
            .orchestrator()
            .hub()
            .get(id)
            .unwrap_or_else(|| panic!("no conversation {id}"))
    }

    /// Whether the running server holds conversation `id` (a shared store's node leaves a
    /// closed one in the database until it is named).
    pub fn holds(&self, id: &str) -> bool {
        self.running().orchestrator().hub().get(id).is_some()
    }

    /// Waits until at least `n` waits (long-polls, `waitForChange`, `getUpdatesOrGuidance`)
    /// are parked on the head of conversation `id`; fails after [`WAIT`].
    pub async fn wait_for_waiters(&self, id: &str, n: usize) {
        let conv = self.view(id);
        eventually(&format!("{n} waits parked on {id}"), || conv.waiters() >= n).await;
    }

    /// Waits until a stream the publisher writes to (a WebSocket subscription, an SSE stream)
    /// follows conversation `id` live.
    pub async fn wait_for_live(&self, id: &str) {
        let conv = self.view(id);
        eventually(&format!("a live stream of {id}"), || !conv.live.is_empty()).await;
    }

    /// The running server.
    pub fn running(&self) -> &RunningServer {
        self.server.as_ref().expect("server running")
    }

    /// The WebSocket URL.
    pub fn url(&self) -> String {
        self.running().rpc_url()
    }

    /// `http://HOST:PORT`, for the HTTP routes.
    pub fn http_base(&self) -> String {
        format!("http://{}", self.running().local_addr())
    }

    /// `GET /metrics`.
    pub async fn metrics(&self) -> String {
        reqwest::get(format!("{}/metrics", self.http_base()))
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("the metrics")
    }

    /// Checks that the server counted connections it ended for each of `reasons`.
    pub async fn assert_dropped(&self, reasons: &[&str]) {
        let metrics = self.metrics().await;
        for reason in reasons {
            assert!(
                metrics
                    .lines()
                    .any(|l| l.starts_with("orchestrator_connections_dropped_total")
                        && l.contains(reason)),
                "{reason}: {metrics}"
            );
        }
    }

    /// The token of an agent.
    pub fn token(&self, agent: &str) -> &str {
        &self.tokens[agent]
    }

    /// A new token for `agent` of `tenant` (made first if it does not exist), a tenant's
    /// `admin` or an `operator`.
    pub fn tenant_token(&self, tenant: &str, agent: &str, admin: bool, operator: bool) -> String {
        let store = open_store(&self.db);
        if !store
            .list_tenants()
            .expect("tenants")
            .iter()
            .any(|t| t.name == tenant)
        {
            store.create_tenant(tenant).expect("a tenant");
        }
        let record = orchestrator::engine::store::TokenRecord {
            tenant: tenant.to_string(),
            agent_id: agent.to_string(),
            admin,
            operator,
            expires_ms: None,
        };
        orchestrator::engine::auth::mint_token(store.as_ref(), &record).expect("a token")
    }

    /// A jsonrpsee client authenticated with `token`.
    pub async fn client_with(&self, token: &str) -> WsClient {
        let c = WsClientBuilder::default()
            .build(self.url())
            .await
            .expect("connect");
        let _: Value = c
            .request("authenticate", P(json!({"token": token})))
            .await
            .expect("authenticate");
        c
    }

    /// A jsonrpsee client authenticated as `agent`.
    pub async fn client(&self, agent: &str) -> WsClient {
        self.client_at(&self.url(), agent).await
    }

    /// A jsonrpsee client authenticated as `agent`, connected to `url` (a load balancer in
    /// front of this server's cluster, say).
    pub async fn client_at(&self, url: &str, agent: &str) -> WsClient {
        let c = WsClientBuilder::default()
            .build(url)
            .await
            .expect("connect");
        let r: Value = c
            .request("authenticate", P(json!({"token": self.token(agent)})))
            .await
            .expect("authenticate");
        assert_eq!(r["agentId"], agent);
        c
    }

    /// An SDK client authenticated as `agent` (at `url`, or the server's own URL).
    pub async fn sdk(&self, agent: &str, url: Option<String>) -> WsJsonRpcClient {
        let mut config = WsConfig::new(url.unwrap_or_else(|| self.url()), self.token(agent));
        config.backoff_min = Duration::from_millis(10);
        config.backoff_max = Duration::from_millis(200);
        WsJsonRpcClient::connect(config).await.expect("sdk connect")
    }

    /// An SDK client authenticated with `token`.
    pub async fn sdk_with(&self, token: &str) -> WsJsonRpcClient {
        let mut config = WsConfig::new(self.url(), token);
        config.backoff_min = Duration::from_millis(10);
        config.backoff_max = Duration::from_millis(200);
        WsJsonRpcClient::connect(config).await.expect("sdk connect")
    }

    /// A raw WebSocket, not authenticated.
    pub async fn raw(&self) -> RawWs {
        let (ws, _) = tokio_tungstenite::connect_async(self.url())
            .await
            .expect("connect raw");
        RawWs { ws }
    }

    /// Gives the running server this scenario library (by name).
    pub fn set_library(&self, named: Vec<(&str, Value)>) {
        self.running()
            .orchestrator()
            .set_scenarios(named.into_iter().map(|(n, v)| (n.to_string(), v)).collect())
            .expect("a valid library");
    }

    /// Creates a conversation as admin.
    pub async fn create(&self, id: &str, participants: &[&str]) {
        let admin = self.client("admin").await;
        let r: Value = admin
            .request(
                "createConversation",
                P(json!({"conversationId": id, "participants": participants})),
            )
            .await
            .expect("create");
        assert_eq!(r["conversationId"], id);
    }
}

/// Every method that names a conversation any agent may call, with its other params (the
/// conversation goes in `conversationId`, or `parentConversationId` for `createConversation`).
pub fn conversation_methods() -> Vec<(&'static str, Value)> {
    vec![
        ("getConversation", json!({})),
        ("tail", json!({"sinceSeq": 0})),
        ("waitForChange", json!({"sinceSeq": 0, "timeoutMs": 0})),
        ("getUpdatesOrGuidance", json!({"sinceSeq": 0})),
        (
            "sendMessage",
            json!({"payload": {"text": "hi"}, "finality": "turn"}),
        ),
        ("sendTrace", json!({"payload": {"type": "note"}})),
        ("subscribe", json!({})),
        ("createConversation", json!({"participants": ["alice"]})),
        ("deleteConversation", json!({})),
    ]
}

/// Every HTTP route that names a conversation any agent may call (`ID` in the path), with its
/// body.
pub fn conversation_routes() -> Vec<(&'static str, &'static str)> {
    vec![
        ("GET /conversations/ID", ""),
        ("DELETE /conversations/ID", ""),
        ("GET /conversations/ID/wait?sinceSeq=0&timeoutMs=0", ""),
        ("GET /conversations/ID/events", ""),
        (
            "POST /conversations/ID/messages",
            r#"{"payload":{"text":"hi"},"finality":"turn"}"#,
        ),
    ]
}

/// A raw WebSocket speaking JSON text frames.
#[derive(Debug)]
pub struct RawWs {
    ws: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
}

impl RawWs {
    /// Sends one text frame.
    pub async fn send_text(&mut self, text: &str) {
        self.ws
            .send(Message::text(text.to_string()))
            .await
            .expect("send");
    }

    /// The next frame, waiting at most [`WAIT`]; none once the connection has ended.
    async fn next_frame(
        &mut self,
    ) -> Option<Result<Message, tokio_tungstenite::tungstenite::Error>> {
        tokio::time::timeout(WAIT, self.ws.next())
            .await
            .expect("a frame in time")
    }

    /// The next text frame as JSON (pings and pongs are skipped).
    pub async fn recv(&mut self) -> Value {
        loop {
            match self.next_frame().await {
                Some(Ok(Message::Text(t))) => {
                    return serde_json::from_str(&t).expect("json answer")
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                other => panic!("unexpected frame: {other:?}"),
            }
        }
    }

    /// The next text frame as it was sent (pings and pongs are skipped).
    pub async fn recv_text(&mut self) -> String {
        loop {
            match self.next_frame().await {
                Some(Ok(Message::Text(t))) => return t.to_string(),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                other => panic!("unexpected frame: {other:?}"),
            }
        }
    }

    /// Subscribes to `conversation` from `since`; the answer.
    pub async fn subscribe(&mut self, id: u64, conversation: &str, since: u64) -> Value {
        self.call(
            id,
            "subscribe",
            json!({"conversationId": conversation, "sinceSeq": since}),
        )
        .await
    }

    /// Waits (at most [`WAIT`]) until the server ends the connection: its close frame's code
    /// and reason, or none when the socket ended without one. Other frames are skipped.
    pub async fn closed(&mut self) -> Option<(u16, String)> {
        loop {
            match self.next_frame().await {
                Some(Ok(Message::Close(frame))) => {
                    return frame.map(|f| (u16::from(f.code), f.reason.to_string()))
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return None,
            }
        }
    }

    /// Sends a call and returns the next frame.
    pub async fn call(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send_text(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        )
        .await;
        self.recv().await
    }

    /// Sends a call and returns its answer, passing over the notifications before it.
    pub async fn request(&mut self, id: u64, method: &str, params: Value) -> Value {
        self.send_text(
            &json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string(),
        )
        .await;
        loop {
            let frame = self.recv().await;
            if frame["id"] == id {
                return frame;
            }
        }
    }

    /// Authenticates.
    pub async fn authenticate(&mut self, token: &str) {
        let r = self.call(0, "authenticate", json!({"token": token})).await;
        assert_eq!(r["result"]["ok"], true, "{r}");
    }
}

/// A WebSocket client that answers nothing, pings included: a raw TCP connection after the
/// handshake.
#[derive(Debug)]
pub struct DeafWs(tokio::net::TcpStream);

impl DeafWs {
    /// Connects to `url` (`ws://HOST:PORT/rpc`) and completes the handshake.
    pub async fn connect(url: &str) -> DeafWs {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let host = url
            .trim_start_matches("ws://")
            .trim_end_matches("/rpc")
            .to_string();
        let mut tcp = tokio::net::TcpStream::connect(&host)
            .await
            .expect("connect");
        tcp.write_all(
            format!(
                "GET /rpc HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                 Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .expect("send the handshake");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            let n = tokio::time::timeout(WAIT, tcp.read(&mut byte))
                .await
                .expect("a handshake answer in time")
                .expect("read the handshake answer");
            assert!(n == 1, "the server closed during the handshake");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        DeafWs(tcp)
    }

    /// Sends one client frame: `first` is its first byte (FIN, RSV bits, opcode), the payload
    /// masked with a zero key (so sent as it is).
    pub async fn send_frame(&mut self, first: u8, payload: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let mut frame = vec![first];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n < 65_536 => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        frame.extend_from_slice(&[0, 0, 0, 0]);
        frame.extend_from_slice(payload);
        // The server may close before it has read all of it.
        let _ = self.0.write_all(&frame).await;
    }

    /// Reads the server's frames until it ends the connection (at most [`WAIT`]): the code of
    /// the close frame it sent, or `None` if it ended the connection without one.
    pub async fn close_code(&mut self) -> Option<u16> {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        let mut chunk = [0u8; 65_536];
        tokio::time::timeout(WAIT, async {
            while let Ok(n) = self.0.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&chunk[..n]);
            }
        })
        .await
        .expect("the server ends the connection in time");
        // Walk the (unmasked) server frames for a close.
        let mut at = 0;
        while at + 2 <= got.len() {
            let (op, len7) = (got[at] & 0x0f, (got[at + 1] & 0x7f) as usize);
            let (len, head) = match len7 {
                126 if at + 4 <= got.len() => {
                    (u16::from_be_bytes([got[at + 2], got[at + 3]]) as usize, 4)
                }
                127 if at + 10 <= got.len() => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&got[at + 2..at + 10]);
                    (u64::from_be_bytes(b) as usize, 10)
                }
                n => (n, 2),
            };
            if op == 0x8 && len >= 2 && at + head + 2 <= got.len() {
                return Some(u16::from_be_bytes([got[at + head], got[at + head + 1]]));
            }
            at += head + len;
        }
        None
    }

    /// Reads (and ignores) what the server sends until it ends the connection, waiting at
    /// most [`WAIT`].
    pub async fn closed(&mut self) {
        use tokio::io::AsyncReadExt;
        let mut sink = [0u8; 4096];
        tokio::time::timeout(WAIT, async {
            while self.0.read(&mut sink).await.is_ok_and(|n| n > 0) {}
        })
        .await
        .expect("the server ends the connection in time");
    }
}

/// Waits (at most [`WAIT`]) until something listens on 127.0.0.1:`port`.
pub async fn wait_listening(port: u16, what: &str) {
    let until = tokio::time::Instant::now() + WAIT;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(tokio::time::Instant::now() < until, "{what} did not listen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next notification of a jsonrpsee subscription (within [`WAIT`]).
pub async fn next_event(
    sub: &mut jsonrpsee::core::client::Subscription<Value>,
    what: &str,
) -> Value {
    tokio::time::timeout(WAIT, sub.next())
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing in time"))
        .unwrap_or_else(|| panic!("{what}: the subscription closed"))
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// A `subscribe` with these params on a jsonrpsee client.
pub async fn subscribe(
    c: &WsClient,
    params: Value,
) -> jsonrpsee::core::client::Subscription<Value> {
    use jsonrpsee::core::client::SubscriptionClientT;
    c.subscribe::<Value, _>("subscribe", P(params), "unsubscribe")
        .await
        .expect("subscribe")
}

/// The JSON-RPC error code of a jsonrpsee client result.
pub fn error_code<T: std::fmt::Debug>(r: Result<T, jsonrpsee::core::ClientError>) -> i32 {
    match r {
        Err(jsonrpsee::core::ClientError::Call(e)) => e.code(),
        other => panic!("expected a call error, got {other:?}"),
    }
}

/// The whole log of a conversation, page by page (a `tail` page is at most 1,000 events).
pub async fn full_log(client: &dyn agent_sdk::AgentClient, id: &str) -> Vec<proto_spec::Event> {
    let mut log: Vec<proto_spec::Event> = Vec::new();
    loop {
        let since = log.last().map_or(0, |e| e.seq);
        let page = client
            .tail(proto_spec::TailParams {
                conversation_id: id.into(),
                since_seq: since,
                limit: None,
            })
            .await
            .expect("tail");
        let done =
            page.events.is_empty() || page.events.last().map(|e| e.seq) == Some(page.latest_seq);
        log.extend(page.events);
        if done {
            return log;
        }
    }
}

/// Waits (at most [`WAIT`]) until `cond` holds for the conversation's whole log, read again
/// each time the conversation moves (`waitForChange` past its last seq), never on a timer.
pub async fn log_until(
    client: &dyn agent_sdk::AgentClient,
    id: &str,
    what: &str,
    cond: impl Fn(&[proto_spec::Event]) -> bool,
) -> Vec<proto_spec::Event> {
    let until = tokio::time::Instant::now() + WAIT;
    loop {
        let log = full_log(client, id).await;
        if cond(&log) {
            return log;
        }
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "{id}: {what} did not happen: {log:?}");
        client
            .wait_for_change(proto_spec::WaitForChangeParams {
                conversation_id: id.to_string(),
                since_seq: log.last().map_or(0, |e| e.seq),
                timeout_ms: left.as_millis().max(1) as u64,
            })
            .await
            .expect("waitForChange");
    }
}

/// The payloads of the log's traces of type `kind` (`turn_start`, `llm_call`, …), in order.
pub fn traces(log: &[proto_spec::Event], kind: &str) -> Vec<Value> {
    log.iter()
        .filter(|e| e.kind == proto_spec::EventKind::Trace && e.payload_value()["type"] == kind)
        .map(|e| e.payload_value())
        .collect()
}

/// What the log's `turn_error` traces say, in order.
pub fn turn_errors(log: &[proto_spec::Event]) -> Vec<String> {
    traces(log, "turn_error")
        .iter()
        .map(|t| t["error"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// Waits (at most [`WAIT`]) until `cond` holds for the conversation's snapshot: read again each
/// time the conversation moves (`waitForChange` past the head it was read at), never on a timer.
pub async fn wait_for(
    client: &dyn agent_sdk::AgentClient,
    id: &str,
    what: &str,
    cond: impl Fn(&proto_spec::Snapshot) -> bool,
) -> proto_spec::Snapshot {
    let until = tokio::time::Instant::now() + WAIT;
    loop {
        let s = client.get_conversation(id).await.expect("snapshot");
        if cond(&s) {
            return s;
        }
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "{id}: {what} did not happen: {s:?}");
        client
            .wait_for_change(proto_spec::WaitForChangeParams {
                conversation_id: id.to_string(),
                since_seq: s.latest_seq,
                timeout_ms: left.as_millis().max(1) as u64,
            })
            .await
            .expect("waitForChange");
    }
}

/// Waits until `cond` holds, polling every few milliseconds; fails after [`WAIT`].
pub async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let until = tokio::time::Instant::now() + WAIT;
    while !cond() {
        assert!(tokio::time::Instant::now() < until, "{what} did not happen");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Creates a conversation from an inline scenario (as `client`, an admin).
pub async fn create_scenario(client: &dyn agent_sdk::AgentClient, id: &str, scenario: Value) {
    client
        .create_conversation(proto_spec::CreateConversationParams {
            conversation_id: Some(id.into()),
            scenario: Some(scenario),
            ..Default::default()
        })
        .await
        .expect("create");
}

/// Sends a text message (finality `none`) with an idempotency key; its answer (panics on an
/// error).
pub async fn ws_send(c: &WsClient, conv: &str, text: &str, key: &str) -> Value {
    c.request(
        "sendMessage",
        P(json!({"conversationId": conv, "payload": {"text": text}, "finality": "none", "clientRequestId": key})),
    )
    .await
    .unwrap_or_else(|e| panic!("sendMessage {key}: {e}"))
}

/// Every event of `conv` as `c` reads it (`tail`), in pages.
pub async fn ws_log(c: &WsClient, conv: &str) -> Vec<Value> {
    let mut all = Vec::new();
    loop {
        let page: Value = c
            .request(
                "tail",
                P(json!({"conversationId": conv, "sinceSeq": all.len(), "limit": 500})),
            )
            .await
            .expect("tail");
        let events = page["events"].as_array().expect("events").clone();
        if events.is_empty() {
            return all;
        }
        all.extend(events);
    }
}

/// [`log_until`] over a jsonrpsee client: waits (at most [`WAIT`]) until `cond` holds for the
/// conversation's whole log, read again each time the conversation moves past its last seq.
pub async fn ws_log_until(
    c: &WsClient,
    conv: &str,
    what: &str,
    cond: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let until = tokio::time::Instant::now() + WAIT;
    loop {
        let log = ws_log(c, conv).await;
        if cond(&log) {
            return log;
        }
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "{conv}: {what} did not happen: {log:?}");
        let since = log.last().and_then(|e| e["seq"].as_u64()).unwrap_or(0);
        let _: Value = c
            .request(
                "waitForChange",
                P(json!({"conversationId": conv, "sinceSeq": since, "timeoutMs": left.as_millis().max(1) as u64})),
            )
            .await
            .expect("waitForChange");
    }
}

/// One HTTP/1.1 request (`GET /path`, say) over a plain TCP connection to `host` (`ip:port`),
/// with `Connection: close`, the further header lines `headers` (each ending in `\r\n`) and
/// `body` (with its length, when not empty): the whole answer, status line and headers
/// included.
pub async fn http_raw(host: &str, request: &str, headers: &str, body: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(host).await.expect("connect");
    let length = if body.is_empty() {
        String::new()
    } else {
        format!("Content-Length: {}\r\n", body.len())
    };
    tcp.write_all(
        format!(
            "{request} HTTP/1.1\r\nHost: {host}\r\n{headers}{length}Connection: close\r\n\r\n{body}"
        )
        .as_bytes(),
    )
    .await
    .expect("send the request");
    let mut out = String::new();
    tokio::time::timeout(WAIT, tcp.read_to_string(&mut out))
        .await
        .expect("an answer in time")
        .expect("read the answer");
    out
}
