//! The writer's conversations: each one's state machine and view side by side ([`Slot`]), found
//! by id or by number, with the open ones counted per creator and per tree.

use super::*;

pub(super) struct Slot {
    pub(super) num: i64,
    pub(super) state: ConvMachine,
    pub(super) shared: Arc<ConvView>,
    /// While a batch runs: this conversation's place in its [`TouchedConversation`] list, plus one (0: not
    /// touched yet), so that each append finds its batch entry without a lookup.
    pub(super) mark: usize,
    /// On a shared store: until when (ms since the epoch) batches read this conversation's head
    /// from the log before deciding, because another node wrote it lately (see `cluster`).
    pub(super) read_until_ms: i64,
    /// Who created it, as a principal's key (what it counts against while open).
    pub(super) creator: String,
    /// Whether it is counted among the open conversations ([`Convs::settle`]).
    pub(super) counted: bool,
}

impl Slot {
    /// A slot for `state`, not yet counted; `creator`, the agent that created it (of the
    /// conversation's tenant).
    pub(super) fn new(
        num: i64,
        state: ConvMachine,
        shared: Arc<ConvView>,
        creator: String,
    ) -> Slot {
        let creator = match proto_spec::tenant::sibling(&state.id, &creator) {
            std::borrow::Cow::Borrowed(_) => creator,
            std::borrow::Cow::Owned(key) => key,
        };
        shared.set_created_by(&creator);
        Slot {
            num,
            state,
            shared,
            mark: 0,
            read_until_ms: 0,
            creator,
            counted: false,
        }
    }

    /// The tree it counts in: for a sub-conversation, its top-level conversation (its parent,
    /// in a log written before the root was recorded).
    pub(super) fn tree(&self) -> Option<&str> {
        self.state
            .parent()
            .map(|p| p.root.as_deref().unwrap_or(&p.conversation_id))
    }
}

/// The writer's conversations: their states side by side, found by id once per append (and
/// by number when another node's commits are caught up on).
#[derive(Default)]
pub(super) struct Convs {
    pub(super) slots: Vec<Slot>,
    pub(super) by_id: Seeded<ShortKey, usize>,
    pub(super) by_num: Seeded<i64, usize>,
    /// The open ones, per creator and per tree (for the caps).
    pub(super) open: tally::OpenCounts,
}

impl Convs {
    pub(super) fn find(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    pub(super) fn get(&self, id: &str) -> Option<&Slot> {
        self.find(id).map(|i| &self.slots[i])
    }

    pub(super) fn insert(&mut self, id: &str, slot: Slot) -> usize {
        self.by_num.insert(slot.num, self.slots.len());
        self.slots.push(slot);
        self.by_id.insert(ShortKey::new(id), self.slots.len() - 1);
        self.settle(self.slots.len() - 1);
        self.slots.len() - 1
    }

    /// Counts the conversation in `at` among the open ones, or out, as its state now is: open
    /// from its `created` event until it closes. Called whenever its state may have changed.
    pub(super) fn settle(&mut self, at: usize) {
        let slot = &mut self.slots[at];
        let open = slot.state.core.head > 0 && !slot.state.core.closed;
        if open != slot.counted {
            slot.counted = open;
            self.open.count(&slot.creator, slot.tree(), open);
        }
    }

    /// Counts a conversation that leaves the writer out.
    pub(super) fn uncount(open: &mut tally::OpenCounts, slot: &Slot) {
        if slot.counted {
            open.count(&slot.creator, slot.tree(), false);
        }
    }

    /// Forgets the conversation in `at` (the last one takes its place).
    pub(super) fn remove(&mut self, at: usize) {
        let slot = self.slots.swap_remove(at);
        Self::uncount(&mut self.open, &slot);
        self.by_id.remove(slot.state.id.as_str());
        self.by_num.remove(&slot.num);
        if let Some(moved) = self.slots.get(at) {
            self.by_id.insert(ShortKey::new(&moved.state.id), at);
            self.by_num.insert(moved.num, at);
        }
    }

    /// Forgets the conversations added since there were `len` (a batch that failed).
    pub(super) fn truncate(&mut self, len: usize) {
        for slot in self.slots.drain(len.min(self.slots.len())..) {
            Self::uncount(&mut self.open, &slot);
            self.by_id.remove(slot.state.id.as_str());
            self.by_num.remove(&slot.num);
        }
    }
}
