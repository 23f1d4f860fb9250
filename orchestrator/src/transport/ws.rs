//! JSON-RPC over WebSocket at `/rpc`: the handshake, then one task that reads the connection's
//! frames and runs each call on a task of its own.
//!
//! Every frame the server sends (answers, events, turn offers, pings, the close) is written
//! whole into the connection's send buffer through its [`ConnWriter`]; the WebSocket library
//! (soketto) only reads frames and answers the peer's pings and close. A frame over the frame
//! limit is answered `-32007` and the connection stays open. The server pings every
//! `ping_interval`; a connection from which nothing (not a pong, not a frame) arrived for three
//! intervals is closed (1001). When the server stops, a connection stops reading, lets the
//! calls in flight answer (for up to [`DRAIN`]), and is closed (1001).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::Response;
use futures::io::BufReader;
use hyper_util::rt::TokioIo;
use proto_spec::method::names;
use proto_spec::{ErrorCode, RpcError};
use soketto::connection::{Error as WsError, Receiver};
use soketto::Incoming;
use tokio::sync::Notify;
use tokio_util::compat::{Compat, TokioAsyncReadCompatExt};

use crate::engine::shares::Shares;
use crate::transport::http::error_response;
use crate::transport::jsonrpc::{self, Frame};
use crate::transport::net::{close_frame, ping_frame, text_frame, ConnWriter};
use crate::transport::rpc::{Methods, Outcome};
use crate::transport::session::Session;

/// How long a stopping server lets a connection's calls in flight answer.
pub const DRAIN: Duration = Duration::from_secs(5);

/// The open WebSocket connections, for `--max-connections` and for a stop to wait on.
#[derive(Debug, Default)]
pub struct Connections {
    open: AtomicUsize,
    none_open: Notify,
    /// Each identity's turn in the readers ([`super::turnstile`]).
    turnstiles: super::turnstile::Turnstiles,
    /// The connections of each address (`--max-connections-per-address`).
    per_address: Arc<Shares<std::net::IpAddr>>,
    /// The connections each agent authenticated (`--max-connections-per-agent`).
    per_agent: Arc<Shares<String>>,
}

impl Connections {
    /// The connections each agent authenticated: a session takes its share there.
    pub fn per_agent(&self) -> &Arc<Shares<String>> {
        &self.per_agent
    }

    /// Counts a connection if fewer than `max` are open.
    fn enter(self: &Arc<Self>, max: usize) -> Option<Counted> {
        let mut n = self.open.load(Ordering::Relaxed);
        loop {
            if n >= max {
                return None;
            }
            match self
                .open
                .compare_exchange_weak(n, n + 1, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(Counted(self.clone())),
                Err(now) => n = now,
            }
        }
    }

    /// Resolves once no connection is open.
    pub async fn closed(&self) {
        loop {
            let none = self.none_open.notified();
            tokio::pin!(none);
            none.as_mut().enable();
            if self.open.load(Ordering::Acquire) == 0 {
                return;
            }
            none.await;
        }
    }
}

/// One open connection, counted while it lives.
#[derive(Debug)]
struct Counted(Arc<Connections>);

impl Drop for Counted {
    fn drop(&mut self) {
        if self.0.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.none_open.notify_waiters();
        }
    }
}

/// Answers a WebSocket upgrade at `/rpc`, and serves the connection once upgraded.
pub fn upgrade(
    mut req: Request<Body>,
    methods: Methods,
    session: Arc<Session>,
    connections: &Arc<Connections>,
) -> Response {
    let limits = methods.orchestrator().limits().clone();
    let Some(frames) = session.frames().cloned() else {
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &RpcError::new(ErrorCode::Internal, "the connection has no frame writer"),
        );
    };
    let Some(counted) = connections.enter(limits.max_connections as usize) else {
        return error_response(
            StatusCode::TOO_MANY_REQUESTS,
            &RpcError::new(
                ErrorCode::RateLimited,
                format!(
                    "too many open connections (limit {}); retry later",
                    limits.max_connections
                ),
            )
            .with_data(serde_json::json!({"limit": limits.max_connections})),
        );
    };
    // Counted before anyone authenticates: one address cannot hold every connection.
    let address_share = match crate::transport::accept::peer_of(&req) {
        Some(ip) => match connections
            .per_address
            .take(&ip, limits.max_connections_per_address as usize)
        {
            Some(share) => Some(share),
            None => {
                let cap = limits.max_connections_per_address;
                return error_response(
                    StatusCode::TOO_MANY_REQUESTS,
                    &RpcError::new(
                        ErrorCode::RateLimited,
                        format!("too many open connections from {ip} (limit {cap} an address); close some first"),
                    )
                    .with_data(serde_json::json!({"limit": cap, "per": "address"})),
                );
            }
        },
        None => None,
    };
    let mut server = soketto::handshake::http::Server::new();
    let response = match server.receive_request(&req) {
        Ok(response) => response,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                &RpcError::new(
                    ErrorCode::InvalidRequest,
                    format!("not a WebSocket handshake: {e}"),
                ),
            )
        }
    };
    let upgraded = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let _address_share = address_share;
        let io = match upgraded.await {
            Ok(io) => io,
            Err(e) => {
                tracing::debug!(error = %e, "WebSocket upgrade failed");
                return;
            }
        };
        // A small read buffer (soketto reads a frame's header in pieces: one system call for
        // many frames instead of three a frame) and no write buffer (what soketto writes,
        // pongs and the answer to a close, lands in the connection's send buffer).
        let reader = BufReader::with_capacity(READ_BUFFER, TokioIo::new(io).compat());
        let mut builder = server.into_builder(reader);
        builder.set_max_message_size(limits.max_frame_bytes as usize);
        let (_sender, receiver) = builder.finish();
        session.watch(limits.auth_timeout, limits.idle_timeout);
        serve(
            methods,
            session,
            frames,
            receiver,
            limits.ping_interval,
            &counted.0.turnstiles,
        )
        .await;
    });
    response.map(|()| Body::empty())
}

