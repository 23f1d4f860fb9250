//! Deleting conversations: apart from any batch, after the one in flight has settled, in one
//! transaction for every deletion the batch brought (one sync for them all); the writer lets
//! go of their states at once (a job after it finds none), and the publisher takes their views
//! out of the hub and tells their readers once the deletion is durable, then answers.

use super::*;

/// One deletion asked: its keys (a tree, the root first), and who is answered.
pub(super) type Deletion = (Vec<String>, oneshot::Sender<Result<Vec<String>, RpcError>>);

impl Writer {
    /// Deletes every tree of `deletions`; each is answered with those of its keys the log had.
    pub(super) fn delete(&mut self, deletions: Vec<Deletion>) {
        self.settle();
        let all: Vec<String> = deletions.iter().flat_map(|d| d.0.clone()).collect();
        let deleted = match self.log.delete(&all) {
            Ok(deleted) => deleted,
            Err(e) => {
                tracing::error!(error = %e, "a deletion failed; nothing was deleted");
                let message = cluster::failure_message(&e);
                for (_, reply) in deletions {
                    let _ = reply.send(Err(RpcError::new(ErrorCode::Internal, message)));
                }
                return;
            }
        };
        let mut deleted: std::collections::HashSet<String> = deleted.into_iter().collect();
        let mut gone = Vec::with_capacity(deleted.len());
        let mut let_go = std::collections::HashSet::new();
        for key in &all {
            if !deleted.contains(key) || !let_go.insert(key) {
                continue;
            }
            if let Some(at) = self.convs.find(key) {
                gone.push(self.convs.slots[at].shared.clone());
                self.convs.remove(at);
            } else if let Some(view) = self.hub.get(key) {
                gone.push(view);
            }
        }
        let mut replies = Vec::with_capacity(deletions.len());
        for (keys, reply) in deletions {
            let asked = keys
                .first()
                .map(|k| proto_spec::tenant::local_id(k).to_string())
                .unwrap_or_default();
            // Asked twice at once, a conversation is the first asker's.
            let mine: Vec<String> = keys.into_iter().filter(|k| deleted.remove(k)).collect();
            if mine.is_empty() {
                let not_found = RpcError::new(
                    ErrorCode::ConversationNotFound,
                    format!("no conversation {asked}"),
                );
                let _ = reply.send(Err(not_found));
                continue;
            }
            tracing::info!(conversation = %mine[0], tree = mine.len(), "deleted");
            replies.push(Reply::Delete(reply, Ok(mine)));
        }
        let jobs = replies.len();
        let committed = Committed {
            ts_ms: now_ms(),
            convs: Vec::new(),
            replies,
            gone,
        };
        self.hand_on_committed(committed, jobs);
    }
}
