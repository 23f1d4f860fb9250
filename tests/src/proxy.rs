//! A TCP proxy on 127.0.0.1 that can cut every connection through it, to test reconnects.

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
}

impl Proxy {
    /// Starts a proxy to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let tunnels: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let t = tunnels.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
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
        }
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