type Io = BufReader<Compat<TokioIo<hyper::upgrade::Upgraded>>>;

/// The read buffer of a WebSocket connection.
const READ_BUFFER: usize = 2048;

/// Milliseconds since `start`.
fn since(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}

/// Reads frames until the connection ends, running each call on a task of its own.
async fn serve(
    methods: Methods,
    session: Arc<Session>,
    frames: ConnWriter,
    mut receiver: Receiver<Io>,
    ping_interval: Duration,
    turnstiles: &super::turnstile::Turnstiles,
) {
    let start = Instant::now();
    // When something last arrived from the peer (ms since `start`).
    let last_heard = Arc::new(AtomicU64::new(0));
    let keeper = tokio::spawn(keep_alive(
        methods.clone(),
        Arc::downgrade(&session),
        frames.clone(),
        last_heard.clone(),
        start,
        ping_interval,
    ));
    let mut conn = Connection {
        max_response: methods.orchestrator().limits().max_response_bytes(),
        methods,
        session,
        frames,
        turnstiles,
        turnstile: None,
    };
    let mut buf = Vec::new();
    // The last message was over the limit: the rest of its fragments may follow.
    let mut too_large = false;
    loop {
        let read = receiver.receive(&mut buf).await;
        if matches!(
            read,
            Ok(Incoming::Data(_) | Incoming::Pong(_)) | Err(WsError::MessageTooLarge { .. })
        ) {
            last_heard.store(since(start), Ordering::Relaxed);
        }
        let went = match read {
            Ok(Incoming::Data(_)) => {
                too_large = false;
                conn.on_frame(std::mem::take(&mut buf)).await.is_err()
            }
            Ok(Incoming::Pong(_)) => false,
            Ok(Incoming::Closed(_)) => true,
            Err(WsError::MessageTooLarge { current, maximum }) => {
                too_large = true;
                buf.clear();
                let e = RpcError::new(
                    ErrorCode::FrameTooLarge,
                    format!("the frame is {current} bytes, over the limit of {maximum}"),
                )
                .with_data(serde_json::json!({"limit": maximum}));
                conn.send_error("null", &e).await.is_err()
            }
            Err(e) => {
                // A frame the protocol does not allow ends the connection with the close code
                // RFC 6455 gives it; an I/O error (the peer went) ends it without one.
                if let Some((code, reason)) = close_for(&e, too_large) {
                    tracing::debug!(error = %e, code, "WebSocket connection closed: a protocol error");
                    conn.frames.abort(&close_frame(code, reason));
                } else {
                    tracing::debug!(error = %e, "WebSocket connection ended");
                }
                true
            }
        };
        if went {
            break;
        }
    }
    keeper.abort();
    conn.session.subscriptions().cancel_all();
    conn.session.executors().cancel_all();
}

/// What a connection's reader needs for each frame it reads.
struct Connection<'a> {
    methods: Methods,
    session: Arc<Session>,
    frames: ConnWriter,
    max_response: usize,
    turnstiles: &'a super::turnstile::Turnstiles,
    /// The turnstile of the identity the session speaks as (kept while it does not change).
    turnstile: Option<(String, Arc<tokio::sync::Semaphore>)>,
}

