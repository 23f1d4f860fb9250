//! The built-in agent kinds behind the engine's [`AgentKinds`], held to the operator's
//! allow-lists ([`agent_kinds::Sandbox`]), and the limits a server has unless told otherwise.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::engine::config::Limits;
use crate::engine::kinds::AgentKinds;

impl AgentKinds for agent_kinds::Sandbox {
    fn check_outputs(&self, settings: &Value, kind: Option<&str>) -> Result<(), String> {
        agent_kinds::Outputs::from_spec(settings, kind).map(drop)
    }

    fn check_agent(&self, settings: &Value) -> Result<(), String> {
        agent_kinds::build(settings, self).map(drop)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The sandbox the limits hold, when they hold the built-in kinds' (the only kinds there are
/// today): what the host builds the agents with.
pub fn sandbox_of(limits: &Limits) -> Option<&agent_kinds::Sandbox> {
    limits.kinds.as_any().downcast_ref::<agent_kinds::Sandbox>()
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 1024 * 1024,
            max_payload_bytes: 256 * 1024,
            max_connections: 1024,
            max_connections_per_address: 512,
            max_connections_per_agent: 512,
            max_append_bytes_per_minute: 64 * 1024 * 1024,
            max_sockets: 20_000,
            header_timeout: Duration::from_secs(10),
            max_in_flight_per_connection: 256,
            max_subscriptions_per_connection: 64,
            max_streams: 16_384,
            max_streams_per_agent: 1024,
            rate_per_identity: 2000,
            rate_burst: 4000,
            auth_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(600),
            max_wait: Duration::from_secs(60),
            max_tail: 1000,
            max_participants: 256,
            max_scenario_bytes: 64 * 1024,
            ping_interval: Duration::from_secs(20),
            max_depth: 3,
            max_children: 16,
            max_tree: 128,
            max_open_per_agent: 100_000,
            kinds: Arc::new(agent_kinds::Sandbox::default()),
            token_recheck: Duration::from_secs(5),
            tenant_quotas: proto_spec::TenantQuotas::default(),
        }
    }
}
