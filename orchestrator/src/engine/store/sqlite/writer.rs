//! The writer's connection to the SQLite log: a batch's rows inserted in one transaction at
//! `synchronous=OFF`, and the WAL synced by the `log-sync` thread ([`WalSync`]).

use rusqlite::OptionalExtension;

use super::*;

/// The writer's connection.
#[derive(Debug)]
pub struct SqliteWriter {
    pub(super) conn: Connection,
    pub(super) sync: Synchronous,
    /// The WAL file, at `synchronous=FULL`: what [`WalSync`] syncs.
    pub(super) wal: Option<WalFile>,
    pub(super) index: Arc<SeqIndex>,
    pub(super) next_pos: i64,
    /// The number the next new conversation gets.
    pub(super) next_num: i64,
    /// The last position committed (written to the WAL; durable once a [`WalSync`] says so).
    pub(super) written: Arc<AtomicI64>,
    /// Set by the checkpointer when the WAL is long and all but the newest frames are copied.
    pub(super) restart_due: Arc<AtomicBool>,
    pub(super) _checkpointer: Option<Checkpointer>,
    /// Held while this writer lives: one writer per database, across processes.
    pub(super) _lock: std::fs::File,
}

impl LogWriter for SqliteWriter {
    fn commit(&mut self, convs: &[NewConversation], rows: &[NewRow<'_>]) -> Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut ins_conv = tx.prepare_cached(
                "INSERT INTO conversations (num, id, created_by, participants, metadata) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            let mut ins_declared =
                tx.prepare_cached("INSERT OR IGNORE INTO declared_agents (agent_id) VALUES (?1)")?;
            for c in convs {
                let participants = serde_json::to_string(&c.participants).unwrap_or_default();
                let metadata = c.metadata.as_ref().map(Value::to_string);
                ins_conv.execute(params![c.num, c.id, c.created_by, participants, metadata])?;
                for a in &c.declared {
                    ins_declared.execute([a])?;
                }
            }
            // Whole chunks of rows go in one statement each: one cursor on the log table for
            // all of them, one step instead of one per row. SQLite numbers the rows itself
            // (the last `pos` + 1: the log is never deleted from), which finds the end of the
            // table at the cursor instead of by a seek from the root for each row; the numbers
            // are checked against the writer's below.
            let mut chunks = rows.chunks_exact(ROWS_PER_INSERT);
            if chunks.len() > 0 {
                let mut ins = tx.prepare_cached(&insert_events_sql(ROWS_PER_INSERT))?;
                for chunk in chunks.by_ref() {
                    for (i, r) in chunk.iter().enumerate() {
                        bind_event(&mut ins, i * EVENT_COLUMNS, r)?;
                    }
                    ins.raw_execute()?;
                }
            }
            let rest = chunks.remainder();
            if !rest.is_empty() {
                let mut ins = tx.prepare_cached(&insert_events_sql(1))?;
                for r in rest {
                    bind_event(&mut ins, 0, r)?;
                    ins.raw_execute()?;
                }
            }
            let last = self.next_pos + rows.len() as i64 - 1;
            if !rows.is_empty() && tx.last_insert_rowid() != last {
                return Err(Error::Corrupt(format!(
                    "the log numbered its last row {}, the writer {last}",
                    tx.last_insert_rowid()
                )));
            }
        }
        tx.commit()?;
        // Committed: from here on nothing may report failure, or the writer would roll back
        // state that is already durable.
        if self
            .restart_due
            .swap(false, std::sync::atomic::Ordering::Relaxed)
        {
            // Copies what was committed since the checkpointer's last pass (a busy reader may
            // hold the copy or the restart off: the checkpointer asks again). It runs at the
            // store's sync mode, so that the WAL is synced before it is copied and the database
            // file after, as the checkpointer's own passes are.
            if let Err(e) = self.checkpoint_synced() {
                tracing::warn!(error = %e, "WAL checkpoint before a restart failed; will retry");
            }
        }
        // Noted before `written` moves: a sync that covers these rows indexes them.
        for c in convs {
            self.index.name(&c.id, c.num);
        }
        self.index.note(rows, self.next_pos);
        self.next_pos += rows.len() as i64;
        self.written.store(self.next_pos - 1, Ordering::Release);
        Ok(())
    }

    fn durability(&mut self) -> Result<Box<dyn Durability>> {
        Ok(Box::new(WalSync {
            wal: self.wal.as_ref().map(WalFile::try_clone).transpose()?,
            written: self.written.clone(),
            index: self.index.clone(),
        }))
    }

    fn conversation_num(&mut self) -> Result<i64> {
        self.next_num += 1;
        Ok(self.next_num - 1)
    }

