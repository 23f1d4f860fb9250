//! Sub-conversations: an agent opens a child conversation from a scenario with an input, waits
//! for it to close and takes its final message as the result.
//!
//! The server links the child to its parent: the child's `created` event names the parent, the
//! parent logs `subconversation_started` in the same transaction, and `subconversation_finished`
//! (with the child's result) in the transaction that closes the child. So the whole tree can be
//! followed from the log, and an agent that waits for a child reads its result from its own
//! conversation, even when the child finished while the agent (or the server) was down.
//!
//! ```no_run
//! # use agent_sdk::{AgentContext, sub::SubConversation};
//! # async fn run(ctx: &AgentContext) -> Result<(), agent_sdk::AgentError> {
//! let child = SubConversation::named("research").input("the history of tea");
//! let id = ctx.open_subconversation(&child, "history").await?;
//! let done = ctx.wait_subconversations(&[id]).await?;
//! println!("{}", done[0].text());
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::time::Duration;

use proto_spec::system::SystemEvent;
use proto_spec::*;
use serde_json::Value;

use crate::client::{ClientError, ClientResult};
use crate::AgentContext;

/// A sub-conversation to open: its scenario (by name or inline) and its task.
#[derive(Debug, Clone, Default)]
pub struct SubConversation {
    /// A scenario the server knows by name.
    pub scenario_name: Option<String>,
    /// An inline scenario.
    pub scenario: Option<Value>,
    /// The task, posted as the child's first message (from `orchestrator`).
    pub input: Option<MessagePayload>,
}

impl SubConversation {
    /// A child from a scenario the server knows by name.
    pub fn named(name: impl Into<String>) -> Self {
        SubConversation {
            scenario_name: Some(name.into()),
            ..Default::default()
        }
    }

    /// A child from an inline scenario.
    pub fn inline(scenario: Value) -> Self {
        SubConversation {
            scenario: Some(scenario),
            ..Default::default()
        }
    }

    /// With this text as its task.
    pub fn input(mut self, text: impl Into<String>) -> Self {
        self.input = Some(MessagePayload::text(text));
        self
    }
}

/// A child's result: the parent's `subconversation_finished` event.
pub use proto_spec::system::SubconversationFinished as Finished;
/// A message of a child, as its result.
pub use proto_spec::system::SubconversationResult as ChildMessage;

/// A child's id: the parent's id and a key that is the same each time the same step runs, so a
/// step run again (after a crash, or by another replica) finds its child instead of opening a
/// second one. Ids longer than the protocol allows keep a prefix and a digest of the rest.
pub fn child_id(parent: &str, key: &str) -> String {
    let id = format!("{parent}.{key}");
    if id.len() <= 128 {
        return id;
    }
    // FNV-1a: stable across builds and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let mut cut = 100.min(id.len());
    while !id.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-{h:016x}", &id[..cut])
}

impl AgentContext {
    /// Opens a sub-conversation of this conversation, named by `key` (unique within this
    /// conversation: the same key finds the same child again). Answers the child's id; a child
    /// that exists already under this parent is the same child.
    pub async fn open_subconversation(
        &self,
        child: &SubConversation,
        key: &str,
    ) -> ClientResult<String> {
        let id = child_id(&self.conversation_id, key);
        let created = self
            .client
            .create_conversation(CreateConversationParams {
                conversation_id: Some(id.clone()),
                scenario: child.scenario.clone(),
                scenario_name: child.scenario_name.clone(),
                participants: None,
                metadata: None,
                parent_conversation_id: Some(self.conversation_id.clone()),
                input: child.input.clone(),
            })
            .await;
        match created {
            Ok(r) => Ok(r.conversation_id),
            Err(ClientError::Rpc(e)) if e.code == ErrorCode::ConversationExists => {
                let snap = self.client.get_conversation(&id).await?;
                if snap.parent_conversation_id.as_deref() == Some(self.conversation_id.as_str()) {
                    Ok(id)
                } else {
                    Err(ClientError::Rpc(RpcError::new(
                        ErrorCode::ConversationExists,
                        format!(
                            "conversation {id} exists and is not a sub-conversation of {}",
                            self.conversation_id
                        ),
                    )))
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Waits until every one of `children` has finished (or the turn's deadline passes) and
    /// answers their results in the same order. Reads the `subconversation_finished` events of
    /// this conversation's log, so a child that finished earlier is found at once.
    pub async fn wait_subconversations(&self, children: &[String]) -> ClientResult<Vec<Finished>> {
        let mut found: HashMap<String, Finished> = HashMap::new();
        let mut cursor = 0;
        loop {
            let page = self
                .client
                .tail(TailParams {
                    conversation_id: self.conversation_id.clone(),
                    since_seq: cursor,
                    limit: None,
                })
                .await?;
            for e in &page.events {
                cursor = cursor.max(e.seq);
                if e.kind != EventKind::System {
                    continue;
                }
                if let Some(SystemEvent::SubconversationFinished(f)) =
                    SystemEvent::parse(e.payload.get())
                {
                    if children.contains(&f.child) {
                        found.insert(f.child.clone(), f);
                    }
                }
            }
            if children.iter().all(|c| found.contains_key(c)) {
                return Ok(children.iter().filter_map(|c| found.remove(c)).collect());
            }
            if page.latest_seq > cursor {
                continue; // more to read
            }
            let left = self.remaining();
            if left.is_zero() {
                let waiting: Vec<&String> = children
                    .iter()
                    .filter(|c| !found.contains_key(*c))
                    .collect();
                return Err(ClientError::Transport(format!(
                    "the turn's deadline passed while sub-conversations were still open: {waiting:?}"
                )));
            }
            self.wait_for_change(cursor, left.min(Duration::from_secs(30)))
                .await?;
        }
    }
}
