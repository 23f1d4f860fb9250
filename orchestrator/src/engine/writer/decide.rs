//! What a batch's jobs do to the writer's state, one job at a time: an append through the state
//! machine (and, when it closes a sub-conversation, its parent's report), a creation (and a
//! sub-conversation's start in its parent), a fork's copied prefix. Each conversation a batch
//! touches keeps its state from before the batch, to roll back to if the commit fails.

use proto_spec::tenant;

use super::*;

/// What one batch does, as the writer goes through its jobs: the conversations it touches (in
/// order of first touch, with their state before the batch and the events they append), the
/// conversations it creates, and the answers it owes.
pub(super) struct BatchWork {
    pub(super) touched: Vec<TouchedConversation>,
    pub(super) new_convs: Vec<NewConversation>,
    pub(super) replies: Vec<Reply>,
}

/// A conversation touched by a batch: the events the batch appends to it, and its state before
/// the batch (to roll back to if the commit fails).
pub(super) struct TouchedConversation {
    pub(super) slot: usize,
    pub(super) drafts: Vec<Draft>,
    pub(super) undo: Undo,
}

/// Marks `slot` touched by the batch (remembering its state before it); its entry in `touched`.
fn touch(slots: &mut [Slot], slot: usize, touched: &mut Vec<TouchedConversation>) -> usize {
    let s = &mut slots[slot];
    if s.mark == 0 {
        touched.push(TouchedConversation {
            slot,
            drafts: Vec::new(),
            undo: Undo::TurnState(s.state.core.clone()),
        });
        s.mark = touched.len();
    }
    s.mark - 1
}

pub(super) enum Undo {
    Created,
    TurnState(TurnState),
}

/// Appends one request to a conversation within the batch. When it closes a sub-conversation,
/// the parent's `subconversation_finished` (with the child's result) joins the same batch, so
/// the tree is never seen half-finished, whatever moment the process stops.
pub(super) fn append_one(
    convs: &mut Convs,
    conversation: &str,
    request: AppendRequest,
    touched: &mut Vec<TouchedConversation>,
) -> Result<AppendResult, RpcError> {
    let Some(at) = convs.find(conversation) else {
        return Err(RpcError::new(
            ErrorCode::ConversationNotFound,
            format!("no conversation {}", tenant::local_id(conversation)),
        ));
    };
    let i = touch(&mut convs.slots, at, touched);
    let slot = &mut convs.slots[at];
    let drafts = &mut touched[i].drafts;
    let before = drafts.len();
    let was_closed = slot.state.core.closed;
    let result = slot.state.apply_into(request, drafts);
    if was_closed || !slot.state.core.closed {
        return result;
    }
    convs.settle(at);
    let slot = &convs.slots[at];
    let drafts = &touched[i].drafts;
    let Some(parent) = slot.state.parent().map(|p| p.conversation_id.clone()) else {
        return result;
    };
    let closing = drafts[before..]
        .iter()
        .find(|d| d.finality == Some(proto_spec::Finality::Conversation));
    if let Some(closing) = closing {
        let event = slot.state.finished_event(closing);
        let report = append_one(convs, &parent, AppendRequest::system(&event), touched);
        if let Err(e) = report {
            // The parent closed first: nothing waits for this child any more.
            tracing::debug!(child = conversation, %parent, error = %e.message, "a finished sub-conversation was not reported");
        }
    }
    result
}

/// The events of a fork: the prefix copied as it was (seq, kind, author, turn, finality,
/// payload; idempotency keys are not carried over), then `forked_from`.
fn fork_drafts(state: &mut ConvMachine, f: ForkFrom) -> Vec<Draft> {
    let at_seq = f.events.last().map_or(0, |e| e.seq);
    let mut drafts = Vec::with_capacity(f.events.len() + 1);
    for e in f.events {
        let d = Draft::of_event(e);
        state.observe(&d);
        drafts.push(d);
    }
    let marker = AppendRequest::system(&SystemEvent::ForkedFrom(ForkedFrom {
        from: tenant::local_id(&f.from).to_string(),
        at_seq,
    }));
    if let Ok(Applied::Append(d, _)) = state.apply(marker) {
        drafts.extend(d);
    }
    drafts
}

