//! `subscribe` and `registerExecutor` over WebSocket, written straight into each connection's
//! send buffer.
//!
//! [`subscribe`] answers the call itself, writing the answer frame and then every `event`
//! notification into the connection's buffer ([`ConnWriter`]), in order with the connection's
//! other frames. The answer is written before any notification, so a client always learns the
//! subscription id first.
//!
//! A subscription to one conversation reads its backlog after the cursor (from the ring of
//! recent events, or from the store), then joins the conversation's [`LiveSet`](crate::engine::hub::live::LiveSet) as a
//! [`LiveSubscriber`], and from
//! then on the log's publisher writes each committed event to it as part of publishing: one
//! copy into the connection's buffer, no task woken per event. Joining happens under the set's
//! lock and only when the subscriber's cursor has reached what the set was last given, so no
//! event is skipped or sent twice. A subscriber whose connection buffer is full (its client
//! reads too slowly) is let go by the publisher, which never waits, and goes back to reading
//! the log by cursor until it has caught up again. A subscription across all of an agent's
//! conversations runs its [`Feed`] in a task and writes each event the same way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use proto_spec::method::names;
use proto_spec::{ErrorCode, Event, RegisterExecutorParams, RpcError, SubscribeParams};

use crate::engine::fanout::{read_after, Feed, PAGE};
use crate::engine::hub::live::{Encoding, LiveEvent, LiveSubscriber};
use crate::engine::hub::{ConvView, Hub};
use crate::engine::service::Orchestrator;
use crate::engine::store::Store;
use crate::transport::jsonrpc::Call;
use crate::transport::net::{text_frame, text_frame_parts, ConnWriter, Offered};
use crate::transport::session::{parse, Session, Subscription};

/// A live subscriber to one conversation, written to by the publisher.
#[derive(Debug)]
pub struct Pusher {
    writer: ConnWriter,
    /// `{"jsonrpc":"2.0","method":"event","params":{"subscription":ID`: what precedes each
    /// event's [`tail`].
    prefix: Box<[u8]>,
    /// The seq the subscriber had reached when the publisher let it go.
    behind: AtomicU64,
    /// Told when the publisher lets the subscriber go.
    let_go: tokio::sync::Notify,
}

impl LiveSubscriber for Pusher {
    fn offer(&self, event: &LiveEvent<'_>) -> bool {
        let tail = event.encoded(Encoding::WebSocket, tail);
        matches!(self.writer.try_frame(&self.prefix, tail), Offered::Queued)
    }

    fn let_go(&self, reached: u64) {
        self.behind.store(reached, Ordering::Release);
        self.let_go.notify_one();
    }
}

