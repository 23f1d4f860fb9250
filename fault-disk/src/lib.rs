//! A file layer for SQLite that simulates what a machine's disk does when the power goes, a
//! sync fails or the disk is full, for deterministic tests of what survives.
//!
//! [`Disk::register`] registers a SQLite VFS (by name) that passes every call to the operating
//! system's own VFS, so SQLite runs exactly as it does in the server, on real files, with real
//! locks and shared memory. Beside that, the disk keeps for every file what a sync has made
//! durable, and the writes since:
//!
//! - **power loss**: from the chosen operation on ([`Faults::power_off_at`]) every write, sync,
//!   truncation and deletion fails, as if the machine had stopped; [`Disk::survivors`] then
//!   writes into another directory what the disk would hold on restart: for each file its
//!   durable image, and of the writes not yet synced none ([`Survive::Synced`]) or a random
//!   subset, each applied whole or not at all ([`Survive::Some`]);
//! - **a failing sync** ([`Faults::fail_sync_at`]): that sync answers an I/O error, the writes
//!   it was to make durable are dropped from what survives (as Linux drops pages it could not
//!   write), and every later sync of that file fails too (Linux reports the loss to every
//!   handle open on the file);
//! - **a full disk** ([`Faults::full_after_bytes`]): writes past that many bytes answer
//!   `SQLITE_FULL` and write nothing.
//!
//! A sync SQLite does not do itself (the store syncs its WAL from another handle) goes through
//! [`Disk::sync_path`]. Every decision is made from the operation count and the seed given, so
//! one seed gives one run when the caller's own operations are in a fixed order.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

mod shim;

/// The faults to inject, by operation number (writes, truncations, syncs and deletions count,
/// from 1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// The power goes off before this operation: it and every later one fail.
    pub power_off_at: Option<u64>,
    /// The sync with this number (syncs counted alone, from 1) fails (`SQLITE_IOERR_FSYNC`),
    /// and what it would have made durable is lost.
    pub fail_sync_at: Option<u64>,
    /// Writes that would take the bytes written past this many fail with `SQLITE_FULL`.
    pub full_after_bytes: Option<u64>,
}

/// What survives of the writes that no sync covered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Survive {
    /// None of them.
    Synced,
    /// Each one, whole, with this probability, drawn from the seed (writes at page and frame
    /// granularity, as SQLite issues them: a disk that keeps writes whole, in any order).
    Some {
        /// Chance that a given write survives.
        chance: f64,
        /// Seed of the draws.
        seed: u64,
    },
}

/// What a file has seen since its durable image.
#[derive(Debug, Clone)]
enum Op {
    Write { offset: u64, data: Vec<u8> },
    Truncate(u64),
}

/// One file the disk tracks.
#[derive(Debug, Default)]
struct Tracked {
    /// What a sync has made durable.
    durable: Vec<u8>,
    /// Writes and truncations since, in order.
    pending: Vec<Op>,
    /// A sync of it failed: every later one fails too (Linux reports a lost write to every
    /// handle open on the file; a later sync must not say that what was lost is durable).
    failed: bool,
}

fn apply(image: &mut Vec<u8>, op: &Op) {
    match op {
        Op::Write { offset, data } => {
            let at = *offset as usize;
            if image.len() < at + data.len() {
                image.resize(at + data.len(), 0);
            }
            image[at..at + data.len()].copy_from_slice(data);
        }
        Op::Truncate(len) => image.truncate(*len as usize),
    }
}

/// The counters and switches shared by every file of a disk.
#[derive(Debug, Default)]
struct State {
    faults: Faults,
    ops: u64,
    syncs: u64,
    bytes: u64,
    off: bool,
    files: HashMap<PathBuf, Arc<Mutex<Tracked>>>,
    /// Syncs that failed, writes refused for space.
    failed_syncs: u64,
    full_writes: u64,
}

/// Why an operation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The power is off.
    Off,
    /// The sync failed.
    SyncFailed,
    /// No space left.
    Full,
}

/// A simulated disk: a SQLite VFS by name, and what survives a power loss.
#[derive(Debug, Clone)]
pub struct Disk {
    name: String,
    state: Arc<Mutex<State>>,
}

impl Disk {
    /// Registers a VFS called `name` over the operating system's default one. Each name may be
    /// registered once per process (SQLite keeps the VFS for the process's life).
    pub fn register(name: &str) -> std::io::Result<Disk> {
        let disk = Disk {
            name: name.to_string(),
            state: Arc::default(),
        };
        shim::register(name, disk.clone())?;
        Ok(disk)
    }