    fn delete(&mut self, keys: &[String]) -> Result<Vec<String>> {
        // Every committed row is in the lists first (readers still see the durable ones only).
        self.index.index_noted();
        let tx = self.conn.transaction()?;
        let mut deleted = Vec::new();
        {
            let mut find = tx.prepare_cached("SELECT num FROM conversations WHERE id = ?1")?;
            let mut del_event =
                tx.prepare_cached("DELETE FROM events WHERE pos = ?1 AND conv = ?2")?;
            let mut del_conv = tx.prepare_cached("DELETE FROM conversations WHERE num = ?1")?;
            for key in keys {
                let num: Option<i64> = find.query_row([key], |r| r.get(0)).optional()?;
                let Some(num) = num else { continue };
                // By position: the log has no index by conversation.
                for pos in self.index.all_positions(num) {
                    del_event.execute(params![pos, num])?;
                }
                del_conv.execute([num])?;
                deleted.push((key.clone(), num));
            }
            // SQLite numbers a new row after the largest: the log's last place stays taken.
            let last = self.next_pos - 1;
            let kept: bool = tx.query_row(
                "SELECT ?1 < 1 OR EXISTS (SELECT 1 FROM events WHERE pos = ?1)",
                [last],
                |r| r.get(0),
            )?;
            if !kept {
                tx.execute(
                    &format!("INSERT INTO events (pos, conv, seq, kind, author, turn, payload, ts_ms) VALUES (?1, {GAP_CONV}, 0, 'gap', '', 0, '', 0)"),
                    [last],
                )?;
            }
        }
        tx.commit()?;
        Ok(deleted
            .into_iter()
            .map(|(key, num)| {
                self.index.forget(&key, num);
                key
            })
            .collect())
    }
}

/// Rows a batch inserts with one statement (the rest one by one).
const ROWS_PER_INSERT: usize = 16;
/// Columns of an event row that are bound (`pos` is numbered by SQLite).
const EVENT_COLUMNS: usize = 11;

/// `INSERT INTO events` of `rows` rows. A row that breaks a constraint (none should) fails
/// the whole transaction (`OR ROLLBACK`), as the batch fails as a whole anyway; so SQLite
/// keeps no statement journal to undo a statement of many rows alone.
fn insert_events_sql(rows: usize) -> String {
    let one = format!(
        "({})",
        (0..EVENT_COLUMNS)
            .map(|_| "?")
            .collect::<Vec<_>>()
            .join(", ")
    );
    format!(
        "INSERT OR ROLLBACK INTO events (conv, seq, kind, author, turn, finality, payload, client_request_id, request_hash, ts_ms, doc) VALUES {}",
        vec![one; rows].join(", ")
    )
}

/// Binds one event row at parameters `at + 1 ..= at + EVENT_COLUMNS`.
fn bind_event(st: &mut rusqlite::Statement<'_>, at: usize, r: &NewRow<'_>) -> Result<()> {
    let d = r.draft;
    st.raw_bind_parameter(at + 1, r.conv)?;
    st.raw_bind_parameter(at + 2, d.seq as i64)?;
    st.raw_bind_parameter(at + 3, d.kind.as_str())?;
    st.raw_bind_parameter(at + 4, &d.author)?;
    st.raw_bind_parameter(at + 5, d.turn as i64)?;
    st.raw_bind_parameter(at + 6, d.finality.map(|f| f.as_str()))?;
    st.raw_bind_parameter(at + 7, d.payload.get())?;
    st.raw_bind_parameter(at + 8, &d.client_request_id)?;
    st.raw_bind_parameter(at + 9, d.hash.as_ref().map(|h| &h[..]))?;
    st.raw_bind_parameter(at + 10, r.ts_ms)?;
    st.raw_bind_parameter(at + 11, r.document().then_some(1))?;
    Ok(())
}

impl SqliteWriter {
    /// A PASSIVE checkpoint on the writer's connection at the store's sync mode.
    fn checkpoint_synced(&self) -> rusqlite::Result<(i64, i64)> {
        self.conn
            .pragma_update(None, "synchronous", self.sync.pragma())?;
        let done = checkpoint(&self.conn, "PASSIVE");
        self.conn
            .pragma_update(None, "synchronous", self.sync.writer_pragma())?;
        done
    }
}

impl Drop for SqliteWriter {
    fn drop(&mut self) {
        // A connection that closes last checkpoints the WAL and removes it: at the store's
        // sync mode, so that the database file is synced first.
        let _ = self
            .conn
            .pragma_update(None, "synchronous", self.sync.pragma());
    }
}

/// Syncs the WAL that a [`SqliteWriter`] writes without syncing, then lets readers see what it
/// covers.
#[derive(Debug)]
pub(super) struct WalSync {
    /// `None` at `synchronous=NORMAL` (commits are not synced, as SQLite does at NORMAL).
    pub(super) wal: Option<WalFile>,
    pub(super) written: Arc<AtomicI64>,
    pub(super) index: Arc<SeqIndex>,
}

impl Durability for WalSync {
    fn sync(&mut self) -> Result<()> {
        // Read before the sync starts: everything committed up to here is covered by it.
        let upto = self.written.load(Ordering::Acquire);
        if let Some(wal) = &self.wal {
            wal.sync()?;
        }
        self.index.index_noted();
        self.index.durable.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }
}
