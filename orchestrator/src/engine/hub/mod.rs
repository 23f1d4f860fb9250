//! Hot state in memory and the fanout of committed events.
//!
//! Only the log publisher thread changes anything here, and only after a commit: it appends
//! the committed events to the conversation's ring of recent events (when someone reads the
//! conversation), updates the conversation's [`TurnState`], moves its head (a `watch`, which wakes
//! long-polls and subscriptions) and sends every event on one global broadcast (for
//! subscriptions that follow all of an agent's conversations). Readers never block the writer:
//! a reader that falls behind the ring reads the log from the store by cursor (see
//! [`crate::engine::fanout`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock};

use dashmap::DashMap;
use proto_spec::Event;
use tokio::sync::{broadcast, watch};

use crate::engine::state::{Members, TurnState};

pub mod listing;
pub mod live;
mod view;

use view::Recent;
pub use view::{search_text, ConvView};

/// How many recent events each conversation keeps in memory at least.
pub const RECENT_EVENTS: usize = 64;
/// Beyond [`RECENT_EVENTS`], a conversation also keeps the events of the last
/// [`RECENT_WINDOW`], up to [`RECENT_MAX`]: a subscriber that is a moment behind a busy
/// conversation reads from memory instead of each one reading the same rows from the store.
/// Memory follows the recent event rate, not the number of conversations.
pub const RECENT_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);
/// The most events a conversation keeps in memory.
pub const RECENT_MAX: usize = 4096;
/// A conversation keeps recent events in memory while someone reads it: a waiter or
/// subscriber is registered on it, a subscription follows all conversations, or a reader
/// asked for recent events within this long. Nobody reading, it keeps none (a reader that
/// comes reads the store once, and the ring from then on).
pub const READ_RECENTLY: std::time::Duration = std::time::Duration::from_secs(5);
/// The global broadcast's buffer (in commits per conversation); a subscriber further behind is
/// resumed from the log.
pub const GLOBAL_BUFFER: usize = 4096;

/// Events of one conversation committed together, in seq order.
pub type EventBatch = Arc<Vec<Arc<Event>>>;

/// The events one commit appends to a conversation, for [`Hub::publish`]: made into [`Event`]s
/// only when something takes them (the ring of a conversation being read, a subscriber, a
/// subscription to all conversations). Most commits to a conversation nobody reads need none.
#[derive(Debug)]
pub struct NewEvents<'a> {
    drafts: Vec<crate::engine::state::Draft>,
    /// The commit's timestamp, for events made from `drafts`.
    ts: &'a str,
    events: Vec<Arc<Event>>,
}

impl<'a> NewEvents<'a> {
    /// Committed drafts with their commit's timestamp (RFC 3339).
    pub fn drafts(drafts: Vec<crate::engine::state::Draft>, ts: &'a str) -> Self {
        NewEvents {
            drafts,
            ts,
            events: Vec::new(),
        }
    }

    /// The events of `conversation_id`, made on first use.
    pub fn get(&mut self, conversation_id: &str) -> &[Arc<Event>] {
        if !self.drafts.is_empty() {
            let ts = self.ts;
            self.events.extend(
                self.drafts
                    .drain(..)
                    .map(|d| Arc::new(crate::engine::store::to_event(conversation_id, d, ts))),
            );
        }
        &self.events
    }
}

/// All conversations' shared state, and the global event broadcast.
#[derive(Debug)]
pub struct Hub {
    convs: DashMap<String, Arc<ConvView>, ahash::RandomState>,
    global: broadcast::Sender<EventBatch>,
    closing: watch::Sender<bool>,
    turn_sink: std::sync::OnceLock<TurnSink>,
    pre_claim: std::sync::OnceLock<Box<dyn PreClaim>>,
    /// Every conversation in list order.
    listing: listing::Listing,
}

/// On a store several nodes share, what the writer asks the turn dispatcher, so that a turn
/// this node will run is claimed in the very commit that opens it (not in a commit of its own
/// once it is open): who this node is in the claims, whether it runs an agent's turns, and the
/// claims its commits were granted.
pub trait PreClaim: Send + Sync {
    /// This node's name in the turn claims.
    fn holder(&self) -> String;
    /// Whether this node runs `agent`'s turns in `conv` (an internal agent, with an executor).
    fn runs_here(&self, conv: &ConvView, agent: &str) -> bool;
    /// Turn `turn` of `conv` was claimed for this node with fence `fence` by a commit sent at
    /// `sent`; called before the commit is published.
    fn granted(&self, conv: &Arc<ConvView>, turn: u64, fence: i64, sent: tokio::time::Instant);
}

