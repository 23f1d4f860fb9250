//! One exchange of the A2A adapter: `SendMessage` (and its streaming form) turned into a
//! message in the conversation and a wait for the reply, `GetTask`, `CancelTask`, and the
//! stream of a task's updates, each read back from the log.

use super::*;
use crate::peers::StreamSlot;

/// Text (and the first data part) of an A2A message.
fn read_message(params: &Value) -> Result<(String, String, Option<Value>), A2aError> {
    let m = params
        .get("message")
        .ok_or_else(|| A2aError::invalid_params("message: required"))?;
    match m["role"].as_str() {
        Some("ROLE_USER" | "ROLE_AGENT") => {}
        Some(other) => {
            return Err(A2aError::invalid_params(format!(
                "message.role: ROLE_USER or ROLE_AGENT, not {other:?}"
            )))
        }
        None => return Err(A2aError::invalid_params("message.role: required")),
    }
    let message_id = m["messageId"]
        .as_str()
        .filter(|s| !s.is_empty() && s.len() <= 200)
        .ok_or_else(|| A2aError::invalid_params("message.messageId: required (1-200 characters)"))?
        .to_string();
    let parts = m["parts"]
        .as_array()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| A2aError::invalid_params("message.parts: at least one part"))?;
    let text: Vec<&str> = parts.iter().filter_map(|p| p["text"].as_str()).collect();
    let data = parts.iter().find_map(|p| p.get("data").cloned());
    if text.is_empty() && data.is_none() {
        return Err(A2aError::invalid_params(
            "message.parts: a text or data part is required",
        ));
    }
    Ok((message_id, text.join("\n"), data))
}

/// The metadata a context the adapter starts is created with: what [`owns`] checks.
fn context_metadata(scenario: &str, message_id: &str) -> Value {
    json!({"a2a": {"scenario": scenario, "messageId": message_id}})
}

/// Whether `conversation` is a context the peer started through the adapter from the scenario
/// it calls: the conversation's `created` event names the peer as its creator and the scenario
/// in its metadata. Anything else (a conversation of someone else's, or one of the peer's own
/// that the adapter did not start) is answered as not found, the same whether it exists or not.
pub(crate) async fn owns(call: &Call<'_>, conversation: &str) -> Result<(), A2aError> {
    if call.peer.knows_context(call.scenario, conversation) {
        return Ok(());
    }
    let first = call
        .client()
        .tail(TailParams {
            conversation_id: conversation.to_string(),
            since_seq: 0,
            limit: Some(1),
        })
        .await;
    let first = match first {
        Ok(page) => page.events.into_iter().next(),
        Err(e)
            if matches!(
                e.code(),
                Some(ErrorCode::ConversationNotFound | ErrorCode::Forbidden)
            ) =>
        {
            None
        }
        Err(e) => return Err(A2aError::upstream(e)),
    };
    let created = first.and_then(|e| match SystemEvent::from_value(&e.payload_value()) {
        Some(SystemEvent::Created(c)) => Some(c),
        _ => None,
    });
    let mine = created.is_some_and(|c| {
        c.created_by == call.me()
            && c.metadata.as_ref().and_then(|m| m.pointer("/a2a/scenario"))
                == Some(&json!(call.scenario))
    });
    if !mine {
        return Err(A2aError::context_not_found(conversation));
    }
    call.peer.learn_context(call.scenario, conversation);
    Ok(())
}

