//! The WAL checkpointer: copies the WAL back into the database file on its own thread, and
//! asks the writer to start the WAL over when it is long.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rusqlite::Connection;

use super::Files;
use crate::engine::error::Result;

/// Copies the WAL back into the database file on its own thread, so that the writer's commits
/// only append to the WAL and sync it. (SQLite would otherwise checkpoint inside a commit.)
///
/// A background checkpoint never catches up with a busy writer: by the time it has copied the
/// frames it saw, the writer has committed more, and SQLite only starts the WAL over (writes
/// from its first frame again) when a write transaction begins with every frame copied. Left
/// alone, the WAL of a busy server grows without bound, and every commit extends the file, so
/// its sync also has to write the file's new size. So when the WAL is past [`RESTART_FRAMES`]
/// and a background checkpoint has copied all it saw, the checkpointer asks the writer (through
/// `restart_due`) to copy the few frames committed since, between two of its commits; the
/// writer's next transaction then starts the WAL over, and from then on commits overwrite a
/// file of a steady size.
#[derive(Debug)]
pub(super) struct Checkpointer {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How often the checkpointer runs.
const CHECKPOINT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// A WAL this long (in frames, one page each: 16 MiB at 16 KiB pages) is started over.
const RESTART_FRAMES: i64 = 1_024;

/// The writer's part of a restart syncs the database file, which can take milliseconds on a
/// busy disk: at most four a second keeps that out of all but a few commits' latency. (The WAL
/// file then settles at what a quarter of a second of commits writes, and is overwritten.)
const RESTART_AT_MOST_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// The restart is asked for once a checkpoint pass has found at most this many new frames.
const WRITER_COPIES: i64 = 16;

/// The WAL file is cut back to this size when it starts over after growing past it (a burst,
/// or a long read that held a restart off).
pub(super) const WAL_SIZE_LIMIT: i64 = 256 << 20;

/// Runs a checkpoint; answers the frames in the WAL and how many of them are copied.
pub(super) fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<(i64, i64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get(1)?, r.get(2)?))
    })
}

/// The checkpointer's connection and what it remembers between rounds.
#[derive(Debug)]
pub(super) struct Passes {
    conn: Connection,
    asked: Option<std::time::Instant>,
    restart_frames: i64,
    at_most_every: std::time::Duration,
}

impl Passes {
    pub(super) fn new(
        files: &Files,
        restart_frames: i64,
        at_most_every: std::time::Duration,
    ) -> Result<Passes> {
        Ok(Passes {
            conn: files.open(false)?,
            asked: None,
            restart_frames,
            at_most_every,
        })
    }

    /// One round: passes again while the last one left many new frames behind, so that what
    /// the writer copies itself between two commits is little; asks for a restart when the WAL
    /// is long and all but the newest few frames are copied.
    pub(super) fn round(&mut self, restart_due: &AtomicBool) -> rusqlite::Result<()> {
        let mut seen = 0;
        for _ in 0..8 {
            let (frames, copied) = checkpoint(&self.conn, "PASSIVE")?;
            if frames < self.restart_frames
                || copied < frames
                || self.asked.is_some_and(|t| t.elapsed() < self.at_most_every)
            {
                break;
            }
            if frames - seen <= WRITER_COPIES {
                restart_due.store(true, Ordering::Relaxed);
                self.asked = Some(std::time::Instant::now());
                break;
            }
            seen = frames;
        }
        Ok(())
    }

    /// The last pass, when the store closes: copies everything and empties the WAL.
    fn last(&self) {
        let _ = checkpoint(&self.conn, "TRUNCATE");
    }
}

impl Checkpointer {
    pub(super) fn start(files: &Files, restart_due: Arc<AtomicBool>) -> Result<Checkpointer> {
        let mut passes = Passes::new(files, RESTART_FRAMES, RESTART_AT_MOST_EVERY)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("wal-checkpoint".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(CHECKPOINT_EVERY);
                    if let Err(e) = passes.round(&restart_due) {
                        tracing::warn!(error = %e, "WAL checkpoint failed; will retry");
                    }
                }
                passes.last();
            })?;
        Ok(Checkpointer {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