/// `,"result":{"conversationId":…,"event":…}}}`: the part of an event's notification that
/// every subscriber shares.
fn tail(conversation_id: &str, e: &Event) -> Vec<u8> {
    let json = e.to_json().get();
    let mut t = Vec::with_capacity(json.len() + conversation_id.len() + 48);
    t.extend_from_slice(br#","result":{"conversationId":"#);
    // A string always serializes. The id within its tenant, as the event's own.
    let _ = serde_json::to_writer(&mut t, proto_spec::tenant::local_id(conversation_id));
    t.extend_from_slice(br#","event":"#);
    t.extend_from_slice(json.as_bytes());
    t.extend_from_slice(b"}}}");
    t
}

/// The last notification of a subscription that ends with `e` (its conversation was deleted,
/// say): `params` carry the subscription and the error, as JSON-RPC subscriptions end.
fn ended(prefix: &[u8], e: &crate::engine::error::Error) -> Vec<u8> {
    let error = serde_json::to_vec(&e.to_rpc().to_wire()).unwrap_or_default();
    let mut frame = Vec::new();
    text_frame_parts(&mut frame, &[prefix, br#","error":"#, &error, b"}}"]);
    frame
}

fn prefix(method: &str, id: u64) -> Box<[u8]> {
    format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":{{"subscription":{id}"#)
        .into_bytes()
        .into_boxed_slice()
}

/// `subscribe`: answers with the subscription id (written into the connection before any
/// event), then follows the conversation, or every conversation of the agent.
pub async fn subscribe(
    orch: &Arc<Orchestrator>,
    session: &Arc<Session>,
    call: &Call,
) -> Result<(), RpcError> {
    let _guard = session.enter(orch.limits().max_in_flight_per_connection)?;
    let who = session.identity()?;
    let p: SubscribeParams = parse(call.params())?;
    let writer = websocket(session, names::SUBSCRIBE)?;
    let limit = orch.limits().max_subscriptions_per_connection as usize;
    if session.subscriptions().len() >= limit {
        return Err(RpcError::new(
            ErrorCode::TooManySubscriptions,
            format!("too many subscriptions on this connection (limit {limit})"),
        )
        .with_data(serde_json::json!({"limit": limit})));
    }
    let slot = orch.open_stream(&who, "ws")?;
    let feed = orch.subscribe(&who, p).await.map_err(|e| e.to_rpc())?;
    let sub_id = new_id();
    if !answer(&writer, call, sub_id).await {
        return Ok(());
    }
    let prefix = prefix(names::EVENT, sub_id);
    let hub = orch.hub().clone();
    let store = orch.store().clone();
    // Spawned under the registry's lock: a task that ends at once removes its entry only
    // after the entry is in.
    let ending = Ending {
        session: session.clone(),
        id: sub_id,
        live: None,
        executor: false,
        _slot: Some(slot),
    };
    let mut subs = session.subscriptions().lock();
    let open = match feed.into_one() {
        Ok((conv, cursor)) => {
            let p = Arc::new(Pusher {
                writer,
                prefix,
                behind: AtomicU64::new(0),
                let_go: tokio::sync::Notify::new(),
            });
            let task = tokio::spawn(follow_one(
                store,
                hub,
                conv.clone(),
                cursor,
                p.clone(),
                ending,
            ));
            Subscription {
                task: task.abort_handle(),
                live: Some((conv, p as Arc<dyn LiveSubscriber>)),
            }
        }
        Err(feed) => {
            let task = tokio::spawn(follow_feed(*feed, writer, prefix, ending));
            Subscription {
                task: task.abort_handle(),
                live: None,
            }
        }
    };
    subs.insert(sub_id, open);
    Ok(())
}

/// The connection's frame writer: only a WebSocket has one.
fn websocket(session: &Session, method: &str) -> Result<ConnWriter, RpcError> {
    session.frames().cloned().ok_or_else(|| {
        RpcError::new(
            ErrorCode::InvalidRequest,
            format!("{method} needs a WebSocket connection (an HTTP request carries no session)"),
        )
    })
}

/// A new subscription id: random, below 2^53 so that JavaScript clients read it exactly.
fn new_id() -> u64 {
    rand::random::<u64>() & ((1 << 53) - 1)
}

/// Writes the answer `{"jsonrpc":"2.0","id":…,"result":sub_id}`; false when the connection is
/// gone (there is no one to answer).
async fn answer(writer: &ConnWriter, call: &Call, sub_id: u64) -> bool {
    let answer = crate::transport::jsonrpc::result(call.id(), &sub_id.to_string());
    let mut frame = Vec::with_capacity(answer.len() + 10);
    text_frame(&mut frame, &answer, &[]);
    writer.write_frames(&frame).await.is_ok()
}

/// `registerExecutor`: a push replica's subscription to `request_turn` offers, until it
/// unregisters, disconnects or the server stops.
pub async fn register_executor(
    orch: &Arc<Orchestrator>,
    session: &Arc<Session>,
    call: &Call,
) -> Result<(), RpcError> {
    let who = session.identity()?;
    let _p: RegisterExecutorParams = parse(call.params())?;
    let writer = websocket(session, names::REGISTER_EXECUTOR)?;
    let sub_id = new_id();
    if !answer(&writer, call, sub_id).await {
        return Ok(());
    }
    let turns = orch.turns().clone();
    let principal = who.principal().into_owned();
    let (id, offers) = turns.register(&principal);
    let registered = Registered {
        turns,
        agent: principal,
        id,
    };
    let closing = orch.hub().closing();
    let mut executors = session.executors().lock();
    let task = tokio::spawn(offer_turns(
        registered,
        offers,
        closing,
        writer,
        prefix(names::REQUEST_TURN, sub_id),
        Ending {
            session: session.clone(),
            id: sub_id,
            live: None,
            executor: true,
            _slot: None,
        },
    ));
    executors.insert(
        sub_id,
        Subscription {
            task: task.abort_handle(),
            live: None,
        },
    );
    Ok(())
}

/// A replica's registration, ended however its task ends.
struct Registered {
    turns: Arc<crate::engine::turns::Turns>,
    /// The principal's key (its agent id within its tenant).
    agent: String,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.turns.unregister(&self.agent, self.id);
    }
}

/// Writes each `request_turn` offer to the replica.
async fn offer_turns(
    _registered: Registered,
    mut offers: tokio::sync::mpsc::UnboundedReceiver<proto_spec::RequestTurnNotification>,
    mut closing: tokio::sync::watch::Receiver<bool>,
    writer: ConnWriter,
    prefix: Box<[u8]>,
    _ending: Ending,
) {
    let mut frame = Vec::new();
    loop {
        let offer = tokio::select! {
            _ = writer.closed() => return,
            _ = closing.wait_for(|c| *c) => return,
            o = offers.recv() => o,
        };
        let Some(offer) = offer else { return };
        let Ok(result) = serde_json::to_vec(&offer) else {
            return;
        };
        frame.clear();
        text_frame_parts(&mut frame, &[&prefix, br#","result":"#, &result, b"}}"]);
        if writer.write_frames(&frame).await.is_err() {
            return;
        }
    }
}

/// Removes a subscription from its connection's registry (and its pusher from the publisher's
/// set) when its task ends, however it ends.
struct Ending {
    session: Arc<Session>,
    id: u64,
    live: Option<(Arc<ConvView>, Arc<dyn LiveSubscriber>)>,
    /// An executor's registration, not a subscription.
    executor: bool,
    /// A subscription's place among the open streams.
    _slot: Option<crate::engine::streams::StreamSlot>,
}

impl Drop for Ending {
    fn drop(&mut self) {
        if let Some((conv, p)) = &self.live {
            conv.live.leave(p);
        }
        let registry = if self.executor {
            self.session.executors()
        } else {
            self.session.subscriptions()
        };
        registry.lock().remove(&self.id);
    }
}

/// One conversation: the backlog by cursor, then live from the publisher, back to the log
/// whenever the publisher lets go.
async fn follow_one(
    store: Arc<dyn Store>,
    hub: Arc<Hub>,
    conv: Arc<ConvView>,
    mut cursor: u64,
    p: Arc<Pusher>,
    mut ending: Ending,
) {
    let sub: Arc<dyn LiveSubscriber> = p.clone();
    ending.live = Some((conv.clone(), sub.clone()));
    let _ending = ending;
    let mut closing = hub.closing();
    let mut frames = Vec::new();
    loop {
        // Catch up from the ring or the store until the publisher's set can be joined.
        loop {
            if *closing.borrow() || p.writer.is_closed() {
                return;
            }
            let events = match read_after(&store, &conv, cursor, PAGE).await {
                Ok(events) => events,
                Err(e) => {
                    tracing::warn!(error = %e, conversation = %conv.id, "subscription ended");
                    let _ = p.writer.write_frames(&ended(&p.prefix, &e)).await;
                    return;
                }
            };
            let Some(last) = events.last() else {
                if conv.live.join(&sub, cursor) {
                    break;
                }
                continue;
            };
            cursor = last.seq;
            frames.clear();
            for e in &events {
                text_frame(&mut frames, &p.prefix, &tail(&conv.id, e));
            }
            if p.writer.write_frames(&frames).await.is_err() {
                return;
            }
        }
        tokio::select! {
            _ = p.let_go.notified() => {
                cursor = p.behind.load(Ordering::Acquire);
                crate::engine::telemetry::resumed();
            }
            _ = closing.wait_for(|c| *c) => return,
            _ = p.writer.closed() => return,
        }
    }
}

/// Every conversation of an agent: the feed, written event by event.
async fn follow_feed(mut feed: Feed, writer: ConnWriter, prefix: Box<[u8]>, _ending: Ending) {
    let mut frame = Vec::new();
    loop {
        let next = tokio::select! {
            n = feed.next() => n,
            _ = writer.closed() => return,
        };
        let e = match next {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "subscription ended");
                let _ = writer.write_frames(&ended(&prefix, &e)).await;
                return;
            }
        };
        frame.clear();
        text_frame(&mut frame, &prefix, &tail(&e.conversation_id, &e));
        if writer.write_frames(&frame).await.is_err() {
            return;
        }
    }
}