/// Starts a new context for a first message: a conversation from the scenario, created by the
/// peer. Its id is the peer's keyed hash of the messageId, so a retried first message finds the
/// same conversation; the bool says whether it is new (a retry's message is in the log already).
async fn new_context(call: &Call<'_>, message_id: &str) -> Result<(String, bool), A2aError> {
    let id = call.peer.context_id(message_id);
    call.peer.new_context(call.app.peers.limits())?;
    let created = call
        .client()
        .create_conversation(CreateConversationParams {
            conversation_id: Some(id.clone()),
            scenario: None,
            scenario_name: Some(call.scenario.to_string()),
            participants: None,
            metadata: Some(context_metadata(call.scenario, message_id)),
            parent_conversation_id: None,
            input: None,
        })
        .await;
    match created {
        Ok(r) => {
            call.peer.learn_context(call.scenario, &r.conversation_id);
            Ok((r.conversation_id, true))
        }
        Err(e) if e.code() == Some(ErrorCode::ConversationExists) => {
            owns(call, &id).await?;
            Ok((id, false))
        }
        Err(ClientError::Rpc(e)) if e.code == ErrorCode::Forbidden => Err(A2aError::new(
            -32603,
            "SCENARIO_HAS_NO_CALLER",
            format!(
                "the orchestrator refused to start scenario {:?} for {}: {} (the operator marks the participant a peer speaks as with `caller: true`)",
                call.scenario,
                call.me(),
                e.message
            ),
        )),
        Err(e) => Err(A2aError::upstream(e)),
    }
}

/// Posts the peer's message (starting a conversation when it names no context); the task it
/// opens or continues, as read back after it, and the message's seq.
pub(crate) async fn start_exchange(
    call: &Call<'_>,
    params: &Value,
) -> Result<(TaskView, u64), A2aError> {
    let (message_id, text, data) = read_message(params)?;
    let m = &params["message"];
    // The mode a peer asks of the scenario's next speaker (as the `a2a` kind sends it).
    let mode = match m.pointer("/metadata/mode") {
        None | Some(Value::Null) => None,
        Some(v) => Some(serde_json::from_value::<Mode>(v.clone()).map_err(|_| {
            A2aError::invalid_params("message.metadata.mode: converse, plan or build")
        })?),
    };
    let existing_task = match m["taskId"].as_str() {
        Some(t) => Some(TaskId::parse(t).ok_or_else(|| A2aError::task_not_found(t))?),
        None => None,
    };
    if let (Some(t), Some(c)) = (&existing_task, m["contextId"].as_str()) {
        if t.conversation != c {
            return Err(A2aError::invalid_params(format!(
                "message.contextId {c} is not the context of task {}",
                t.wire()
            )));
        }
    }
    let (conversation, fresh) = match (m["contextId"].as_str(), &existing_task) {
        (_, Some(t)) => {
            owns(call, &t.conversation)
                .await
                .map_err(|_| A2aError::task_not_found(&t.wire()))?;
            (t.conversation.clone(), false)
        }
        (Some(c), None) => {
            owns(call, c).await?;
            (c.to_string(), false)
        }
        (None, None) => new_context(call, &message_id).await?,
    };
    if let Some(t) = &existing_task {
        // The task must be the peer's, in this context.
        let view = tasks::read(call.client(), call.me(), t)
            .await
            .map_err(|e| A2aError::from_read(e, &t.wire()))?;
        if view.state.terminal() {
            return Err(A2aError::new(
                -32004,
                "UNSUPPORTED_OPERATION",
                format!(
                    "task {} is {}; start a new task",
                    t.wire(),
                    view.state.wire()
                ),
            ));
        }
    }
    if fresh {
        // A scenario may open with others speaking: wait (briefly) for the peer's turn.
        wait_for_turn(call, &conversation).await;
    }
    let mut payload = MessagePayload::text(text);
    payload.data = data;
    payload.mode = mode;
    if let Some(t) = &existing_task {
        payload.tags = vec![tasks::follow_up_tag(t)];
    }
    let posted = call
        .client()
        .send_message(SendMessageParams {
            conversation_id: conversation.clone(),
            payload,
            finality: Finality::Turn,
            turn_hint: None,
            client_request_id: Some(format!("{KEY_PREFIX}{message_id}")),
            after_key: None,
        })
        .await
        .map_err(A2aError::upstream)?;
    let task = existing_task.unwrap_or(TaskId {
        conversation,
        start: posted.seq,
    });
    let view = tasks::read(call.client(), call.me(), &task)
        .await
        .map_err(|e| A2aError::from_read(e, &task.wire()))?;
    Ok((view, posted.seq))
}

/// A conversation's new events as they are committed: a subscription on the peer's own
/// connection, from a seq on. Dropping it ends the subscription on the orchestrator at once,
/// so nothing of a peer that went away keeps waiting there.
pub(crate) struct Changes {
    events: agent_sdk::EventStream,
}

