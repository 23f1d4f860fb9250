//! The writer's pipeline after a commit: the queue of written batches, the sync thread that
//! makes them durable, and the publisher thread that makes them visible and answers their
//! callers, in commit order (see the parent module).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use proto_spec::{AppendResult, ErrorCode, RpcError};
use tokio::sync::oneshot;

use super::{Job, SYNC_AHEAD};
use crate::engine::hub::{ConvView, Hub, NewEvents};
use crate::engine::state::{Draft, TurnState};
use crate::engine::store::{format_ts, Durability};

/// A committed batch, handed to the sync thread and then to the publisher thread, which makes
/// the events visible to readers and subscribers, then answers the callers, in commit order.
pub(super) struct Committed {
    pub(super) ts_ms: i64,
    pub(super) convs: Vec<CommittedConv>,
    pub(super) replies: Vec<Reply>,
    /// Conversations it deleted: taken out of the hub, their readers told.
    pub(super) gone: Vec<Arc<ConvView>>,
}

/// One conversation's part of a committed batch.
pub(super) struct CommittedConv {
    pub(super) shared: Arc<ConvView>,
    /// Its state after the batch.
    pub(super) core: TurnState,
    /// The events the batch appended to it.
    pub(super) drafts: Vec<Draft>,
    /// Whether the batch created it.
    pub(super) new: bool,
    /// No events: the writer's view moved past events of other nodes read only as a head
    /// ([`crate::engine::store::Locked::heads`]); the last of them was committed then (ms).
    pub(super) heads_only: Option<i64>,
}

pub(super) enum Reply {
    Append(
        oneshot::Sender<Result<AppendResult, RpcError>>,
        Result<AppendResult, RpcError>,
    ),
    Create(oneshot::Sender<Result<(), RpcError>>, Result<(), RpcError>),
    Delete(
        oneshot::Sender<Result<Vec<String>, RpcError>>,
        Result<Vec<String>, RpcError>,
    ),
}

/// What callers are told once a sync has failed.
pub(super) const LOG_STOPPED: &str =
    "the log could not be made durable (a sync of the disk failed); nothing more is accepted until the server is restarted";

/// Makes every commit so far durable; false (and the log stopped) if that failed.
pub(super) fn sync(durability: &Mutex<Box<dyn Durability>>, stopped: &AtomicBool) -> bool {
    if stopped.load(Ordering::Acquire) {
        return false;
    }
    let mut d = durability.lock().unwrap_or_else(|p| p.into_inner());
    let started = std::time::Instant::now();
    match d.sync() {
        Ok(()) => {
            crate::engine::telemetry::slow("sync", 0, started.elapsed());
            true
        }
        Err(e) => {
            tracing::error!(error = %e, "syncing the log failed; the log stops: restart the server");
            stopped.store(true, Ordering::Release);
            false
        }
    }
}

/// Written batches between the writer and the sync thread.
#[derive(Default)]
pub(super) struct SyncQueue {
    state: Mutex<Queued>,
    /// Signalled when batches come or the queue closes (for the sync thread), and when the
    /// sync thread takes them (for the writer).
    changed: std::sync::Condvar,
}

/// The batches waiting for a sync, and whether the queue is closed.
#[derive(Default)]
struct Queued {
    batches: Vec<Committed>,
    closed: bool,
}

impl SyncQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queued> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until fewer than [`SYNC_AHEAD`] written batches wait for a sync to start.
    pub(super) fn wait_room(&self) {
        let mut q = self.lock();
        while q.batches.len() >= SYNC_AHEAD {
            q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
        }
    }

    pub(super) fn push(&self, batch: Committed) {
        self.lock().batches.push(batch);
        self.changed.notify_all();
    }

    /// Stops the sync thread once it has taken what is queued.
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    /// Waits for batches and moves them all into `into`; false once closed and empty.
    pub(super) fn take_all(&self, into: &mut Vec<Committed>) -> bool {
        let mut q = self.lock();
        while q.batches.is_empty() && !q.closed {
            q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        if q.batches.is_empty() {
            return false;
        }
        into.append(&mut q.batches);
        drop(q);
        self.changed.notify_all();
        true
    }
}

