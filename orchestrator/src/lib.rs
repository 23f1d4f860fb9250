//! The conversation orchestrator: a durable, seq-ordered event log per conversation, its
//! invariants, turn guidance, fanout to subscribers, and JSON-RPC over WebSocket at `/rpc`.
//!
//! # Layers
//! Three folders, and the arrows between them point one way: [`host`] → [`transport`] →
//! [`engine`]. Nothing in `engine` names a transport or the host (a test in this crate reads
//! the sources and fails if one does).
//!
//! - [`engine`]: the core. The per-conversation state machine ([`engine::state`]; every
//!   invariant lives there), storage behind a trait ([`engine::store`]), the single writer
//!   with group commit ([`engine::writer`]), hot state and the publication of committed events
//!   ([`engine::hub`]; live subscribers are reached through its [`engine::hub::live`] seam),
//!   cursors and feeds ([`engine::fanout`]), turn assignments ([`engine::turns`]), timers
//!   ([`engine::timers`]), the method core every transport calls ([`engine::service`]),
//!   scenarios, identities, limits, errors and metrics.
//! - [`transport`]: how clients reach the method core. JSON-RPC over WebSocket
//!   ([`transport::rpc`], with the connection's [`transport::session`]), `subscribe` written
//!   straight into each connection ([`transport::push`], which implements the hub's live
//!   seam), SSE, long-poll, REST and the console ([`transport::http`]), coalesced writes
//!   ([`transport::net`]) and the axum host on one port ([`transport::server`]).
//! - [`host`]: the composition root. It opens the store and the orchestrator on it, and wires
//!   the agents that run inside the server to the method core through the in-process client
//!   ([`host::client`]); [`host::runner`] runs one scenario to its end (`run`, `demo`).
//!
//! # Example
//! ```no_run
//! use std::sync::Arc;
//! use orchestrator::engine::{auth, store::sqlite::{SqliteStore, Synchronous}};
//! use orchestrator::{host, transport::server};
//!
//! # async fn run() -> anyhow::Result<()> {
//! let store = Arc::new(SqliteStore::open("orchestrator.db", Synchronous::Full)?);
//! let admin_token = auth::create_token(store.as_ref(), "admin", true)?;
//! let orch = host::Options::default().start(store)?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let running = server::start(orch, listener).await?;
//! println!("ws://{}/rpc, token {admin_token}", running.local_addr());
//! running.stop().await;
//! # Ok(()) }
//! ```

pub mod engine;
pub mod host;
pub mod transport;

pub use engine::service::Orchestrator;

#[cfg(test)]
mod layers {
    //! The arrows between the layers, checked on the sources: the engine names no transport,
    //! no host and no transport's library; transports name no host.

    use std::path::Path;

    fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
        for entry in std::fs::read_dir(dir).expect("the source folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("a source file");
                out.push((path.display().to_string(), text));
            }
        }
    }

    fn offences(layer: &str, forbidden: &[&str]) -> Vec<String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("src")
            .join(layer);
        let mut files = Vec::new();
        sources(&root, &mut files);
        assert!(files.len() > 2, "no sources found under {}", root.display());
        let mut found = Vec::new();
        for (path, text) in files {
            for (n, line) in text.lines().enumerate() {
                for word in forbidden {
                    if line.contains(word) {
                        found.push(format!("{path}:{}: {word}", n + 1));
                    }
                }
            }
        }
        found
    }

    #[test]
    fn the_engine_names_no_transport_and_no_host() {
        let found = offences(
            "engine",
            &[
                "crate::transport",
                "crate::host",
                "jsonrpsee",
                "axum",
                "tungstenite",
                "InProcessClient",
                "InternalExecutor",
                // The kinds are the host's: the engine checks them through `engine::kinds`.
                "agent_kinds",
            ],
        );
        assert!(
            found.is_empty(),
            "the engine reaches outward:\n{}",
            found.join("\n")
        );
    }

    #[test]
    fn transports_name_no_host() {
        let found = offences("transport", &["crate::host", "InternalExecutor"]);
        assert!(
            found.is_empty(),
            "a transport reaches the host:\n{}",
            found.join("\n")
        );
    }
}
