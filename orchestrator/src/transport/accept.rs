//! The accept loop: every TCP (or TLS) connection served as HTTP/1.1 by hyper, with the limits
//! that keep sockets from being held for nothing.
//!
//! - **Sockets are counted**, whatever they carry (a WebSocket, an SSE stream, a long-poll, a
//!   plain request, nothing yet): over `--max-sockets` a new one is answered `503` with the
//!   protocol's error (`RateLimited`) and closed at once.
//! - **Headers must arrive in time**: a connection that has not sent a whole request head
//!   within `--header-timeout-ms` of connecting, or of its last answer (an idle keep-alive
//!   connection), is closed. Bodies have the same time to arrive (each route that reads one
//!   answers `408` past it).
//!
//! Each request carries its connection's [`ConnWriter`] in its extensions, for the WebSocket
//! upgrade at `/rpc`. A stop lets every connection finish its request in progress.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::sync::{oneshot, watch};
use tower::ServiceExt;

use crate::transport::net::{Coalesced, ConnWriter};

/// What hyper buffers of a connection: a request head up to this size, and a response's body
/// up to this much ahead of the connection's send buffer (an SSE stream's chunks, which its
/// client may not read). hyper's default is ~400 KiB.
pub const HTTP_BUFFER: usize = 64 * 1024;

/// What the accept loop needs to know of the limits.
#[derive(Debug, Clone, Copy)]
pub struct SocketLimits {
    /// Open sockets at once.
    pub max_sockets: usize,
    /// How long a request head (and a body) may take to arrive.
    pub header_timeout: Duration,
}

/// Serves `listener` with `app` until `stop` fires, then lets the connections finish the
/// request in progress (hyper's graceful shutdown) and returns once they have all closed.
pub async fn serve<L>(
    mut listener: L,
    app: Router,
    mut stop: oneshot::Receiver<()>,
    limits: SocketLimits,
) where
    L: axum::serve::Listener<Io = Coalesced, Addr = SocketAddr>,
{
    let open = Arc::new(AtomicUsize::new(0));
    let (stopping, stopping_rx) = watch::channel(false);
    loop {
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut stop => break,
        };
        if open.load(Ordering::Relaxed) >= limits.max_sockets {
            tokio::spawn(refuse(io, limits.max_sockets));
            continue;
        }
        let counted = Counted::new(&open);
        let writer = io.frame_writer();
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(writer.clone());
            req.extensions_mut().insert(PeerAddr(addr));
            app.clone().oneshot(req.map(Body::new))
        });
        let mut stopping = stopping_rx.clone();
        tokio::spawn(async move {
            let _counted = counted;
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .max_buf_size(HTTP_BUFFER)
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let conn = builder
                .serve_connection(TokioIo::new(io), service)
                .with_upgrades();
            tokio::pin!(conn);
            let stop = async move {
                let _ = stopping.wait_for(|s| *s).await;
            };
            let served = tokio::select! {
                served = conn.as_mut() => served,
                _ = stop => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = served {
                if e.is_timeout() {
                    crate::engine::telemetry::dropped_connection("header_timeout");
                }
                tracing::debug!(peer = %addr, error = %e, "connection ended with an error");
            }
        });
    }
    let _ = stopping.send(true);
    while open.load(Ordering::Acquire) > 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One open socket, counted while it lives.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(open: &Arc<AtomicUsize>) -> Counted {
        open.fetch_add(1, Ordering::Relaxed);
        Counted(open.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Answers a socket over the limit with `503` and the protocol's error, and closes it.
async fn refuse(mut io: Coalesced, limit: usize) {
    crate::engine::telemetry::dropped_connection("socket_limit");
    let e = proto_spec::RpcError::new(
        proto_spec::ErrorCode::RateLimited,
        format!("too many open sockets (limit {limit}); retry later"),
    )
    .with_data(serde_json::json!({"limit": limit}));
    let body = serde_json::json!({"error": e.to_wire()}).to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = io.write_all(answer.as_bytes()).await;
    let _ = io.flush().await;
    let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
}

/// The connection a request came on (its frame writer), if the accept loop served it.
pub fn writer_of<B>(req: &axum::http::Request<B>) -> Option<ConnWriter> {
    req.extensions().get::<ConnWriter>().cloned()
}

/// The address a request's connection came from, which the accept loop puts into every
/// request's extensions.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

/// The address of the connection `req` came on, if the accept loop served it.
pub fn peer_of<B>(req: &axum::http::Request<B>) -> Option<std::net::IpAddr> {
    req.extensions().get::<PeerAddr>().map(|p| p.0.ip())
}