impl std::fmt::Debug for dyn PreClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PreClaim")
    }
}

/// A callback on a conversation.
pub type ConvCallback = Box<dyn Fn(&Arc<ConvView>) + Send + Sync>;

/// What the publisher calls when a conversation's speaker may have changed.
pub struct TurnSink(pub ConvCallback);

impl std::fmt::Debug for TurnSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TurnSink")
    }
}

impl Default for Hub {
    fn default() -> Self {
        Hub {
            convs: DashMap::default(),
            global: broadcast::channel(GLOBAL_BUFFER).0,
            closing: watch::channel(false).0,
            turn_sink: std::sync::OnceLock::new(),
            pre_claim: std::sync::OnceLock::new(),
            listing: listing::Listing::default(),
        }
    }
}

impl Hub {
    /// Makes the shared state of a conversation, not yet visible to readers.
    pub fn make(id: &str, participants: Vec<String>, core: TurnState) -> Arc<ConvView> {
        Arc::new(ConvView {
            id: id.to_string(),
            members: Members::new(&participants),
            participants,
            head: watch::channel(core.head).0,
            live: live::LiveSet::after(core.head),
            core: RwLock::new(core),
            recent: Mutex::new(Recent::default()),
            turn_started_ms: std::sync::atomic::AtomicI64::new(0),
            created_ms: std::sync::atomic::AtomicI64::new(0),
            last_event_ms: std::sync::atomic::AtomicI64::new(0),
            policy: std::sync::OnceLock::new(),
            parent: std::sync::OnceLock::new(),
            metadata: std::sync::OnceLock::new(),
            scenario: std::sync::OnceLock::new(),
            created_by: std::sync::OnceLock::new(),
            search_text: std::sync::OnceLock::new(),
            listed_ms: std::sync::atomic::AtomicI64::new(listing::NOT_LISTED),
            relist: std::sync::atomic::AtomicBool::new(false),
            gone: std::sync::atomic::AtomicBool::new(false),
            deleted: std::sync::atomic::AtomicBool::new(false),
            touched_ms: std::sync::atomic::AtomicI64::new(crate::engine::store::now_ms()),
            remote_head: std::sync::atomic::AtomicU64::new(0),
            read_ms: std::sync::atomic::AtomicI64::new(0),
        })
    }

    /// Makes a conversation visible to readers (and to lists).
    pub fn register(&self, shared: Arc<ConvView>) {
        self.listing.mark(&shared);
        self.convs.insert(shared.id.clone(), shared);
    }

    /// Every conversation in list order.
    pub fn listing(&self) -> &listing::Listing {
        &self.listing
    }

    /// Makes and registers a conversation (at start, from the log).
    pub fn insert(&self, id: &str, participants: Vec<String>, core: TurnState) -> Arc<ConvView> {
        let shared = Hub::make(id, participants, core);
        self.register(shared.clone());
        shared
    }

    /// Where conversations whose speaker changed are sent (the turn dispatcher); set once.
    pub fn set_turn_sink(&self, sink: TurnSink) {
        let _ = self.turn_sink.set(sink);
    }

    /// On a shared store: what the writer claims turns for (the turn dispatcher); set once.
    pub fn set_pre_claim(&self, hook: Box<dyn PreClaim>) {
        let _ = self.pre_claim.set(hook);
    }

    /// What the writer claims turns for, once the dispatcher joined a cluster.
    pub fn pre_claim(&self) -> Option<&dyn PreClaim> {
        self.pre_claim.get().map(|h| h.as_ref())
    }

    /// Tells the turn dispatcher that a policy named a speaker (publisher thread, after the
    /// commit and the publication).
    pub fn turn_changed(&self, conv: &Arc<ConvView>) {
        if let Some(sink) = self.turn_sink.get() {
            (sink.0)(conv);
        }
    }

