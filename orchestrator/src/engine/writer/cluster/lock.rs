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
    pub(in crate::engine::writer) fn begin_shared(
        &mut self,
        batch: &mut Vec<Job>,
        read_all: bool,
    ) -> Result<()> {
        self.cluster.verified.clear();
        let behind = self.take_in_notices(batch)?;
        let put_off_before = std::mem::take(&mut self.cluster.put_off);
        self.cluster.stale.clear();
        let plan = self.plan_locks(batch, read_all, &put_off_before)?;
        // Those heard of that the batch does not write are read off its path
        // ([`Writer::read_behind`]).
        self.read_behind(
            behind
                .into_iter()
                .filter(|n| plan.nums.binary_search(n).is_err()),
        );
        let may_skip = plan.may_skip();
        // Each with its view's head as it is now: the read starts after it.
        let read: Vec<(i64, u64)> = plan
            .read
            .iter()
            .filter_map(|&n| {
                let at = *self.convs.by_num.get(&n)?;
                Some((n, self.convs.slots[at].state.core.head))
            })
            .collect();
        let whole = self.read_whole(&read, &plan.nums, read_all);
        if plan.nums.is_empty() && plan.new_ids.is_empty() && plan.fences.is_empty() {
            if read.is_empty() {
                return Ok(());
            }
            let caught_up = self.log.read_many(&read)?;
            return self.take_in_read(caught_up);
        }
        let locked = self.log.lock(&crate::engine::store::ToLock {
            nums: &plan.nums,
            read: &read,
            whole: &whole,
            new_ids: &plan.new_ids,
            fences: &plan.fences,
            may_skip: &may_skip,
        })?;
        self.cluster.stale.extend(locked.stale);
        self.cluster.verified = read
            .into_iter()
            .map(|r| r.0)
            .filter(|n| {
                plan.nums.binary_search(n).is_ok() && locked.skipped.binary_search(n).is_err()
            })
            .collect();
        for id in &locked.existing {
            self.known(id)?;
        }
        if !locked.skipped.is_empty() {
            self.put_off(batch, &plan.writes, &locked.skipped, &put_off_before);
        }
        self.take_in_read(locked.read)?;
        self.skip_to_heads(locked.heads, &locked.skipped);
        Ok(())
    }

    /// What `batch` locks and reads, from its jobs ([`LockPlan`]); loads the conversations it
    /// names that this node does not know yet.
    fn plan_locks(
        &mut self,
        batch: &[Job],
        read_all: bool,
        put_off_before: &[u8],
    ) -> Result<LockPlan> {
        let now = crate::engine::store::now_ms();
        let mut plan = LockPlan::default();
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
                        plan.fences.push((key, f.fence));
                    }
                    conversation.as_str()
                }
                Job::Shared(SharedJob::Load { id, .. }) => {
                    self.known(id)?;
                    continue;
                }
                Job::Create { conv, .. } => {
                    plan.new_ids.push(conv.id.clone());
                    // The caps count the creator's open conversations: those another node may
                    // have closed past this node's view are read first.
                    let creator = proto_spec::tenant::sibling(&conv.id, &conv.created_by);
                    plan.read.extend(self.behind_of(&creator));
                    match &conv.child_of {
                        Some(c) => c.parent.as_str(),
                        None => continue,
                    }
                }
                Job::Stop | Job::CommitAnswered | Job::Shared(_) | Job::Delete { .. } => continue,
            };
            let Some(at) = self.known(id)? else { continue };
            // Each conversation the job writes, and whether another node wrote it lately (or
            // wrote past this node's view, which stays behind while nothing here follows it).
            let contended = |slot: &Slot| (slot.num, slot.read_until_ms > now || slot.behind());
            let slot = &self.convs.slots[at];
            let own = contended(slot);
            // A sub-conversation that closes reports to its parent in the same batch.
            let parent = match slot.state.parent().map(|p| p.conversation_id.clone()) {
                Some(parent) => self
                    .known(&parent)?
                    .map(|p| contended(&self.convs.slots[p])),
                None => None,
            };
            let tired = put_off_before.get(place).is_some_and(|&t| t >= MAX_PUT_OFF);
            for (num, contended) in std::iter::once(own).chain(parent) {
                plan.add(place, num, contended, read_all || tired, read_all);
            }
        }
        plan.nums.sort_unstable();
        plan.nums.dedup();
        plan.read.sort_unstable();
        plan.read.dedup();
        plan.waited.sort_unstable();
        Ok(plan)
    }

    /// Of the conversations `read` (sorted), those whose every event is read: those a client
    /// here follows (they are published here), those the batch does not lock (not in `nums`),
    /// and all after a conflict; of the others, once locked, only what moves more than the
    /// head.
    fn read_whole(&self, read: &[(i64, u64)], nums: &[i64], read_all: bool) -> Vec<i64> {
        let global = self.hub.followed_all();
        read.iter()
            .map(|r| r.0)
            .filter(|n| {
                read_all
                    || nums.binary_search(n).is_err()
                    || self.convs.by_num.get(n).is_none_or(|&at| {
                        self.convs.slots[at].shared.follows_remote_commits(global)
                    })
            })
            .collect()
    }

    /// Takes out of `batch` the jobs that write a conversation the lock skipped (held by
    /// another node's batch), in the batch's order, for the next batch ([`Writer::carried`]).
    fn put_off(
        &mut self,
        batch: &mut Vec<Job>,
        writes: &[(usize, i64)],
        skipped: &[i64],
        put_off_before: &[u8],
    ) {
        let mut put_off: Vec<usize> = writes
            .iter()
            .filter(|w| skipped.binary_search(&w.1).is_ok())
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
                gone: Vec::new(),
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

/// What a batch locks and reads on a shared store, gathered from its jobs.
#[derive(Debug, Default)]
struct LockPlan {
    /// The conversations it writes, by number (sorted): locked until the batch ends.
    nums: Vec<i64>,
    /// What it reads with its locks (sorted): the conversations it writes that other nodes
    /// wrote lately (or all it writes, after a conflict), and the creators' conversations
    /// behind the log.
    read: Vec<i64>,
    /// The ids it would create.
    new_ids: Vec<String>,
    /// Its fenced writes' turns and fences.
    fences: Vec<(crate::engine::store::TurnKey, i64)>,
    /// Each job it may put off (by its place in the batch) with a conversation it writes.
    writes: Vec<(usize, i64)>,
    /// The conversations it waits for (sorted): those not contended, those of jobs carried
    /// too often, and all after a conflict.
    waited: Vec<i64>,
}

impl LockPlan {
    /// The job at `place` writes conversation `num`, which another node wrote lately when
    /// `contended`; `wait` when its lock is waited for whatever holds it.
    fn add(&mut self, place: usize, num: i64, contended: bool, wait: bool, read_all: bool) {
        self.nums.push(num);
        if read_all || contended {
            self.read.push(num);
        }
        if wait || !contended {
            self.waited.push(num);
        } else {
            self.writes.push((place, num));
        }
    }

    /// The conversations locked only if free now (sorted): those of jobs that may be put off,
    /// unless another job waits for the same conversation.
    fn may_skip(&self) -> Vec<i64> {
        let mut may_skip: Vec<i64> = self
            .writes
            .iter()
            .map(|w| w.1)
            .filter(|n| self.waited.binary_search(n).is_err())
            .collect();
        may_skip.sort_unstable();
        may_skip.dedup();
        may_skip
    }
}
