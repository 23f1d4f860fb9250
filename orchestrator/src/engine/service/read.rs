//! Reading a conversation: `tail`, `waitForChange`, the HTTP long-poll and
//! `getUpdatesOrGuidance`. Each reads the conversation as its access needs
//! ([`Orchestrator::readable`]) and waits on its head, registered before the head is read, so
//! no wake-up is lost.

use std::time::Duration;

use proto_spec::*;
use tokio::time::Instant;

use super::{Orchestrator, DEFAULT_WAIT_MS};
use crate::engine::auth::Identity;
use crate::engine::error::Result;
use crate::engine::fanout::{read_after, PAGE};
use crate::engine::hub::ConvView;

impl Orchestrator {
    /// `tail`.
    pub async fn tail(&self, who: &Identity, p: TailParams) -> Result<TailResult> {
        let conv = self.readable(who, &p.conversation_id).await?;
        let latest_seq = conv.head();
        let limit = p
            .limit
            .map(|l| l as usize)
            .unwrap_or(self.limits.max_tail)
            .min(self.limits.max_tail);
        let events = read_after(&self.store, &conv, p.since_seq, limit).await?;
        Ok(TailResult {
            events: events.iter().map(|e| (**e).clone()).collect(),
            latest_seq,
        })
    }

    fn capped(&self, timeout_ms: u64) -> Duration {
        Duration::from_millis(timeout_ms).min(self.limits.max_wait)
    }

    /// Waits until the head of `conv` passes `since` or the deadline; true if it did. A
    /// conversation deleted meanwhile ends the wait with `ConversationNotFound`.
    async fn wait_past(&self, conv: &ConvView, since: u64, deadline: Instant) -> Result<bool> {
        let mut head = conv.watch();
        let mut closing = self.hub.closing();
        if *head.borrow_and_update() > since {
            return Ok(true);
        }
        let wait = head.wait_for(|h| *h > since || conv.deleted());
        let passed = tokio::select! {
            r = wait => r.is_ok(),
            _ = tokio::time::sleep_until(deadline) => false,
            _ = closing.wait_for(|c| *c) => conv.head() > since,
        };
        if conv.deleted() {
            return Err(crate::engine::error::deleted(&conv.id));
        }
        Ok(passed)
    }

    /// `waitForChange`: the waiter is registered before the head is read, so no wake-up is lost.
    pub async fn wait_for_change(
        &self,
        who: &Identity,
        p: WaitForChangeParams,
    ) -> Result<WaitForChangeResult> {
        let conv = self.readable(who, &p.conversation_id).await?;
        let deadline = Instant::now() + self.capped(p.timeout_ms);
        let changed = self.wait_past(&conv, p.since_seq, deadline).await?;
        Ok(WaitForChangeResult {
            latest_seq: conv.head(),
            timed_out: !changed,
        })
    }

    /// The long-poll of `GET /conversations/{id}/wait`: events after `since_seq`, as soon as
    /// there are any or when the (capped) timeout ends. The waiter is registered before the
    /// head is read, so no wake-up is lost.
    pub async fn wait_events(
        &self,
        who: &Identity,
        conversation_id: &str,
        q: WaitQuery,
    ) -> Result<crate::engine::fanout::WaitEvents> {
        let conv = self.readable(who, conversation_id).await?;
        let timeout = self.capped(q.timeout_ms.unwrap_or(DEFAULT_WAIT_MS));
        let deadline = Instant::now() + timeout;
        let changed = self.wait_past(&conv, q.since_seq, deadline).await?;
        let mut events = if changed {
            read_after(&self.store, &conv, q.since_seq, self.limits.max_tail).await?
        } else {
            Vec::new()
        };
        // Within the answer limit every transport shares: the caller asks again from the last
        // event it got (one event always fits: payloads are far below the limit).
        let budget = self.limits.max_response_bytes().saturating_sub(1024);
        let mut used = 0;
        let fits = events
            .iter()
            .take_while(|e| {
                used += e.to_json().get().len() + 1;
                used <= budget
            })
            .count();
        events.truncate(fits.max(1));
        Ok(crate::engine::fanout::WaitEvents {
            latest_seq: conv.head(),
            timed_out: !changed,
            events,
        })
    }

    /// `getUpdatesOrGuidance`: new messages and guidance; when there are no new messages and a
    /// timeout is given, waits for some first.
    pub async fn get_updates(
        &self,
        who: &Identity,
        p: GetUpdatesParams,
    ) -> Result<GetUpdatesResult> {
        let conv = self.readable(who, &p.conversation_id).await?;
        let limit = p
            .limit
            .map(|l| l as usize)
            .unwrap_or(self.limits.max_tail)
            .clamp(1, self.limits.max_tail);
        let deadline = Instant::now() + self.capped(p.timeout_ms.unwrap_or(0));
        let mut cursor = p.since_seq.unwrap_or(0);
        let mut messages = Vec::new();
        let mut timed_out = false;
        loop {
            // The head and whether it is closed, as of one publication.
            let core = conv.core();
            self.read_messages(&conv, &mut cursor, core.head, &mut messages, limit)
                .await?;
            let closed = core.closed && cursor >= core.head;
            if !messages.is_empty() || closed || Instant::now() >= deadline {
                break;
            }
            if !self.wait_past(&conv, cursor, deadline).await? {
                timed_out = true;
                break;
            }
        }
        let snapshot = conv.snapshot(&who.agent_id);
        if snapshot.status == ConversationStatus::Closed {
            // Closed while this read: the messages up to its close come with the word `closed`
            // (nothing follows them), as far as the limit allows.
            self.read_messages(
                &conv,
                &mut cursor,
                snapshot.latest_seq,
                &mut messages,
                limit,
            )
            .await?;
        }
        Ok(GetUpdatesResult {
            messages,
            guidance: snapshot.guidance,
            latest_seq: cursor,
            status: snapshot.status,
            timed_out,
        })
    }

    /// Reads the messages of `conv` after `cursor` up to `head` into `messages` (at most
    /// `limit` in all), moving `cursor` past what it read.
    async fn read_messages(
        &self,
        conv: &ConvView,
        cursor: &mut u64,
        head: u64,
        messages: &mut Vec<Event>,
        limit: usize,
    ) -> Result<()> {
        while *cursor < head && messages.len() < limit {
            let evs = read_after(&self.store, conv, *cursor, PAGE).await?;
            let Some(last) = evs.last() else { break };
            let last_seq = last.seq;
            for e in evs {
                *cursor = e.seq;
                if e.kind == EventKind::Message {
                    messages.push((*e).clone());
                    if messages.len() == limit {
                        break;
                    }
                }
            }
            if *cursor < last_seq {
                break;
            }
        }
        Ok(())
    }
}