    /// Every conversation.
    pub fn all(&self) -> Vec<Arc<ConvView>> {
        self.convs.iter().map(|c| c.clone()).collect()
    }

    /// Forgets a conversation (whose creation did not commit, or that leaves memory).
    pub fn remove(&self, id: &str) {
        if let Some((_, v)) = self.convs.remove(id) {
            self.listing.forget(&v);
        }
    }

    /// Takes a deleted conversation out, and tells whoever reads it (publisher only, once its
    /// deletion is durable): waits and subscriptions end with `ConversationNotFound`.
    pub fn remove_deleted(&self, view: &ConvView) {
        view.mark_deleted();
        if let Some((_, v)) = self
            .convs
            .remove_if(&view.id, |_, v| std::ptr::eq(&**v, view))
        {
            self.listing.forget(&v);
        }
    }

    /// A conversation's shared state.
    pub fn get(&self, id: &str) -> Option<Arc<ConvView>> {
        self.convs.get(id).map(|c| c.clone())
    }

    /// Every conversation of `tenant` its agent `agent` takes part in.
    pub fn conversations_of(&self, tenant: &str, agent: &str) -> Vec<Arc<ConvView>> {
        self.convs
            .iter()
            .filter(|c| proto_spec::tenant::tenant_of(&c.id) == tenant && c.is_participant(agent))
            .map(|c| c.clone())
            .collect()
    }

    /// How many conversations are known.
    pub fn len(&self) -> usize {
        self.convs.len()
    }

    /// Whether no conversation is known.
    pub fn is_empty(&self) -> bool {
        self.convs.is_empty()
    }

    /// Whether the all-conversations subscription has a subscriber here.
    pub fn followed_all(&self) -> bool {
        self.global.receiver_count() > 0
    }

    /// A receiver of every committed event (one item per conversation per commit), for
    /// subscriptions across conversations.
    pub fn global(&self) -> broadcast::Receiver<EventBatch> {
        self.global.subscribe()
    }

    /// Publishes committed events of one conversation (writer thread only, after the commit).
    pub fn publish(&self, conv: &ConvView, core: TurnState, mut events: NewEvents<'_>) {
        let global = self.global.receiver_count() > 0;
        let waited_on = conv.head.receiver_count() > 0 || global;
        if let Ok(mut recent) = conv.recent.lock() {
            let now = std::time::Instant::now();
            if waited_on {
                recent.read_at = Some(now);
            }
            if recent
                .read_at
                .is_some_and(|t| now.duration_since(t) <= READ_RECENTLY)
            {
                let new = events.get(&conv.id);
                // The ring stays gapless: after a head moved with no events (the writer read
                // another node's events only as a head), it starts over.
                let last = recent.events.back().map(|(_, e)| e.seq);
                if last.is_some_and(|l| new.first().is_none_or(|e| e.seq != l + 1)) {
                    recent.events.clear();
                }
                for e in new {
                    recent.events.push_back((now, e.clone()));
                }
                trim(&mut recent.events, now);
            } else {
                // Nobody reads it: keeping (and later dropping) every event would be work for
                // nothing. The ring must stay gapless, so it starts over when a reader comes.
                recent.events.clear();
            }
        }
        let head = core.head;
        if let Ok(mut c) = conv.core.write() {
            *c = core;
        }
        conv.head.send_replace(head);
        conv.live.deliver(&conv.id, head, &mut events);
        if global {
            let _ = self.global.send(Arc::new(events.get(&conv.id).to_vec()));
        }
    }

    /// Drops events older than [`RECENT_WINDOW`] from every conversation's ring (keeping
    /// [`RECENT_EVENTS`]), so a burst followed by silence does not stay in memory.
    pub fn trim_recent(&self) {
        let now = std::time::Instant::now();
        for conv in self.all() {
            if let Ok(mut recent) = conv.recent.lock() {
                trim(&mut recent.events, now);
            }
        }
    }

    /// Tells every waiter and subscription that the server is stopping.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// A receiver that turns true when the server is stopping.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }
}

