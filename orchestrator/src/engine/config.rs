//! Limits and settings, with the defaults a careful deployment starts from.

use std::time::Duration;

/// Every limit the server enforces, each answered with its own error.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest WebSocket frame or HTTP body (`FrameTooLarge`, -32007).
    pub max_frame_bytes: u32,
    /// Largest message or trace payload, serialized (`PayloadTooLarge`, -32030).
    pub max_payload_bytes: usize,
    /// Open WebSocket connections at once (HTTP 429 at the handshake).
    pub max_connections: u32,
    /// Open WebSocket connections from one address at once, counted at the handshake before
    /// anyone authenticates (HTTP 429).
    pub max_connections_per_address: u32,
    /// Open WebSocket connections one agent has authenticated at once (`RateLimited` to the
    /// `authenticate` beyond).
    pub max_connections_per_agent: u32,
    /// Open sockets at once, whatever they carry (HTTP 503 and closed at once beyond).
    pub max_sockets: usize,
    /// How long a request head may take to arrive (after connecting, or after the last answer
    /// on a kept-alive connection), and a request body: the connection is closed (or the
    /// request answered 408) past it.
    pub header_timeout: Duration,
    /// Calls in flight on one connection (`RateLimited`, -32029).
    pub max_in_flight_per_connection: usize,
    /// Subscriptions open on one connection.
    pub max_subscriptions_per_connection: u32,
    /// Open SSE streams and parked long-polls at once (`RateLimited`, HTTP 429).
    pub max_streams: usize,
    /// Open SSE streams and parked long-polls of one agent at once (`RateLimited`, HTTP 429).
    pub max_streams_per_agent: usize,
    /// Requests a second one identity may make, over every connection and stream of it on a
    /// node (`RateLimited` with `retryAfterMs`; HTTP 429 with `Retry-After`); 0: no limit.
    pub rate_per_identity: u32,
    /// How many requests one identity may make at once above its rate.
    pub rate_burst: u32,
    /// Bytes of payload one identity may append a minute, on each node, refilled continuously
    /// (`QuotaExceeded`, -32032, with `retryAfterMs`; HTTP 429); 0: no budget. The agents the
    /// server runs for scenarios are not metered.
    pub max_append_bytes_per_minute: u64,
    /// How long a new WebSocket connection may take to authenticate before it is closed.
    pub auth_timeout: Duration,
    /// How long a WebSocket connection may go with no call, no call in flight and no
    /// subscription before it is closed (its pings do not count).
    pub idle_timeout: Duration,
    /// The longest wait a long-poll may ask for; longer timeouts are capped.
    pub max_wait: Duration,
    /// The most events one `tail` returns.
    pub max_tail: usize,
    /// The most participants a conversation may have.
    pub max_participants: usize,
    /// The largest scenario a `createConversation` may give inline, serialized (`InvalidParams`).
    pub max_scenario_bytes: usize,
    /// How often each WebSocket is pinged; one silent for three intervals is closed.
    pub ping_interval: Duration,
    /// How deep sub-conversations may nest (`SubconversationLimit`, -32031).
    pub max_depth: u32,
    /// How many sub-conversations one conversation may have open at once
    /// (`SubconversationLimit`, -32031).
    pub max_children: u32,
    /// How many sub-conversations one tree (a top-level conversation's, at every depth) may
    /// have open at once (`SubconversationLimit`, -32031; 0: no cap).
    pub max_tree: u32,
    /// How many open conversations one agent may have created (`RateLimited`, -32029; 0: no
    /// cap).
    pub max_open_per_agent: u32,
    /// The agent kinds this server runs, held to what the operator allows them to reach
    /// (`serve --agent-env`, `--agent-net`, …); the host's (its default is in `host::kinds`).
    pub kinds: std::sync::Arc<dyn crate::engine::kinds::AgentKinds>,
    /// How often the tokens of open connections and SSE streams are checked against the
    /// database: a revoked or expired token loses its connections within this long (on every
    /// node), and last uses are written.
    pub token_recheck: Duration,
    /// The quotas of every tenant that has none of its own set (none by default).
    pub tenant_quotas: proto_spec::TenantQuotas,
}

impl Limits {
    /// The caps on open conversations the writer holds each creation to.
    pub fn open_caps(&self) -> crate::engine::writer::OpenCaps {
        crate::engine::writer::OpenCaps {
            per_agent: self.max_open_per_agent,
            per_tree: self.max_tree,
            tenants: None,
        }
    }

    /// The largest answer, on every transport (`ResponseTooLarge`, -32008): sixteen frames.
    pub fn max_response_bytes(&self) -> usize {
        (self.max_frame_bytes as usize).saturating_mul(16)
    }
}
