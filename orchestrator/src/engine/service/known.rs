//! Which conversations this node holds, and how current: on a log several nodes write, a
//! conversation created through another node may not be here yet, and one held here may be
//! behind what other nodes committed to it (a node takes in only what something here follows).
//! Each method asks for what its access needs, before it decides: a read, the conversation
//! known and its view brought up to what other nodes committed ([`Orchestrator::readable`]); a
//! listing, the caller's closed conversations loaded; an append, nothing here (the writer loads
//! the conversation under its batch's lock and decides on the log itself). On a store one node
//! owns, every conversation is held and current, and each of these returns at once.

use std::sync::Arc;
use std::time::Duration;

use super::Orchestrator;
use crate::engine::auth::Identity;
use crate::engine::error::Result;
use crate::engine::hub::ConvView;

/// How long a read waits for its node to take in what other nodes committed to the
/// conversations it reads.
pub const CATCH_UP_WAIT: Duration = Duration::from_secs(5);

impl Orchestrator {
    /// The conversation, once known here and brought up to what other nodes committed to it,
    /// if `who` may read it (else `ConversationNotFound`: [`Orchestrator::may_read`]); followed
    /// for a while after, so that later reads find it current.
    /// `asked` is the id as the caller names it (see [`Identity::key`]).
    pub(super) async fn readable(&self, who: &Identity, asked: &str) -> Result<Arc<ConvView>> {
        let id = who.key(asked)?;
        self.ensure_known(&id).await;
        let conv = self.may_read(who, &id)?;
        if self.store.shared() {
            conv.mark_read();
            self.catch_up(std::slice::from_ref(&conv)).await;
        }
        Ok(conv)
    }

    /// Makes sure this node knows conversation `id` when the log has it: on a log several nodes
    /// write, one created through another node moments ago may not have reached this one yet.
    pub(super) async fn ensure_known(&self, id: &str) {
        if !self.store.shared() {
            return;
        }
        if let Some(c) = self.hub.get(id) {
            c.touch();
            return;
        }
        if let Err(e) = self.writer.ensure_known(id.to_string()).await {
            tracing::debug!(conversation = id, error = %e, "could not look the conversation up");
        }
    }

    /// Brings the views `convs` up to what other nodes' notices named (at most
    /// [`CATCH_UP_WAIT`]: past it a reader sees what is here).
    pub(super) async fn catch_up(&self, convs: &[Arc<ConvView>]) {
        if !self.store.shared() {
            return;
        }
        let behind: Vec<&Arc<ConvView>> = convs.iter().filter(|c| c.behind()).collect();
        if behind.is_empty() {
            return;
        }
        self.writer
            .follow(behind.iter().map(|c| c.id.clone()).collect());
        futures::future::join_all(behind.iter().map(|c| c.reach_remote_head(CATCH_UP_WAIT))).await;
    }

    /// On a shared store, loads the closed conversations of `who` (every one for an admin)
    /// that this node does not hold: they stay in the database until a client names them.
    /// Right after a start, first waits until the open ones are all held (they are taken in
    /// while the node serves).
    pub(super) async fn load_closed_of(&self, who: &Identity) {
        if !self.store.shared() {
            return;
        }
        self.writer.swept().await;
        let store = self.store.clone();
        let agent = (!who.admin).then(|| who.agent_id.clone());
        let ids =
            match tokio::task::spawn_blocking(move || store.closed_ids(agent.as_deref())).await {
                Ok(Ok(ids)) => ids,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "could not list the closed conversations");
                    return;
                }
                Err(_) => return,
            };
        let missing = ids
            .into_iter()
            .filter(|id| who.in_tenant(id) && self.hub.get(id).is_none());
        // Queued together, so that the writer loads them in few batches.
        futures::future::join_all(missing.map(|id| async move { self.ensure_known(&id).await }))
            .await;
    }
}
