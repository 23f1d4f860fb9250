//! Accepted connections with coalesced writes.
//!
//! The WebSocket server writes and flushes every frame on its own, so a connection that is sent
//! a thousand small events a second costs a thousand `send` calls, and a thousand such
//! connections saturate the machine on system calls alone. [`Coalesced`] puts a small send
//! buffer in front of the socket with one writer task per connection: a write lands in the
//! buffer and wakes the writer, which sends everything that has accumulated in one call. When
//! the server is idle the writer runs at once, so a lone frame goes out with no added delay;
//! when it is busy, frames that arrive while the writer waits for its turn leave together.
//!
//! A flush returns once the bytes are in the buffer (as they would be in the kernel's), so
//! frames can gather; a full buffer (256 KiB) makes writers wait, so a slow reader still
//! pushes back on the server. An error on the socket is returned to the next write or flush.
//! Shutdown waits until the buffer is sent. When the connection is dropped, the writer sends
//! what is left, giving up after [`DRAIN_GRACE`] if the peer reads nothing.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// Writes wait once this much is buffered and not yet sent.
pub const HIGH_WATER: usize = 256 * 1024;
/// How long a dropped connection's writer keeps trying to send what is left.
pub const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// A writer's spare buffer above this size is released after use.
const KEEP_CAPACITY: usize = 16 * 1024;

/// A listener whose connections have `TCP_NODELAY` and coalesced writes.
#[derive(Debug)]
pub struct CoalescingListener(pub TcpListener);

impl axum::serve::Listener for CoalescingListener {
    type Io = Coalesced;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Coalesced, SocketAddr) {
        let (tcp, addr) = axum::serve::Listener::accept(&mut self.0).await;
        opened(Coalesced::new(tcp), addr, "plain")
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// Counts and logs a connection just accepted.
fn opened(mut conn: Coalesced, addr: SocketAddr, over: &'static str) -> (Coalesced, SocketAddr) {
    crate::engine::telemetry::accepted();
    tracing::debug!(peer = %addr, over, "connection opened");
    conn.peer = Some((addr, std::time::Instant::now()));
    (conn, addr)
}

/// A listener of TLS connections (handshakes done by [`agent_sdk::tls::incoming`]) whose
/// connections have coalesced writes, as [`CoalescingListener`]'s have.
#[derive(Debug)]
pub struct TlsCoalescingListener(pub agent_sdk::tls::TlsIncoming);

impl axum::serve::Listener for TlsCoalescingListener {
    type Io = Coalesced;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Coalesced, SocketAddr) {
        let (tls, addr) = self.0.accept().await;
        opened(Coalesced::over_tls(tls), addr, "tls")
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.0.local_addr())
    }
}

#[derive(Debug, Default)]
struct Out {
    buf: Vec<u8>,
    error: Option<io::ErrorKind>,
    /// No more writes: send what is buffered, then shut the write side down.
    shutdown: bool,
    /// The writer has finished (shut down, failed or given up).
    done: bool,
    /// The connection was dropped.
    dropped: bool,
    /// A write waiting for room.
    blocked: Option<Waker>,
    /// A shutdown waiting for the writer to finish.
    closing: Option<Waker>,
    /// The WebSocket server has written part of a frame and not yet flushed it: frames written
    /// through a [`ConnWriter`] wait in `held` until the flush.
    mid_frame: bool,
    /// Whole frames from a [`ConnWriter`], waiting for the frame in progress to end.
    held: Vec<u8>,
    /// A [`ConnWriter`] waits for room or for the connection's end.
    waiting: bool,
}

impl Out {
    fn closed(&self) -> bool {
        self.error.is_some() || self.shutdown || self.done || self.dropped
    }

    fn queued(&self) -> usize {
        self.buf.len() + self.held.len()
    }