impl Connection<'_> {
    /// Handles one text frame; `Err` when the connection is gone.
    async fn on_frame(&mut self, frame: Vec<u8>) -> std::io::Result<()> {
        match jsonrpc::read(frame) {
            Frame::Notification => Ok(()),
            Frame::Refused(id, e) => self.send_error(&id, &e).await,
            Frame::Call(mut call) => {
                // Admitted here, before the next frame is read: a connection whose identity is
                // over its rate is read once per refusal's hold, and what it sends meanwhile
                // waits in its socket.
                if let Err(e) = self.methods.admit(&self.session, &mut call).await {
                    return self.send_error(call.id(), &e).await;
                }
                let turn = self.turn_for(&call).await;
                self.run(call, turn).await;
                Ok(())
            }
        }
    }

    /// Answers with a JSON-RPC error.
    async fn send_error(&self, id: &str, e: &RpcError) -> std::io::Result<()> {
        send(&self.frames, &jsonrpc::error(id, e, "ws")).await
    }

    /// The call's turn among its identity's readers, for its first run only (none for
    /// `authenticate` or before it).
    async fn turn_for(
        &mut self,
        call: &jsonrpc::Call,
    ) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if call.method() == names::AUTHENTICATE {
            return None;
        }
        let who = self.session.identity().ok()?;
        if self
            .turnstile
            .as_ref()
            .is_none_or(|(a, _)| *a != who.principal())
        {
            let principal = who.principal().into_owned();
            let t = self.turnstiles.of(&principal);
            self.turnstile = Some((principal, t));
        }
        let (_, t) = self.turnstile.as_ref()?;
        t.clone().acquire_owned().await.ok()
    }

    /// Runs a call here until it waits: a call that needs nothing else (a read of the state)
    /// is answered before the next frame is read, so that a busy connection puts one task at a
    /// time in the runtime's queue, not one per frame. One that waits (a commit, a long wait)
    /// goes on in a task of its own, and the calls on a connection still run concurrently.
    /// `turn` is let go before it waits.
    async fn run(&self, call: jsonrpc::Call, turn: Option<tokio::sync::OwnedSemaphorePermit>) {
        let methods = self.methods.clone();
        let session = self.session.clone();
        let frames = self.frames.clone();
        let max_response = self.max_response;
        let mut running = Box::pin(async move {
            let id = call.id().to_owned();
            let outcome = tokio::select! {
                _ = frames.closed() => return,
                o = methods.run(session, call) => o,
            };
            let answer = match outcome {
                Ok(Outcome::Written) => return,
                Ok(Outcome::Result(r)) => jsonrpc::answer(&id, Ok(r), max_response, "ws"),
                Err(e) => jsonrpc::error(&id, &e, "ws"),
            };
            // A connection gone has no one to answer.
            let _ = send(&frames, &answer).await;
        });
        let first = futures::poll!(running.as_mut());
        drop(turn);
        if first.is_pending() {
            tokio::spawn(running);
        } else {
            // Answered here: let the other connections' tasks run before the next frame of
            // this one (a connection with many frames buffered would otherwise keep a worker
            // thread for all of them).
            tokio::task::yield_now().await;
        }
    }
}

/// The close code and reason for a read error that breaks the protocol: 1009 for a message
/// over the limit, and for what follows a fragmented one (`after_too_large`: its remaining
/// fragments cannot be read as frames); 1002 for a frame the protocol does not allow (a
/// reserved opcode or bit, a fragmented control frame, a stray continuation); `None` for an I/O
/// error or a connection already closed.
fn close_for(e: &WsError, after_too_large: bool) -> Option<(u16, &'static str)> {
    use soketto::base::Error as Codec;
    match e {
        WsError::Io(_) | WsError::Closed | WsError::Codec(Codec::Io(_)) => None,
        WsError::Codec(Codec::PayloadTooLarge { .. }) | WsError::MessageTooLarge { .. } => {
            Some((1009, "the message is over the frame limit"))
        }
        _ if after_too_large => Some((1009, "the message is over the frame limit")),
        _ => Some((1002, "a frame the WebSocket protocol does not allow")),
    }
}

/// Writes one text frame whose payload is `payload`.
async fn send(frames: &ConnWriter, payload: &[u8]) -> std::io::Result<()> {
    let mut frame = Vec::with_capacity(payload.len() + 10);
    text_frame(&mut frame, payload, &[]);
    frames.write_frames(&frame).await
}

/// Pings the peer every `interval` and closes a connection that has been silent for three;
/// when the server stops, lets the calls in flight answer, then closes the connection.
async fn keep_alive(
    methods: Methods,
    session: std::sync::Weak<Session>,
    frames: ConnWriter,
    last_heard: Arc<AtomicU64>,
    start: Instant,
    interval: Duration,
) {
    let mut closing = methods.orchestrator().hub().closing();
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    let silent_limit = 3 * interval.as_millis() as u64;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = closing.wait_for(|c| *c) => break,
            _ = frames.closed() => return,
        }
        let silent = since(start).saturating_sub(last_heard.load(Ordering::Relaxed));
        if silent >= silent_limit {
            crate::engine::telemetry::dropped_connection("ping_timeout");
            let reason = format!("nothing received for {} s", silent / 1000);
            frames.abort(&close_frame(1001, &reason));
            return;
        }
        // A peer whose buffer is full is not reading: the ping waits for nothing.
        let _ = frames.try_write(&ping_frame(b""));
    }
    let deadline = tokio::time::Instant::now() + DRAIN;
    while session.upgrade().is_some_and(|s| s.in_flight() > 0)
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    frames.abort(&close_frame(1001, "the server is stopping"));
}
