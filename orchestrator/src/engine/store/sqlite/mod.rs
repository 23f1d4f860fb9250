//! The embedded default backend: SQLite through rusqlite, WAL, `synchronous=FULL` unless told.
//!
//! The log is one table ordered by `pos` (the global commit order), so every commit appends at
//! the end of one B-tree. Where each conversation's events are (seq → pos) lives in memory, in
//! a [`SeqIndex`] that is extended after each commit is synced and that [`Store::recover`]
//! rebuilds from one scan of the table at start (8 bytes per event).
//!
//! At `synchronous=FULL` the writer's own connection does not sync: its commits write the WAL,
//! and a [`WalSync`] on another thread then syncs the WAL file (`fdatasync`) before anything in
//! it is acknowledged or readable, so the writer's next transaction overlaps the sync of the
//! one before. One sync covers every commit written before it started. Checkpoints run on
//! connections that do sync (the WAL before copying it, the database file after), so the WAL
//! is never started over on top of frames that are not in a synced database file.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use proto_spec::Event;
use rusqlite::{params, Connection};
use serde_json::value::RawValue;
use serde_json::Value;

mod checkpoint;
mod files;
mod principals;
mod seq_index;
mod writer;

use checkpoint::{checkpoint, Checkpointer, WAL_SIZE_LIMIT};
pub use files::{Checkpoints, FileLayer, SqliteOptions};
use files::{Files, WalFile};
use seq_index::Run;
pub use seq_index::SeqIndex;
pub use writer::SqliteWriter;

use super::migrations::{latest, MIGRATIONS};
use super::{
    finality_from, format_ts, hash_from, kind_from, ConvListing, ConversationRecord, Durability,
    LogWriter, NewConversation, NewRow, RecoveredEvent, Store,
};
use crate::engine::error::{Error, Result};
use crate::engine::state::Draft;

/// The conversation number of a row that only keeps the log's last place after a deletion
/// (SQLite numbers a new row after the largest): no conversation has it.
pub(super) const GAP_CONV: i64 = 0;

/// How hard SQLite syncs a commit to the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// fsync on every commit: an acknowledged event survives power loss (the default).
    #[default]
    Full,
    /// fsync at checkpoints only: survives a crash of the process, not of the machine.
    Normal,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        }
    }

    /// The writer connection's own setting: at FULL its commits are synced by a [`WalSync`]
    /// instead of inside the commit.
    fn writer_pragma(self) -> &'static str {
        match self {
            Synchronous::Full => "OFF",
            Synchronous::Normal => "NORMAL",
        }
    }
}

/// The SQLite store: a path, the sync mode, a pool of read connections and the seq index.
#[derive(Debug)]
pub struct SqliteStore {
    files: Files,
    checkpoints: Checkpoints,
    /// Set when the WAL is long and all but its newest frames are copied: the writer then
    /// copies the rest and its next transaction starts the WAL over.
    restart_due: Arc<AtomicBool>,
    /// The connection [`SqliteStore::checkpoint_pass`] checkpoints with.
    manual: Mutex<Option<checkpoint::Passes>>,
    readers: Mutex<Vec<Connection>>,
    index: Arc<SeqIndex>,
}

const READERS_KEPT: usize = 8;

/// The page size of a new database.
pub const PAGE_SIZE: i64 = 16_384;

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and migrates it to the latest schema.
    pub fn open(path: impl AsRef<Path>, sync: Synchronous) -> Result<Self> {
        SqliteStore::open_with(
            path,
            SqliteOptions {
                sync,
                ..SqliteOptions::default()
            },
        )
    }

    /// [`SqliteStore::open`] with every option.
    pub fn open_with(path: impl AsRef<Path>, options: SqliteOptions) -> Result<Self> {
        let files = Files {
            path: path.as_ref().to_path_buf(),
            sync: options.sync,
            layer: options.files,
        };
        let mut conn = files.open(false)?;
        migrate(&mut conn)?;
        Ok(SqliteStore {
            files,
            checkpoints: options.checkpoints,
            restart_due: Arc::default(),
            manual: Mutex::new(None),
            readers: Mutex::new(Vec::new()),
            index: Arc::default(),
        })
    }

    /// One checkpoint round, for a store opened with [`Checkpoints::Manual`]: copies the WAL
    /// into the database file (syncing both at the store's sync mode) and, when the WAL is long
    /// and copied, asks the writer to start it over (its next commit copies the newest frames
    /// and starts the WAL over). Does nothing for a store that checkpoints on its own.
    pub fn checkpoint_pass(&self) -> Result<()> {
        let Checkpoints::Manual { restart_frames } = self.checkpoints else {
            return Ok(());
        };
        let mut manual = self
            .manual
            .lock()
            .map_err(|_| Error::Poisoned("the checkpoint connection"))?;
        if manual.is_none() {
            *manual = Some(checkpoint::Passes::new(
                &self.files,
                restart_frames,
                std::time::Duration::ZERO,
            )?);
        }
        if let Some(passes) = manual.as_mut() {
            passes.round(&self.restart_due)?;
        }
        Ok(())
    }

    fn with_reader<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self
            .readers
            .lock()
            .map_err(|_| Error::Poisoned("the reader pool"))?
            .pop();
        let conn = match conn {
            Some(c) => c,
            None => self.files.open(true)?,
        };
        let out = f(&conn);
        if let Ok(mut pool) = self.readers.lock() {
            if pool.len() < READERS_KEPT {
                pool.push(conn);
            }
        }
        out
    }
}

