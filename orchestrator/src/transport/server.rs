//! The HTTP host: axum on one port, with jsonrpsee mounted at `/rpc` as a tower service and
//! the routes of [`crate::transport::http`] beside it.
//!
//! Each request to `/rpc` gets a fresh [`Session`] in its extensions before it reaches
//! jsonrpsee; a WebSocket upgrade is one request, so the session lives as long as the
//! connection. [`RunningServer::stop`] ends feeds and waits, closes every WebSocket session,
//! stops accepting, and stops the writer once every queued append is committed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use jsonrpsee::server::middleware::rpc::RpcServiceBuilder;
use jsonrpsee::server::{
    stop_channel, BatchRequestConfig, PingConfig, ServerConfig, ServerHandle, StopHandle,
    TowerServiceBuilder,
};
use jsonrpsee::Methods;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tower::Service;

use crate::engine::error::Result;
use crate::engine::service::Orchestrator;
use crate::transport::rpc;
use crate::transport::session::Session;

#[derive(Clone)]
struct AppState {
    orch: Arc<Orchestrator>,
    methods: Methods,
    stop: StopHandle,
    rpc: TowerServiceBuilder<
        tower::layer::util::Stack<
            crate::transport::push::SubscriptionsLayer,
            tower::layer::util::Identity,
        >,
        tower::layer::util::Identity,
    >,
}

/// A server that is running; stop it with [`RunningServer::stop`].
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    orch: Arc<Orchestrator>,
    rpc_handle: ServerHandle,
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
        let _ = self.rpc_handle.stop();
        let _ = self.http_stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.rpc_handle.stopped()).await;
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
    let limits = orch.limits().clone();
    let module =
        rpc::module(orch.clone()).map_err(|e| crate::engine::error::Error::Setup(e.to_string()))?;
    let (stop, rpc_handle) = stop_channel();
    let config = ServerConfig::builder()
        .max_request_body_size(limits.max_frame_bytes)
        .max_response_body_size(limits.max_frame_bytes.saturating_mul(16))
        .max_connections(limits.max_connections)
        .max_subscriptions_per_connection(limits.max_subscriptions_per_connection)
        // One call per frame: a batch's library errors would collide with the protocol's codes,
        // and calls on a connection share its session and in-flight limit anyway.
        .set_batch_request_config(BatchRequestConfig::Disabled)
        // Partners sit behind flaky networks: ping every connection, and close one that has
        // answered no ping (and sent nothing) for three intervals, so its session and
        // subscriptions are released instead of lingering on a half-open socket.
        .enable_ws_ping(
            PingConfig::new()
                .ping_interval(limits.ping_interval)
                .inactive_limit(limits.ping_interval * 3)
                .max_failures(3),
        )
        .build();
    let rpc = jsonrpsee::server::Server::builder()
        .set_config(config)
        .set_rpc_middleware(
            RpcServiceBuilder::new()
                .layer(crate::transport::push::SubscriptionsLayer(orch.clone())),
        )
        .to_service_builder();
    let state = AppState {
        orch: orch.clone(),
        methods: module.into(),
        stop,
        rpc,
    };
    let app = Router::new()
        .route("/rpc", any(rpc_route))
        .route("/healthz", get(healthz))
        .with_state(state)
        .merge(crate::transport::http::router(orch.clone()));
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
    let task = tokio::spawn(async move {
        let app = app.into_make_service_with_connect_info::<crate::transport::net::ConnWriter>();
        let stopped = async move {
            let _ = stopped.await;
        };
        let served = match listening {
            Listening::Plain(l) => axum::serve(l, app).with_graceful_shutdown(stopped).await,
            Listening::Tls(l) => axum::serve(l, app).with_graceful_shutdown(stopped).await,
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "http server failed");
        }
    });
    Ok(RunningServer {
        addr,
        orch,
        rpc_handle,
        http_stop,
        task,
    })
}

async fn rpc_route(State(app): State<AppState>, mut req: Request<Body>) -> Response {
    let upgrade = req
        .headers()
        .get(http::header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let frames = req
        .extensions()
        .get::<axum::extract::ConnectInfo<crate::transport::net::ConnWriter>>()
        .map(|c| c.0.clone());
    let session = Arc::new(Session::new(
        upgrade.then(|| crate::engine::telemetry::Open::connection("ws")),
        frames.filter(|_| upgrade),
    ));
    let limits = app.orch.limits();
    session.watch(limits.auth_timeout, limits.idle_timeout);
    req.extensions_mut().insert(session);
    let mut svc = app.rpc.clone().build(app.methods.clone(), app.stop.clone());
    match svc.call(req).await {
        Ok(resp) => resp.map(Body::new),
        Err(e) => {
            tracing::warn!(error = %e, "rpc service failed");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

async fn healthz(State(app): State<AppState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok", "conversations": app.orch.hub().len()}))
}