impl Changes {
    pub(crate) async fn from(
        client: &WsJsonRpcClient,
        conversation: &str,
        since: u64,
    ) -> Result<Changes, A2aError> {
        let events = client
            .subscribe(SubscribeParams {
                conversation_id: Some(conversation.to_string()),
                since_seq: Some(since),
                cursors: None,
            })
            .await
            .map_err(A2aError::upstream)?;
        Ok(Changes { events })
    }

    /// Waits until at least one event came (then takes every one already here), or `until`.
    /// `Ok(false)`: the time ran out; an error: the subscription ended.
    pub(crate) async fn wait(&mut self, until: Instant) -> Result<bool, A2aError> {
        use futures::FutureExt;
        let until = tokio::time::Instant::from_std(until);
        match tokio::time::timeout_at(until, self.events.next()).await {
            Err(_) => Ok(false),
            Ok(None) => Err(A2aError::new(
                -32603,
                "UPSTREAM_UNAVAILABLE",
                "the orchestrator ended the subscription to this context",
            )),
            Ok(Some(_)) => {
                while let Some(Some(_)) = self.events.next().now_or_never() {}
                Ok(true)
            }
        }
    }
}

async fn wait_for_turn(call: &Call<'_>, conversation: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let Ok(snap) = call.client().get_conversation(conversation).await else {
        return;
    };
    if snap.guidance.status != GuidanceStatus::Wait {
        return;
    }
    let Ok(mut changes) = Changes::from(call.client(), conversation, snap.latest_seq).await else {
        return;
    };
    while let Ok(true) = changes.wait(deadline).await {
        match call.client().get_conversation(conversation).await {
            Ok(snap) if snap.guidance.status == GuidanceStatus::Wait => {}
            _ => return,
        }
    }
}

/// Waits until the task settles (or `until`), following the log from `view.latest_seq`.
async fn settle(call: &Call<'_>, mut view: TaskView, until: Instant) -> Result<TaskView, A2aError> {
    if view.state.settled() {
        return Ok(view);
    }
    let mut changes = Changes::from(call.client(), &view.id.conversation, view.latest_seq).await?;
    while !view.state.settled() && changes.wait(until).await? {
        view = tasks::read(call.client(), call.me(), &view.id)
            .await
            .map_err(|e| A2aError::from_read(e, &view.id.wire()))?;
    }
    Ok(view)
}

pub(crate) async fn send_message(call: &Call<'_>, params: &Value) -> Result<Value, A2aError> {
    // Checked before anything is posted.
    let history = history_length(&params["configuration"])?;
    let (view, _) = start_exchange(call, params).await?;
    let immediate = params["configuration"]["returnImmediately"].as_bool() == Some(true);
    let view = if immediate {
        view
    } else {
        settle(call, view, Instant::now() + call.app.blocking_wait).await?
    };
    Ok(json!({"task": view.wire(call.me(), history)}))
}

/// `historyLength`: how many of the latest messages to include (none: all); never negative.
pub(crate) fn history_length(v: &Value) -> Result<Option<usize>, A2aError> {
    match v.get("historyLength") {
        None | Some(Value::Null) => Ok(None),
        Some(n) => n.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
            A2aError::invalid_params("historyLength must be a non-negative integer")
        }),
    }
}

/// The task that `params.id` names, read from the log, if it is the peer's.
pub(crate) async fn task_of(call: &Call<'_>, params: &Value) -> Result<TaskView, A2aError> {
    let task = params["id"]
        .as_str()
        .ok_or_else(|| A2aError::invalid_params("id: the task id is required"))?;
    let tid = TaskId::parse(task).ok_or_else(|| A2aError::task_not_found(task))?;
    owns(call, &tid.conversation)
        .await
        .map_err(|_| A2aError::task_not_found(task))?;
    tasks::read(call.client(), call.me(), &tid)
        .await
        .map_err(|e| A2aError::from_read(e, task))
}

pub(crate) async fn get_task(call: &Call<'_>, params: &Value) -> Result<Value, A2aError> {
    let history = history_length(params)?;
    let view = task_of(call, params).await?;
    Ok(view.wire(call.me(), history))
}

