//! The caps on open conversations, which the writer decides with each creation: how many one
//! agent has created and not closed, how many sub-conversations of one tree are open, and how
//! many conversations of one tenant are open (its quota).
//!
//! The counts follow the writer's conversations (every open one is held on every node): a
//! conversation counts from when its state has its `created` event until it closes, whoever's
//! batch (or another node's) opened or closed it, and a batch rolled back is uncounted with it
//! ([`super::Convs::settle`]).

use crate::engine::state::Seeded;
use proto_spec::{ErrorCode, RpcError};
use serde_json::json;

/// The caps (0: none).
#[derive(Debug, Clone, Default)]
pub struct OpenCaps {
    /// The most open conversations one agent may have created (top-level ones for an admin,
    /// sub-conversations and forks for any agent).
    pub per_agent: u32,
    /// The most sub-conversations open at once in one tree (under one top-level conversation,
    /// at every depth).
    pub per_tree: u32,
    /// Each tenant's quota of open conversations (its `openConversations`).
    pub tenants: Option<std::sync::Arc<crate::engine::quotas::QuotaBook>>,
}

/// How many open conversations each creator, each tree and each tenant has.
#[derive(Debug, Default)]
pub(super) struct OpenCounts {
    by_creator: Seeded<String, u32>,
    by_tree: Seeded<String, u32>,
    by_tenant: Seeded<String, u32>,
}

impl OpenCounts {
    /// Counts one open conversation in (`open`) or out; `creator`, a principal's key (its
    /// tenant is the conversation's).
    pub(super) fn count(&mut self, creator: &str, tree: Option<&str>, open: bool) {
        bump(&mut self.by_creator, creator, open);
        bump(
            &mut self.by_tenant,
            proto_spec::tenant::tenant_of(creator),
            open,
        );
        if let Some(t) = tree {
            bump(&mut self.by_tree, t, open);
        }
    }

    /// Refuses one more conversation by `creator` (in the tree of `root`, for a
    /// sub-conversation) when that would pass a cap.
    pub(super) fn admit(
        &self,
        caps: &OpenCaps,
        creator: &str,
        root: Option<&str>,
    ) -> Result<(), RpcError> {
        let tenant = proto_spec::tenant::tenant_of(creator);
        let tenant_cap = caps.tenants.as_ref().map_or(0, |q| q.open_cap(tenant));
        let open = self.by_tenant.get(tenant).copied().unwrap_or(0);
        if tenant_cap > 0 && open >= tenant_cap {
            return Err(RpcError::new(
                ErrorCode::TenantQuotaExceeded,
                format!(
                    "tenant {tenant} has {open} conversations open, its quota; close one first"
                ),
            )
            .with_data(json!({"quota": "openConversations", "limit": tenant_cap, "used": open})));
        }
        let mine = self.by_creator.get(creator).copied().unwrap_or(0);
        let tree = root.map(|r| (r, self.by_tree.get(r).copied().unwrap_or(0)));
        let (code, message, data) = match tree {
            _ if caps.per_agent > 0 && mine >= caps.per_agent => (
                ErrorCode::RateLimited,
                format!("{creator} has {mine} conversations open that it created; at most {} at once: close one first", caps.per_agent),
                json!({"limit": "openConversations", "max": caps.per_agent, "open": mine}),
            ),
            Some((root, open)) if caps.per_tree > 0 && open >= caps.per_tree => (
                ErrorCode::SubconversationLimit,
                format!("parentConversationId: the tree of {root} has {open} sub-conversations open; at most {} at once", caps.per_tree),
                json!({"limit": "tree", "max": caps.per_tree, "open": open, "root": root}),
            ),
            _ => return Ok(()),
        };
        Err(RpcError::new(code, message).with_data(data))
    }
}

fn bump(counts: &mut Seeded<String, u32>, key: &str, up: bool) {
    if up {
        match counts.get_mut(key) {
            Some(n) => *n += 1,
            None => {
                counts.insert(key.to_string(), 1);
            }
        }
    } else if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_come_and_go_and_caps_refuse_at_the_limit() {
        let caps = OpenCaps {
            per_agent: 2,
            per_tree: 1,
            tenants: None,
        };
        let mut c = OpenCounts::default();
        assert!(c.admit(&caps, "a", None).is_ok());
        c.count("a", None, true);
        c.count("a", Some("root"), true);
        let e = c.admit(&caps, "a", None).unwrap_err();
        assert_eq!(e.code, ErrorCode::RateLimited);
        assert_eq!(e.data.as_ref().unwrap()["limit"], "openConversations");
        // Another agent is not held by a's count, but the tree is full for everyone.
        let e = c.admit(&caps, "b", Some("root")).unwrap_err();
        assert_eq!(e.code, ErrorCode::SubconversationLimit);
        assert_eq!(e.data.as_ref().unwrap()["limit"], "tree");
        assert!(c.admit(&caps, "b", Some("other")).is_ok());
        c.count("a", Some("root"), false);
        assert!(c.admit(&caps, "a", Some("root")).is_ok());
        assert!(c.by_tree.is_empty(), "an empty count is let go");
        // No caps: nothing is refused.
        let none = OpenCaps::default();
        c.count("a", Some("root"), true);
        assert!(c.admit(&none, "a", Some("root")).is_ok());
    }
}
