//! `deleteConversation`: a conversation and its sub-conversations leave the log. Its tenant's
//! admins, or the agent that created it, may delete it; a sub-conversation whose parent is
//! open goes with the conversation above it (its parent may be waiting for it).

use std::sync::Arc;

use proto_spec::system::SystemEvent;
use proto_spec::*;

use super::Orchestrator;
use crate::engine::auth::Identity;
use crate::engine::error::{refuse, Error, Result};
use crate::engine::hub::ConvView;

/// The most conversations one deletion takes with it (the tree's limits keep real ones far
/// below).
const MAX_TREE: usize = 100_000;

impl Orchestrator {
    /// `deleteConversation`: the conversation and its sub-conversations, every event of
    /// theirs; answered once that is durable and their readers are told.
    pub async fn delete_conversation(
        &self,
        who: &Identity,
        p: ConversationParams,
    ) -> Result<DeleteConversationResult> {
        let conv = self.readable(who, &p.conversation_id).await?;
        let key = self.writable_key(who, p.conversation_id)?;
        self.may_delete(who, &conv)?;
        if let Some(parent) = conv.parent() {
            self.ensure_known(parent).await;
            let open = self
                .hub
                .get(parent)
                .is_some_and(|v| v.status() != ConversationStatus::Closed);
            if open {
                return Err(Error::Rpc(
                    RpcError::new(
                        ErrorCode::InvalidParams,
                        format!(
                            "conversationId: {} is a sub-conversation of {}, which is open: delete that one, or wait until it closes",
                            proto_spec::tenant::local_id(&key),
                            proto_spec::tenant::local_id(parent)
                        ),
                    )
                    .with_data(serde_json::json!({"path": "conversationId"})),
                ));
            }
        }
        let tree = self.tree_of(&key).await?;
        let deleted = self.writer.delete(tree).await?;
        Ok(DeleteConversationResult { deleted })
    }

    /// Whether `who` may delete `conv`: an admin of its tenant, or the agent that created it
    /// (not an agent a scenario declares).
    fn may_delete(&self, who: &Identity, conv: &ConvView) -> Result<()> {
        let creator = proto_spec::tenant::key(&who.tenant, &who.agent_id);
        let allowed =
            who.scope.is_none() && (who.admin || conv.created_by() == Some(creator.as_str()));
        if allowed {
            Ok(())
        } else {
            Err(refuse(
                ErrorCode::Forbidden,
                format!(
                    "only an admin of its tenant or its creator deletes conversation {}",
                    proto_spec::tenant::local_id(&conv.id)
                ),
            ))
        }
    }

    /// Conversation `key` and every sub-conversation below it, each before those below it:
    /// read from the log (the sub-conversations each one started), closed ones included.
    async fn tree_of(&self, key: &str) -> Result<Vec<String>> {
        let mut tree = vec![key.to_string()];
        let mut seen: std::collections::HashSet<String> = tree.iter().cloned().collect();
        let mut at = 0;
        while at < tree.len() && tree.len() < MAX_TREE {
            let children = self.children_of(&tree[at]).await?;
            for child in children {
                if seen.insert(child.clone()) {
                    tree.push(child);
                }
            }
            at += 1;
        }
        Ok(tree)
    }

    /// The sub-conversations `key` started, as keys.
    async fn children_of(&self, key: &str) -> Result<Vec<String>> {
        let store: Arc<dyn crate::engine::store::Store> = self.store.clone();
        let id = key.to_string();
        tokio::task::spawn_blocking(move || {
            let mut children = Vec::new();
            let mut after = 0;
            loop {
                let events = store.read_events(&id, after, crate::engine::fanout::PAGE)?;
                let Some(last) = events.last() else { break };
                after = last.seq;
                for e in &events {
                    if e.kind != EventKind::System {
                        continue;
                    }
                    if let Some(SystemEvent::SubconversationStarted(s)) =
                        SystemEvent::parse(e.payload.get())
                    {
                        children.push(proto_spec::tenant::sibling(&id, &s.child).into_owned());
                    }
                }
            }
            Ok(children)
        })
        .await
        .map_err(|e| Error::Unavailable(format!("reading the conversation's tree stopped: {e}")))?
    }
}