impl Writer {
    /// Checks a new sub-conversation against its parent (open, depth, fan-out) and appends the
    /// parent's `subconversation_started` to the batch; the child's depth.
    fn start_child(
        &mut self,
        child: &str,
        by: &str,
        c: &ChildOf,
        touched: &mut Vec<TouchedConversation>,
    ) -> Result<u32, RpcError> {
        let Some(parent) = self.convs.get(c.parent.as_str()) else {
            return Err(RpcError::new(
                ErrorCode::ConversationNotFound,
                format!("no conversation {}", tenant::local_id(&c.parent)),
            ));
        };
        let depth = parent
            .state
            .admit_child(&c.parent, c.max_depth, c.max_children)?;
        let started = AppendRequest::system(&SystemEvent::SubconversationStarted(
            SubconversationStarted {
                child: tenant::local_id(child).to_string(),
                by: by.to_string(),
                depth,
            },
        ));
        append_one(&mut self.convs, &c.parent, started, touched)?;
        Ok(depth)
    }

    /// Applies one creation to the batch: the new conversation's state and events (and, for a
    /// sub-conversation, its parent's `subconversation_started`), or the refusal.
    pub(super) fn create_one(
        &mut self,
        c: CreateJob,
        work: &mut BatchWork,
    ) -> Result<(), RpcError> {
        let CreateJob {
            id,
            participants,
            metadata,
            created_by,
            policy,
            fork,
            child_of,
            scenario,
        } = c;
        if self.convs.find(&id).is_some() {
            return Err(RpcError::new(
                ErrorCode::ConversationExists,
                format!("conversation {} exists already", tenant::local_id(&id)),
            ));
        }
        // The tree a sub-conversation joins: its parent's, or the parent's own when that is a
        // top-level conversation (an unknown parent is refused by `start_child`).
        let root = child_of.as_ref().and_then(|c| {
            let parent = self.convs.get(&c.parent)?;
            Some(parent.tree().unwrap_or(&c.parent).to_string())
        });
        let creator = proto_spec::tenant::sibling(&id, &created_by);
        self.convs
            .open
            .admit(&self.caps, &creator, root.as_deref())?;
        // A sub-conversation: checked against its parent, which logs its start in this
        // transaction (or the creation is refused and nothing is written).
        // Written as the ids within the tenant (as clients read them); read back as keys.
        let link = match &child_of {
            Some(c) => Some(ParentLink {
                conversation_id: tenant::local_id(&c.parent).to_string(),
                depth: self.start_child(&id, &created_by, c, &mut work.touched)?,
                root: root.map(|r| tenant::local_id(&r).to_string()),
            }),
            None => None,
        };
        let num = self.log.conversation_num().map_err(|e| e.to_rpc())?;
        let mut state = ConvMachine::new(id.clone(), participants.clone());
        let drafts = match fork {
            None => {
                let created = Created {
                    parent: link,
                    scenario,
                    ..ConvMachine::created(
                        &participants,
                        metadata.as_ref(),
                        &created_by,
                        policy.as_ref(),
                    )
                };
                let created = AppendRequest::system(&SystemEvent::Created(created))
                    .with_opening(&created_by, child_of.and_then(|c| c.input));
                match state.apply(created) {
                    Ok(Applied::Append(d, _)) => d,
                    _ => Vec::new(),
                }
            }
            Some(f) => fork_drafts(&mut state, f),
        };
        let declared = state
            .policy()
            .map(|p| {
                p.agents
                    .keys()
                    .map(|a| proto_spec::tenant::sibling(&id, a).into_owned())
                    .collect()
            })
            .unwrap_or_default();
        work.new_convs.push(NewConversation {
            id: id.clone(),
            num,
            participants,
            created_by: created_by.clone(),
            metadata,
            declared,
        });
        let empty = ConvMachine::new(id.clone(), Vec::new()).core;
        let shared = Hub::make(&id, state.participants().to_vec(), empty);
        share_links(&state, &shared);
        let mut slot = Slot::new(num, state, shared, created_by);
        slot.mark = work.touched.len() + 1;
        let slot = self.convs.insert(&id, slot);
        work.touched.push(TouchedConversation {
            slot,
            drafts,
            undo: Undo::Created,
        });
        Ok(())
    }
}
