//! Where a SQLite store's files are: the connections it opens (through the operating system's
//! VFS, or a file layer of a test's), how they are checkpointed, and the WAL handle the store
//! syncs from outside SQLite.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rusqlite::{Connection, OpenFlags};

use super::{Synchronous, PAGE_SIZE};
use crate::engine::error::{Error, Result};

/// The file layer a [`SqliteStore`](super::SqliteStore) runs on when it is not the operating system's own: a
/// SQLite VFS registered under [`FileLayer::vfs`], and how a file of it is synced from outside
/// SQLite (the store syncs its WAL from a handle of its own). Tests run the store over a
/// simulated disk this way (`fault-disk`); the server never does.
pub trait FileLayer: Send + Sync + std::fmt::Debug {
    /// The VFS's name.
    fn vfs(&self) -> &str;
    /// Syncs the data of the file at `path` (as `fdatasync` of another handle on it would).
    fn sync_data(&self, path: &Path) -> std::io::Result<()>;
}

/// How a [`SqliteStore`](super::SqliteStore) checkpoints its WAL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Checkpoints {
    /// On a thread of its own, every 100 ms (the server's way).
    #[default]
    Background,
    /// Only when [`SqliteStore::checkpoint_pass`](super::SqliteStore::checkpoint_pass) is called, asking the writer to start the WAL
    /// over once it holds `restart_frames` frames, with no clock involved: a simulation that
    /// calls it between its own steps runs the same way every time.
    Manual {
        /// The WAL's length, in frames, past which it is started over.
        restart_frames: i64,
    },
}

/// How a [`SqliteStore`](super::SqliteStore) is opened.
#[derive(Debug, Clone, Default)]
pub struct SqliteOptions {
    /// How hard a commit is synced.
    pub sync: Synchronous,
    /// The file layer (`None`: the operating system's).
    pub files: Option<Arc<dyn FileLayer>>,
    /// How the WAL is checkpointed.
    pub checkpoints: Checkpoints,
}

/// Where a store's connections come from: its path, its sync mode and its file layer.
#[derive(Debug, Clone)]
pub(crate) struct Files {
    pub(super) path: PathBuf,
    pub(super) sync: Synchronous,
    pub(super) layer: Option<Arc<dyn FileLayer>>,
}

impl Files {
    /// A connection at the store's sync mode (a writable one in WAL mode, with the page size
    /// of a new database).
    pub(super) fn open(&self, read_only: bool) -> Result<Connection> {
        let (path, sync) = (&self.path, self.sync);
        let flags = if read_only {
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX
        } else {
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
        };
        let conn = match &self.layer {
            Some(layer) => Connection::open_with_flags_and_vfs(path, flags, layer.vfs())?,
            None => Connection::open_with_flags(path, flags)?,
        };
        conn.busy_timeout(std::time::Duration::from_secs(10))?;
        if !read_only {
            // Only takes effect when the file is new (before WAL mode writes its header): 16 KiB
            // pages make appends ~20% cheaper than the default 4 KiB (BENCHMARKS.md).
            conn.pragma_update(None, "page_size", PAGE_SIZE)?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            // The bundled SQLite checks foreign keys by default. The log's one (an event's
            // conversation) is kept by the writer, which inserts a conversation in the batch
            // that first writes it; checked, it looked the conversation up for every event and,
            // because an immediate check may abort a statement of many rows half-way, made
            // SQLite copy each page a batch's inserts touch to a statement journal first (a
            // sixth of the writer's time in the turn loop: BENCHMARKS.md). PostgreSQL's log
            // dropped the same key for the same reason (its schema step 3).
            conn.pragma_update(None, "foreign_keys", false)?;
        }
        conn.pragma_update(None, "synchronous", sync.pragma())?;
        conn.pragma_update(None, "cache_size", -16_384)?;
        conn.set_prepared_statement_cache_capacity(32);
        Ok(conn)
    }
}

/// A handle on the WAL file, to sync it from outside SQLite.
#[derive(Debug)]
pub(super) struct WalFile {
    file: std::fs::File,
    path: PathBuf,
    files: Files,
}

impl WalFile {
    pub(super) fn open(files: &Files) -> Result<WalFile> {
        let path = wal_path(&files.path);
        let file = std::fs::File::open(&path).map_err(|e| {
            Error::Io(std::io::Error::new(
                e.kind(),
                format!("opening {} to sync it: {e}", path.display()),
            ))
        })?;
        Ok(WalFile {
            file,
            path,
            files: files.clone(),
        })
    }

    pub(super) fn try_clone(&self) -> std::io::Result<WalFile> {
        Ok(WalFile {
            file: self.file.try_clone()?,
            path: self.path.clone(),
            files: self.files.clone(),
        })
    }

    /// Syncs it: `fdatasync`, or through the store's file layer.
    pub(super) fn sync(&self) -> std::io::Result<()> {
        match &self.files.layer {
            Some(layer) => layer.sync_data(&self.path),
            None => self.file.sync_data(),
        }
    }
}

fn wal_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-wal");
    PathBuf::from(name)
}
