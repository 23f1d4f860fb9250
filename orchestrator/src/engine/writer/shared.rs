//! The writer on a log that other nodes write too (PostgreSQL).
//!
//! Before a batch decides anything, [`Writer::begin_shared`] locks, in the database, every
//! conversation the batch may touch, and catches the writer's state up on whatever another node
//! appended to them since this one last looked: the batch then decides on the whole log, and
//! the lock keeps it whole until the commit. Events another node commits are also caught up on
//! when it says so ([`Job::Refresh`], from the store's notifications and its polling), so that
//! readers and subscribers here see them; those are published in the log's order, through the
//! same pipeline as this node's own batches.

use super::*;
use crate::engine::store::{ConversationRecord, RecoveredEvent};

/// The refusal of a write made for a turn another node has taken over.
pub(super) fn taken_over(conversation: &str, turn: u64) -> RpcError {
    RpcError::new(
        ErrorCode::ClaimNotFound,
        format!("turn {turn} of conversation {conversation} was taken over by another node; this write is refused"),
    )
}

/// What a caller is told when a batch failed: whether the database could not be used, or
/// something else went wrong.
pub(super) fn failure_message(e: &Error) -> &'static str {
    match e {
        Error::Unavailable(_) | Error::Postgres(_) => crate::engine::error::UNAVAILABLE,
        _ => "the append could not be made durable",
    }
}

impl Writer {
    /// Locks the conversations `batch` may touch and catches up on them; loads the ones this
    /// node has not met yet (created by another node) and the ids it would create that another
    /// node has taken meanwhile (so that the creation is refused).
    pub(super) fn begin_shared(&mut self, batch: &[Job]) -> Result<()> {
        let mut nums = Vec::new();
        let mut new_ids = Vec::new();
        let mut fences = Vec::new();
        self.stale.clear();
        for job in batch {
            let id = match job {
                Job::Append {
                    conversation,
                    request,
                    ..
                } => {
                    if let Some(f) = request.fence {
                        let key = crate::engine::store::TurnKey {
                            conversation_id: conversation.clone(),
                            turn: f.turn,
                        };
                        fences.push((key, f.fence));
                    }
                    conversation.as_str()
                }
                Job::Meet { id, .. } => {
                    self.known(id)?;
                    continue;
                }
                Job::Create { conv, .. } => {
                    new_ids.push(conv.id.clone());
                    match &conv.child_of {
                        Some(c) => c.parent.as_str(),
                        None => continue,
                    }
                }
                Job::Refresh(changes) => {
                    self.refresh(changes.as_deref())?;
                    continue;
                }
                Job::Stop | Job::Forget { .. } => continue,
            };
            let Some(at) = self.known(id)? else { continue };
            let slot = &self.convs.slots[at];
            nums.push(slot.num);
            // A sub-conversation that closes reports to its parent in the same batch.
            if let Some(parent) = slot.state.parent().map(|p| p.conversation_id.clone()) {
                if let Some(p) = self.known(&parent)? {
                    nums.push(self.convs.slots[p].num);
                }
            }
        }
        if nums.is_empty() && new_ids.is_empty() {
            return Ok(());
        }
        let locked = self.log.lock(&crate::engine::store::ToLock {
            nums: &nums,
            new_ids: &new_ids,
            fences: &fences,
        })?;
        self.stale.extend(locked.stale);
        for id in &locked.existing {
            self.known(id)?;
        }
        for (num, head) in locked.heads {
            if let Some(&at) = self.convs.by_num.get(&num) {
                self.catch_up(at, head)?;
            }
        }
        Ok(())
    }

    /// The slot of conversation `id`, loaded from the log if this node has not met it.
    fn known(&mut self, id: &str) -> Result<Option<usize>> {
        if let Some(at) = self.convs.find(id) {
            return Ok(Some(at));
        }
        match self.log.load(id)? {
            Some((record, events)) => Ok(Some(self.adopt(record, events)?)),
            None => Ok(None),
        }
    }

