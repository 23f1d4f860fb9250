//! A batch's locks on PostgreSQL, and what it reads under them (the heads, the marked events, the
//! claims its fenced writes hold), sent with the transaction's `BEGIN`.

use tokio_postgres::types::ToSql;

use super::*;

impl PgWriter {
    /// [`LogWriter::lock`]: locks the batch's conversations, the ids it would create and the
    /// claims of its fenced writes, and reads what must be read under the locks, in one round
    /// trip with the transaction's `BEGIN`.
    pub(super) fn lock_and_read(&mut self, asked: &ToLock<'_>) -> Result<Locked> {
        if self.in_tx {
            self.abort();
        }
        let mut nums = asked.nums.to_vec();
        nums.sort_unstable();
        nums.dedup();
        if nums.is_empty() && asked.new_ids.is_empty() && asked.fences.is_empty() {
            return Ok(Locked::default());
        }
        if asked.read.is_empty()
            && asked.new_ids.is_empty()
            && asked.fences.is_empty()
            && asked.may_skip.is_empty()
        {
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
        let query = LockQuery::new(asked, nums);
        let locked = self.run(move |c, st| query.send(c, st))?;
        self.in_tx = true;
        Ok(locked)
    }
}

/// What a batch's `BEGIN` round trip locks and reads, as the statements take it.
struct LockQuery {
    /// The conversations locked whatever it takes (sorted).
    nums: Vec<i64>,
    /// Those locked only if free now (sorted; see `ToLock::may_skip`).
    tried: Vec<i64>,
    /// The ids it would create (sorted).
    ids: Vec<String>,
    /// The conversations read, the head each is read after, and whether whole.
    read_nums: Vec<i64>,
    read_after: Vec<i64>,
    read_whole: Vec<bool>,
    /// Those read in part, and their heads (the writer keeps them only if it locked them).
    part_nums: Vec<i64>,
    part_after: Vec<i64>,
    /// The fenced writes' turns, and the fences they carry.
    fences: Vec<(TurnKey, i64)>,
}

impl LockQuery {
    fn new(asked: &ToLock<'_>, nums: Vec<i64>) -> Self {
        let whole = |n: &i64| asked.whole.binary_search(n).is_ok();
        let (part_nums, part_after) = asked
            .read
            .iter()
            .filter(|r| !whole(&r.0))
            .map(|r| (r.0, r.1 as i64))
            .unzip();
        // Waited for, then tried.
        let (tried, nums) = nums
            .into_iter()
            .partition(|n| asked.may_skip.binary_search(n).is_ok());
        let mut ids = asked.new_ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        LockQuery {
            nums,
            tried,
            ids,
            read_nums: asked.read.iter().map(|r| r.0).collect(),
            read_after: asked.read.iter().map(|r| r.1 as i64).collect(),
            read_whole: asked.read.iter().map(|r| whole(&r.0)).collect(),
            part_nums,
            part_after,
            fences: asked.fences.to_vec(),
        }
    }

    /// Sends it all together, in this order (one round trip): the ids' locks before the rows'
    /// on every node, so that two nodes never wait on each other in a circle. The rows' locks:
    /// those waited for in order first, then those only taken if free (a transaction waits
    /// only while it holds rows of the first kind, all below the one it waits for: no two wait
    /// on each other in a circle), then (pipelined: the server runs it once they are held, on
    /// a snapshot taken then) what the log has past the writer's view.
    async fn send(self, c: Arc<Client>, st: Arc<statements::Statements>) -> Result<Locked> {
        let LockQuery {
            nums, tried, ids, ..
        } = &self;
        let begin = c.batch_execute("BEGIN");
        let existing = async {
            if ids.is_empty() {
                return Ok(Vec::new());
            }
            // Two nodes creating the same id: the second waits here for the first's commit,
            // then finds the id taken.
            c.execute(&st.lock_ids, &[ids]).await?;
            c.query(&st.existing_ids, &[ids]).await
        };
        let rows_locked = when(!nums.is_empty(), async {
            c.query(&st.lock_convs, &[nums]).await
        });
        let tried_locked = when(!tried.is_empty(), async {
            c.query(&st.try_lock_convs, &[tried]).await
        });
        let caught_up = when(!self.read_nums.is_empty(), async {
            let params: [&(dyn ToSql + Sync); 3] =
                [&self.read_nums, &self.read_after, &self.read_whole];
            c.query(&st.read_marked, &params).await
        });
        let heads = when(!self.part_nums.is_empty(), async {
            c.query(&st.read_heads, &[&self.part_nums, &self.part_after])
                .await
        });
        let fenced: Vec<String> = self
            .fences
            .iter()
            .map(|(k, _)| k.conversation_id.clone())
            .collect();
        let fenced_turns: Vec<i64> = self.fences.iter().map(|(k, _)| k.turn as i64).collect();
        // FOR SHARE: a takeover waits for this batch to commit, and then sees its writes.
        let claims = when(!self.fences.is_empty(), async {
            c.query(&st.lock_fences, &[&fenced, &fenced_turns]).await
        });
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
        Ok(Locked {
            read: rows::by_conversation(&caught_up)?,
            heads: heads
                .iter()
                .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1) as u64, r.get(2)))
                .collect(),
            existing: existing.iter().map(|r| r.get(0)).collect(),
            stale: self
                .fences
                .into_iter()
                .filter(|(k, f)| {
                    current.get(&(k.conversation_id.clone(), k.turn as i64)) != Some(f)
                })
                .collect(),
            // Both sorted.
            skipped: self
                .tried
                .into_iter()
                .filter(|n| free.binary_search(n).is_err())
                .collect(),
        })
    }
}

/// `query`'s rows when `needed`, else none (the statement is not sent).
async fn when(
    needed: bool,
    query: impl std::future::Future<
        Output = std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>,
    >,
) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    if needed {
        query.await
    } else {
        Ok(Vec::new())
    }
}