    /// Adds whole frames (`write` appends them) after the frame in progress, if any; true when
    /// the writer task must be woken (the send buffer was empty).
    fn put(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> bool {
        if self.mid_frame {
            write(&mut self.held);
            return false;
        }
        let was_empty = self.buf.is_empty();
        write(&mut self.buf);
        was_empty
    }
}

#[derive(Debug, Default)]
struct Shared {
    /// The server ended the connection ([`ConnWriter::abort`]): reads see its end at once.
    aborted: std::sync::atomic::AtomicBool,
    /// The task reading the connection, woken by an abort.
    reader: futures::task::AtomicWaker,
    out: Mutex<Out>,
    wake_writer: Notify,
    /// Room was made, or the connection ended (for [`ConnWriter`]s that wait to write).
    changed: Notify,
    /// The connection is closed or closing.
    ended: Notify,
}

impl Shared {
    fn notify_ended(&self) {
        self.changed.notify_waiters();
        self.ended.notify_waiters();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Out> {
        // A panic while holding this lock leaves plain data behind; carry on with it.
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A TLS connection accepted by the server.
type TlsStream = agent_sdk::tls::ServerTlsStream<TcpStream>;

/// The read side of a connection: the socket's, or the TLS session's.
#[derive(Debug)]
enum ReadSide {
    Plain(OwnedReadHalf),
    Tls(tokio::io::ReadHalf<TlsStream>),
}

/// One accepted connection: reads go straight to the socket (or the TLS session); writes
/// through the buffer.
#[derive(Debug)]
pub struct Coalesced {
    read: ReadSide,
    shared: Arc<Shared>,
    /// Who connected, and when (logged when the connection closes).
    peer: Option<(SocketAddr, std::time::Instant)>,
}

impl Coalesced {
    /// Wraps an accepted stream and starts its writer task.
    pub fn new(tcp: TcpStream) -> Coalesced {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let (read, write) = tcp.into_split();
        Coalesced::with(ReadSide::Plain(read), write)
    }

    /// Wraps a TLS connection (its handshake done, `TCP_NODELAY` set) and starts its writer
    /// task; the writer encrypts what accumulated in one record run.
    pub fn over_tls(tls: TlsStream) -> Coalesced {
        let (read, write) = tokio::io::split(tls);
        Coalesced::with(ReadSide::Tls(read), write)
    }

    fn with(read: ReadSide, write: impl AsyncWrite + Unpin + Send + 'static) -> Coalesced {
        let shared = Arc::new(Shared::default());
        tokio::spawn(write_loop(write, shared.clone()));
        Coalesced {
            read,
            shared,
            peer: None,
        }
    }
}

async fn write_loop(mut w: impl AsyncWrite + Unpin, shared: Arc<Shared>) {
    let mut chunk: Vec<u8> = Vec::new();
    loop {
        let (shutdown, dropped) = {
            let mut o = shared.lock();
            std::mem::swap(&mut o.buf, &mut chunk);
            if let Some(waker) = o.blocked.take() {
                waker.wake();
            }
            if std::mem::take(&mut o.waiting) {
                shared.changed.notify_waiters();
            }
            (o.shutdown, o.dropped)
        };
        if chunk.is_empty() {
            if shutdown || dropped {
                let _ = tokio::time::timeout(DRAIN_GRACE, w.shutdown()).await;
                finish(&shared, None);
                return;
            }
            shared.wake_writer.notified().await;
            continue;
        }
        let sent = if dropped {
            tokio::time::timeout(DRAIN_GRACE, w.write_all(&chunk))
                .await
                .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))
        } else {
            w.write_all(&chunk).await
        };
        if let Err(e) = sent {
            finish(&shared, Some(e.kind()));
            return;
        }
        chunk.clear();
        if chunk.capacity() > KEEP_CAPACITY {
            chunk = Vec::new();
        }
    }
}

fn finish(shared: &Shared, error: Option<io::ErrorKind>) {
    let mut o = shared.lock();
    o.done = true;
    if o.error.is_none() {
        o.error = error;
    }
    o.buf = Vec::new();
    o.held = Vec::new();
    if let Some(waker) = o.blocked.take() {
        waker.wake();
    }
    if let Some(waker) = o.closing.take() {
        waker.wake();
    }
    drop(o);
    shared.notify_ended();
}

impl AsyncRead for Coalesced {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self
            .shared
            .aborted
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Poll::Ready(Ok(()));
        }
        self.shared.reader.register(cx.waker());
        match &mut self.read {
            ReadSide::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ReadSide::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Coalesced {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut o = self.shared.lock();
        if let Some(kind) = o.error {
            return Poll::Ready(Err(kind.into()));
        }
        if o.shutdown || o.done {
            return Poll::Ready(Err(io::ErrorKind::BrokenPipe.into()));
        }
        if o.buf.len() >= HIGH_WATER {
            o.blocked = Some(cx.waker().clone());
            return Poll::Pending;
        }
        let was_empty = o.buf.is_empty();
        // hyper's own refusals (a request it cannot read) get the protocol's error shape.
        match crate::transport::refusal::as_json(buf) {
            Some(answer) => o.buf.extend_from_slice(&answer),
            None => o.buf.extend_from_slice(buf),
        }
        o.mid_frame = true;
        drop(o);
        if was_empty {
            self.shared.wake_writer.notify_one();
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut o = self.shared.lock();
        if let Some(kind) = o.error {
            return Poll::Ready(Err(kind.into()));
        }
        // The WebSocket server flushes after each whole frame: frames held back go out now.
        o.mid_frame = false;
        if !o.held.is_empty() {
            let out = &mut *o;
            let was_empty = out.buf.is_empty();
            if was_empty {
                std::mem::swap(&mut out.buf, &mut out.held);
            } else {
                out.buf.append(&mut out.held);
            }
            drop(o);
            if was_empty {
                self.shared.wake_writer.notify_one();
            }
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut o = self.shared.lock();
        if o.done {
            return Poll::Ready(match o.error {
                Some(kind) => Err(kind.into()),
                None => Ok(()),
            });
        }
        o.shutdown = true;
        o.closing = Some(cx.waker().clone());
        drop(o);
        self.shared.wake_writer.notify_one();
        self.shared.notify_ended();
        Poll::Pending
    }
}

impl Drop for Coalesced {
    fn drop(&mut self) {
        if let Some((peer, since)) = self.peer {
            tracing::debug!(peer = %peer, secs = since.elapsed().as_secs_f64(), "connection closed");
        }
        self.shared.lock().dropped = true;
        self.shared.wake_writer.notify_one();
        self.shared.notify_ended();
    }
}

impl Coalesced {
    /// A handle that writes whole WebSocket frames into this connection's buffer.
    pub fn frame_writer(&self) -> ConnWriter {
        ConnWriter(self.shared.clone())
    }
}

/// What became of a frame offered with [`ConnWriter::try_frame`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offered {
    /// In the send buffer.
    Queued,
    /// Not taken: the buffer is at [`HIGH_WATER`] (the peer is not reading fast enough).
    Full,
    /// Not taken: the connection is closed or closing.
    Closed,
}

/// Writes whole WebSocket frames straight into a connection's send buffer, between the frames
/// the WebSocket server writes itself: the server flushes after each of its frames, and a
/// frame offered while one of the server's is half written is held until that flush. Only
/// for upgraded WebSocket connections, whose server frames are unmasked.
#[derive(Debug, Clone)]
pub struct ConnWriter(Arc<Shared>);

impl ConnWriter {
    /// Offers one text frame whose payload is `prefix` followed by `tail`, without waiting.
    pub fn try_frame(&self, prefix: &[u8], tail: &[u8]) -> Offered {
        self.offer(|b| text_frame(b, prefix, tail))
    }

    /// Offers whole frames without waiting (not taken when the buffer is full or closed).
    pub fn try_write(&self, frames: &[u8]) -> Offered {
        self.offer(|b| b.extend_from_slice(frames))
    }

    fn offer(&self, write: impl FnOnce(&mut Vec<u8>)) -> Offered {
        let mut o = self.0.lock();
        if o.closed() {
            return Offered::Closed;
        }
        if o.queued() >= HIGH_WATER {
            return Offered::Full;
        }
        let wake = o.put(write);
        drop(o);
        if wake {
            self.0.wake_writer.notify_one();
        }
        Offered::Queued
    }

    /// Writes whole frames (as [`text_frame`] makes them), waiting while the buffer is full.
    pub async fn write_frames(&self, frames: &[u8]) -> io::Result<()> {
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut o = self.0.lock();
                if o.closed() {
                    return Err(io::ErrorKind::BrokenPipe.into());
                }
                if o.queued() < HIGH_WATER {
                    let wake = o.put(|b| b.extend_from_slice(frames));
                    drop(o);
                    if wake {
                        self.0.wake_writer.notify_one();
                    }
                    return Ok(());
                }
                o.waiting = true;
            }
            changed.await;
        }
    }

