//! `serve`'s flags for what one client may hold of the server beside the global limits: its
//! address's and its agent's share of the WebSocket connections, and its agent's budget of
//! bytes appended.

use orchestrator::engine::config::Limits;

/// The shares one client may hold.
#[derive(clap::Args, Debug)]
pub struct ShareOpts {
    /// Most open WebSocket connections from one address, counted before anyone authenticates.
    #[arg(long, env = "ORCHESTRATOR_MAX_CONNECTIONS_PER_ADDRESS", default_value_t = Limits::default().max_connections_per_address)]
    max_connections_per_address: u32,
    /// Most open WebSocket connections one agent has authenticated.
    #[arg(long, env = "ORCHESTRATOR_MAX_CONNECTIONS_PER_AGENT", default_value_t = Limits::default().max_connections_per_agent)]
    max_connections_per_agent: u32,
    /// Bytes of payload one agent may append a minute, on each node (0: no budget).
    #[arg(long, env = "ORCHESTRATOR_MAX_APPEND_BYTES_PER_MINUTE", default_value_t = Limits::default().max_append_bytes_per_minute)]
    max_append_bytes_per_minute: u64,
}

impl ShareOpts {
    /// `limits` with these shares.
    pub fn apply(&self, limits: Limits) -> Limits {
        Limits {
            max_connections_per_address: self.max_connections_per_address,
            max_connections_per_agent: self.max_connections_per_agent,
            max_append_bytes_per_minute: self.max_append_bytes_per_minute,
            ..limits
        }
    }
}
