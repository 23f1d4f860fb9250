//! Reading the log by cursor, and feeds: the backlog after a cursor, then live events, with no
//! gap and no duplicate, for one conversation or for all of an agent's conversations.
//!
//! A feed never holds the writer back. It reads what it needs from the conversation's ring of
//! recent events, or from the store when it is further behind; it learns of new events from
//! the conversation's head (`watch`) or the global broadcast, and when that broadcast reports
//! that the feed lagged, it re-reads every conversation whose head passed its cursor.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use proto_spec::{tenant, Event};
use tokio::sync::{broadcast, watch};

use crate::engine::error::Result;
use crate::engine::hub::{ConvView, EventBatch, Hub};
use crate::engine::store::Store;

/// How many events one read of the store takes.
pub const PAGE: usize = 512;

/// Events of `conv` with seq > `after`, at most `limit`: from memory when it has them,
/// otherwise from the store.
pub async fn read_after(
    store: &Arc<dyn Store>,
    conv: &ConvView,
    after: u64,
    limit: usize,
) -> Result<Vec<Arc<Event>>> {
    if conv.deleted() {
        return Err(crate::engine::error::deleted(&conv.id));
    }
    if let Some(evs) = conv.recent_after(after, limit) {
        return Ok(evs);
    }
    let store = store.clone();
    let id = conv.id.clone();
    let events =
        tokio::task::spawn_blocking(move || store.read_events(&id, after, limit)).await??;
    Ok(events.into_iter().map(Arc::new).collect())
}

/// A stream of committed events in seq order per conversation.
#[derive(Debug)]
pub struct Feed {
    store: Arc<dyn Store>,
    hub: Arc<Hub>,
    backlog: VecDeque<Arc<Event>>,
    closing: watch::Receiver<bool>,
    mode: Mode,
    resumed: u64,
}

#[derive(Debug)]
enum Mode {
    One {
        conv: Arc<ConvView>,
        cursor: u64,
        head: watch::Receiver<u64>,
    },
    All {
        /// The tenant and the agent whose conversations these are.
        tenant: String,
        agent: String,
        /// Cursor per conversation the agent takes part in; `None` for one it does not.
        cursors: HashMap<String, Option<u64>>,
        /// Conversations to re-read after a lag.
        stale: VecDeque<Arc<ConvView>>,
        rx: broadcast::Receiver<EventBatch>,
    },
}

impl Feed {
    /// Events of one conversation with seq > `since`, then live ones.
    pub fn one(store: Arc<dyn Store>, hub: Arc<Hub>, conv: Arc<ConvView>, since: u64) -> Feed {
        let head = conv.watch();
        Feed::new(
            store,
            hub,
            Mode::One {
                conv,
                cursor: since,
                head,
            },
        )
    }

    fn new(store: Arc<dyn Store>, hub: Arc<Hub>, mode: Mode) -> Feed {
        let closing = hub.closing();
        Feed {
            store,
            hub,
            backlog: VecDeque::new(),
            closing,
            mode,
            resumed: 0,
        }
    }

    /// Events of every conversation of a tenant that an agent of it takes part in (`member`:
    /// the tenant and the agent), new ones included. With `since`,
    /// each existing conversation replays its events after that seq; without, only what is
    /// committed from now on. A conversation created later is followed from its first event.
    /// A conversation named in `from` replays after its own seq instead.
    pub fn all(
        store: Arc<dyn Store>,
        hub: Arc<Hub>,
        (tenant, agent): (&str, &str),
        since: Option<u64>,
        from: std::collections::BTreeMap<String, u64>,
    ) -> Feed {
        let rx = hub.global();
        let mut cursors = HashMap::new();
        let mut stale = VecDeque::new();
        for conv in hub.conversations_of(tenant, agent) {
            let cursor = from
                .get(&conv.id)
                .copied()
                .or(since)
                .unwrap_or_else(|| conv.head());
            cursors.insert(conv.id.clone(), Some(cursor));
            if cursor < conv.head() {
                stale.push_back(conv);
            }
        }
        let mode = Mode::All {
            tenant: tenant.to_string(),
            agent: agent.to_string(),
            cursors,
            stale,
            rx,
        };
        Feed::new(store, hub, mode)
    }

    /// A feed of one conversation as the conversation and its cursor; any other feed as it is.
    pub fn into_one(self) -> std::result::Result<(Arc<ConvView>, u64), Box<Feed>> {
        match self.mode {
            Mode::One { conv, cursor, .. } if self.backlog.is_empty() => Ok((conv, cursor)),
            mode => Err(Box::new(Feed { mode, ..self })),
        }
    }

    /// How many times this feed fell behind the broadcast and was resumed from the log.
    pub fn resumed_from_log(&self) -> u64 {
        self.resumed
    }