/// Takes the exclusive lock that makes this process the database's only log writer. Seq is
/// assigned by the single writer, so a second server on the same file must not start.
fn writer_lock(path: &Path) -> Result<std::fs::File> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&name)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(Error::Locked(format!(
            "{} is in use by another orchestrator (lock {}); one server per database",
            path.display(),
            std::path::Path::new(&name).display()
        ))),
        Err(std::fs::TryLockError::Error(e)) => Err(Error::Io(e)),
    }
}

/// Runs every pending migration in one transaction.
pub fn migrate(conn: &mut Connection) -> Result<()> {
    let current: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if current > latest() {
        return Err(Error::SchemaTooNew {
            found: current,
            supported: latest(),
        });
    }
    if current == latest() {
        return Ok(());
    }
    let tx = conn.transaction()?;
    for (i, step) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        tx.execute_batch(step)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
    }
    tx.commit()?;
    Ok(())
}

/// The columns an [`Event`] is read from.
const READ_COLUMNS: &str = "seq, kind, author, turn, finality, payload, client_request_id, ts_ms";

/// One row of [`READ_COLUMNS`].
struct EventRow {
    seq: i64,
    kind: String,
    author: String,
    turn: i64,
    finality: Option<String>,
    payload: String,
    client_request_id: Option<String>,
    ts_ms: i64,
}

impl EventRow {
    fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<EventRow> {
        Ok(EventRow {
            seq: r.get(0)?,
            kind: r.get(1)?,
            author: r.get(2)?,
            turn: r.get(3)?,
            finality: r.get(4)?,
            payload: r.get(5)?,
            client_request_id: r.get(6)?,
            ts_ms: r.get(7)?,
        })
    }

    fn into_event(self, conversation: &str) -> Result<Event> {
        Ok(Event {
            conversation_id: conversation.to_string(),
            seq: self.seq as u64,
            kind: kind_from(&self.kind)?,
            author: self.author,
            turn: self.turn as u64,
            finality: finality_from(self.finality)?,
            payload: RawValue::from_string(self.payload)
                .map_err(|e| Error::Corrupt(e.to_string()))?,
            client_request_id: self.client_request_id,
            ts: format_ts(self.ts_ms),
            json: Default::default(),
        })
    }
}

impl Store for SqliteStore {
    fn writer(&self) -> Result<Box<dyn LogWriter>> {
        let lock = writer_lock(&self.files.path)?;
        let conn = self.files.open(false)?;
        conn.pragma_update(None, "wal_autocheckpoint", 0)?;
        let next_pos: i64 =
            conn.query_row("SELECT COALESCE(MAX(pos), 0) + 1 FROM events", [], |r| {
                r.get(0)
            })?;
        let next_num: i64 = conn.query_row(
            "SELECT COALESCE(MAX(num), 0) + 1 FROM conversations",
            [],
            |r| r.get(0),
        )?;
        // Everything in the log at start is durable (a WAL found at open is synced, below).
        self.index.durable.store(next_pos - 1, Ordering::Release);
        conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
        let wal = match self.files.sync {
            Synchronous::Full => {
                // The WAL file exists once the connection has read the database in WAL mode
                // (above); an fdatasync of any handle on it syncs what the writer's connection
                // writes. What a crash left in it may never have been synced: that is synced
                // before anything in it is served, then the writer's commits go unsynced (see
                // [`WalSync`]).
                let wal = WalFile::open(&self.files)?;
                wal.sync()?;
                conn.pragma_update(None, "synchronous", Synchronous::Full.writer_pragma())?;
                Some(wal)
            }
            Synchronous::Normal => None,
        };
        self.restart_due.store(false, Ordering::Relaxed);
        let checkpointer = match self.checkpoints {
            Checkpoints::Background => {
                Some(Checkpointer::start(&self.files, self.restart_due.clone())?)
            }
            Checkpoints::Manual { .. } => None,
        };
        let restart_due = self.restart_due.clone();
        Ok(Box::new(SqliteWriter {
            conn,
            sync: self.files.sync,
            wal,
            index: self.index.clone(),
            next_pos,
            next_num,
            written: Arc::new(AtomicI64::new(next_pos - 1)),
            restart_due,
            _checkpointer: checkpointer,
            _lock: lock,
        }))
    }

