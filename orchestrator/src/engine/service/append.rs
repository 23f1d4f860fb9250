//! `sendMessage` and `sendTrace`: each request checked (its key, its payload's size, that the
//! caller may write to the conversation) and queued for the writer, whose state machine decides
//! every other rule of an append.

use proto_spec::*;

use super::Orchestrator;
use crate::engine::auth::Identity;
use crate::engine::error::{refuse, Error, Result};
use crate::engine::state::AppendRequest;
use crate::engine::writer::Appending;

/// What a write an executor makes for a turn it runs carries besides its params (nothing, for
/// a client's own write).
#[derive(Debug, Clone, Default)]
pub struct ForTurn {
    /// On a cluster: the claim the turn is run under; the write is refused once another node
    /// has taken the turn over.
    pub fence: Option<crate::engine::store::Fence>,
    /// The key of the attempt's `turn_start`, sent ahead of this write without waiting for its
    /// answer: the write is refused unless that trace is in the log ahead of it.
    pub after: Option<String>,
    /// A trace nobody waits on to go on: it may wait a moment for other writes to commit with
    /// ([`AppendRequest::trailing`]).
    pub trailing: bool,
}

impl Orchestrator {
    /// Refuses a payload past `--max-payload-bytes` with `PayloadTooLarge`.
    pub(super) fn check_payload(&self, json: &str) -> Result<()> {
        if json.len() > self.limits.max_payload_bytes {
            return Err(Error::Rpc(
                RpcError::new(
                    ErrorCode::PayloadTooLarge,
                    format!(
                        "payload is {} bytes; the limit is {}",
                        json.len(),
                        self.limits.max_payload_bytes
                    ),
                )
                .with_data(
                    serde_json::json!({"limit": self.limits.max_payload_bytes, "size": json.len()}),
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a `clientRequestId` (or an `afterKey`, which names one) that is empty or longer
    /// than 256 characters.
    fn check_key(key: &Option<String>, field: &str) -> Result<()> {
        match key {
            Some(k) if k.is_empty() || k.len() > 256 => Err(refuse(
                ErrorCode::InvalidParams,
                format!("{field}: 1-256 characters"),
            )),
            _ => Ok(()),
        }
    }

    /// The key a write is held to: the params' `afterKey` (a client over the wire), else the
    /// one an executor inside the server holds its writes to.
    fn held_to(after_key: Option<String>, made: Option<String>) -> Result<Option<String>> {
        Self::check_key(&after_key, "afterKey")?;
        Ok(after_key.or(made))
    }

    /// `sendMessage`: acknowledged once durable. Existence and participation are checked by the
    /// writer's state machine, like every other rule of an append.
    ///
    /// The message is checked and queued for the writer when this is called; the future only
    /// waits for the answer (see [`crate::engine::writer::WriterHandle::append`]).
    pub fn send_message(&self, who: &Identity, p: SendMessageParams) -> Appending {
        self.send_message_for(who, p, ForTurn::default())
    }

    /// `sendMessage` made by an executor for a turn it runs (see [`ForTurn`]).
    pub fn send_message_for(
        &self,
        who: &Identity,
        mut p: SendMessageParams,
        made: ForTurn,
    ) -> Appending {
        let request = Self::held_to(p.after_key.take(), made.after)
            .and_then(|after| Ok((self.message_request(who, p)?, after)));
        match request {
            Ok(((conversation, req), after)) => self
                .writer
                .append(conversation, req.with_fence(made.fence).with_after(after)),
            Err(e) => Appending::refused(e),
        }
    }

    /// A `sendMessage`'s conversation and request, checked (key and payload size).
    fn message_request(
        &self,
        who: &Identity,
        mut p: SendMessageParams,
    ) -> Result<(String, AppendRequest)> {
        Self::check_key(&p.client_request_id, "clientRequestId")?;
        let key = self.writable_key(who, std::mem::take(&mut p.conversation_id))?;
        let payload = serde_json::value::to_raw_value(&p.payload)?;
        let req = AppendRequest::from_raw(
            who.agent_id.clone(),
            EventKind::Message,
            Some(p.finality),
            payload,
        )
        .with_turn_hint(p.turn_hint.map(|h| h.turn))
        .with_client_request_id(p.client_request_id);
        self.check_payload(req.payload.get())?;
        self.spend(who, req.payload.get().len())?;
        Ok((key, req))
    }

    /// `sendTrace`: acknowledged once durable.
    pub async fn send_trace(&self, who: &Identity, p: SendTraceParams) -> Result<AppendResult> {
        self.send_trace_for(who, p, ForTurn::default()).await
    }

    /// `sendTrace` made by an executor for a turn it runs (see [`ForTurn`]).
    pub async fn send_trace_for(
        &self,
        who: &Identity,
        mut p: SendTraceParams,
        made: ForTurn,
    ) -> Result<AppendResult> {
        if p.finality.is_some() {
            return Err(refuse(
                ErrorCode::InvalidFinality,
                "only messages carry finality; a trace cannot",
            ));
        }
        Self::check_key(&p.client_request_id, "clientRequestId")?;
        let after = Self::held_to(p.after_key, made.after)?;
        let key = self.writable_key(who, std::mem::take(&mut p.conversation_id))?;
        if who.scope.is_some() && p.payload.get("type").and_then(|t| t.as_str()) == Some("llm_call")
        {
            // What the tenant's model participants spend, against its tokens a day.
            let tokens = ["promptTokens", "completionTokens"]
                .iter()
                .filter_map(|k| p.payload.get(*k).and_then(serde_json::Value::as_u64))
                .sum();
            self.quotas.spent_llm_tokens(&who.tenant, tokens);
        }
        let mut req = AppendRequest::new(who.agent_id.clone(), EventKind::Trace, None, p.payload)
            .with_turn(p.turn)
            .with_client_request_id(p.client_request_id)
            .with_fence(made.fence)
            .with_after(after);
        req.trailing = made.trailing;
        self.check_payload(req.payload.get())?;
        self.spend(who, req.payload.get().len())?;
        self.writer.append(key, req).await
    }
}
