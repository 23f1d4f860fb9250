//! A2A tasks read from the orchestrator's log.
//!
//! A `contextId` is a conversation. A task is one exchange: it starts with the caller's
//! message at seq `S` of conversation `C` and its id is `C~S` (`~` cannot appear in an id), so
//! nothing about it lives in the adapter: its state is read back from the log every time.
//! - `completed` once the conversation is closed;
//! - `canceled` once the adapter logged a cancel trace for it;
//! - `input-required` when the turn is back with the caller (its guidance is `may_speak`)
//!   after its latest message;
//! - `working` otherwise (`submitted` while nobody has answered yet).

use std::sync::Arc;

use agent_sdk::proto::*;
use agent_sdk::{AgentClient, ClientError, WsJsonRpcClient};
use serde_json::{json, Value};

/// The trace type that records a cancelled task.
pub const CANCEL_TRACE: &str = "a2a_task_canceled";
/// The prefix of the clientRequestId made from an A2A messageId.
pub const KEY_PREFIX: &str = "a2a:";

/// A task id: conversation and the seq of the message that opened it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskId {
    /// The conversation (the A2A contextId).
    pub conversation: String,
    /// The seq of the caller's message that opened the task.
    pub start: u64,
}

impl TaskId {
    /// Parses `C~S`.
    pub fn parse(id: &str) -> Option<TaskId> {
        let (c, s) = id.rsplit_once('~')?;
        let start = s.parse().ok()?;
        (!c.is_empty()).then(|| TaskId {
            conversation: c.to_string(),
            start,
        })
    }

    /// The wire form.
    pub fn wire(&self) -> String {
        format!("{}~{}", self.conversation, self.start)
    }
}

/// A task's state, as A2A names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Nobody has answered yet.
    Submitted,
    /// Others are speaking.
    Working,
    /// The turn is back with the caller.
    InputRequired,
    /// The conversation is closed.
    Completed,
    /// Cancelled by the caller.
    Canceled,
}

impl State {
    /// The wire name.
    pub fn wire(self) -> &'static str {
        match self {
            State::Submitted => "TASK_STATE_SUBMITTED",
            State::Working => "TASK_STATE_WORKING",
            State::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            State::Completed => "TASK_STATE_COMPLETED",
            State::Canceled => "TASK_STATE_CANCELED",
        }
    }

    /// Whether the exchange is over (for now, or for good).
    pub fn settled(self) -> bool {
        matches!(
            self,
            State::InputRequired | State::Completed | State::Canceled
        )
    }

    /// Whether nothing more will happen in the task.
    pub fn terminal(self) -> bool {
        matches!(self, State::Completed | State::Canceled)
    }
}

/// An event of the log as an A2A message.
pub fn message(me: &str, task: &TaskId, e: &Event) -> Value {
    let p = e.payload_value();
    let mine = e.author == me;
    let message_id = match (&e.client_request_id, mine) {
        (Some(k), true) if k.starts_with(KEY_PREFIX) => k[KEY_PREFIX.len()..].to_string(),
        _ => format!("{}~{}", e.conversation_id, e.seq),
    };
    let mut parts =
        vec![json!({"text": p.get("text").and_then(Value::as_str).unwrap_or_default()})];
    if let Some(data) = p.get("data") {
        parts.push(json!({"data": data}));
    }
    json!({
        "messageId": message_id,
        "contextId": e.conversation_id,
        "taskId": task.wire(),
        "role": if mine { "ROLE_USER" } else { "ROLE_AGENT" },
        "parts": parts,
        "metadata": {"author": e.author, "seq": e.seq, "turn": e.turn, "finality": e.finality},
    })
}

/// What a peer asked to approve is told.
fn approval_text(waiting: &str) -> String {
    format!("Approval requested: {waiting} speaks next only if you approve. Answer \"approve\" or \"reject\".")
}

