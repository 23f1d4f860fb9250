//! The SSE stream of one conversation, written to by the log's publisher.
//!
//! As a WebSocket `subscribe` does ([`crate::transport::push`]), the stream reads its backlog
//! after the cursor (from the ring of recent events, or from the store), then joins the
//! conversation's [`LiveSet`](crate::engine::hub::live::LiveSet); from then on the publisher
//! appends each committed event's SSE frame to the stream's queue as part of publishing (the
//! frame made once per event, however many streams take it), and the stream hands everything
//! queued to the connection as one chunk when the connection's task next asks. A stream whose
//! queue is full (its client reads too slowly) is let go by the publisher, which never waits,
//! and goes back to reading the log by cursor until it has caught up again: nothing is skipped
//! or sent twice.
//!
//! Before (an SSE stream followed the conversation's head), every event woke each stream to
//! read the ring and make the event's frame for itself: at 1,000 streams a quarter more of the
//! server's CPU than the WebSocket subscriptions the publisher writes to.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use axum::body::Bytes;
use proto_spec::Event;

use crate::engine::auth::Grant;
use crate::engine::fanout::{read_after, PAGE};
use crate::engine::hub::live::{Encoding, LiveEvent, LiveSubscriber};
use crate::engine::hub::{ConvView, Hub};
use crate::engine::store::Store;
use crate::engine::streams::StreamSlot;

/// How many bytes of frames a stream's queue holds before the publisher lets it go. With the
/// connection's HTTP buffer ([`crate::transport::accept::HTTP_BUFFER`]) and its send buffer
/// ([`crate::transport::net::HIGH_WATER`]), what a stream whose client reads nothing makes
/// the server hold.
pub const QUEUE_BYTES: usize = 64 * 1024;

/// `id: SEQ`, then the event's JSON as `data:` lines, then the blank line that ends it.
fn frame(out: &mut Vec<u8>, e: &Event) {
    out.extend_from_slice(b"id: ");
    out.extend_from_slice(e.seq.to_string().as_bytes());
    out.push(b'\n');
    // The JSON holds a newline only where a stored payload kept one in its spacing; each line
    // becomes a `data:` line, and a reader joins them with newlines again.
    for line in e.to_json().get().split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
}

/// The last frame of a stream that ends with `e` (its conversation was deleted, say): an
/// `error` event whose data is the JSON-RPC error.
fn error_frame(e: &crate::engine::error::Error) -> Vec<u8> {
    let error = serde_json::to_string(&e.to_rpc().to_wire()).unwrap_or_default();
    format!("event: error\ndata: {error}\n\n").into_bytes()
}

fn encode(_conversation_id: &str, e: &Event) -> Vec<u8> {
    let mut out = Vec::with_capacity(e.to_json().get().len() + 32);
    frame(&mut out, e);
    out
}

/// What the publisher left for the stream.
#[derive(Debug, Default)]
struct Queue {
    /// Frames not yet handed to the connection.
    frames: Vec<u8>,
    /// Set when the publisher let the stream go: the last seq it took.
    let_go: Option<u64>,
}

/// A live SSE stream, as the publisher sees it.
#[derive(Debug, Default)]
struct Queued {
    queue: Mutex<Queue>,
    /// Told when the queue was empty and is not, or the stream was let go.
    ready: tokio::sync::Notify,
}

impl Queued {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LiveSubscriber for Queued {
    fn offer(&self, event: &LiveEvent<'_>) -> bool {
        let frame = event.encoded(Encoding::Sse, encode);
        let mut q = self.lock();
        if q.frames.len() >= QUEUE_BYTES {
            return false;
        }
        let was_empty = q.frames.is_empty();
        q.frames.extend_from_slice(frame);
        drop(q);
        if was_empty {
            self.ready.notify_one();
        }
        true
    }

    fn let_go(&self, reached: u64) {
        self.lock().let_go = Some(reached);
        self.ready.notify_one();
    }
}

/// One conversation's stream: the backlog by cursor, then live from the publisher, back to the
/// log whenever the publisher lets go. Leaves the publisher's set when dropped (the client went
/// away, the token was revoked, the server is stopping).
pub struct Follow {
    store: Arc<dyn Store>,
    conv: Arc<ConvView>,
    cursor: u64,
    queued: Arc<Queued>,
    joined: bool,
    /// It sent its `error` event (the conversation was deleted): nothing follows.
    ended: bool,
    grant: Arc<Grant>,
    closing: tokio::sync::watch::Receiver<bool>,
    keep_alive: Duration,
    /// When the stream last sent something, and the timer that checks it: reset only when it
    /// fires, not per event.
    sent: Instant,
    idle: Pin<Box<tokio::time::Sleep>>,
    _slot: StreamSlot,
}

impl std::fmt::Debug for Follow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Follow")
            .field("conversation", &self.conv.id)
            .field("cursor", &self.cursor)
            .field("joined", &self.joined)
            .finish_non_exhaustive()
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        if self.joined {
            let sub: Arc<dyn LiveSubscriber> = self.queued.clone();
            self.conv.live.leave(&sub);
        }
    }
}

