//! Turns on a cluster: an internal agent's turn runs on one node at a time.
//!
//! Every node sees every pending turn, so before a node runs an internal agent's turn it claims
//! the turn in the database ([`Store::claim_turn`]): one node is granted it, with a fence; the
//! others wait for the holder's lease to run out (or for the turn to end) and try again. The
//! holder renews its leases every [`RENEW_EVERY`]; it stops a run at once when a renewal says
//! the claim was taken, and also when it could not renew for [`LEASE`] less [`MARGIN`] by its
//! own clock (a node cut off from the database stops before any other node can be granted the
//! turn: the lease it was granted ends, by the database's clock, no earlier than a lease after
//! the renewal was sent). Every write the run makes carries the fence, and the writer refuses it
//! under the claim's row lock once another node holds the turn: a node that was only cut off,
//! and comes back, appends nothing for the turn it lost. A graceful stop lets go of every lease
//! at once, so the turns go on elsewhere without waiting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use executors::Assignment;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::engine::hub::ConvView;
use crate::engine::store::{Claimed, Store, TurnKey};

/// How long a claim lasts unless renewed.
pub const LEASE: Duration = Duration::from_secs(2);
/// How often the leases held are renewed.
pub const RENEW_EVERY: Duration = Duration::from_millis(500);
/// A holder stops a run this long before its lease could have run out by the database's clock.
pub const MARGIN: Duration = Duration::from_millis(300);

/// A claim this node holds.
#[derive(Debug)]
struct Held {
    fence: i64,
    stop: watch::Sender<bool>,
    conv: Arc<ConvView>,
    /// Past this (this node's clock) the lease may have run out: the run stops.
    valid_until: Instant,
    /// Claimed by the commit that opened the turn ([`Cluster::granted`]), and no run has
    /// taken it yet.
    waiting: bool,
}

/// This node's claims on turns, and what it claims them with.
#[derive(Debug)]
pub struct Cluster {
    store: Arc<dyn Store>,
    /// This node's name in the claims (new at every start).
    holder: String,
    held: Mutex<HashMap<TurnKey, Held>>,
    /// Whether a renewal is waiting for the database (a slow one is not piled on).
    renewing: std::sync::atomic::AtomicBool,
    /// Held while leases are renewed or let go, so that a renewal in flight cannot renew a
    /// lease after a graceful stop let go of it; true once let go.
    released: tokio::sync::Mutex<bool>,
}

/// Whether `agent` is still to speak in `turn` of `conv`.
fn still_pending(conv: &ConvView, agent: &str, turn: u64) -> bool {
    let core = conv.core();
    core.turn == turn
        && core
            .turn_to_hand_out()
            .is_some_and(|(speaker, _)| speaker == agent)
}

impl Cluster {
    /// This node's claims on `store`, renewed on `runtime` until the hub closes.
    pub fn start(
        store: Arc<dyn Store>,
        runtime: &tokio::runtime::Handle,
        mut closing: watch::Receiver<bool>,
    ) -> Arc<Cluster> {
        let cluster = Arc::new(Cluster {
            store,
            holder: format!("node-{}", uuid::Uuid::new_v4()),
            held: Mutex::default(),
            renewing: std::sync::atomic::AtomicBool::new(false),
            released: tokio::sync::Mutex::new(false),
        });
        let me = cluster.clone();
        runtime.spawn(async move {
            let mut tick = tokio::time::interval(RENEW_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let stopping = tokio::select! {
                    _ = tick.tick() => false,
                    // Closed, or the hub is gone: either way this node stops.
                    _ = closing.wait_for(|c| *c) => true,
                };
                if stopping {
                    break;
                }
                // Runs whose lease may have run out stop whatever the database answers, or
                // however long it takes to answer.
                me.expire();
                if !me.renewing.swap(true, std::sync::atomic::Ordering::AcqRel) {
                    let renewing = me.clone();
                    tokio::spawn(async move {
                        renewing.renew().await;
                        renewing
                            .renewing
                            .store(false, std::sync::atomic::Ordering::Release);
                    });
                }
            }
            me.release().await;
        });
        cluster
    }

