//! Deleting conversations: apart from any batch, after the one in flight has settled, in one
//! transaction of its own; the writer lets go of their states at once (a job after it finds
//! none), and the publisher takes their views out of the hub and tells their readers once the
//! deletion is durable, then answers.

use super::*;

impl Writer {
    /// Deletes `keys` (a tree, the root first) and answers with those the log had.
    pub(super) fn delete(
        &mut self,
        keys: Vec<String>,
        reply: oneshot::Sender<Result<Vec<String>, RpcError>>,
    ) {
        self.settle();
        let deleted = match self.log.delete(&keys) {
            Ok(deleted) => deleted,
            Err(e) => {
                tracing::error!(error = %e, "a deletion failed; nothing was deleted");
                let _ = reply.send(Err(RpcError::new(
                    ErrorCode::Internal,
                    cluster::failure_message(&e),
                )));
                return;
            }
        };
        let Some(root) = deleted.first() else {
            let asked = keys.first().map_or("", |k| proto_spec::tenant::local_id(k));
            let _ = reply.send(Err(RpcError::new(
                ErrorCode::ConversationNotFound,
                format!("no conversation {asked}"),
            )));
            return;
        };
        tracing::info!(conversation = %root, tree = deleted.len(), "deleted");
        let mut gone = Vec::with_capacity(deleted.len());
        for key in &deleted {
            if let Some(at) = self.convs.find(key) {
                gone.push(self.convs.slots[at].shared.clone());
                self.convs.remove(at);
            } else if let Some(view) = self.hub.get(key) {
                gone.push(view);
            }
        }
        let committed = Committed {
            ts_ms: now_ms(),
            convs: Vec::new(),
            replies: vec![Reply::Delete(reply, Ok(deleted))],
            gone,
        };
        self.hand_on_committed(committed, 1);
    }
}