    /// Ends the connection from the server's side: sends `close` (a close frame) after what is
    /// buffered, shuts the socket's write side, and makes the WebSocket server read the end of
    /// the connection at once, whether or not the peer answers.
    pub fn abort(&self, close: &[u8]) {
        {
            let mut o = self.0.lock();
            if !o.closed() {
                o.put(|b| b.extend_from_slice(close));
                o.shutdown = true;
            }
        }
        self.0
            .aborted
            .store(true, std::sync::atomic::Ordering::Release);
        self.0.reader.wake();
        self.0.wake_writer.notify_one();
        self.0.notify_ended();
    }

    /// Whether the connection is closed or closing.
    pub fn is_closed(&self) -> bool {
        self.0.lock().closed()
    }

    /// Resolves once the connection is closed or closing.
    pub async fn closed(&self) {
        loop {
            let ended = self.0.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if self.is_closed() {
                return;
            }
            ended.await;
        }
    }
}

/// An unmasked close frame with `code` and `reason` (at most 123 bytes of it are sent).
pub fn close_frame(code: u16, reason: &str) -> Vec<u8> {
    let reason = &reason.as_bytes()[..reason.len().min(123)];
    let mut out = vec![0x88, (2 + reason.len()) as u8];
    out.extend_from_slice(&code.to_be_bytes());
    out.extend_from_slice(reason);
    out
}

/// Appends one unmasked, final text frame whose payload is `prefix` followed by `tail`.
pub fn text_frame(out: &mut Vec<u8>, prefix: &[u8], tail: &[u8]) {
    text_frame_parts(out, &[prefix, tail]);
}

/// Appends one unmasked, final text frame whose payload is `parts`, one after the other.
pub fn text_frame_parts(out: &mut Vec<u8>, parts: &[&[u8]]) {
    frame(out, 0x81, parts);
}

/// An unmasked ping frame (its payload at most 125 bytes).
pub fn ping_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 2);
    frame(&mut out, 0x89, &[&payload[..payload.len().min(125)]]);
    out
}