pub(crate) async fn cancel_task(call: &Call<'_>, params: &Value) -> Result<Value, A2aError> {
    let view = task_of(call, params).await?;
    let task = view.id.wire();
    let tid = view.id.clone();
    if view.state.terminal() {
        return Err(A2aError::new(
            -32002,
            "TASK_NOT_CANCELABLE",
            format!("task {task} is already {}", view.state.wire()),
        ));
    }
    call.client()
        .send_trace(SendTraceParams {
            conversation_id: tid.conversation.clone(),
            payload: json!({"type": CANCEL_TRACE, "taskId": task}),
            turn: None,
            client_request_id: Some(format!("a2a-cancel:{task}")),
            finality: None,
            after_key: None,
        })
        .await
        .map_err(A2aError::upstream)?;
    let view = tasks::read(call.client(), call.me(), &tid)
        .await
        .map_err(|e| A2aError::from_read(e, &task))?;
    Ok(view.wire(call.me(), None))
}

/// An SSE answer: the task first, then a `working` update for each new message from the
/// others, then the settling update (`input-required`, `completed` or `canceled`). It follows
/// the log, so a peer that subscribes again gets the task as it is and then the rest.
///
/// `announce_after`: the seq of the message the peer just sent. Every message from the others
/// after it gets its update, and the settling one follows, even those already in the task the
/// stream opens with: an agent in the server may answer before the task is read back, and the
/// peer must not find the answer only inside the task, with a stream that ends at once.
pub(crate) fn stream(
    peer: Arc<Peer>,
    slot: StreamSlot,
    id: Value,
    view: TaskView,
    announce_after: Option<u64>,
) -> Response {
    let frame = move |result: Value| -> Result<SseEvent, Infallible> {
        let body = json!({"jsonrpc": "2.0", "id": id, "result": result});
        Ok(SseEvent::default().data(body.to_string()))
    };
    // The keep-alive comments find a peer that went away without a word: the stream is then
    // dropped, and its subscription with it.
    let mut resp = Sse::new(follow(peer, slot, view, announce_after, frame))
        .keep_alive(axum::response::sse::KeepAlive::default())
        .into_response();
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    resp
}

struct Follow<F> {
    peer: Arc<Peer>,
    /// Held while the stream is open: the peer's cap on open streams.
    _slot: StreamSlot,
    frame: F,
    view: TaskView,
    /// The subscription the stream waits on, opened at its first wait.
    changes: Option<Changes>,
    /// Messages from the others up to this seq are sent.
    sent: u64,
    queue: std::collections::VecDeque<Value>,
    done: bool,
}

/// Queues what `next` holds past `sent` (which it moves on): a `working` update for each
/// message from the others, then the settling update if the task has settled; whether it has.
fn announce(
    me: &str,
    sent: &mut u64,
    next: &TaskView,
    queue: &mut std::collections::VecDeque<Value>,
) -> bool {
    for m in next
        .messages
        .iter()
        .filter(|m| m.seq > *sent && m.author != me)
    {
        let mut update = next.status_update(me);
        let status = &mut update["statusUpdate"]["status"];
        status["state"] = json!(TaskState::Working.wire());
        status["message"] = tasks::message(me, &next.id, m);
        status["timestamp"] = json!(m.ts);
        queue.push_back(update);
    }
    *sent = (*sent).max(next.latest_seq);
    let settled = next.state.settled();
    if settled {
        queue.push_back(next.status_update(me));
    }
    settled
}

/// One wait of a stream for the conversation to move.
const STREAM_WAIT: Duration = Duration::from_secs(20);