fn trim(ring: &mut VecDeque<(std::time::Instant, Arc<Event>)>, now: std::time::Instant) {
    while ring.len() > RECENT_EVENTS
        && (ring.len() > RECENT_MAX
            || ring
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) > RECENT_WINDOW))
    {
        ring.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::state::{ConvMachine, Draft};

    fn publish_to(hub: &Hub, conv: &ConvView, seqs: std::ops::RangeInclusive<u64>) {
        let mut core = conv.core();
        let drafts = seqs
            .map(|seq| {
                core.head = seq;
                draft(seq)
            })
            .collect();
        // As the publisher does: events are made only if something takes them.
        hub.publish(conv, core, NewEvents::drafts(drafts, "t"));
    }

    fn draft(seq: u64) -> Draft {
        Draft {
            seq,
            kind: proto_spec::EventKind::Trace,
            author: "alice".into(),
            turn: 1,
            finality: None,
            payload: serde_json::value::RawValue::from_string(format!("{{\"n\":{seq}}}")).unwrap(),
            client_request_id: None,
            hash: None,
            doc: false,
        }
    }

    #[test]
    fn new_events_are_made_once_from_their_drafts() {
        let mut new = NewEvents::drafts(vec![draft(7), draft(8)], "2026-01-01T00:00:00.000Z");
        let made: Vec<Arc<Event>> = new.get("c").to_vec();
        assert_eq!(made.iter().map(|e| e.seq).collect::<Vec<_>>(), [7, 8]);
        assert!(made.iter().all(|e| e.conversation_id == "c"
            && e.ts == "2026-01-01T00:00:00.000Z"
            && e.author == "alice"));
        assert_eq!(made[1].payload.get(), r#"{"n":8}"#);
        // The same events (not made again) on every later use.
        let again = new.get("c");
        assert!(made.iter().zip(again).all(|(a, b)| Arc::ptr_eq(a, b)));
    }

    fn one_conversation() -> (Hub, Arc<ConvView>) {
        let hub = Hub::default();
        let core = ConvMachine::new("c", vec!["alice".into()]).core;
        let conv = hub.insert("c", vec!["alice".into()], core);
        (hub, conv)
    }

    fn seqs(events: Option<Vec<Arc<Event>>>) -> Option<Vec<u64>> {
        events.map(|evs| evs.iter().map(|e| e.seq).collect())
    }

    #[test]
    fn a_conversation_nobody_reads_keeps_no_events_in_memory() {
        let (hub, conv) = one_conversation();
        publish_to(&hub, &conv, 1..=3);
        assert_eq!(conv.head(), 3);
        assert!(conv.recent.lock().unwrap().events.is_empty());
        // The first reader is sent to the store; from then on the ring is kept, gapless.
        assert_eq!(seqs(conv.recent_after(0, 10)), None);
        assert_eq!(seqs(conv.recent_after(3, 10)), Some(vec![]));
        publish_to(&hub, &conv, 4..=5);
        assert_eq!(seqs(conv.recent_after(3, 10)), Some(vec![4, 5]));
        assert_eq!(
            seqs(conv.recent_after(0, 10)),
            None,
            "older ones are in the store"
        );
    }

    #[test]
    fn a_head_moved_without_its_events_starts_the_ring_over() {
        let (hub, conv) = one_conversation();
        let _waiter = conv.watch();
        publish_to(&hub, &conv, 1..=2);
        assert_eq!(seqs(conv.recent_after(0, 10)), Some(vec![1, 2]));
        // Another node's events 3 to 5, passed by their head: no events published.
        let mut core = conv.core();
        core.head = 5;
        hub.publish(&conv, core, NewEvents::drafts(Vec::new(), "t"));
        assert_eq!(conv.head(), 5);
        assert_eq!(
            seqs(conv.recent_after(2, 10)),
            None,
            "3 to 5 are read from the store"
        );
        publish_to(&hub, &conv, 6..=6);
        assert_eq!(seqs(conv.recent_after(5, 10)), Some(vec![6]));
        assert_eq!(seqs(conv.recent_after(0, 10)), None);
    }

    #[test]
    fn a_waiter_keeps_the_ring() {
        let (hub, conv) = one_conversation();
        let waiter = conv.watch();
        publish_to(&hub, &conv, 1..=2);
        drop(waiter);
        // The waiter is gone, but it read a moment ago: the ring goes on.
        publish_to(&hub, &conv, 3..=3);
        assert_eq!(seqs(conv.recent_after(0, 10)), Some(vec![1, 2, 3]));
    }
}