/// Everything needed to describe a task, read from the log.
#[derive(Debug, Clone)]
pub struct TaskView {
    /// Its id.
    pub id: TaskId,
    /// Its state.
    pub state: State,
    /// Messages from the task's start, in order.
    pub messages: Vec<Event>,
    /// The latest message from others after the caller's latest one (the answer so far).
    pub answer: Option<Event>,
    /// The other messages from others after the caller's latest one, oldest first.
    pub earlier: Vec<Event>,
    /// An approval asked of the caller and not yet given: who waits to speak.
    pub approval: Option<String>,
    /// The latest seq read.
    pub latest_seq: u64,
    /// When its state last changed (the last event's time).
    pub ts: String,
}

impl TaskView {
    /// The status: its state and, when others spoke since the caller, a message with what
    /// they said: the latest message first (its parts as they are), then each earlier one
    /// (`author: text`), then, when the caller is asked to approve, what it decides on.
    fn status(&self, me: &str) -> Value {
        let mut status = json!({"state": self.state.wire(), "timestamp": self.ts});
        if let Some(a) = &self.answer {
            let mut m = message(me, &self.id, a);
            for e in &self.earlier {
                let p = e.payload_value();
                let text = p.get("text").and_then(Value::as_str).unwrap_or_default();
                if let Some(parts) = m["parts"].as_array_mut() {
                    parts.push(json!({"text": format!("{}: {text}", e.author)}));
                }
            }
            if let Some(waiting) = &self.approval {
                if let Some(parts) = m["parts"].as_array_mut() {
                    parts.push(json!({"text": approval_text(waiting)}));
                }
                m["metadata"]["approvalFor"] = json!(waiting);
            }
            m["metadata"]["earlier"] = json!(self
                .earlier
                .iter()
                .map(|e| json!({"author": e.author, "seq": e.seq}))
                .collect::<Vec<_>>());
            status["message"] = m;
        } else if let Some(waiting) = &self.approval {
            status["message"] = json!({
                "messageId": format!("{}~approval~{}", self.id.conversation, self.latest_seq),
                "contextId": self.id.conversation,
                "taskId": self.id.wire(),
                "role": "ROLE_AGENT",
                "parts": [{"text": approval_text(waiting)}],
                "metadata": {"approvalFor": waiting},
            });
        }
        status
    }

    /// The A2A `Task`, with at most `history` messages of history (all when `None`).
    pub fn wire(&self, me: &str, history: Option<usize>) -> Value {
        let status = self.status(me);
        let skip = history.map_or(0, |h| self.messages.len().saturating_sub(h));
        let history: Vec<Value> = self.messages[skip..]
            .iter()
            .map(|e| message(me, &self.id, e))
            .collect();
        json!({
            "id": self.id.wire(),
            "contextId": self.id.conversation,
            "status": status,
            "history": history,
        })
    }

    /// A `statusUpdate` of this view.
    pub fn status_update(&self, me: &str) -> Value {
        let status = self.status(me);
        json!({"statusUpdate": {
            "taskId": self.id.wire(),
            "contextId": self.id.conversation,
            "status": status,
        }})
    }
}

/// Every event of `conversation` after seq `after`, in seq order.
pub async fn events_after(
    client: &Arc<WsJsonRpcClient>,
    conversation: &str,
    after: u64,
) -> Result<Vec<Event>, ReadError> {
    let mut events: Vec<Event> = Vec::new();
    let mut cursor = after;
    loop {
        let page = client
            .tail(TailParams {
                conversation_id: conversation.to_string(),
                since_seq: cursor,
                limit: None,
            })
            .await
            .map_err(ReadError::from_client)?;
        let Some(last) = page.events.last() else {
            break;
        };
        cursor = last.seq;
        events.extend(page.events);
        if cursor >= page.latest_seq {
            break;
        }
    }
    Ok(events)
}

/// The tag on a message that continues a task (a message of the caller without one opens a
/// task).
pub fn follow_up_tag(task: &TaskId) -> String {
    format!("a2a-task:{}", task.wire())
}

/// Whether `e` is a message of `me` that opened a task.
pub fn opens_task(me: &str, e: &Event) -> bool {
    e.kind == EventKind::Message
        && e.author == me
        && !e.payload_value()["tags"].as_array().is_some_and(|tags| {
            tags.iter()
                .any(|t| t.as_str().is_some_and(|t| t.starts_with("a2a-task:")))
        })
}