impl Follow {
    /// A stream of `conv` after `cursor`, held open by `slot` until the token behind `grant`
    /// is revoked; an idle stream sends a comment every `keep_alive`.
    pub fn new(
        store: Arc<dyn Store>,
        hub: &Hub,
        conv: Arc<ConvView>,
        cursor: u64,
        grant: Arc<Grant>,
        keep_alive: Duration,
        slot: StreamSlot,
    ) -> Follow {
        let closing = hub.closing();
        Follow {
            store,
            conv,
            cursor,
            queued: Arc::default(),
            joined: false,
            ended: false,
            grant,
            closing,
            keep_alive,
            sent: Instant::now(),
            idle: Box::pin(tokio::time::sleep(keep_alive)),
            _slot: slot,
        }
    }

    /// The stream as the response's body: one chunk per call, `None` once it ends.
    pub fn into_stream(self) -> impl futures::Stream<Item = Result<Bytes, Infallible>> + Send {
        futures::stream::unfold(self, |mut f| async move {
            let chunk = f.next_chunk().await?;
            f.sent = Instant::now();
            Some((Ok(chunk), f))
        })
    }

    async fn next_chunk(&mut self) -> Option<Bytes> {
        loop {
            // Checked here too: a stream catching up from the log does not reach the wait below.
            if *self.closing.borrow() || self.grant.is_revoked() || self.ended {
                return None;
            }
            if !self.joined {
                // Catch up from the ring or the store until the publisher's set can be joined.
                let events = match read_after(&self.store, &self.conv, self.cursor, PAGE).await {
                    Ok(events) => events,
                    Err(e) => {
                        tracing::warn!(error = %e, "an SSE stream could not read the log");
                        self.ended = true;
                        return Some(Bytes::from(error_frame(&e)));
                    }
                };
                let Some(last) = events.last() else {
                    let sub: Arc<dyn LiveSubscriber> = self.queued.clone();
                    self.joined = self.conv.live.join(&sub, self.cursor);
                    continue;
                };
                self.cursor = last.seq;
                let mut out = Vec::new();
                for e in &events {
                    frame(&mut out, e);
                }
                return Some(Bytes::from(out));
            }
            let wait = self.queued.ready.notified();
            {
                let mut q = self.queued.lock();
                if !q.frames.is_empty() {
                    // The frames first: they come before the seq a let-go names.
                    return Some(Bytes::from(std::mem::take(&mut q.frames)));
                }
                if let Some(reached) = q.let_go.take() {
                    self.cursor = reached;
                    self.joined = false;
                    crate::engine::telemetry::resumed();
                    continue;
                }
            }
            tokio::select! {
                _ = wait => {}
                // The token was revoked or expired: the stream ends.
                _ = self.grant.revoked() => return None,
                _ = self.closing.wait_for(|c| *c) => return None,
                _ = self.idle.as_mut() => {
                    let due = self.sent + self.keep_alive;
                    if Instant::now() >= due {
                        self.idle.as_mut().reset(Instant::now() + self.keep_alive);
                        return Some(Bytes::from_static(b":\n\n"));
                    }
                    self.idle.as_mut().reset(due);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::state::Draft;

    fn event(seq: u64, payload: &str) -> Event {
        let d = Draft {
            seq,
            kind: proto_spec::EventKind::Message,
            author: "alice".into(),
            turn: 1,
            finality: None,
            payload: serde_json::value::RawValue::from_string(payload.into()).unwrap(),
            client_request_id: None,
            hash: None,
            doc: false,
        };
        crate::engine::store::to_event("c", d, "2026-11-28T00:00:00Z")
    }

    #[test]
    fn a_frame_is_the_id_then_one_data_line_per_line_of_json() {
        let e = event(7, "{\"text\":\n\"hi\"}");
        let mut out = Vec::new();
        frame(&mut out, &e);
        let text = String::from_utf8(out).unwrap();
        let mut lines = text.split('\n');
        assert_eq!(lines.next(), Some("id: 7"));
        let data: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.is_empty())
            .map(|l| l.strip_prefix("data: ").expect("a data line"))
            .collect();
        assert_eq!(data.len(), 2, "{text}");
        let json: serde_json::Value = serde_json::from_str(&data.join("\n")).unwrap();
        assert_eq!(json["seq"], 7);
        assert_eq!(json["payload"]["text"], "hi");
        assert!(text.ends_with("\n\n"));
    }

    #[test]
    fn a_full_queue_refuses_and_a_let_go_names_the_last_seq_taken() {
        let q = Queued::default();
        let big = format!("{{\"text\":\"{}\"}}", "x".repeat(4 * 1024));
        let mut taken = 0;
        for seq in 1..=100 {
            let e = event(seq, &big);
            if !q.offer(&LiveEvent::new("c", &e)) {
                break;
            }
            taken = seq;
        }
        assert!(taken > 0 && taken < 100, "took {taken}");
        assert!(q.lock().frames.len() >= QUEUE_BYTES);
        q.let_go(taken);
        assert_eq!(q.lock().let_go, Some(taken));
    }
}
