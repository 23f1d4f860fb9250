//! Each batch's locks on a shared store, and what it catches up on under them.

use super::*;

impl Writer {
    /// Loads the conversations `batch` may touch that this node does not know yet (created by
    /// another node) and the ids it would create that another node has taken meanwhile (so that
    /// the creation is refused); locks its conversations, the ids it would create and the
    /// claims of its fenced writes; catches up on the conversations another node wrote lately
    /// (on every one when `read_all`).
    ///
    /// A conversation another node wrote lately is locked only if no other transaction holds
    /// it now: the jobs that would write one that is held leave the batch for the next
    /// ([`Writer::carried`]), at most [`MAX_PUT_OFF`] times, then their batch waits for the
    /// lock. Batches of several nodes over the same conversations then commit side by side, each
    /// with the conversations free when it began, instead of each waiting for the others'
    /// commits.
    ///
    /// What the batch's notices say other nodes committed is read in the same round trip, for
    /// every notice at once ([`Writer::take_in_notices`]).
    #[allow(clippy::too_many_lines)] // longer than the house's 100 lines; to be split
    pub(in crate::engine::writer) fn begin_shared(
        &mut self,
        batch: &mut Vec<Job>,
        read_all: bool,
    ) -> Result<()> {
        self.cluster.verified.clear();
        let behind = self.take_in_notices(batch)?;
        let now = crate::engine::store::now_ms();
        let mut nums = Vec::new();
        // What the batch reads with its locks: the conversations it writes that other nodes
        // wrote lately (or all it writes, after a conflict). Those it heard of and does not
        // write are read off its path ([`Writer::read_behind`]).
        let mut read = Vec::new();
        let mut new_ids = Vec::new();
        let mut fences = Vec::new();
        // The conversations each job writes (by its place in the batch), for those it may put
        // off; and those the jobs carried from the last batch write, which are waited for.
        let mut writes: Vec<(usize, i64)> = Vec::new();
        let mut waited: Vec<i64> = Vec::new();
        let put_off_before = std::mem::take(&mut self.cluster.put_off);
        self.cluster.stale.clear();
        for (place, job) in batch.iter().enumerate() {
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
                Job::Shared(SharedJob::Load { id, .. }) => {
                    self.known(id)?;
                    continue;
                }
                Job::Create { conv, .. } => {
                    new_ids.push(conv.id.clone());
                    // The caps count the creator's open conversations: those another node may
                    // have closed past this node's view are read first.
                    read.extend(self.behind_of(&conv.created_by));
                    match &conv.child_of {
                        Some(c) => c.parent.as_str(),
                        None => continue,
                    }
                }
                Job::Stop | Job::CommitAnswered | Job::Shared(_) => continue,
            };
            let Some(at) = self.known(id)? else { continue };
            // Each conversation the job writes, and whether another node wrote it lately (or
            // wrote past this node's view, which stays behind while nothing here follows it).
            let touched = |slot: &Slot| (slot.num, slot.read_until_ms > now || slot.behind());
            let slot = &self.convs.slots[at];
            let own = touched(slot);
            // A sub-conversation that closes reports to its parent in the same batch.
            let parent = match slot.state.parent().map(|p| p.conversation_id.clone()) {
                Some(parent) => self.known(&parent)?.map(|p| touched(&self.convs.slots[p])),
                None => None,
            };
            for (num, contended) in std::iter::once(own).chain(parent) {
                nums.push(num);
                if read_all || contended {
                    read.push(num);
                }
                let tired = put_off_before.get(place).is_some_and(|&t| t >= MAX_PUT_OFF);
                if tired || read_all || !contended {
                    waited.push(num);
                } else {
                    writes.push((place, num));
                }
            }
        }
        nums.sort_unstable();
        nums.dedup();
        read.sort_unstable();
        read.dedup();
        self.read_behind(
            behind
                .into_iter()
                .filter(|n| nums.binary_search(n).is_err()),
        );
        waited.sort_unstable();
        let mut may_skip: Vec<i64> = writes
            .iter()
            .map(|w| w.1)
            .filter(|n| waited.binary_search(n).is_err())
            .collect();
        may_skip.sort_unstable();
        may_skip.dedup();
        // Each with its view's head as it is now: the read starts after it.
        let read: Vec<(i64, u64)> = read
            .into_iter()
            .filter_map(|n| {
                let at = *self.convs.by_num.get(&n)?;
                Some((n, self.convs.slots[at].state.core.head))
            })
            .collect();
        // Every event is read of those a client here follows (they are published here), of
        // those the batch does not lock, and of all after a conflict; of the others, once
        // locked, only what moves more than the head.
        let global = self.hub.followed_all();
        let whole: Vec<i64> = read
            .iter()
            .map(|r| r.0)
            .filter(|n| {
                read_all
                    || nums.binary_search(n).is_err()
                    || self.convs.by_num.get(n).is_none_or(|&at| {
                        self.convs.slots[at].shared.follows_remote_commits(global)
                    })
            })
            .collect();
        if nums.is_empty() && new_ids.is_empty() && fences.is_empty() {
            if read.is_empty() {
                return Ok(());
            }
            let caught_up = self.log.read_many(&read)?;
            return self.take_in_read(caught_up);
        }
        let locked = self.log.lock(&crate::engine::store::ToLock {
            nums: &nums,
            read: &read,
            whole: &whole,
            new_ids: &new_ids,
            fences: &fences,
            may_skip: &may_skip,
        })?;
        self.cluster.stale.extend(locked.stale);
        self.cluster.verified = read
            .into_iter()
            .map(|r| r.0)
            .filter(|n| nums.binary_search(n).is_ok() && locked.skipped.binary_search(n).is_err())
            .collect();
        for id in &locked.existing {
            self.known(id)?;
        }
        if !locked.skipped.is_empty() {
            let mut put_off: Vec<usize> = writes
                .iter()
                .filter(|w| locked.skipped.binary_search(&w.1).is_ok())
                .map(|w| w.0)
                .collect();
            put_off.dedup();
            crate::engine::telemetry::put_off(put_off.len());
            self.stats
                .put_off
                .fetch_add(put_off.len() as u64, Ordering::Relaxed);
            // In the batch's order, ahead of whatever comes next.
            let mut next = put_off.into_iter().peekable();
            let mut kept = Vec::with_capacity(batch.len());
            for (place, job) in batch.drain(..).enumerate() {
                if next.peek() == Some(&place) {
                    next.next();
                    let times = put_off_before.get(place).copied().unwrap_or(0);
                    self.cluster.carried.push((job, times + 1));
                } else {
                    kept.push(job);
                }
            }
            *batch = kept;
        }
        self.take_in_read(locked.read)?;
        self.skip_to_heads(locked.heads, &locked.skipped);
        Ok(())
    }

    /// Moves the views of conversations the batch locked past events other nodes committed
    /// that move nothing but the head ([`crate::engine::store::Locked::heads`]), and has the
    /// new heads published (no events: a reader here reads them from the log). Those the
    /// batch did not lock (`skipped`) are left; those it read whole are at their head already.
    pub(in crate::engine::writer) fn skip_to_heads(
        &mut self,
        heads: Vec<(i64, u64, i64)>,
        skipped: &[i64],
    ) {
        let until = crate::engine::store::now_ms() + CONTENDED.as_millis() as i64;
        let mut convs = Vec::new();
        for (num, head, ts_ms) in heads {
            if skipped.binary_search(&num).is_ok() {
                continue;
            }
            let Some(&at) = self.convs.by_num.get(&num) else {
                continue;
            };
            let slot = &mut self.convs.slots[at];
            slot.read_until_ms = until;
            if head <= slot.state.core.head {
                continue;
            }
            crate::engine::telemetry::passed(head - slot.state.core.head);
            slot.state.core.head = head;
            convs.push(CommittedConv {
                shared: slot.shared.clone(),
                core: slot.state.core.clone(),
                drafts: Vec::new(),
                new: false,
                heads_only: Some(ts_ms),
            });
        }
        if !convs.is_empty() {
            let committed = Committed {
                ts_ms: crate::engine::store::now_ms(),
                convs,
                replies: Vec::new(),
            };
            self.hand_on_committed(committed, 0);
        }
    }

    /// Conversations `creator` created whose views here are behind the log (another node
    /// committed to them since, and nothing here followed them).
    pub(in crate::engine::writer) fn behind_of(&mut self, creator: &str) -> Vec<i64> {
        let convs = &self.convs;
        let mut found = Vec::new();
        self.cluster.behind_views.retain(|num| {
            let Some(&at) = convs.by_num.get(num) else {
                return false;
            };
            let slot = &convs.slots[at];
            if !slot.behind() {
                return false;
            }
            if slot.creator == creator {
                found.push(*num);
            }
            true
        });
        found
    }
}