/// Reads a task back from the log. `NotFound` when the conversation does not exist (or is
/// not the caller's) or its seq is not one of the caller's messages.
pub async fn read(
    client: &Arc<WsJsonRpcClient>,
    me: &str,
    id: &TaskId,
) -> Result<TaskView, ReadError> {
    let snapshot = client
        .get_conversation(&id.conversation)
        .await
        .map_err(ReadError::from_client)?;
    let mut events = events_after(client, &id.conversation, id.start.saturating_sub(1)).await?;
    // The task as of the snapshot: an event appended between the two reads would show its
    // message beside a state from before it (and a stream following from the view's seq would
    // never announce it). The next read has it.
    events.retain(|e| e.seq <= snapshot.latest_seq);
    view(&snapshot, &events, me, id).ok_or(ReadError::NotFound)
}

/// A task as `events` (its conversation's, from the task's first message on) and the
/// conversation's `snapshot` show it; `None` when the first event is not a message of `me`.
pub fn view(snapshot: &Snapshot, events: &[Event], me: &str, id: &TaskId) -> Option<TaskView> {
    let cursor = events.last().map_or(0, |e| e.seq);
    let opened = events
        .first()
        .is_some_and(|e| e.seq == id.start && e.author == me && e.kind == EventKind::Message);
    if !opened {
        return None;
    }
    let canceled = events.iter().any(|e| {
        e.kind == EventKind::Trace
            && e.author == me
            && e.payload_value()["type"] == CANCEL_TRACE
            && e.payload_value()["taskId"] == id.wire()
    });
    let messages: Vec<Event> = events
        .iter()
        .filter(|e| e.kind == EventKind::Message)
        .cloned()
        .collect();
    let last_mine = messages.iter().rposition(|e| e.author == me).unwrap_or(0);
    let since_mine = &messages[last_mine + 1..];
    let answer = since_mine.last().cloned();
    // At most the 20 before the latest: what a peer reads in one status.
    let earlier = since_mine
        [since_mine.len().saturating_sub(21)..since_mine.len().saturating_sub(1)]
        .to_vec();
    // An approval asked of the caller after its latest message, while it holds the turn.
    let mine_seq = messages.get(last_mine).map_or(0, |e| e.seq);
    let approval = events
        .iter()
        .rev()
        .take_while(|e| e.seq > mine_seq)
        .filter(|e| e.kind == EventKind::System)
        .find_map(|e| match SystemEvent::from_value(&e.payload_value()) {
            Some(SystemEvent::ApprovalRequested(a)) if a.approver == me => Some(a.for_speaker),
            _ => None,
        })
        .filter(|_| snapshot.speaker.as_deref() == Some(me));
    let state = if canceled {
        State::Canceled
    } else if snapshot.status == ConversationStatus::Closed {
        State::Completed
    } else if snapshot.guidance.status == GuidanceStatus::MaySpeak
        && (answer.is_some() || snapshot.speaker.as_deref() == Some(me))
    {
        State::InputRequired
    } else if answer.is_some() {
        State::Working
    } else {
        State::Submitted
    };
    let ts = events.last().map(|e| e.ts.clone()).unwrap_or_default();
    Some(TaskView {
        id: id.clone(),
        state,
        messages,
        answer,
        earlier,
        approval,
        latest_seq: cursor.max(snapshot.latest_seq),
        ts,
    })
}

/// Why a task could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// No such task for this caller.
    NotFound,
    /// The orchestrator failed or could not be reached.
    Upstream(ClientError),
}

impl ReadError {
    fn from_client(e: ClientError) -> ReadError {
        match e.code() {
            Some(ErrorCode::ConversationNotFound | ErrorCode::Forbidden) => ReadError::NotFound,
            _ => ReadError::Upstream(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_ids_round_trip_and_refuse_garbage() {
        let id = TaskId {
            conversation: "a2a-1:x".into(),
            start: 12,
        };
        assert_eq!(TaskId::parse(&id.wire()), Some(id));
        assert_eq!(TaskId::parse("nope"), None);
        assert_eq!(TaskId::parse("~3"), None);
        assert_eq!(TaskId::parse("c~x"), None);
    }
}
