//! The HTTP host: axum on one port, with JSON-RPC at `/rpc` (WebSocket, [`crate::transport::ws`],
//! or one call per HTTP `POST`) and the routes of [`crate::transport::http`] beside it.
//!
//! Each request to `/rpc` gets a fresh [`Session`]; a WebSocket upgrade is one request, so the
//! session lives as long as the connection. [`RunningServer::stop`] ends feeds and waits,
//! closes every WebSocket session, stops accepting, and stops the writer once every queued
//! append is committed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use proto_spec::{ErrorCode, RpcError};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::engine::error::Result;
use crate::engine::service::Orchestrator;
use crate::transport::accept;
use crate::transport::jsonrpc::{self, Frame};
use crate::transport::rpc::{self, Methods, Outcome};
use crate::transport::session::Session;
use crate::transport::ws::{self, Connections};

#[derive(Clone)]
struct AppState {
    orch: Arc<Orchestrator>,
    methods: Methods,
    connections: Arc<Connections>,
}

/// A server that is running; stop it with [`RunningServer::stop`].
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    orch: Arc<Orchestrator>,
    connections: Arc<Connections>,
    http_stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The WebSocket URL of `/rpc`.
    pub fn rpc_url(&self) -> String {
        format!("ws://{}/rpc", self.addr)
    }

    /// The orchestrator it serves.
    pub fn orchestrator(&self) -> &Arc<Orchestrator> {
        &self.orch
    }

    /// Stops gracefully: open subscriptions and waits end, WebSocket sessions close, and every
    /// acknowledged event is on disk when this returns.
    pub async fn stop(self) {
        self.orch.hub().close();
        let _ = self.http_stop.send(());
        let _ = tokio::time::timeout(
            ws::DRAIN + Duration::from_secs(1),
            self.connections.closed(),
        )
        .await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        self.orch.shutdown().await;
    }
}

/// The listen backlog: bursts of thousands of connections (long-polls, idle sessions) queue
/// instead of being dropped and retried by the client a second later.
pub const BACKLOG: u32 = 4096;

/// Binds `addr` with [`BACKLOG`] (address reuse on, so a restart can take the port at once).
pub fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// What the server accepts connections on.
enum Listening {
    Plain(crate::transport::net::CoalescingListener),
    Tls(crate::transport::net::TlsCoalescingListener),
}

/// Every route the server answers: `/rpc`, `/healthz` and those of [`crate::transport::http`],
/// with the JSON answers for a method a route does not take and a request target too long.
/// WebSocket connections upgraded at `/rpc` are counted in `connections`.
pub fn app(orch: Arc<Orchestrator>, connections: Arc<Connections>) -> Router {
    let state = AppState {
        orch: orch.clone(),
        methods: rpc::methods(orch.clone()),
        connections,
    };
    Router::new()
        .route("/rpc", any(rpc_route))
        .route("/healthz", get(healthz))
        .with_state(state)
        .merge(crate::transport::http::router(orch))
        .method_not_allowed_fallback(crate::transport::http::method_not_allowed)
        .layer(axum::middleware::from_fn(crate::transport::http::limit_uri))
}

/// Starts serving on `listener`.
pub async fn start(orch: Arc<Orchestrator>, listener: TcpListener) -> Result<RunningServer> {
    start_with(orch, listener, None).await
}

/// Starts serving on `listener`, over TLS when `tls` is given (`wss://`, `https://`).
pub async fn start_with(
    orch: Arc<Orchestrator>,
    listener: TcpListener,
    tls: Option<Arc<agent_sdk::tls::ServerTls>>,
) -> Result<RunningServer> {
    let connections = Arc::new(Connections::default());
    let app = app(orch.clone(), connections.clone());
    let addr = listener.local_addr()?;
    let (http_stop, stopped) = oneshot::channel::<()>();
    // Small frames (a claim, a reply) must not wait for Nagle's algorithm, and many small
    // frames to one connection leave in one write when the server is busy.
    let listening = match tls {
        Some(tls) => Listening::Tls(crate::transport::net::TlsCoalescingListener(
            agent_sdk::tls::incoming(listener, tls)?,
        )),
        None => Listening::Plain(crate::transport::net::CoalescingListener(listener)),
    };
    let sockets = crate::transport::accept::SocketLimits {
        max_sockets: orch.limits().max_sockets,
        header_timeout: orch.limits().header_timeout,
    };
    let task = tokio::spawn(async move {
        match listening {
            Listening::Plain(l) => accept::serve(l, app, stopped, sockets).await,
            Listening::Tls(l) => accept::serve(l, app, stopped, sockets).await,
        }
    });
    Ok(RunningServer {
        addr,
        orch,
        connections,
        http_stop,
        task,
    })
}

async fn rpc_route(State(app): State<AppState>, req: Request<Body>) -> Response {
    let upgrade = req
        .headers()
        .get(http::header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if upgrade {
        let frames = accept::writer_of(&req);
        let session = Arc::new(
            Session::new(
                Some(crate::engine::telemetry::Open::connection("ws")),
                frames,
            )
            .with_agent_shares(app.connections.per_agent().clone()),
        );
        return ws::upgrade(req, app.methods, session, &app.connections);
    }
    if req.method() != Method::POST {
        return crate::transport::http::error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &RpcError::new(
                ErrorCode::InvalidRequest,
                "/rpc takes a WebSocket upgrade (GET) or one JSON-RPC call per POST",
            ),
        );
    }
    let max = app.orch.limits().max_frame_bytes as usize;
    let read =
        crate::transport::http::read_body(req.into_body(), max, app.orch.limits().header_timeout);
    let body = match read.await {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => {
            return crate::transport::http::error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                &RpcError::new(
                    ErrorCode::FrameTooLarge,
                    format!("the body is over the limit of {max} bytes"),
                )
                .with_data(serde_json::json!({"limit": max})),
            )
        }
        Err(e) => return e.into_response(),
    };
    let answer = match jsonrpc::read(body.to_vec()) {
        Frame::Notification => return StatusCode::NO_CONTENT.into_response(),
        Frame::Refused(id, e) => jsonrpc::error(&id, &e, "http"),
        Frame::Call(call) => {
            let id = call.id().to_owned();
            match app
                .methods
                .run(Arc::new(Session::new(None, None)), call)
                .await
            {
                Ok(Outcome::Result(r)) => {
                    jsonrpc::answer(&id, Ok(r), app.orch.limits().max_response_bytes(), "http")
                }
                // Only a WebSocket method writes its own answer, and it refuses HTTP.
                Ok(Outcome::Written) => jsonrpc::result(&id, "null"),
                Err(e) => jsonrpc::error(&id, &e, "http"),
            }
        }
    };
    ([(http::header::CONTENT_TYPE, "application/json")], answer).into_response()
}

async fn healthz(State(app): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok", "conversations": app.orch.hub().len()}))
}
