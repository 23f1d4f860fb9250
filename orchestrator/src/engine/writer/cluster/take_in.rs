//! Conversations and events other nodes committed, taken in: loaded when this node first meets
//! them, caught up on from notices and reads, published here in the log's order.

use super::*;
use crate::engine::store::ConversationRecord;

impl Writer {
    /// The slot of conversation `id`, loaded from the log if this node does not know it.
    pub(in crate::engine::writer) fn known(&mut self, id: &str) -> Result<Option<usize>> {
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
    pub(in crate::engine::writer) fn adopt(
        &mut self,
        record: ConversationRecord,
        events: Vec<RecoveredEvent>,
    ) -> Result<usize> {
        let state = ConvMachine::new(record.id.clone(), record.participants.clone());
        let shared = Hub::make(
            &record.id,
            state.participants().to_vec(),
            state.core.clone(),
        );
        let at = self.convs.insert(
            &record.id,
            Slot::new(record.num, state, shared, record.created_by),
        );
        self.take_in(at, events, true)?;
        Ok(at)
    }

    /// Takes in what was read from the log past this node's views (per conversation number);
    /// another node wrote those, so their next batches read them first for a while
    /// ([`CONTENDED`]).
    /// Each conversation is taken in from the first event past the view: a read made off the
    /// writer's path ([`Writer::apply_read`]) may find the view moved on since it was asked for
    /// (never back), and holds every event past the head it was asked from, so what is left
    /// follows the view.
    pub(in crate::engine::writer) fn take_in_read(
        &mut self,
        read: Vec<(i64, Vec<RecoveredEvent>)>,
    ) -> Result<()> {
        let until = crate::engine::store::now_ms() + CONTENDED.as_millis() as i64;
        for (num, events) in read {
            if let Some(&at) = self.convs.by_num.get(&num) {
                let slot = &mut self.convs.slots[at];
                slot.read_until_ms = until;
                let head = slot.state.core.head;
                let events: Vec<RecoveredEvent> =
                    events.into_iter().filter(|e| e.draft.seq > head).collect();
                if !events.is_empty() {
                    self.take_in(at, events, false)?;
                }
            }
        }
        Ok(())
    }

    /// Observes events another node committed and hands them on to be published, one commit
    /// (one timestamp) at a time; `new`: the first commit makes the conversation known here.
    pub(in crate::engine::writer) fn take_in(
        &mut self,
        at: usize,
        events: Vec<RecoveredEvent>,
        new: bool,
    ) -> Result<()> {
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
                        heads_only: None,
                    }],
                    replies: Vec::new(),
                    gone: Vec::new(),
                }),
            }
        }
        if new {
            // Before anything is published: the turn dispatcher reads the policy when the
            // first commit names a speaker.
            share_links(&slot.state, &slot.shared);
        }
        self.convs.settle(at);
        for g in groups {
            self.hand_on_committed(g, 0);
        }
        Ok(())
    }

    /// Takes in what the notices among `batch` say other nodes committed (conversation
    /// numbers with their heads; everything changed lately for a notice without them): loads
    /// the conversations this node does not know (unless closed, or the sweep after the start
    /// will reach them), and answers, by number, those
    /// it knows and is behind on, now counted as written lately by another node
    /// ([`CONTENDED`]): the batch reads them past its view with its locks, in one round trip
    /// however many notices it holds.
    /// Takes out of `heads` the conversations another node deleted
    /// ([`crate::engine::store::DELETED_HEAD`]) and lets go of those held here: their
    /// readers are told (the deletion is durable already).
    fn forget_deleted(&mut self, heads: &mut Vec<(i64, u64)>) {
        let deleted: std::collections::HashSet<i64> = heads
            .iter()
            .filter(|h| h.1 == crate::engine::store::DELETED_HEAD)
            .map(|h| h.0)
            .collect();
        if deleted.is_empty() {
            return;
        }
        heads.retain(|h| !deleted.contains(&h.0));
        if deleted.iter().any(|n| self.convs.by_num.contains_key(n)) {
            // A batch in flight holds its conversations' places, which letting go moves.
            self.settle();
        }
        for num in deleted {
            self.let_go_of_deleted(num);
        }
    }

    /// Lets go of conversation `num`, which another node deleted (durably): its readers here
    /// are told. No batch may be in flight (letting go moves other conversations' places).
    pub(in crate::engine::writer) fn let_go_of_deleted(&mut self, num: i64) {
        if let Some(&at) = self.convs.by_num.get(&num) {
            let view = self.convs.slots[at].shared.clone();
            tracing::info!(conversation = %view.id, "deleted by another node");
            self.convs.remove(at);
            self.hub.remove_deleted(&view);
        }
    }

    pub(in crate::engine::writer) fn take_in_notices(&mut self, batch: &[Job]) -> Result<Vec<i64>> {
        let mut heads: Vec<(i64, u64)> = Vec::new();
        for job in batch {
            let Job::Shared(SharedJob::Refresh(changes)) = job else {
                continue;
            };
            match changes {
                Some(c) => {
                    crate::engine::telemetry::refreshed("notification");
                    heads.extend_from_slice(c);
                }
                None => {
                    crate::engine::telemetry::refreshed("scan");
                    heads.extend(self.log.changed_lately()?);
                }
            }
        }
        self.forget_deleted(&mut heads);
        // The highest head heard of each.
        heads.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        heads.dedup_by_key(|h| h.0);
        let until = crate::engine::store::now_ms() + CONTENDED.as_millis() as i64;
        let global = self.hub.followed_all();
        let mut behind = Vec::new();
        let mut unmet = Vec::new();
        for (num, head) in heads {
            match self.convs.by_num.get(&num) {
                Some(&at) => {
                    let slot = &mut self.convs.slots[at];
                    if head > slot.state.core.head {
                        slot.read_until_ms = until;
                        slot.shared.note_remote_head(head);
                        // Read back now only if something here follows it; else when a batch
                        // writes it or a client reads it.
                        if slot.shared.follows_remote_commits(global) {
                            behind.push(num);
                        } else {
                            self.cluster.behind_views.insert(num);
                        }
                    }
                }
                // One the sweep after the start has not reached yet: it will read it, after
                // this commit (right after a start, the look at everything written lately
                // names many such; loading each here, one by one, would hold the sweep up).
                None if num > self.cluster.swept_until => {}
                None => unmet.push(num),
            }
        }
        // Those still open, read together (a look at everything written lately may name
        // thousands, most of them closed).
        if !unmet.is_empty() {
            for (record, events) in self.log.load_open(&unmet)? {
                self.adopt(record, events)?;
            }
        }
        Ok(behind)
    }
}
