//! The conversation orchestrator: a durable, seq-ordered event log per conversation, its
//! invariants, turn guidance, fanout to subscribers, and JSON-RPC over WebSocket at `/rpc`.
//!
//! # Layout
//! - [`state`]: the per-conversation state machine; every invariant lives there.
//! - [`store`]: storage behind a trait; [`store::sqlite`] is the embedded default.
//! - [`writer`]: the single writer thread with group commit.
//! - [`hub`]: hot state in memory and the fanout of committed events; [`fanout`]: cursors and feeds.
//! - [`service`]: the method core, shared by every transport.
//! - [`rpc`]: the jsonrpsee module; [`push`]: `subscribe` written straight to each connection;
//!   [`http`]: SSE, long-poll, REST and the viewer page;
//!   [`server`]: the axum host on one port, graceful shutdown; [`net`]: coalesced writes.
//! - [`telemetry`]: the metrics behind `GET /metrics`.
//! - [`scenario`]: inline scenarios (participants, speaker policy, turn timeout).
//! - [`runner`]: one scenario run to its end with a live transcript (`run`, `demo`).
//! - [`timers`]: turn timeouts, idle timeouts and maximum durations, from logged times.
//! - [`turns`]: turn assignments: internal agents, push executors' offers and claims.
//! - [`client`]: the in-process [`agent_sdk::AgentClient`] of agents that run in the server.
//! - [`auth`]: identities and tokens; [`config`]: limits; [`error`]: errors and their wire mapping.
//!
//! # Example
//! ```no_run
//! use std::sync::Arc;
//! use orchestrator::{auth, config::Limits, server, service::Orchestrator, store::sqlite::{SqliteStore, Synchronous}};
//!
//! # async fn run() -> anyhow::Result<()> {
//! let store = Arc::new(SqliteStore::open("orchestrator.db", Synchronous::Full)?);
//! let admin_token = auth::create_token(store.as_ref(), "admin", true)?;
//! let orch = Orchestrator::open(store, Limits::default())?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let running = server::start(orch, listener).await?;
//! println!("ws://{}/rpc, token {admin_token}", running.local_addr());
//! running.stop().await;
//! # Ok(()) }
//! ```

pub mod auth;
pub mod client;
pub mod config;
pub mod error;
pub mod fanout;
pub mod http;
pub mod hub;
pub mod net;
pub mod push;
pub mod rpc;
pub mod runner;
pub mod scenario;
pub mod server;
pub mod service;
pub mod state;
pub mod store;
pub mod telemetry;
pub mod timers;
pub mod turns;
pub mod writer;