    /// The VFS's name, for `sqlite3_open_v2`.
    pub fn vfs_name(&self) -> &str {
        &self.name
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts over: new faults, the power on, the counters at zero, no file tracked (files
    /// are read afresh when next opened). Every connection of the last run must be closed.
    pub fn reset(&self, faults: Faults) {
        let mut s = self.state();
        *s = State {
            faults,
            ..State::default()
        };
    }

    /// Changes the faults of the run under way (the files stay tracked): a `power_off_at` at
    /// or below the operations so far turns the power off at once.
    pub fn reset_faults(&self, faults: Faults) {
        let mut s = self.state();
        s.faults = faults;
        if faults.power_off_at.is_some_and(|at| at <= s.ops) {
            s.off = true;
        }
    }

    /// Operations so far (writes, truncations, syncs, deletions).
    pub fn ops(&self) -> u64 {
        self.state().ops
    }

    /// Whether the power went off.
    pub fn is_off(&self) -> bool {
        self.state().off
    }

    /// Syncs that failed and writes refused for space so far.
    pub fn refusals(&self) -> (u64, u64) {
        let s = self.state();
        (s.failed_syncs, s.full_writes)
    }

    /// Counts one operation; whether it may go ahead.
    fn count(&self, s: &mut State) -> Result<u64, Refusal> {
        if s.off {
            return Err(Refusal::Off);
        }
        s.ops += 1;
        if s.faults.power_off_at.is_some_and(|at| s.ops >= at) {
            s.off = true;
            return Err(Refusal::Off);
        }
        Ok(s.ops)
    }

    /// The tracked file at `path`, read from the real file when first seen.
    pub(crate) fn track(&self, path: &Path) -> Arc<Mutex<Tracked>> {
        let mut s = self.state();
        s.files
            .entry(path.to_path_buf())
            .or_insert_with(|| {
                Arc::new(Mutex::new(Tracked {
                    durable: std::fs::read(path).unwrap_or_default(),
                    ..Tracked::default()
                }))
            })
            .clone()
    }

    /// Before a write of `len` bytes.
    pub(crate) fn before_write(&self, len: usize) -> Result<(), Refusal> {
        let mut s = self.state();
        self.count(&mut s)?;
        if s.faults
            .full_after_bytes
            .is_some_and(|max| s.bytes + len as u64 > max)
        {
            s.full_writes += 1;
            return Err(Refusal::Full);
        }
        s.bytes += len as u64;
        Ok(())
    }

    /// Before a truncation or a deletion.
    pub(crate) fn before_change(&self) -> Result<(), Refusal> {
        let mut s = self.state();
        self.count(&mut s).map(|_| ())
    }

    /// A sync of `file`: its writes become durable, unless this sync fails (then they are
    /// lost to a power loss, as a failed `fsync` drops the pages it could not write).
    pub(crate) fn sync(&self, file: &Mutex<Tracked>) -> Result<(), Refusal> {
        let failed = {
            let mut s = self.state();
            self.count(&mut s)?;
            s.syncs += 1;
            let failed = s.faults.fail_sync_at == Some(s.syncs);
            if failed {
                s.failed_syncs += 1;
            }
            failed
        };
        let mut t = file.lock().unwrap_or_else(|p| p.into_inner());
        let pending = std::mem::take(&mut t.pending);
        if failed || t.failed {
            t.failed = true;
            return Err(Refusal::SyncFailed);
        }
        for op in &pending {
            apply(&mut t.durable, op);
        }
        Ok(())
    }

    /// Syncs the file at `path` from outside SQLite (an `fdatasync` of another handle on it).
    pub fn sync_path(&self, path: &Path) -> std::io::Result<()> {
        let file = self.track(path);
        self.sync(&file).map_err(|r| match r {
            Refusal::Off => std::io::Error::other("the power is off"),
            Refusal::SyncFailed => std::io::Error::other("injected sync failure (EIO)"),
            Refusal::Full => std::io::Error::other("no space left on device"),
        })
    }

    /// A file was written or truncated.
    pub(crate) fn note(&self, file: &Mutex<Tracked>, op: Op) {
        file.lock()
            .unwrap_or_else(|p| p.into_inner())
            .pending
            .push(op);
    }

    /// A file was deleted: it is gone for good.
    pub(crate) fn forget(&self, path: &Path) {
        self.state().files.remove(path);
    }

    /// Writes into `dir` what the disk would hold after the power went off: every tracked
    /// file under its own name, with the writes that `survive`. The names of the files written.
    pub fn survivors(&self, dir: &Path, survive: Survive) -> std::io::Result<Vec<PathBuf>> {
        let files: Vec<(PathBuf, Arc<Mutex<Tracked>>)> = {
            let s = self.state();
            let mut v: Vec<_> = s
                .files
                .iter()
                .map(|(p, t)| (p.clone(), t.clone()))
                .collect();
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v
        };
        let mut rng = match survive {
            Survive::Synced => None,
            Survive::Some { chance, seed } => Some((chance, SplitMix(seed))),
        };
        let mut out = Vec::new();
        for (path, file) in files {
            let Some(name) = path.file_name() else {
                continue;
            };
            let t = file.lock().unwrap_or_else(|p| p.into_inner());
            let mut image = t.durable.clone();
            if let Some((chance, rng)) = rng.as_mut() {
                for op in &t.pending {
                    if rng.chance(*chance) {
                        apply(&mut image, op);
                    }
                }
            }
            let to = dir.join(name);
            std::fs::write(&to, &image)?;
            out.push(to);
        }
        Ok(out)
    }
}

/// A small deterministic generator (SplitMix64): the same seed, the same draws.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}
