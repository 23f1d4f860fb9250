//! One conversation's view: what every reader shares, as of the last publication (the turn
//! state, the head and its `watch`, the ring of recent events while someone reads it, the
//! policy and parent it was created with, and on a shared store how far other nodes' commits
//! are ahead of it).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, RwLock};

use proto_spec::{ConversationStatus, Event, Snapshot};
use tokio::sync::watch;

use super::*;
use crate::engine::state::{guidance_for, Members, TurnState};

/// A conversation's recent events, and when it was last read.
#[derive(Debug, Default)]
pub(super) struct Recent {
    pub(super) events: VecDeque<(std::time::Instant, Arc<Event>)>,
    /// When someone last read or waited on the conversation (as the publisher or a reader of
    /// the ring saw it).
    pub(super) read_at: Option<std::time::Instant>,
}

/// One conversation's shared, read-mostly state.
#[derive(Debug)]
pub struct ConvView {
    /// The conversation id.
    pub id: String,
    /// The agents that take part.
    pub participants: Vec<String>,
    /// The participants as the state machine checks them ([`crate::engine::state`]'s one rule).
    pub(super) members: Members,
    pub(super) core: RwLock<TurnState>,
    pub(super) head: watch::Sender<u64>,
    pub(super) recent: Mutex<Recent>,
    /// When the current speaker's turn was given (ms since the epoch; its `next_speaker` event).
    pub(super) turn_started_ms: std::sync::atomic::AtomicI64,
    /// When the conversation was created, and when its last event by a participant (not the
    /// orchestrator) was committed (ms).
    pub(super) created_ms: std::sync::atomic::AtomicI64,
    pub(super) last_event_ms: std::sync::atomic::AtomicI64,
    /// The conversation's policy (set once, at creation or recovery; it never changes).
    pub(super) policy: std::sync::OnceLock<crate::engine::state::TurnPolicy>,
    /// For a sub-conversation: the conversation that opened it (set once).
    pub(super) parent: std::sync::OnceLock<String>,
    /// The metadata it was created with, and the scenario it was made from (set once).
    pub(super) metadata: std::sync::OnceLock<Arc<serde_json::Value>>,
    pub(super) scenario: std::sync::OnceLock<Arc<str>>,
    /// The agent that created it (its key in the conversation's tenant; set once).
    pub(super) created_by: std::sync::OnceLock<String>,
    /// Its id and metadata in lower case, for a list's text query (made on first use).
    pub(super) search_text: std::sync::OnceLock<String>,
    /// Where the list's order holds it: the activity time it is filed under
    /// ([`listing::NOT_LISTED`]: nowhere), whether it waits to be filed again, and whether it
    /// left the hub.
    pub(super) listed_ms: std::sync::atomic::AtomicI64,
    pub(super) relist: std::sync::atomic::AtomicBool,
    pub(super) gone: std::sync::atomic::AtomicBool,
    /// Whether it was deleted: its readers end with `ConversationNotFound`.
    pub(super) deleted: std::sync::atomic::AtomicBool,
    /// When a client last named it (ms since the epoch; from its loading on): on a shared
    /// store a closed conversation untouched for a while leaves memory.
    pub(super) touched_ms: std::sync::atomic::AtomicI64,
    /// Live subscribers the publisher writes to itself (see [`live`]).
    pub live: live::LiveSet,
    /// On a shared log: the highest head another node's notice named for it (the writer's
    /// view may stay behind it while nothing here needs the events: [`ConvView::follows_remote_commits`]).
    pub(super) remote_head: std::sync::atomic::AtomicU64,
    /// When a client last read it here (ms since the epoch; 0: never).
    pub(super) read_ms: std::sync::atomic::AtomicI64,
}

/// How long after a client read a conversation its node keeps taking in what other nodes
/// commit to it as they do.
pub const FOLLOW_AFTER_READ: std::time::Duration = std::time::Duration::from_secs(60);

impl ConvView {
    /// Whether `agent` takes part.
    pub fn is_participant(&self, agent: &str) -> bool {
        self.members.contains(agent, &self.participants)
    }