    /// The next event; `None` once the server is stopping.
    pub async fn next(&mut self) -> Result<Option<Arc<Event>>> {
        loop {
            if let Some(e) = self.backlog.pop_front() {
                return Ok(Some(e));
            }
            if *self.closing.borrow() {
                return Ok(None);
            }
            match &mut self.mode {
                Mode::One { conv, cursor, head } => {
                    let h = *head.borrow_and_update();
                    if conv.deleted() {
                        return Err(crate::engine::error::deleted(&conv.id));
                    }
                    if *cursor < h {
                        let evs = read_after(&self.store, conv, *cursor, PAGE).await?;
                        if let Some(last) = evs.last() {
                            *cursor = last.seq;
                        }
                        self.backlog.extend(evs);
                        continue;
                    }
                    tokio::select! {
                        r = head.changed() => if r.is_err() { return Ok(None) },
                        _ = self.closing.changed() => return Ok(None),
                    }
                }
                Mode::All {
                    tenant,
                    agent,
                    cursors,
                    stale,
                    rx,
                } => {
                    if let Some(conv) = stale.pop_front() {
                        if conv.deleted() {
                            // Gone for good: no more to read of it.
                            cursors.remove(&conv.id);
                            continue;
                        }
                        let cursor = cursors.get(&conv.id).copied().flatten().unwrap_or(0);
                        if cursor < conv.head() {
                            let evs = read_after(&self.store, &conv, cursor, PAGE).await?;
                            if let Some(last) = evs.last() {
                                cursors.insert(conv.id.clone(), Some(last.seq));
                                if last.seq < conv.head() {
                                    stale.push_back(conv.clone());
                                }
                            }
                            self.backlog.extend(evs);
                        }
                        continue;
                    }
                    let received = tokio::select! {
                        r = rx.recv() => r,
                        _ = self.closing.changed() => return Ok(None),
                    };
                    match received {
                        Ok(batch) => {
                            take_batch(
                                &self.hub,
                                (tenant, agent),
                                cursors,
                                stale,
                                &mut self.backlog,
                                &batch,
                            );
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            self.resumed += 1;
                            crate::engine::telemetry::resumed();
                            for conv in self.hub.conversations_of(tenant, agent) {
                                let cursor = *cursors.entry(conv.id.clone()).or_insert(Some(0));
                                if cursor.unwrap_or(0) < conv.head() {
                                    stale.push_back(conv);
                                }
                            }
                        }
                        Err(broadcast::error::RecvError::Closed) => return Ok(None),
                    }
                }
            }
        }
    }
}

/// Of one committed batch of a conversation, what an all-conversations feed of `member` (the
/// tenant and the agent) has not delivered: into `backlog`, in order; after a gap the rest is
/// read from the log (`stale`).
fn take_batch(
    hub: &Hub,
    (tenant, agent): (&str, &str),
    cursors: &mut HashMap<String, Option<u64>>,
    stale: &mut VecDeque<Arc<ConvView>>,
    backlog: &mut VecDeque<Arc<Event>>,
    batch: &EventBatch,
) {
    let Some(first) = batch.first() else { return };
    let id = &first.conversation_id;
    let entry = match cursors.get_mut(id) {
        Some(e) => e,
        None => {
            let mine = hub
                .get(id)
                .filter(|c| tenant::tenant_of(&c.id) == tenant && c.is_participant(agent))
                .map(|_| 0);
            cursors.entry(id.clone()).or_insert(mine)
        }
    };
    let Some(cursor) = entry else { return };
    for ev in batch.iter() {
        if ev.seq <= *cursor {
            continue;
        }
        if ev.seq != *cursor + 1 {
            // A gap: read the rest of this conversation from the log.
            if let Some(conv) = hub.get(id) {
                stale.push_back(conv);
            }
            break;
        }
        *cursor = ev.seq;
        backlog.push_back(ev.clone());
    }
}

/// The answer of a long-poll: a [`WaitResult`] whose events are shared with the log's other
/// readers. It serializes to the same JSON, each event's text made once however many waiters
/// it wakes (see [`proto_spec::Event::to_json`]).
#[derive(Debug)]
pub struct WaitEvents {
    /// The seq of the last event.
    pub latest_seq: u64,
    /// True when the wait ended with nothing after `sinceSeq`.
    pub timed_out: bool,
    /// Events with seq > `sinceSeq`, in order.
    pub events: Vec<Arc<proto_spec::Event>>,
}

impl serde::Serialize for WaitEvents {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let events: Vec<&serde_json::value::RawValue> =
            self.events.iter().map(|e| e.to_json()).collect();
        let mut st = s.serialize_struct("WaitResult", 3)?;
        st.serialize_field("latestSeq", &self.latest_seq)?;
        st.serialize_field("timedOut", &self.timed_out)?;
        st.serialize_field("events", &events)?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto_spec::WaitResult;

    #[test]
    fn a_long_polls_answer_serializes_as_its_wire_type() {
        let event = |seq: u64| proto_spec::Event {
            conversation_id: "c".into(),
            seq,
            kind: proto_spec::EventKind::Message,
            author: "alice".into(),
            turn: 1,
            finality: Some(proto_spec::Finality::None),
            payload: serde_json::value::to_raw_value(
                &serde_json::json!({"text": "hi \"there\"\n"}),
            )
            .expect("payload"),
            client_request_id: Some("k1".into()),
            ts: "2026-11-22T00:00:00.000Z".into(),
            json: Default::default(),
        };
        let answer = WaitEvents {
            latest_seq: 2,
            timed_out: false,
            events: vec![Arc::new(event(1)), Arc::new(event(2))],
        };
        let wire = WaitResult {
            latest_seq: 2,
            timed_out: false,
            events: vec![event(1), event(2)],
        };
        let text = serde_json::to_string(&answer).expect("serializes");
        assert_eq!(text, serde_json::to_string(&wire).expect("serializes"));
        let back: WaitResult = serde_json::from_str(&text).expect("a WaitResult");
        assert_eq!(back, wire);
    }
}
