//! TLS with rustls, for clients and for servers.
//!
//! A client (`wss://`, `https://`) trusts the public web's roots (Mozilla's, built in) and, when
//! given one, a CA of the operator's own: a PEM file named by [`CA_FILE_ENV`] or passed to
//! [`client_config`]. A server reads its certificate chain and key from PEM files
//! ([`ServerTls::load`]) and reads them again on [`ServerTls::reload`] (on SIGHUP with
//! [`ServerTls::reload_on_sighup`]): handshakes after a reload present the new pair, connections
//! already made keep theirs, and a pair that cannot be read leaves the old one in place.
//! [`incoming`] accepts TLS connections on a TCP listener with every handshake on a task of its
//! own, within [`HANDSHAKE_TIMEOUT`] and at most [`HANDSHAKES_IN_FLIGHT`] at a time, so a client
//! that connects and says nothing holds nobody else up.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};

/// A server-side TLS connection.
pub use tokio_rustls::server::TlsStream as ServerTlsStream;

/// The environment variable naming a PEM file of CA certificates a client trusts besides the
/// built-in roots (for a server whose certificate an operator's own CA signed).
pub const CA_FILE_ENV: &str = "ORCHESTRATOR_CA_FILE";
/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; further connections wait in the listen backlog.
pub const HANDSHAKES_IN_FLIGHT: usize = 1024;

/// What stops TLS from being set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate, key or CA file that cannot be read or holds nothing usable.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A configuration rustls refuses (a key that does not match its certificate, …).
    #[error("{0}")]
    Config(String),
}

fn file_error(path: &Path, message: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.to_owned(),
        message: message.to_string(),
    }
}

/// The cryptography every configuration here uses (ring), named rather than taken from a
/// process-wide default, so that nothing depends on which crates installed one.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file; an error if it has none.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "no PEM certificate in the file"));
    }
    Ok(certs)
}

/// A client configuration trusting the built-in roots and the CA certificates of `ca_file`.
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<ClientConfig>, TlsError> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = ca_file {
        for cert in certificates(path)? {
            roots.add(cert).map_err(|e| file_error(path, e))?;
        }
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The certificate a server presents: read from its files, swapped on reload.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// A server's certificate chain and key, from PEM files.
#[derive(Debug)]
pub struct ServerTls {
    cert: PathBuf,
    key: PathBuf,
    current: Arc<Current>,
    config: Arc<ServerConfig>,
}

impl ServerTls {
    /// Reads the chain (`cert`, the server's certificate first) and its key (`key`: PKCS#8,
    /// PKCS#1 or SEC1); an error says which file is wrong and how.
    pub fn load(cert: &Path, key: &Path) -> Result<Arc<ServerTls>, TlsError> {
        let current = Arc::new(Current(RwLock::new(Arc::new(read_pair(cert, key)?))));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        // Every listener here speaks HTTP/1.1 (WebSocket upgrades, SSE, long-polls).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(ServerTls {
            cert: cert.to_owned(),
            key: key.to_owned(),
            current,
            config: Arc::new(config),
        }))
    }

    /// Reads the files again; the next handshakes present what they hold now. On an error the
    /// pair in use stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let pair = Arc::new(read_pair(&self.cert, &self.key)?);
        *self.current.0.write().unwrap_or_else(|p| p.into_inner()) = pair;
        Ok(())
    }

    /// Reloads on every SIGHUP for as long as the process runs, logging what happened.
    pub fn reload_on_sighup(self: &Arc<Self>) -> std::io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = signal(SignalKind::hangup())?;
        let tls = self.clone();
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                match tls.reload() {
                    Ok(()) => {
                        tracing::info!(cert = %tls.cert.display(), "TLS certificate reloaded")
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "TLS certificate not reloaded; the one in use stays")
                    }
                }
            }
        });
        Ok(())
    }

    /// The configuration handshakes use.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.config.clone()
    }
}

/// A server's TLS from its `--tls-cert` and `--tls-key` flags: both (TLS), or neither (plain).
pub fn server_from_flags(
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<Arc<ServerTls>>, TlsError> {
    match (cert, key) {
        (Some(cert), Some(key)) => ServerTls::load(cert, key).map(Some),
        (None, None) => Ok(None),
        _ => Err(TlsError::Config(
            "--tls-cert and --tls-key go together: give both to serve over TLS, or neither".into(),
        )),
    }
}

fn read_pair(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = certificates(cert)?;
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| file_error(key, e))?;
    CertifiedKey::from_der(chain, der, &provider())
        .map_err(|e| TlsError::Config(format!("{} and {}: {e}", cert.display(), key.display())))
}

/// TLS connections accepted on a listener (see the module docs). Dropping it stops accepting.
#[derive(Debug)]
pub struct TlsIncoming {
    done: mpsc::Receiver<(ServerTlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for TlsIncoming {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Accepts TLS connections on `listener` with `tls` (see the module docs).
pub fn incoming(listener: TcpListener, tls: Arc<ServerTls>) -> std::io::Result<TlsIncoming> {
    let local = listener.local_addr()?;
    let (tx, done) = mpsc::channel(64);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
    let slots = Arc::new(Semaphore::new(HANDSHAKES_IN_FLIGHT));
    let accepting = tokio::spawn(async move {
        loop {
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let (tcp, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let _slot = slot;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send((stream, peer)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    Ok(TlsIncoming {
        done,
        local,
        accepting,
    })
}

impl TlsIncoming {
    /// The next connection whose handshake completed.
    pub async fn accept(&mut self) -> (ServerTlsStream<TcpStream>, SocketAddr) {
        match self.done.recv().await {
            Some(c) => c,
            // The accepting task ended (it only does when aborted): nothing more will come.
            None => std::future::pending().await,
        }
    }

    /// The address listened on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

#[cfg(feature = "axum")]
impl axum::serve::Listener for TlsIncoming {
    type Io = ServerTlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        TlsIncoming::accept(self).await
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}