    /// Head, turn, speaker, status as of the last commit.
    pub fn core(&self) -> TurnState {
        self.core
            .read()
            .map(|c| c.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Notes that a client named it now.
    pub fn touch(&self) {
        self.touched_ms.store(
            crate::engine::store::now_ms(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// When a client last named it (ms since the epoch).
    pub fn touched_ms(&self) -> i64 {
        self.touched_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records when the current speaker was named (publisher and recovery only).
    pub fn set_turn_started(&self, ts_ms: i64) {
        self.turn_started_ms
            .store(ts_ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Records the creation time (when not 0) and the time of the last commit (publisher and
    /// recovery only).
    pub fn set_clock(&self, created_ms: i64, last_event_ms: i64) {
        use std::sync::atomic::Ordering::Relaxed;
        if created_ms != 0 {
            self.created_ms.store(created_ms, Relaxed);
        }
        self.last_event_ms.store(last_event_ms, Relaxed);
    }

    /// Records the conversation's policy (once, at creation or recovery).
    pub fn set_policy(&self, policy: crate::engine::state::TurnPolicy) {
        let _ = self.policy.set(policy);
    }

    /// Records the conversation that opened this one (once, at creation or recovery).
    pub fn set_parent(&self, parent: String) {
        let _ = self.parent.set(parent);
    }

    /// For a sub-conversation: the conversation that opened it.
    pub fn parent(&self) -> Option<&str> {
        self.parent.get().map(String::as_str)
    }

    /// Records the metadata it was created with (once, at creation or recovery).
    pub fn set_metadata(&self, metadata: Arc<serde_json::Value>) {
        let _ = self.metadata.set(metadata);
    }

    /// The metadata it was created with.
    pub fn metadata(&self) -> Option<&serde_json::Value> {
        self.metadata.get().map(|m| &**m)
    }

    /// Records the scenario it was made from (once, at creation or recovery).
    pub fn set_scenario(&self, scenario: Arc<str>) {
        let _ = self.scenario.set(scenario);
    }

    /// The scenario it was made from (its library name, or an inline scenario's `name`).
    pub fn scenario(&self) -> Option<&str> {
        self.scenario.get().map(|s| &**s)
    }

    /// Records the agent that created it (once, when its slot is made).
    pub fn set_created_by(&self, creator: &str) {
        let _ = self.created_by.set(creator.to_string());
    }

    /// The agent that created it (a key in its tenant).
    pub fn created_by(&self) -> Option<&str> {
        self.created_by.get().map(String::as_str)
    }

    /// Whether it was deleted (its view may still be held by a reader).
    pub fn deleted(&self) -> bool {
        self.deleted.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks it deleted and wakes every reader: waits on its head, and live subscribers (let
    /// go, they read the log again and find it deleted).
    pub(super) fn mark_deleted(&self) {
        self.deleted
            .store(true, std::sync::atomic::Ordering::Release);
        self.head.send_modify(|_| {});
        self.live.let_all_go();
    }

    /// The conversation's policy, if it has one.
    pub fn policy(&self) -> Option<&crate::engine::state::TurnPolicy> {
        self.policy.get()
    }

    /// Whether internal executors trace each turn (the scenario's `turn.traces`; default on).
    pub fn traces(&self) -> bool {
        self.policy().is_none_or(|p| p.traces)
    }

    /// The scenario's description of an internal participant (`{"kind": …}`).
    pub fn agent_spec(&self, agent: &str) -> Option<&serde_json::Value> {
        self.policy()?.agents.get(agent)
    }

    /// When the conversation closes for idleness, and for its maximum duration (ms since the
    /// epoch), from logged times.
    pub fn stop_deadlines(&self) -> (Option<i64>, Option<i64>) {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(p) = self.policy() else {
            return (None, None);
        };
        (
            p.idle_timeout_ms
                .map(|idle| self.last_event_ms.load(Relaxed) + idle as i64),
            p.max_duration_ms
                .map(|max| self.created_ms.load(Relaxed) + max as i64),
        )
    }

    /// When the current turn must be answered (ms since the epoch), from the logged time of its
    /// `next_speaker` event and the policy's timeout; `None` without a timeout.
    pub fn turn_deadline_ms(&self, core: &TurnState) -> Option<i64> {
        let timeout = core.turn_timeout_ms?;
        core.speaker.as_ref()?;
        let started = self
            .turn_started_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        Some(started + timeout as i64)
    }

    /// The latest committed seq.
    pub fn head(&self) -> u64 {
        *self.head.borrow()
    }

    /// On a shared log, another node's notice named `head` for it.
    pub fn note_remote_head(&self, head: u64) {
        self.remote_head
            .fetch_max(head, std::sync::atomic::Ordering::Relaxed);
    }

    /// The highest head other nodes' notices named for it.
    pub fn remote_head(&self) -> u64 {
        self.remote_head.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether another node committed past this node's view of it (as far as notices said).
    pub fn behind(&self) -> bool {
        self.remote_head() > self.head()
    }

    /// A client reads it here: other nodes' commits to it are taken in as they come, for a
    /// while ([`FOLLOW_AFTER_READ`]).
    pub fn mark_read(&self) {
        self.read_ms.store(
            crate::engine::store::now_ms(),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Whether this node takes in other nodes' commits to it as they come, rather than when it
    /// writes it or a client reads it: when someone here follows it (a subscriber, a waiter,
    /// the all-conversations subscription — `global`), read it lately, or its turns, timers or
    /// tree may be run here (a policy, a parent).
    pub fn follows_remote_commits(&self, global: bool) -> bool {
        let read_ms = self.read_ms.load(std::sync::atomic::Ordering::Relaxed);
        global
            || self.policy().is_some()
            || self.parent().is_some()
            || self.head.receiver_count() > 0
            || !self.live.is_empty()
            || (read_ms > 0
                && crate::engine::store::now_ms() - read_ms < FOLLOW_AFTER_READ.as_millis() as i64)
    }

    /// Waits until the view reaches what another node's notice named (at most `limit`).
    pub async fn reach_remote_head(&self, limit: std::time::Duration) {
        let remote = self.remote_head.load(std::sync::atomic::Ordering::Relaxed);
        if self.head() >= remote {
            return;
        }
        let mut head = self.watch();
        let _ = tokio::time::timeout(limit, head.wait_for(|h| *h >= remote)).await;
    }

    /// How many waiters (long-polls, `waitForChange`, feeds) watch the head.
    pub fn waiters(&self) -> usize {
        self.head.receiver_count()
    }

    /// A receiver woken whenever the head moves. Take it before reading the head, so that no
    /// wake-up is lost.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.head.subscribe()
    }

    /// Events with seq > `after` from the ring, if the ring covers them.
    pub fn recent_after(&self, after: u64, limit: usize) -> Option<Vec<Arc<Event>>> {
        let mut recent = self.recent.lock().ok()?;
        // A reader: the publisher keeps the ring from now on.
        recent.read_at = Some(std::time::Instant::now());
        let ring = &recent.events;
        let first = ring.front().map(|(_, e)| e.seq);
        match first {
            Some(f) if f <= after + 1 => {
                let skip = (after + 1 - f) as usize;
                Some(
                    ring.iter()
                        .skip(skip)
                        .take(limit)
                        .map(|(_, e)| e.clone())
                        .collect(),
                )
            }
            None if after >= self.head() => Some(Vec::new()),
            _ => None,
        }
    }

    /// Active, paused or closed, as of the last commit.
    pub fn status(&self) -> ConversationStatus {
        let core = self.core.read().unwrap_or_else(|p| p.into_inner());
        status_of(&core)
    }

    /// Its id within its tenant and its metadata, in lower case (what a list's text query
    /// looks in).
    pub fn search_text(&self) -> &str {
        self.search_text
            .get_or_init(|| search_text(&self.id, self.metadata()))
    }

    /// When it was created (ms since the epoch).
    pub fn created_ms(&self) -> i64 {
        self.created_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The snapshot as `agent` sees it.
    pub fn snapshot(&self, agent: &str) -> Snapshot {
        let core = self.core();
        let status = status_of(&core);
        let mut guidance = guidance_for(&self.participants, &core, agent);
        guidance.deadline = self
            .turn_deadline_ms(&core)
            .map(crate::engine::store::format_ts);
        Snapshot {
            conversation_id: self.id.clone(),
            status,
            latest_seq: core.head,
            turn: core.turn,
            speaker: core.speaker.clone(),
            participants: self.participants.clone(),
            guidance,
            parent_conversation_id: self.parent().map(str::to_string),
            last_event_at: match self
                .last_event_ms
                .load(std::sync::atomic::Ordering::Relaxed)
            {
                0 => None,
                ms => Some(crate::engine::store::format_ts(ms)),
            },
        }
    }
}

fn status_of(core: &TurnState) -> ConversationStatus {
    if core.closed {
        ConversationStatus::Closed
    } else if core.paused {
        ConversationStatus::Paused
    } else {
        ConversationStatus::Active
    }
}

/// What a list's text query looks in: the id within its tenant of conversation `key` and its
/// metadata, in lower case.
pub fn search_text(key: &str, metadata: Option<&serde_json::Value>) -> String {
    let mut text = proto_spec::tenant::local_id(key).to_lowercase();
    if let Some(m) = metadata {
        text.push('\n');
        text.push_str(&m.to_string().to_lowercase());
    }
    text
}
