//! The open conversations taken in after the start, a slice at a time, and the closed ones
//! nobody holds let go.

use super::*;

impl Writer {
    /// Takes in a slice of the open conversations numbered after `after` (see
    /// [`SharedJob::Sweep`]): each that this node does not know yet is built from its events and
    /// registered for readers, and the turn dispatcher looks at it, as at a start that loads
    /// everything. Read on the writer's connection between two batches, so no notice of a
    /// later commit can have been taken in before it: one this node already heard of was
    /// loaded then (and is skipped here), one it hears of later is caught up on. The last
    /// number read and how many were new here, or `None` when there were no more.
    pub(in crate::engine::writer) fn sweep(&mut self, after: i64) -> Result<Option<(i64, usize)>> {
        let loaded = self.log.open_after(after, SWEEP_SLICE)?;
        let Some(last) = loaded.last().map(|(record, _)| record.num) else {
            self.cluster.swept_until = i64::MAX;
            return Ok(None);
        };
        self.cluster.swept_until = last;
        let mut taken = 0;
        for (record, events) in loaded {
            if self.convs.find(&record.id).is_some() {
                continue;
            }
            taken += 1;
            let id = record.id.clone();
            let slot = slot_from(record, &events)?;
            let view = slot.shared.clone();
            self.hub.register(view.clone());
            self.convs.insert(&id, slot);
            self.hub.turn_changed(&view);
        }
        Ok(Some((last, taken)))
    }

    /// Lets go of the closed conversations nobody holds (only this writer and the hub have
    /// their view) and no client named for `idle_ms`; how many. Only on a shared store, where
    /// the next client to name one loads it again ([`Writer::known`]); a closed conversation
    /// never changes, so a reader that took its view just before keeps a true one.
    pub(in crate::engine::writer) fn forget_idle(&mut self, idle_ms: i64) -> usize {
        if !self.cluster.is_shared() {
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
}
