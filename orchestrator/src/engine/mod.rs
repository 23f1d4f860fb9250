//! The core: the log, its invariants, its publication and the method core. Nothing here names
//! a transport or the host; transports reach live subscribers through [`hub::live`].

pub mod auth;
pub mod config;
pub mod error;
pub mod fanout;
pub mod hub;
pub mod kinds;
pub mod quotas;
pub mod rate;
pub mod scenario;
pub mod service;
pub mod shares;
pub mod state;
pub mod store;
pub mod streams;
pub mod telemetry;
pub mod timers;
pub mod turns;
pub mod writer;
