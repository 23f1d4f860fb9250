//! A TCP proxy on 127.0.0.1 that can cut every connection through it, to test reconnects, or
//! stall them (bytes held, connections open: a network partition), to test a node cut off from
//! its database.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// Forwards connections to `upstream` until dropped; [`Proxy::cut`] drops the open ones.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    tunnels: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
    /// True while stalled: nothing is forwarded and no connection is made upstream.
    stalled: tokio::sync::watch::Sender<bool>,
}

/// Copies one direction of a tunnel, holding the bytes while the proxy is stalled.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Proxy {
    /// Starts a proxy to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let tunnels: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let t = tunnels.clone();
        let (stalled, watch) = tokio::sync::watch::channel(false);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let mut w = watch.clone();
                let task = tokio::spawn(async move {
                    if w.wait_for(|s| !*s).await.is_err() {
                        return;
                    }
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        tokio::join!(pump(cr, sw, w.clone()), pump(sr, cw, w.clone()));
                    }
                });
                if let Ok(mut t) = t.lock() {
                    t.retain(|h| !h.is_finished());
                    t.push(task.abort_handle());
                }
            }
        })
        .abort_handle();
        Proxy {
            addr,
            tunnels,
            accept,
            stalled,
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds every byte and every new connection until [`Proxy::resume`] (the connections stay
    /// open: the other side sees silence, not a reset).
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Forwards again what was held, and what comes.
    pub fn resume(&self) {
        self.stalled.send_replace(false);
    }

    /// The WebSocket URL through the proxy.
    pub fn rpc_url(&self) -> String {
        format!("ws://{}/rpc", self.addr)
    }

    /// Cuts every open connection (as a network failure would); new ones are accepted.
    pub fn cut(&self) -> usize {
        let Ok(mut t) = self.tunnels.lock() else {
            return 0;
        };
        let n = t.len();
        for h in t.drain(..) {
            h.abort();
        }
        n
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
