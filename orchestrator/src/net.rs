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
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
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
        crate::telemetry::accepted();
        (Coalesced::new(tcp), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
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
}

#[derive(Debug, Default)]
struct Shared {
    out: Mutex<Out>,
    wake_writer: Notify,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Out> {
        // A panic while holding this lock leaves plain data behind; carry on with it.
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One accepted connection: reads go straight to the socket; writes through the buffer.
#[derive(Debug)]
pub struct Coalesced {
    read: OwnedReadHalf,
    shared: Arc<Shared>,
}

impl Coalesced {
    /// Wraps an accepted stream and starts its writer task.
    pub fn new(tcp: TcpStream) -> Coalesced {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        let (read, write) = tcp.into_split();
        let shared = Arc::new(Shared::default());
        tokio::spawn(write_loop(write, shared.clone()));
        Coalesced { read, shared }
    }
}

async fn write_loop(mut w: OwnedWriteHalf, shared: Arc<Shared>) {
    let mut chunk: Vec<u8> = Vec::new();
    loop {
        let (shutdown, dropped) = {
            let mut o = shared.lock();
            std::mem::swap(&mut o.buf, &mut chunk);
            if let Some(waker) = o.blocked.take() {
                waker.wake();
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
    if let Some(waker) = o.blocked.take() {
        waker.wake();
    }
    if let Some(waker) = o.closing.take() {
        waker.wake();
    }
}

impl AsyncRead for Coalesced {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.read).poll_read(cx, buf)
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
        o.buf.extend_from_slice(buf);
        drop(o);
        if was_empty {
            self.shared.wake_writer.notify_one();
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.shared.lock().error {
            Some(kind) => Poll::Ready(Err(kind.into())),
            None => Poll::Ready(Ok(())),
        }
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
        Poll::Pending
    }
}

impl Drop for Coalesced {
    fn drop(&mut self) {
        self.shared.lock().dropped = true;
        self.shared.wake_writer.notify_one();
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
