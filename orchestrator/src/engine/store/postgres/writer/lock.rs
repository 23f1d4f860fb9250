//! A batch's locks on PostgreSQL, and what it reads under them (the heads, the marked events, the
//! claims its fenced writes hold), sent with the transaction's `BEGIN`.

use super::*;

impl PgWriter {
    #[allow(clippy::too_many_lines)] // longer than the house's 100 lines; to be split
    /// [`LogWriter::lock`]: locks the batch's conversations, the ids it would create and the
    /// claims of its fenced writes, and reads what must be read under the locks, in one round
    /// trip with the transaction's `BEGIN`.
    pub(super) fn lock_and_read(&mut self, asked: &ToLock<'_>) -> Result<Locked> {
        let ToLock {
            nums,
            read,
            whole,
            new_ids,
            fences,
            may_skip,
        } = *asked;
        let read_nums: Vec<i64> = read.iter().map(|r| r.0).collect();
        let read_after: Vec<i64> = read.iter().map(|r| r.1 as i64).collect();
        let read_whole: Vec<bool> = read
            .iter()
            .map(|r| whole.binary_search(&r.0).is_ok())
            .collect();
        // The heads of those read in part (the writer keeps them only if it locked them).
        let (part_nums, part_after): (Vec<i64>, Vec<i64>) = read
            .iter()
            .filter(|r| whole.binary_search(&r.0).is_err())
            .map(|r| (r.0, r.1 as i64))
            .unzip();
        let fenced: Vec<String> = fences
            .iter()
            .map(|(k, _)| k.conversation_id.clone())
            .collect();
        let fenced_turns: Vec<i64> = fences.iter().map(|(k, _)| k.turn as i64).collect();
        let asked = fences.to_vec();
        if self.in_tx {
            self.abort();
        }
        let mut nums = nums.to_vec();
        nums.sort_unstable();
        nums.dedup();
        if nums.is_empty() && new_ids.is_empty() && fences.is_empty() {
            return Ok(Locked::default());
        }
        if read_nums.is_empty() && new_ids.is_empty() && fences.is_empty() && may_skip.is_empty() {
            // Nothing to read or check before deciding: the commit takes the locks, before it
            // writes anything (see `LogWriter::lock`).
            self.lock_at_commit = nums;
            return Ok(Locked::default());
        }
        debug_assert!(
            self.in_flight.is_empty(),
            "a batch that reads before deciding, behind a batch in flight"
        );
        self.lock_at_commit.clear();
        // Waited for, then tried (see `ToLock::may_skip`).
        let (tried, nums): (Vec<i64>, Vec<i64>) = nums
            .into_iter()
            .partition(|n| may_skip.binary_search(n).is_ok());
        let mut ids = new_ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        let locked = self.run(move |c, st| async move {
            // Sent together, in this order (one round trip): the ids' locks before the rows'
            // on every node, so that two nodes never wait on each other in a circle.
            let begin = c.batch_execute("BEGIN");
            let existing = async {
                if ids.is_empty() {
                    return Ok(Vec::new());
                }
                // Two nodes creating the same id: the second waits here for the first's
                // commit, then finds the id taken.
                c.execute(&st.lock_ids, &[&ids]).await?;
                c.query(&st.existing_ids, &[&ids]).await
            };
            // The rows' locks, those waited for in order first, then those only taken if free
            // (a transaction waits only while it holds rows of the first kind, all below the
            // one it waits for: no two wait on each other in a circle), then (pipelined: the
            // server runs it once they are held, on a snapshot taken then) what the log has
            // past the writer's view.
            let rows_locked = async {
                if nums.is_empty() {
                    return Ok(Vec::new());
                }
                c.query(&st.lock_convs, &[&nums]).await
            };
            let tried_locked = async {
                if tried.is_empty() {
                    return Ok(Vec::new());
                }
                c.query(&st.try_lock_convs, &[&tried]).await
            };
            let caught_up = async {
                if read_nums.is_empty() {
                    return Ok(Vec::new());
                }
                c.query(&st.read_marked, &[&read_nums, &read_after, &read_whole])
                    .await
            };
            let heads = async {
                if part_nums.is_empty() {
                    return Ok(Vec::new());
                }
                c.query(&st.read_heads, &[&part_nums, &part_after]).await
            };
            let claims = async {
                if asked.is_empty() {
                    return Ok(Vec::new());
                }
                // FOR SHARE: a takeover waits for this batch to commit, and then sees its
                // writes.
                c.query(&st.lock_fences, &[&fenced, &fenced_turns]).await
            };
            let ((), existing, _, free, caught_up, heads, claims) = futures::try_join!(
                begin,
                existing,
                rows_locked,
                tried_locked,
                caught_up,
                heads,
                claims
            )?;
            let free: Vec<i64> = free.iter().map(|r| r.get(0)).collect();
            let current: std::collections::HashMap<(String, i64), i64> = claims
                .iter()
                .map(|r| ((r.get(0), r.get(1)), r.get(2)))
                .collect();
            let heads = heads
                .iter()
                .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1) as u64, r.get(2)))
                .collect();
            Ok(Locked {
                read: rows::by_conversation(&caught_up)?,
                heads,
                existing: existing.iter().map(|r| r.get(0)).collect(),
                stale: asked
                    .into_iter()
                    .filter(|(k, f)| {
                        current.get(&(k.conversation_id.clone(), k.turn as i64)) != Some(f)
                    })
                    .collect(),
                // Both sorted.
                skipped: tried
                    .into_iter()
                    .filter(|n| free.binary_search(n).is_err())
                    .collect(),
            })
        })?;
        self.in_tx = true;
        Ok(locked)
    }
}