    /// Takes in a conversation another node created: its state from its events, published
    /// here as it was committed there (the first commit registers it for readers).
    fn adopt(&mut self, record: ConversationRecord, events: Vec<RecoveredEvent>) -> Result<usize> {
        let state = ConvMachine::new(record.id.clone(), record.participants.clone());
        let shared = Hub::make(
            &record.id,
            state.participants().to_vec(),
            state.core.clone(),
        );
        let at = self.convs.insert(
            &record.id,
            Slot {
                num: record.num,
                state,
                shared,
                mark: 0,
            },
        );
        self.take_in(at, events, true)?;
        Ok(at)
    }

    /// Brings the conversation in `at` up to `head` from the log, publishing what it reads.
    fn catch_up(&mut self, at: usize, head: u64) -> Result<()> {
        let slot = &self.convs.slots[at];
        if head <= slot.state.core.head {
            return Ok(());
        }
        let events = self.log.read_since(slot.num, slot.state.core.head)?;
        self.take_in(at, events, false)
    }

    /// Observes events another node committed and hands them on to be published, one commit
    /// (one timestamp) at a time; `new`: the first commit makes the conversation known here.
    fn take_in(&mut self, at: usize, events: Vec<RecoveredEvent>, new: bool) -> Result<()> {
        let slot = &mut self.convs.slots[at];
        crate::engine::telemetry::caught_up(events.len());
        let mut groups: Vec<Committed> = Vec::new();
        for e in events {
            if e.draft.seq != slot.state.core.head + 1 {
                return Err(Error::Corrupt(format!(
                    "conversation {} read back seq {} after {}",
                    slot.state.id, e.draft.seq, slot.state.core.head
                )));
            }
            slot.state.observe(&e.draft);
            let core = slot.state.core.clone();
            match groups.last_mut() {
                Some(g) if g.ts_ms == e.ts_ms => {
                    let c = &mut g.convs[0];
                    c.drafts.push(e.draft);
                    c.core = core;
                }
                _ => groups.push(Committed {
                    ts_ms: e.ts_ms,
                    convs: vec![CommittedConv {
                        shared: slot.shared.clone(),
                        core,
                        drafts: vec![e.draft],
                        new: new && groups.is_empty(),
                    }],
                    replies: Vec::new(),
                }),
            }
        }
        if new {
            // Before anything is published: the turn dispatcher reads the policy when the
            // first commit names a speaker.
            share_links(&slot.state, &slot.shared);
        }
        for g in groups {
            self.hand_on_committed(g, 0);
        }
        Ok(())
    }

    /// Lets go of the closed conversations nobody holds (only this writer and the hub have
    /// their view) and no client named for `idle_ms`; how many. Only on a shared store, where
    /// the next client to name one loads it again ([`Writer::known`]); a closed conversation
    /// never changes, so a reader that took its view just before keeps a true one.
    pub(super) fn forget_idle(&mut self, idle_ms: i64) -> usize {
        if !self.shared {
            return 0;
        }
        let now = crate::engine::store::now_ms();
        let mut forgotten = 0;
        let mut at = 0;
        while at < self.convs.slots.len() {
            let slot = &self.convs.slots[at];
            let idle = slot.state.core.closed
                && now - slot.shared.touched_ms() >= idle_ms
                && Arc::strong_count(&slot.shared) == 2;
            if idle {
                self.hub.remove(&slot.state.id);
                self.convs.remove(at);
                forgotten += 1;
            } else {
                at += 1;
            }
        }
        forgotten
    }

    /// Catches up on the conversations another node says it wrote (`None`: every one changed
    /// lately), loading those this node has not met unless they are closed.
    pub(super) fn refresh(&mut self, changes: Option<&[(i64, u64)]>) -> Result<()> {
        let lately;
        crate::engine::telemetry::refreshed(if changes.is_some() {
            "notification"
        } else {
            "scan"
        });
        let changes = match changes {
            Some(c) => c,
            None => {
                lately = self.log.changed_lately()?;
                &lately
            }
        };
        for &(num, head) in changes {
            let at = match self.convs.by_num.get(&num) {
                Some(&at) => at,
                None => {
                    if let Some((record, events)) = self.log.load_num(num)? {
                        self.adopt(record, events)?;
                    }
                    continue;
                }
            };
            self.catch_up(at, head)?;
        }
        Ok(())
    }
}
