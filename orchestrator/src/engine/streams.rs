//! Open streams, counted in all and per agent on this node: SSE streams, parked long-polls and
//! WebSocket subscriptions. One agent cannot hold every stream the server will keep open, and
//! the server keeps no more than its limit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use proto_spec::{ErrorCode, RpcError};

use crate::engine::shares::{Share, Shares};
use crate::engine::telemetry::Open;

/// The counts, shared by every transport.
#[derive(Debug, Default)]
pub struct Streams {
    open: AtomicUsize,
    per_agent: Arc<Shares<String>>,
}

/// One open stream, counted while it lives.
#[derive(Debug)]
pub struct StreamSlot {
    streams: Arc<Streams>,
    _share: Option<Share<String>>,
    _open: Open,
}

impl Streams {
    /// Counts a stream of `agent` on `transport`, or refuses it (`RateLimited`) over `limit`
    /// in all or `per_agent` for the agent.
    pub fn take(
        self: &Arc<Self>,
        agent: &str,
        transport: &'static str,
        limit: usize,
        per_agent: usize,
    ) -> Result<StreamSlot, RpcError> {
        let before = self.open.fetch_add(1, Ordering::Relaxed);
        let share = self.per_agent.take(&agent.to_string(), per_agent);
        let mine_over = share.is_none();
        // Counted from here on: a refusal gives its place back when the slot drops.
        let slot = StreamSlot {
            streams: self.clone(),
            _share: share,
            _open: Open::subscriber(transport),
        };
        let refuse = |message: String, limit: usize| {
            Err(RpcError::new(ErrorCode::RateLimited, message)
                .with_data(serde_json::json!({"limit": limit})))
        };
        if before >= limit {
            return refuse(
                format!("too many open streams, waits and subscriptions (limit {limit}); try again later"),
                limit,
            );
        }
        if mine_over {
            return refuse(
                format!(
                    "{agent} has too many open streams, waits and subscriptions (limit {per_agent} an agent); close some first"
                ),
                per_agent,
            );
        }
        Ok(slot)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.streams.open.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_in_all_and_per_agent_and_given_back() {
        let s = Arc::new(Streams::default());
        let a1 = s.take("a", "sse", 3, 2).unwrap();
        let _a2 = s.take("a", "ws", 3, 2).unwrap();
        assert!(s.take("a", "ws", 3, 2).is_err(), "over the agent's cap");
        let _b = s.take("b", "ws", 3, 2).unwrap();
        assert!(s.take("c", "ws", 3, 2).is_err(), "over the cap in all");
        drop(a1);
        let _a3 = s.take("a", "sse", 3, 2).expect("a place given back");
        assert_eq!(s.open.load(Ordering::Relaxed), 3);
    }
}
