//! The seam through which the publisher writes committed events to live subscribers that a
//! transport owns (the WebSocket `subscribe` and SSE streams).
//!
//! The publisher writes each event to every live subscriber of the conversation as part of
//! publishing, never waiting: one call per subscriber, no task woken per event (the measured
//! reason for this design is in BENCHMARKS.md). What the hub owns is the ordering: a
//! subscriber joins a conversation's [`LiveSet`] only when its cursor has reached what the set
//! was last given (under the set's lock), so no event is skipped or sent twice; a subscriber
//! that cannot take an event is let go and told how far it got, and goes back to reading the
//! log by cursor. What the transport owns is the writing ([`LiveSubscriber`]).

use std::sync::{Arc, Mutex, OnceLock};

use proto_spec::Event;

use super::NewEvents;

/// A subscriber the publisher writes to without waiting (implemented by a transport).
pub trait LiveSubscriber: Send + Sync + std::fmt::Debug {
    /// Takes one committed event at once, or answers false when it cannot (its buffer is full,
    /// its connection is gone); the publisher then lets it go.
    fn offer(&self, event: &LiveEvent<'_>) -> bool;

    /// The publisher let this subscriber go; `reached` is the last seq it took. Called once,
    /// from the publisher, after which nothing more is offered.
    fn let_go(&self, reached: u64);
}

/// How a transport writes an event to its live subscribers: each encoding is made once per
/// event, however many subscribers take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// The shared tail of a WebSocket `event` notification.
    WebSocket,
    /// An SSE frame.
    Sse,
}

/// One committed event as the publisher offers it, with its encodings shared by every
/// subscriber it is offered to: the first that needs one makes it, the others reuse it.
#[derive(Debug)]
pub struct LiveEvent<'a> {
    /// The conversation the event belongs to.
    pub conversation_id: &'a str,
    /// The event.
    pub event: &'a Event,
    encoded: [OnceLock<Vec<u8>>; 2],
}

impl<'a> LiveEvent<'a> {
    /// An event of `conversation_id`, not yet encoded.
    pub fn new(conversation_id: &'a str, event: &'a Event) -> Self {
        LiveEvent {
            conversation_id,
            event,
            encoded: [OnceLock::new(), OnceLock::new()],
        }
    }

    /// The event's bytes in `as_`, made by `encode` on first use.
    pub fn encoded(&self, as_: Encoding, encode: impl FnOnce(&str, &Event) -> Vec<u8>) -> &[u8] {
        self.encoded[as_ as usize].get_or_init(|| encode(self.conversation_id, self.event))
    }
}

/// One conversation's live subscribers, written to by the publisher.
#[derive(Debug)]
pub struct LiveSet {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The last seq published (every publish moves it, with or without subscribers).
    pushed: u64,
    /// The conversation was deleted: nobody joins any more.
    closed: bool,
    /// Each subscriber with the next seq it expects.
    subs: Vec<(Arc<dyn LiveSubscriber>, u64)>,
}

impl LiveSet {
    /// A set for a conversation whose latest seq is `head`.
    pub fn after(head: u64) -> LiveSet {
        LiveSet {
            inner: Mutex::new(Inner {
                pushed: head,
                closed: false,
                subs: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Offers committed events (in seq order, the conversation's latest, up to `head`) to
    /// every subscriber (publisher only, after the conversation's head has moved). The events
    /// are made only if someone subscribes.
    pub fn deliver(&self, conversation_id: &str, head: u64, events: &mut NewEvents<'_>) {
        let mut set = self.lock();
        if head <= set.pushed {
            return;
        }
        set.pushed = head;
        if set.subs.is_empty() {
            return;
        }
        let offered: Vec<LiveEvent<'_>> = events
            .get(conversation_id)
            .iter()
            .map(|e| LiveEvent::new(conversation_id, e))
            .collect();
        set.subs.retain_mut(|(sub, next)| {
            for e in &offered {
                if e.event.seq < *next {
                    continue;
                }
                // Events before it were not offered here (the head moved without them): the
                // subscriber reads on from the log.
                if e.event.seq > *next || !sub.offer(e) {
                    sub.let_go(*next - 1);
                    return false;
                }
                *next = e.event.seq + 1;
            }
            true
        });
    }

    /// Adds `sub` if `cursor` has reached what the set was last given; otherwise there is
    /// more to read from the log first (or the conversation was deleted), and it is not added.
    pub fn join(&self, sub: &Arc<dyn LiveSubscriber>, cursor: u64) -> bool {
        let mut set = self.lock();
        if cursor < set.pushed || set.closed {
            return false;
        }
        set.subs.push((sub.clone(), cursor + 1));
        true
    }

    /// Whether nobody subscribes.
    pub fn is_empty(&self) -> bool {
        self.lock().subs.is_empty()
    }

    /// Lets every subscriber go (the conversation was deleted: each reads the log again and
    /// finds it gone).
    pub fn let_all_go(&self) {
        let subs = {
            let mut set = self.lock();
            set.closed = true;
            std::mem::take(&mut set.subs)
        };
        for (sub, next) in subs {
            sub.let_go(next - 1);
        }
    }

    /// Removes `sub`; nothing is offered to it after this returns.
    pub fn leave(&self, sub: &Arc<dyn LiveSubscriber>) {
        self.lock().subs.retain(|(s, _)| !Arc::ptr_eq(s, sub));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes every event it is offered and records how far it was let go.
    #[derive(Debug, Default)]
    struct Taker {
        took: Mutex<Vec<u64>>,
        let_go: Mutex<Option<u64>>,
    }

    impl LiveSubscriber for Taker {
        fn offer(&self, event: &LiveEvent<'_>) -> bool {
            self.took.lock().unwrap().push(event.event.seq);
            true
        }

        fn let_go(&self, reached: u64) {
            *self.let_go.lock().unwrap() = Some(reached);
        }
    }

    fn publish(set: &LiveSet, seqs: std::ops::RangeInclusive<u64>) {
        let head = *seqs.end();
        let drafts = seqs
            .map(|seq| crate::engine::state::Draft {
                seq,
                kind: proto_spec::EventKind::Message,
                author: "alice".into(),
                turn: 1,
                finality: None,
                payload: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
                client_request_id: None,
                hash: None,
                doc: false,
            })
            .collect();
        set.deliver("c", head, &mut NewEvents::drafts(drafts, "t"));
    }

    #[test]
    fn a_head_moved_without_its_events_lets_the_subscriber_go_to_the_log() {
        let set = LiveSet::after(2);
        let taker = Arc::new(Taker::default());
        let sub: Arc<dyn LiveSubscriber> = taker.clone();
        assert!(set.join(&sub, 2));
        publish(&set, 3..=4);
        // The head moves to 7 with no events (another node's, passed by their head), then 8.
        set.deliver("c", 7, &mut NewEvents::drafts(Vec::new(), "t"));
        publish(&set, 8..=8);
        assert_eq!(*taker.took.lock().unwrap(), [3, 4]);
        assert_eq!(
            *taker.let_go.lock().unwrap(),
            Some(4),
            "it reads 5 on from the log"
        );
        assert!(set.is_empty());
        // A subscriber whose cursor has reached the head joins again.
        assert!(!set.join(&sub, 4));
        assert!(set.join(&sub, 8));
    }
}
