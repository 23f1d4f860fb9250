//! Where each conversation's events are in the log, kept in memory (8 bytes per event) instead
//! of a `(conv, seq)` index on the table (docs/decisions.md).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use dashmap::DashMap;

use crate::engine::error::{Error, Result};
use crate::engine::store::NewRow;

/// Where each conversation's events are in the log: `positions[seq - 1]`.
///
/// The writer only notes the runs of positions each commit wrote ([`SeqIndex::note`]); the
/// thread that syncs them extends the lists ([`SeqIndex::index_noted`]) and then moves the
/// durable mark, so the writer's thread does no per-conversation work here.
#[derive(Debug)]
pub struct SeqIndex {
    /// Each conversation's number, by id.
    pub(super) nums: DashMap<String, i64, ahash::RandomState>,
    /// Each conversation's positions, by number.
    pub(super) lists: DashMap<i64, Arc<RwLock<Vec<i64>>>, ahash::RandomState>,
    /// The last position known durable: readers see nothing after it.
    pub(super) durable: AtomicI64,
    /// Runs written and not yet in the lists.
    pub(super) noted: Mutex<Vec<Run>>,
}

/// `count` events of conversation `conv` from `first_seq` on, at `first_pos` onwards.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    pub(super) conv: i64,
    pub(super) first_seq: u64,
    pub(super) first_pos: i64,
    pub(super) count: usize,
}

impl Default for SeqIndex {
    fn default() -> Self {
        SeqIndex {
            nums: DashMap::default(),
            lists: DashMap::default(),
            durable: AtomicI64::new(i64::MAX),
            noted: Mutex::default(),
        }
    }
}

impl SeqIndex {
    pub(super) fn positions(&self, conversation: &str, after: u64, limit: usize) -> Vec<i64> {
        let Some(num) = self.nums.get(conversation).map(|n| *n) else {
            return Vec::new();
        };
        let Some(list) = self.lists.get(&num).map(|l| l.clone()) else {
            return Vec::new();
        };
        let durable = self.durable.load(Ordering::Acquire);
        let list = list.read().unwrap_or_else(|p| p.into_inner());
        let start = (after as usize).min(list.len());
        let end = start.saturating_add(limit).min(list.len());
        // Positions grow with seq: the durable ones are a prefix.
        let durable_end = start + list[start..end].partition_point(|&pos| pos <= durable);
        list[start..durable_end].to_vec()
    }

    /// Every position of conversation `num` in the lists.
    pub(super) fn all_positions(&self, num: i64) -> Vec<i64> {
        self.lists.get(&num).map_or_else(Vec::new, |l| {
            l.read().unwrap_or_else(|p| p.into_inner()).clone()
        })
    }

    /// Forgets conversation `id` (number `num`): it was deleted.
    pub(super) fn forget(&self, id: &str, num: i64) {
        self.nums.remove(id);
        self.lists.remove(&num);
    }

    /// Records the number of conversation `id`.
    pub(super) fn name(&self, id: &str, num: i64) {
        self.nums.insert(id.to_string(), num);
    }

    /// Records that a conversation's events from `run.first_seq` on are at `run.first_pos`
    /// onwards.
    pub(super) fn push_run(&self, run: Run) -> Result<()> {
        let existing = self.lists.get(&run.conv).map(|l| l.clone());
        let list = existing.unwrap_or_else(|| self.lists.entry(run.conv).or_default().clone());
        let mut list = list.write().unwrap_or_else(|p| p.into_inner());
        if list.len() as u64 + 1 != run.first_seq {
            return Err(Error::Corrupt(format!(
                "conversation number {}: seq {} follows seq {} in the log",
                run.conv,
                run.first_seq,
                list.len()
            )));
        }
        list.extend((0..run.count as i64).map(|i| run.first_pos + i));
        Ok(())
    }

    /// Notes the runs of a commit's rows (grouped by conversation, in seq order) that start at
    /// `first_pos`, for [`SeqIndex::index_noted`].
    pub(super) fn note(&self, rows: &[NewRow<'_>], first_pos: i64) {
        let mut noted = self.noted.lock().unwrap_or_else(|p| p.into_inner());
        let mut start = 0;
        while start < rows.len() {
            let conv = rows[start].conv;
            let end = rows[start..]
                .iter()
                .position(|r| r.conv != conv)
                .map_or(rows.len(), |n| start + n);
            noted.push(Run {
                conv,
                first_seq: rows[start].draft.seq,
                first_pos: first_pos + start as i64,
                count: end - start,
            });
            start = end;
        }
    }

    /// Puts every noted run in the lists.
    pub(super) fn index_noted(&self) {
        let runs = std::mem::take(&mut *self.noted.lock().unwrap_or_else(|p| p.into_inner()));
        for run in runs {
            if let Err(e) = self.push_run(run) {
                tracing::error!(error = %e, "seq index out of step with the log");
            }
        }
    }
}