    /// This node's name in the claims.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Claims a turn for a push replica (`holder`: this node and the claim's id); whether it was
    /// granted (a database that cannot be asked grants nothing). The lease is renewed with this
    /// node's others while the turn is open and the replica holds it: if this node dies, the
    /// claim runs out and a replica on another node can take the turn.
    pub async fn claim_push(&self, conv: &Arc<ConvView>, turn: u64, holder: String) -> bool {
        let key = TurnKey {
            conversation_id: conv.id.clone(),
            turn,
        };
        let (store, k) = (self.store.clone(), key.clone());
        let sent = Instant::now();
        match tokio::task::spawn_blocking(move || store.claim_turn(&k, &holder, LEASE)).await {
            Ok(Ok(Claimed::Granted { fence })) => {
                // Nothing runs here for a push claim: nothing to stop.
                self.hold(key, fence, watch::channel(false).0, conv, sent, false);
                true
            }
            Ok(Ok(Claimed::Held { .. })) => false,
            Ok(Err(e)) => {
                tracing::warn!(conversation = %conv.id, turn, error = %e, "could not claim a turn for a replica");
                false
            }
            Err(_) => false,
        }
    }

    /// Lets go of a push replica's claim (the replica went, or its claim expired here), so that
    /// another replica, on any node, can be granted the turn at once.
    pub async fn release_push(&self, conversation_id: &str, turn: u64, holder: String) {
        let key = TurnKey {
            conversation_id: conversation_id.to_string(),
            turn,
        };
        if let Ok(mut held) = self.held.lock() {
            held.remove(&key);
        }
        let store = self.store.clone();
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || store.release_turns(&holder)).await
        {
            tracing::warn!(error = %e, "could not let go of a replica's claim; it runs out by itself");
        }
    }

    /// Claims the turn of `a`, then hands it to the internal executor; while another node holds
    /// it, waits for its lease to run out or the turn to end, and tries again.
    pub async fn run_claimed(
        self: Arc<Self>,
        conv: Arc<ConvView>,
        mut a: Assignment,
        tx: mpsc::UnboundedSender<Assignment>,
    ) {
        let key = TurnKey {
            conversation_id: a.conversation_id.clone(),
            turn: a.turn,
        };
        let mut head = conv.watch();
        if let Some((fence, stopped)) = self.take_granted(&key) {
            crate::engine::telemetry::claim("with_commit");
            a.claim = Some(fence);
            a.stop = Some(stopped);
            let _ = tx.send(a);
            return;
        }
        while still_pending(&conv, &a.agent_id, a.turn) {
            let sent = Instant::now();
            let (store, k, holder) = (self.store.clone(), key.clone(), self.holder.clone());
            let claimed =
                tokio::task::spawn_blocking(move || store.claim_turn(&k, &holder, LEASE)).await;
            let wait = match claimed {
                Ok(Ok(Claimed::Granted { fence })) => {
                    crate::engine::telemetry::claim("granted");
                    let (stop, stopped) = watch::channel(false);
                    self.hold(key, fence, stop, &conv, sent, false);
                    a.claim = Some(fence);
                    a.stop = Some(stopped);
                    let _ = tx.send(a);
                    return;
                }
                Ok(Ok(Claimed::Held { left_ms })) => {
                    crate::engine::telemetry::claim("held");
                    Duration::from_millis(left_ms as u64 + 20 + rand::random::<u64>() % 80)
                }
                Ok(Err(e)) => {
                    crate::engine::telemetry::claim("error");
                    tracing::warn!(conversation = %a.conversation_id, turn = a.turn, error = %e, "could not claim a turn; trying again");
                    Duration::from_secs(1)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "claiming a turn failed");
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = head.changed() => {}
            }
        }
    }

    /// Holds turn `turn` of `conv`, claimed by the commit (sent at `sent`) that opened it, for
    /// the run [`Cluster::run_claimed`] is about to start; renewed as every claim held.
    pub fn granted(&self, conv: &Arc<ConvView>, turn: u64, fence: i64, sent: Instant) {
        let key = TurnKey {
            conversation_id: conv.id.clone(),
            turn,
        };
        self.hold(key, fence, watch::channel(false).0, conv, sent, true);
    }

    /// Holds the claim on `key` with `fence`, its lease asked for at `sent`; `stop` stops its
    /// run; `waiting`: no run has taken it yet.
    fn hold(
        &self,
        key: TurnKey,
        fence: i64,
        stop: watch::Sender<bool>,
        conv: &Arc<ConvView>,
        sent: Instant,
        waiting: bool,
    ) {
        if let Ok(mut held) = self.held.lock() {
            held.insert(
                key,
                Held {
                    fence,
                    stop,
                    conv: conv.clone(),
                    valid_until: sent + LEASE - MARGIN,
                    waiting,
                },
            );
        }
    }

    /// The fence of a claim a commit made for `key` that no run has taken yet, and what stops
    /// the run. (A renewal that ran before the turn was published here forgot it: the run then
    /// asks the database, which grants this node its own claim again, with the same fence.)
    fn take_granted(&self, key: &TurnKey) -> Option<(i64, watch::Receiver<bool>)> {
        let mut held = self.held.lock().ok()?;
        let h = held.get_mut(key).filter(|h| h.waiting)?;
        h.waiting = false;
        let (stop, stopped) = watch::channel(false);
        h.stop = stop;
        Some((h.fence, stopped))
    }

    /// Stops the runs whose lease may have run out unrenewed (by this node's clock).
    fn expire(&self) {
        let Ok(mut map) = self.held.lock() else {
            return;
        };
        let now = Instant::now();
        map.retain(|key, h| {
            if h.valid_until > now {
                return true;
            }
            tracing::warn!(conversation = %key.conversation_id, turn = key.turn, "a turn claim could not be renewed in time; stopping the turn here");
            crate::engine::telemetry::claim_lost("expired");
            h.stop.send_replace(true);
            false
        });
    }

    /// Renews every lease held; stops the runs whose claim was taken; forgets the claims of
    /// turns that have moved on.
    async fn renew(&self) {
        let held: Vec<(TurnKey, i64)> = match self.held.lock() {
            Ok(mut held) => {
                // A turn that moved on needs its claim no more (its run finishes by itself).
                held.retain(|k, h| {
                    let core = h.conv.core();
                    !core.closed && core.turn == k.turn
                });
                held.iter().map(|(k, h)| (k.clone(), h.fence)).collect()
            }
            Err(_) => return,
        };
        let released = self.released.lock().await;
        if *released {
            return;
        }
        let sent = Instant::now();
        let renewed = if held.is_empty() {
            Ok(Vec::new())
        } else {
            let (store, holder, list) = (self.store.clone(), self.holder.clone(), held.clone());
            tokio::task::spawn_blocking(move || store.renew_turns(&holder, &list, LEASE))
                .await
                .map_err(crate::engine::error::Error::from)
                .and_then(|r| r)
        };
        let Ok(mut map) = self.held.lock() else {
            return;
        };
        match renewed {
            Ok(kept) => {
                for ((key, _), kept) in held.iter().zip(kept) {
                    if kept {
                        if let Some(h) = map.get_mut(key) {
                            h.valid_until = sent + LEASE - MARGIN;
                        }
                    } else if let Some(h) = map.remove(key) {
                        tracing::info!(conversation = %key.conversation_id, turn = key.turn, "another node took the turn over; stopping it here");
                        crate::engine::telemetry::claim_lost("taken");
                        h.stop.send_replace(true);
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, held = held.len(), "could not renew turn claims");
            }
        }
    }

    /// A graceful stop: every run here stops, and every lease is let go so other nodes take
    /// the turns at once.
    pub async fn release(&self) {
        let mut released = self.released.lock().await;
        *released = true;
        if let Ok(mut held) = self.held.lock() {
            for (_, h) in held.drain() {
                h.stop.send_replace(true);
            }
        }
        let (store, holder) = (self.store.clone(), self.holder.clone());
        match tokio::task::spawn_blocking(move || store.release_turns(&holder)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not let go of turn claims; they run out by themselves")
            }
            Err(e) => tracing::warn!(error = %e, "letting go of turn claims failed"),
        }
    }
}