/// The sync thread: takes every batch committed since its last sync, makes them durable with
/// one sync, and hands them on to the publisher in commit order (or refuses them if the sync
/// failed).
pub(super) fn sync_loop(
    durability: &Mutex<Box<dyn Durability>>,
    stopped: &AtomicBool,
    written: &SyncQueue,
    publisher: std::sync::mpsc::Sender<Committed>,
    queued: &AtomicUsize,
) {
    let mut batches = Vec::new();
    while written.take_all(&mut batches) {
        let durable = sync(durability, stopped);
        for b in batches.drain(..) {
            let refused = if durable {
                publisher.send(b).err().map(|e| e.0)
            } else {
                Some(b)
            };
            if let Some(b) = refused {
                queued.fetch_sub(1, Ordering::AcqRel);
                fail_all(b.replies, LOG_STOPPED);
            }
        }
    }
}

/// The publisher thread: for each committed batch, in commit order, registers new
/// conversations, publishes the events to the hub, then answers the callers (so a caller that
/// reads after its answer sees its own write).
pub(super) fn publish_loop(
    hub: &Hub,
    committed: std::sync::mpsc::Receiver<Committed>,
    queued: &AtomicUsize,
) {
    while let Ok(batch) = committed.recv() {
        publish(hub, batch);
        queued.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Publishes one committed batch (new conversations, events, turn changes), then answers its
/// callers.
pub(super) fn publish(hub: &Hub, batch: Committed) {
    {
        let ts = format_ts(batch.ts_ms);
        for CommittedConv {
            shared,
            core,
            drafts,
            new,
            heads_only,
        } in batch.convs
        {
            if let Some(ms) = heads_only {
                // Participants' events, read only as a head (the orchestrator's are read whole).
                shared.set_clock(0, ms);
                hub.listing().mark(&shared);
            } else if new {
                shared.set_clock(batch.ts_ms, batch.ts_ms);
                hub.register(shared.clone());
            } else if drafts
                .iter()
                .any(|d| d.author != proto_spec::ORCHESTRATOR_AUTHOR)
            {
                // Idleness counts from the participants' last event: the orchestrator's own
                // (timeouts, decisions) never keep a conversation alive.
                shared.set_clock(0, batch.ts_ms);
                hub.listing().mark(&shared);
            }
            // The state machine says which event named the current speaker: one of this
            // batch's, or an earlier one.
            if drafts.first().is_some_and(|d| core.speaker_seq >= d.seq) {
                shared.set_turn_started(batch.ts_ms);
            }
            // Any decision, pause or resume may change who is to be handed a turn.
            let turn_changed = drafts
                .iter()
                .any(|d| d.kind == proto_spec::EventKind::System);
            hub.publish(&shared, core, NewEvents::drafts(drafts, &ts));
            if turn_changed {
                hub.turn_changed(&shared);
            }
        }
        for view in &batch.gone {
            hub.remove_deleted(view);
        }
        answer(batch.replies);
    }
}

impl Reply {
    /// A job's answer once the log has stopped (none for `Stop`).
    pub(super) fn refusing(job: Job) -> Option<Reply> {
        let stopped = || RpcError::new(ErrorCode::Internal, LOG_STOPPED);
        match job {
            Job::Append { reply, .. } => Some(Reply::Append(reply, Err(stopped()))),
            Job::Create { reply, .. } => Some(Reply::Create(reply, Err(stopped()))),
            Job::Delete { reply, .. } => Some(Reply::Delete(reply, Err(stopped()))),
            Job::Shared(job) => job.refusing(),
            Job::Stop | Job::CommitAnswered => None,
        }
    }
}

/// Answers every caller with `Internal` and `message`, whatever their result was.
pub(super) fn fail_all(replies: Vec<Reply>, message: &str) {
    let internal = || RpcError::new(ErrorCode::Internal, message);
    for r in replies {
        match r {
            Reply::Append(tx, _) => {
                let _ = tx.send(Err(internal()));
            }
            Reply::Create(tx, _) => {
                let _ = tx.send(Err(internal()));
            }
            Reply::Delete(tx, _) => {
                let _ = tx.send(Err(internal()));
            }
        }
    }
}

pub(super) fn answer(replies: Vec<Reply>) {
    for r in replies {
        match r {
            Reply::Append(tx, res) => {
                let _ = tx.send(res);
            }
            Reply::Create(tx, res) => {
                let _ = tx.send(res);
            }
            Reply::Delete(tx, res) => {
                let _ = tx.send(res);
            }
        }
    }
}