    fn recover(&self, each: &mut dyn FnMut(ConversationRecord, Vec<RecoveredEvent>)) -> Result<()> {
        self.with_reader(|conn| {
            let mut records: HashMap<i64, (ConversationRecord, Vec<RecoveredEvent>)> = HashMap::new();
            let mut order = Vec::new();
            let mut convs = conn.prepare("SELECT num, id, created_by, participants, metadata FROM conversations ORDER BY num")?;
            let mut rows = convs.query([])?;
            while let Some(row) = rows.next()? {
                let num: i64 = row.get(0)?;
                let participants: String = row.get(3)?;
                let metadata: Option<String> = row.get(4)?;
                let record = ConversationRecord {
                    num,
                    id: row.get(1)?,
                    created_by: row.get(2)?,
                    participants: serde_json::from_str(&participants).map_err(|e| Error::Corrupt(e.to_string()))?,
                    metadata: metadata.and_then(|m| serde_json::from_str(&m).ok()),
                };
                order.push(num);
                self.index.name(&record.id, num);
                records.insert(num, (record, Vec::new()));
            }
            let mut evs = conn.prepare(&format!(
                // The payload of system events, and of messages marked as possible plans or
                // deliverables (the state numbers documents).
                "SELECT pos, conv, seq, kind, author, turn, finality,
                        CASE WHEN kind = 'system' OR doc IS NOT NULL THEN payload END,
                        client_request_id, request_hash, ts_ms
                 FROM events WHERE conv <> {GAP_CONV} ORDER BY pos"
            ))?;
            let mut er = evs.query([])?;
            while let Some(e) = er.next()? {
                let pos: i64 = e.get(0)?;
                let conv: i64 = e.get(1)?;
                let Some((_, events)) = records.get_mut(&conv) else {
                    return Err(Error::Corrupt(format!("event at {pos} names unknown conversation {conv}")));
                };
                let payload_json: Option<String> = e.get(7)?;
                let payload = match payload_json {
                    Some(p) => RawValue::from_string(p).map_err(|e| Error::Corrupt(e.to_string()))?,
                    None => RawValue::NULL.to_owned(),
                };
                let seq = e.get::<_, i64>(2)? as u64;
                self.index.push_run(Run { conv, first_seq: seq, first_pos: pos, count: 1 })?;
                let kind = kind_from(&e.get::<_, String>(3)?)?;
                events.push(RecoveredEvent {
                    draft: Draft {
                        seq,
                        kind,
                        doc: Draft::doc_of(kind, payload.get()),
                        author: e.get(4)?,
                        turn: e.get::<_, i64>(5)? as u64,
                        finality: finality_from(e.get(6)?)?,
                        payload,
                        client_request_id: e.get(8)?,
                        hash: hash_from(e.get(9)?),
                    },
                    ts_ms: e.get(10)?,
                });
            }
            for num in order {
                if let Some((record, events)) = records.remove(&num) {
                    each(record, events);
                }
            }
            Ok(())
        })
    }

    fn read_events(&self, conversation: &str, after: u64, limit: usize) -> Result<Vec<Event>> {
        let positions = self.index.positions(conversation, after, limit);
        if positions.is_empty() {
            return Ok(Vec::new());
        }
        self.with_reader(|conn| {
            let mut st =
                conn.prepare_cached(&format!("SELECT {READ_COLUMNS} FROM events WHERE pos = ?1"))?;
            let mut out = Vec::with_capacity(positions.len());
            for pos in positions {
                let row = st.query_row([pos], EventRow::read)?;
                out.push(row.into_event(conversation)?);
            }
            Ok(out)
        })
    }

    fn read_log(&self, conversation: &str, after: u64, limit: usize) -> Result<Vec<Event>> {
        // No index by conversation on disk (the one in memory is built by a server's start):
        // one pass over the log.
        self.with_reader(|conn| {
            let mut st = conn.prepare_cached(&format!(
                "SELECT {READ_COLUMNS} FROM events \
                 WHERE conv = (SELECT num FROM conversations WHERE id = ?1) AND seq > ?2 \
                 ORDER BY seq LIMIT ?3"
            ))?;
            let rows = st.query_map(
                params![conversation, after as i64, limit as i64],
                EventRow::read,
            )?;
            let mut out = Vec::new();
            for row in rows {
                out.push(row?.into_event(conversation)?);
            }
            Ok(out)
        })
    }

    fn list_conversations(&self) -> Result<Vec<ConvListing>> {
        self.with_reader(|conn| {
            let mut st = conn.prepare(
                "SELECT c.id, c.participants, c.created_by, e.head, e.last_ms, e.closed \
                 FROM conversations c LEFT JOIN \
                   (SELECT conv, max(seq) AS head, max(ts_ms) AS last_ms, \
                           max(kind = 'message' AND finality = 'conversation') AS closed \
                    FROM events GROUP BY conv) e ON e.conv = c.num \
                 ORDER BY c.num",
            )?;
            let rows = st.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                    r.get::<_, Option<i64>>(4)?,
                    r.get::<_, Option<bool>>(5)?,
                ))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (id, participants, created_by, head, last_ms, closed) = row?;
                out.push(ConvListing {
                    conversation_id: id,
                    participants: serde_json::from_str(&participants)
                        .map_err(|e| Error::Corrupt(e.to_string()))?,
                    created_by,
                    latest_seq: head.unwrap_or(0) as u64,
                    last_ms,
                    closed: closed.unwrap_or(false),
                });
            }
            Ok(out)
        })
    }
}