impl<F> Follow<F> {
    /// Waits for the conversation to move past the view and reads the task again; `None` when
    /// the stream must end (the orchestrator cannot be asked).
    async fn next_view(&mut self) -> Option<TaskView> {
        let task = self.view.id.wire();
        if self.changes.is_none() {
            let opened = Changes::from(
                &self.peer.client,
                &self.view.id.conversation,
                self.view.latest_seq,
            )
            .await;
            match opened {
                Ok(c) => self.changes = Some(c),
                Err(e) => {
                    tracing::warn!(%task, error = ?e, "a task's stream ends: subscribing to its conversation failed");
                    return None;
                }
            }
        }
        let changes = self.changes.as_mut()?;
        loop {
            match changes.wait(Instant::now() + STREAM_WAIT).await {
                Ok(true) => break,
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!(%task, error = ?e, "a task's stream ends: its subscription ended");
                    return None;
                }
            }
        }
        match tasks::read(&self.peer.client, &self.peer.me, &self.view.id).await {
            Ok(next) => Some(next),
            Err(e) => {
                tracing::warn!(%task, error = ?e, "a task's stream ends: reading the task back failed");
                None
            }
        }
    }
}

fn follow<F>(
    peer: Arc<Peer>,
    slot: StreamSlot,
    view: TaskView,
    announce_after: Option<u64>,
    frame: F,
) -> impl futures::Stream<Item = Result<SseEvent, Infallible>>
where
    F: Fn(Value) -> Result<SseEvent, Infallible> + Send + 'static,
{
    let mut queue = std::collections::VecDeque::new();
    queue.push_back(json!({"task": view.wire(&peer.me, None)}));
    let (mut sent, mut done) = (view.latest_seq, view.state.settled());
    if let Some(after) = announce_after {
        sent = after;
        done = announce(&peer.me, &mut sent, &view, &mut queue);
    }
    let state = Follow {
        sent,
        done,
        peer,
        _slot: slot,
        frame,
        view,
        changes: None,
        queue,
    };
    futures::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(result) = st.queue.pop_front() {
                let item = (st.frame)(result);
                return Some((item, st));
            }
            if st.done {
                return None;
            }
            // The stream ends without its settling update only when the orchestrator cannot
            // be asked; the peer then reads the task with `GetTask` or subscribes again.
            let next = st.next_view().await?;
            st.done = announce(&st.peer.me, &mut st.sent, &next, &mut st.queue);
            st.view = next;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tasks::{State, TaskId};

    fn message(seq: u64, author: &str, text: &str) -> agent_sdk::proto::Event {
        serde_json::from_value(json!({
            "conversationId": "c", "seq": seq, "kind": "message", "author": author, "turn": seq,
            "finality": "turn", "payload": {"text": text}, "ts": "2026-11-27T00:00:00.000Z"
        }))
        .unwrap()
    }

    /// The peer's message at seq 1, the agent's answer at 2 (seq 3: the next decision), the
    /// task back with the peer.
    fn answered() -> TaskView {
        let (mine, answer) = (
            message(1, "peer", "Stream it"),
            message(2, "agent", "Hello"),
        );
        TaskView {
            id: TaskId {
                conversation: "c".into(),
                start: 1,
            },
            state: State::InputRequired,
            messages: vec![mine, answer.clone()],
            answer: Some(answer),
            earlier: Vec::new(),
            approval: None,
            latest_seq: 3,
            ts: "2026-11-27T00:00:00.000Z".into(),
        }
    }

    /// A task that was answered before the stream read it back still gets the answer's
    /// `working` update and the settling one, when announced from the peer's message; from
    /// the task's latest seq (a peer subscribing again), only the settling state is new.
    #[test]
    fn an_answer_already_in_the_task_is_announced_after_the_peers_message() {
        let view = answered();
        let mut queue = std::collections::VecDeque::new();
        let mut sent = 1;
        assert!(announce("peer", &mut sent, &view, &mut queue));
        assert_eq!(sent, 3);
        let states: Vec<&str> = queue
            .iter()
            .map(|u| u["statusUpdate"]["status"]["state"].as_str().unwrap())
            .collect();
        assert_eq!(states, ["TASK_STATE_WORKING", "TASK_STATE_INPUT_REQUIRED"]);
        assert_eq!(
            queue[0]["statusUpdate"]["status"]["message"]["parts"][0]["text"],
            "Hello"
        );

        let mut queue = std::collections::VecDeque::new();
        let mut sent = 3;
        assert!(announce("peer", &mut sent, &view, &mut queue));
        assert_eq!(queue.len(), 1, "{queue:?}");
    }
}
