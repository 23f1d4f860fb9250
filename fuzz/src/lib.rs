//! What the fuzz targets share: one server in process (its method table and its HTTP routes) on
//! a SQLite database in a temporary folder, with tokens for alice, bob, carol (agents) and
//! admin, and the conversation `c1` of alice and bob. It is made again every [`RENEW_EVERY`]
//! inputs (the old one stopped and its folder removed), so that what inputs create does not
//! pile up: a run of millions of inputs goes as fast at its end as at its start.
//!
//! Its limits keep one input short: long-polls wait at most 5 ms, and a function agent's
//! scenario check is bounded as in the server.

pub mod a2a;
pub mod mcp;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous};
use orchestrator::transport::jsonrpc::{self, Frame};
use orchestrator::transport::rpc::{Methods, Outcome};
use orchestrator::transport::session::Session;
use orchestrator::transport::ws::Connections;
use serde_json::{json, Value};

/// The identities an input may speak as: none, then these.
pub const AGENTS: [&str; 4] = ["alice", "bob", "carol", "admin"];

/// The shared server.
pub struct Harness {
    /// Runs every call.
    pub rt: tokio::runtime::Runtime,
    /// The orchestrator.
    pub orch: Arc<Orchestrator>,
    /// Its JSON-RPC methods.
    pub methods: Methods,
    /// Its HTTP routes.
    pub app: axum::Router,
    /// A token of each of [`AGENTS`].
    pub tokens: Vec<String>,
    /// A session of no one, then of each of [`AGENTS`], authenticated once: for the targets
    /// whose inputs do not change a session (they only call methods through it).
    sessions: Vec<Arc<Session>>,
    _dir: tempfile::TempDir,
}

/// A SQLite store in a new temporary folder (removed when the folder is dropped).
pub fn scratch_store() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store = SqliteStore::open(dir.path().join("fuzz.db"), Synchronous::Normal);
    (dir, Arc::new(store.expect("a store")))
}

/// How many inputs one server (or adapter) takes before it is made again.
pub const RENEW_EVERY: u64 = 2_000;

/// A value made again every [`RENEW_EVERY`] uses (or as many as [`Renewed::every`] says); the
/// one it replaces is retired first.
pub struct Renewed<T> {
    current: Mutex<Option<(Arc<T>, u64)>>,
    every: u64,
}

impl<T> Renewed<T> {
    /// None made yet; renewed every [`RENEW_EVERY`] uses.
    pub const fn new() -> Self {
        Renewed::every(RENEW_EVERY)
    }

    /// None made yet; renewed every `uses` uses.
    pub const fn every(uses: u64) -> Self {
        Renewed {
            current: Mutex::new(None),
            every: uses,
        }
    }

    /// The current value, made (after `retire` has the old one, when no input holds it any
    /// more) on first use and every `every` uses.
    pub fn get(&self, make: impl FnOnce() -> T, retire: impl FnOnce(T)) -> Arc<T> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((value, uses)) = current.as_mut() {
            if *uses < self.every {
                *uses += 1;
                return value.clone();
            }
        }
        if let Some((old, _)) = current.take() {
            if let Ok(old) = Arc::try_unwrap(old) {
                retire(old);
            }
        }
        let value = Arc::new(make());
        *current = Some((value.clone(), 1));
        value
    }
}

impl<T> Default for Renewed<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// An orchestrator serving WebSocket on 127.0.0.1, in a runtime of its own with one worker,
/// for an adapter whose routes run in process (on the same runtime); long-polls wait at most
/// 5 ms.
pub struct Served {
    /// Runs the server, and every request to the adapter (`block_on`).
    pub rt: tokio::runtime::Runtime,
    /// A token of the agent the adapter speaks as.
    pub token: String,
    server: orchestrator::transport::server::RunningServer,
    _dir: tempfile::TempDir,
}

impl Served {
    /// A server on a new database with a token for `agent` (an admin if `admin`), the named
    /// `scenarios`, and the conversations `made` creates on it before it serves.
    pub fn start<F>(agent: &str, admin: bool, scenarios: Vec<(String, Value)>, made: F) -> Served
    where
        F: AsyncFnOnce(&Orchestrator),
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let (dir, store) = scratch_store();
        let token = orchestrator::engine::auth::create_token(store.as_ref(), agent, admin)
            .expect("a token");
        let server = rt.block_on(async {
            let options = orchestrator::host::Options {
                limits: Limits {
                    max_wait: Duration::from_millis(5),
                    rate_per_identity: 0,
                    ..Limits::default()
                },
                scenarios,
                ..Default::default()
            };
            let orch = options.start(store).expect("the orchestrator");
            made(orch.as_ref()).await;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a port");
            orchestrator::transport::server::start(orch, listener)
                .await
                .expect("serving")
        });
        Served {
            rt,
            token,
            server,
            _dir: dir,
        }
    }

    /// The server's WebSocket URL.
    pub fn url(&self) -> String {
        self.server.rpc_url()
    }

    /// Stops the server; drop the adapter first, so that no connection of its is left for the
    /// server to wait for.
    pub fn stop(self) {
        self.rt.block_on(self.server.stop());
    }
}