fn frame(out: &mut Vec<u8>, first: u8, parts: &[&[u8]]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    out.reserve(len + 10);
    out.push(first);
    if len < 126 {
        out.push(len as u8);
    } else if len <= u16::MAX as usize {
        out.push(126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    for p in parts {
        out.extend_from_slice(p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (Coalesced, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr);
        let (accepted, client) = tokio::join!(listener.accept(), client);
        (Coalesced::new(accepted.unwrap().0), client.unwrap())
    }

    #[tokio::test]
    async fn bytes_arrive_in_order_and_whole() {
        let (mut server, mut client) = pair().await;
        let mut expected = Vec::new();
        for i in 0..2000u32 {
            let frame = format!("frame {i};");
            expected.extend_from_slice(frame.as_bytes());
            server.write_all(frame.as_bytes()).await.unwrap();
            server.flush().await.unwrap();
        }
        server.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, expected);
    }

    #[tokio::test]
    async fn a_reader_that_stops_pushes_back_and_a_drop_sends_the_rest() {
        let (mut server, mut client) = pair().await;
        // The client reads nothing: the kernel buffers fill, then ours, then writes wait.
        let chunk = vec![7u8; 64 * 1024];
        let mut written = 0usize;
        loop {
            let w =
                tokio::time::timeout(Duration::from_millis(300), server.write_all(&chunk)).await;
            match w {
                Ok(r) => {
                    r.unwrap();
                    written += chunk.len();
                }
                Err(_) => break,
            }
            assert!(written < 512 * 1024 * 1024, "writes never pushed back");
        }
        // Dropping the connection still delivers what was accepted, once the client reads.
        drop(server);
        let mut got = 0usize;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = client.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got += n;
        }
        assert_eq!(got, written);
    }

    #[tokio::test]
    async fn a_closed_peer_is_an_error_on_a_later_write() {
        let (mut server, client) = pair().await;
        drop(client);
        let mut failed = false;
        for _ in 0..200 {
            if server.write_all(&[1u8; 4096]).await.is_err() || server.flush().await.is_err() {
                failed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(failed, "writes to a closed peer never failed");
    }
}
