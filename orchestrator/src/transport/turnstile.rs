//! One identity's calls take turns in the WebSocket readers.
//!
//! A connection's reader runs each call it admits until the call first waits (a read of the
//! state is answered right there). An identity with many connections, each with calls queued,
//! would otherwise have a reader of every connection in the runtime's queue at once, and a
//! call of another identity would wait behind all of them. Each identity has a turnstile (a
//! semaphore of one permit, first come first served): a reader holds it only while it runs a
//! call up to its first wait, never while a call waits on the log or a refusal is held, so an
//! identity has at most one such call in the runtime's queue, and its other readers wait
//! parked, their frames in their sockets. One permit costs an identity little throughput (a
//! call's first run takes microseconds) and nothing of its concurrency: calls that wait go on
//! side by side as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use dashmap::DashMap;
use tokio::sync::Semaphore;

/// The turnstiles of the identities with a connection open, each kept as long as a reader
/// holds it.
#[derive(Debug, Default)]
pub struct Turnstiles {
    by_agent: DashMap<String, Weak<Semaphore>>,
    /// The map's size after its last pruning.
    pruned_at: AtomicUsize,
}

impl Turnstiles {
    /// The turnstile of `agent`, made if no reader holds one.
    pub fn of(&self, agent: &str) -> Arc<Semaphore> {
        if let Some(t) = self.by_agent.get(agent).and_then(|w| w.upgrade()) {
            return t;
        }
        let made = Arc::new(Semaphore::new(1));
        let t = match self.by_agent.entry(agent.to_string()) {
            dashmap::mapref::entry::Entry::Occupied(mut e) => match e.get().upgrade() {
                Some(t) => t,
                None => {
                    e.insert(Arc::downgrade(&made));
                    made
                }
            },
            dashmap::mapref::entry::Entry::Vacant(e) => {
                e.insert(Arc::downgrade(&made));
                made
            }
        };
        self.prune();
        t
    }

    /// Forgets the turnstiles no reader holds, once the map has doubled since it last did.
    fn prune(&self) {
        let len = self.by_agent.len();
        if len > 64 && len > 2 * self.pruned_at.load(Ordering::Relaxed) {
            self.by_agent.retain(|_, w| w.strong_count() > 0);
            self.pruned_at.store(self.by_agent.len(), Ordering::Relaxed);
        }
    }

    /// How many identities have a turnstile in the map (held or not yet pruned).
    pub fn len(&self) -> usize {
        self.by_agent.len()
    }

    /// True when no identity has one.
    pub fn is_empty(&self) -> bool {
        self.by_agent.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_identity_one_turn_at_a_time_others_apart() {
        let t = Turnstiles::default();
        let a1 = t.of("a");
        let a2 = t.of("a");
        assert!(
            Arc::ptr_eq(&a1, &a2),
            "an identity's readers share one turnstile"
        );
        let held = a1.clone().try_acquire_owned().expect("free");
        assert!(a2.try_acquire().is_err(), "its other readers wait");
        let b = t.of("b");
        assert!(b.try_acquire().is_ok(), "another identity does not");
        drop(held);
        assert!(a2.try_acquire().is_ok());
    }

    #[test]
    fn turnstiles_nobody_holds_are_forgotten() {
        let t = Turnstiles::default();
        let kept = t.of("kept");
        for i in 0..1_000 {
            drop(t.of(&format!("agent-{i}")));
        }
        assert!(t.len() < 200, "{} left", t.len());
        assert!(Arc::ptr_eq(&kept, &t.of("kept")), "one still held stays");
    }
}