/// `list[i]`, or `other` when `i` is past its end: a known name most of the time, any string
/// otherwise.
pub fn pick(list: &[&str], i: u8, other: &str) -> String {
    list.get(i as usize).map_or(other, |m| m).to_string()
}

/// A JSON-RPC id of one of the kinds a client may send, or of one it may not (an array).
pub fn any_id(n: u8, kinds: u8) -> Value {
    match n % kinds {
        0 => json!(n),
        1 => json!(format!("id-{n}")),
        2 => Value::Null,
        3 if kinds > 4 => json!(true),
        _ => json!([n]),
    }
}

/// `app`'s answer to `req`; a hang (no answer within 5 s) fails the input.
pub async fn answer_in_time(
    app: &axum::Router,
    req: axum::http::Request<axum::body::Body>,
) -> axum::response::Response {
    use tower::ServiceExt;
    tokio::time::timeout(Duration::from_secs(5), app.clone().oneshot(req))
        .await
        .expect("an answer within 5 s")
        .expect("infallible")
}

/// The server: the same one for [`RENEW_EVERY`] inputs.
pub fn harness() -> Arc<Harness> {
    static H: Renewed<Harness> = Renewed::new();
    H.get(Harness::make, |old| {
        old.rt.block_on(old.orch.shutdown());
    })
}

impl Harness {
    /// A new server with its tokens and `c1`.
    fn make() -> Harness {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let (dir, store) = scratch_store();
        let tokens = AGENTS
            .iter()
            .map(|a| {
                orchestrator::engine::auth::create_token(store.as_ref(), a, *a == "admin")
                    .expect("a token")
            })
            .collect();
        let limits = Limits {
            max_wait: Duration::from_millis(5),
            rate_per_identity: 0,
            ..Limits::default()
        };
        let (orch, methods, app) = rt.block_on(async {
            let orch = Orchestrator::open(store, limits).expect("the orchestrator");
            let methods = orchestrator::transport::rpc::methods(orch.clone());
            let app = orchestrator::transport::server::app(
                orch.clone(),
                Arc::new(Connections::default()),
            );
            (orch, methods, app)
        });
        let mut h = Harness {
            rt,
            orch,
            methods,
            app,
            tokens,
            sessions: Vec::new(),
            _dir: dir,
        };
        h.sessions = (0..=AGENTS.len()).map(|who| h.session(who)).collect();
        let admin = h.session(4);
        let made = h.call(
            &admin,
            "createConversation",
            json!({"conversationId": "c1", "participants": ["alice", "bob"]}),
        );
        assert!(made.get("result").is_some(), "{made}");
        h
    }
}

impl Harness {
    /// A session authenticated as `AGENTS[who - 1]`, or not at all for 0 (and beyond).
    pub fn session(&self, who: usize) -> Arc<Session> {
        let session = Arc::new(Session::new(None, None));
        if let Some(token) = who.checked_sub(1).and_then(|i| self.tokens.get(i)) {
            let r = self.call(&session, "authenticate", json!({"token": token}));
            assert_eq!(r["result"]["ok"], true, "{r}");
        }
        session
    }

    /// The session of [`Harness::session`]`(who)` made with the harness, the same for every
    /// input: for calls that do not change it (no `authenticate`, no subscription).
    pub fn shared_session(&self, who: usize) -> Arc<Session> {
        self.sessions[who.min(AGENTS.len())].clone()
    }

    /// Runs one JSON-RPC frame on `session`: its answer, or none for a notification.
    pub fn frame(&self, session: &Arc<Session>, frame: Vec<u8>) -> Option<Value> {
        let answer = match jsonrpc::read(frame) {
            Frame::Notification => return None,
            Frame::Refused(id, e) => jsonrpc::error(&id, &e, "fuzz"),
            Frame::Call(call) => {
                let id = call.id().to_owned();
                match self.rt.block_on(self.methods.run(session.clone(), call)) {
                    Ok(Outcome::Result(r)) => jsonrpc::answer(&id, Ok(r), 1 << 24, "fuzz"),
                    Ok(Outcome::Written) => jsonrpc::result(&id, "null"),
                    Err(e) => jsonrpc::error(&id, &e, "fuzz"),
                }
            }
        };
        let v: Value = serde_json::from_slice(&answer).expect("every answer is JSON");
        let ok = v.get("result").is_some() != v.get("error").is_some();
        assert!(ok, "an answer has a result or an error: {v}");
        if let Some(code) = v["error"]["code"].as_i64() {
            assert!(
                proto_spec::ErrorCode::from_code(code as i32).is_some(),
                "a code from the table: {v}"
            );
            assert!(v["error"]["data"]["error"].is_string(), "data.error: {v}");
        }
        Some(v)
    }

    /// Calls `method` with `params` on `session`: the answer.
    pub fn call(&self, session: &Arc<Session>, method: &str, params: Value) -> Value {
        let frame = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        self.frame(session, frame.to_string().into_bytes())
            .expect("a call is answered")
    }
}
