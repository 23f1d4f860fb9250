//! `serve`'s flags for what one client may hold of the server beside the global limits: its
//! address's and its agent's share of the WebSocket connections, its agent's budget of bytes
//! appended, and the quotas of each tenant that has none of its own.

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
    /// Each tenant's conversations open at once, unless its own quota says otherwise (0: none).
    #[arg(long, env = "ORCHESTRATOR_TENANT_OPEN_CONVERSATIONS")]
    tenant_open_conversations: Option<u64>,
    /// Each tenant's bytes of payload held in the log (0: none).
    #[arg(long, env = "ORCHESTRATOR_TENANT_STORED_BYTES")]
    tenant_stored_bytes: Option<u64>,
    /// Each tenant's events appended a second, across the cluster (0: none).
    #[arg(long, env = "ORCHESTRATOR_TENANT_APPENDS_PER_SECOND")]
    tenant_appends_per_second: Option<u64>,
    /// Each tenant's WebSocket connections, across the cluster (0: none).
    #[arg(long, env = "ORCHESTRATOR_TENANT_CONNECTIONS")]
    tenant_connections: Option<u64>,
    /// Each tenant's model tokens a day, UTC (0: none).
    #[arg(long, env = "ORCHESTRATOR_TENANT_LLM_TOKENS_PER_DAY")]
    tenant_llm_tokens_per_day: Option<u64>,
    /// Each tenant's tokens held (0: none).
    #[arg(long, env = "ORCHESTRATOR_TENANT_TOKENS")]
    tenant_tokens: Option<u64>,
}

impl ShareOpts {
    /// `limits` with these shares.
    pub fn apply(&self, limits: Limits) -> Limits {
        Limits {
            max_connections_per_address: self.max_connections_per_address,
            max_connections_per_agent: self.max_connections_per_agent,
            max_append_bytes_per_minute: self.max_append_bytes_per_minute,
            tenant_quotas: proto_spec::TenantQuotas {
                open_conversations: self.tenant_open_conversations,
                stored_bytes: self.tenant_stored_bytes,
                appends_per_second: self.tenant_appends_per_second,
                connections: self.tenant_connections,
                llm_tokens_per_day: self.tenant_llm_tokens_per_day,
                tokens: self.tenant_tokens,
            }
            .without_zeros(),
            ..limits
        }
    }
}
