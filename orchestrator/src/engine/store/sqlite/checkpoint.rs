//! The WAL checkpointer: copies the WAL back into the database file on its own thread, and
//! asks the writer to start the WAL over when it is long.

use std::path::Path;
use std::sync::Arc;

use rusqlite::Connection;

use super::{open_conn, Synchronous};
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
    stop: Arc<std::sync::atomic::AtomicBool>,
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

impl Checkpointer {
    pub(super) fn start(
        path: &Path,
        sync: Synchronous,
        restart_due: Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<Checkpointer> {
        let conn = open_conn(path, sync, false)?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("wal-checkpoint".into())
            .spawn(move || {
                let mut asked: Option<std::time::Instant> = None;
                while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(CHECKPOINT_EVERY);
                    // Passes again while the last one left many new frames behind, so that
                    // what the writer copies itself between two commits is little.
                    let mut seen = 0;
                    for _ in 0..8 {
                        match checkpoint(&conn, "PASSIVE") {
                            Ok((frames, copied)) => {
                                if frames < RESTART_FRAMES
                                    || copied < frames
                                    || asked.is_some_and(|t| t.elapsed() < RESTART_AT_MOST_EVERY)
                                {
                                    break;
                                }
                                if frames - seen <= WRITER_COPIES {
                                    restart_due.store(true, std::sync::atomic::Ordering::Relaxed);
                                    asked = Some(std::time::Instant::now());
                                    break;
                                }
                                seen = frames;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "WAL checkpoint failed; will retry");
                                break;
                            }
                        }
                    }
                }
                let _ = checkpoint(&conn, "TRUNCATE");
            })?;
        Ok(Checkpointer {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
