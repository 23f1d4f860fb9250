//! One exchange of the A2A adapter: `SendMessage` (and its streaming form) turned into a
//! message in the conversation and a wait for the reply, `GetTask`, `CancelTask`, and the
//! stream of a task's updates, each read back from the log.

use super::*;

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

/// Posts the peer's message (starting a conversation when it names no context); the task it
/// opens or continues, as read back after it, and the message's seq.
pub(crate) async fn start_exchange(
    app: &App,
    scenario: &str,
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
    let mut fresh = m["contextId"].as_str().is_none() && existing_task.is_none();
    let conversation = match (m["contextId"].as_str(), &existing_task) {
        (_, Some(t)) => t.conversation.clone(),
        (Some(c), None) => c.to_string(),
        (None, None) => {
            // A new context: a new conversation from the scenario. Its id comes from the
            // messageId, so a retried first message finds the same conversation.
            let id = format!("a2a-{}", short_hash(&message_id));
            let created = app
                .client
                .create_conversation(CreateConversationParams {
                    conversation_id: Some(id.clone()),
                    scenario: None,
                    scenario_name: Some(scenario.to_string()),
                    participants: None,
                    metadata: Some(json!({"a2a": {"scenario": scenario, "messageId": message_id}})),
                    parent_conversation_id: None,
                    input: None,
                })
                .await;
            match created {
                Ok(r) => r.conversation_id,
                Err(e) if e.code() == Some(ErrorCode::ConversationExists) => {
                    // A retried first message: it is in the log already (its key answers it),
                    // so waiting for a turn that is now the others' would hold the retry.
                    fresh = false;
                    id
                }
                Err(e) => return Err(A2aError::upstream(e)),
            }
        }
    };
    if let Some(t) = &existing_task {
        // The task must be the peer's, in this context.
        let view = tasks::read(&app.client, &app.me, t)
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
        wait_for_turn(app, &conversation).await;
    }
    let mut payload = MessagePayload::text(text);
    payload.data = data;
    payload.mode = mode;
    if let Some(t) = &existing_task {
        payload.tags = vec![tasks::follow_up_tag(t)];
    }
    let posted = app
        .client
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
    let view = tasks::read(&app.client, &app.me, &task)
        .await
        .map_err(|e| A2aError::from_read(e, &task.wire()))?;
    Ok((view, posted.seq))
}

fn short_hash(s: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    format!("{:016x}", h.finish())
}

async fn wait_for_turn(app: &App, conversation: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut since = 0;
    while Instant::now() < deadline {
        let Ok(snap) = app.client.get_conversation(conversation).await else {
            return;
        };
        if snap.guidance.status != GuidanceStatus::Wait {
            return;
        }
        since = since.max(snap.latest_seq);
        let _ = app
            .client
            .wait_for_change(WaitForChangeParams {
                conversation_id: conversation.to_string(),
                since_seq: since,
                timeout_ms: 2_000,
            })
            .await;
    }
}

/// Waits until the task settles (or `until`), following the log from `view.latest_seq`.
async fn settle(app: &App, mut view: TaskView, until: Instant) -> Result<TaskView, A2aError> {
    while !view.state.settled() && Instant::now() < until {
        let left = until.saturating_duration_since(Instant::now());
        let _ = app
            .client
            .wait_for_change(WaitForChangeParams {
                conversation_id: view.id.conversation.clone(),
                since_seq: view.latest_seq,
                timeout_ms: (left.as_millis() as u64).clamp(1, POLL_MS),
            })
            .await
            .map_err(A2aError::upstream)?;
        view = tasks::read(&app.client, &app.me, &view.id)
            .await
            .map_err(|e| A2aError::from_read(e, &view.id.wire()))?;
    }
    Ok(view)
}

pub(crate) async fn send_message(
    app: &App,
    scenario: &str,
    params: &Value,
) -> Result<Value, A2aError> {
    // Checked before anything is posted.
    let history = history_length(&params["configuration"])?;
    let (view, _) = start_exchange(app, scenario, params).await?;
    let immediate = params["configuration"]["returnImmediately"].as_bool() == Some(true);
    let view = if immediate {
        view
    } else {
        settle(app, view, Instant::now() + app.blocking_wait).await?
    };
    Ok(json!({"task": view.wire(&app.me, history)}))
}

/// `historyLength`: how many of the latest messages to include (none: all); never negative.
fn history_length(v: &Value) -> Result<Option<usize>, A2aError> {
    match v.get("historyLength") {
        None | Some(Value::Null) => Ok(None),
        Some(n) => n.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
            A2aError::invalid_params("historyLength must be a non-negative integer")
        }),
    }
}

/// The task that `params.id` names, read from the log.
pub(crate) async fn task_of(app: &App, params: &Value) -> Result<TaskView, A2aError> {
    let task = params["id"]
        .as_str()
        .ok_or_else(|| A2aError::invalid_params("id: the task id is required"))?;
    let tid = TaskId::parse(task).ok_or_else(|| A2aError::task_not_found(task))?;
    tasks::read(&app.client, &app.me, &tid)
        .await
        .map_err(|e| A2aError::from_read(e, task))
}

pub(crate) async fn get_task(app: &App, params: &Value) -> Result<Value, A2aError> {
    let history = history_length(params)?;
    let view = task_of(app, params).await?;
    Ok(view.wire(&app.me, history))
}

pub(crate) async fn cancel_task(app: &App, params: &Value) -> Result<Value, A2aError> {
    let view = task_of(app, params).await?;
    let task = view.id.wire();
    let tid = view.id.clone();
    if view.state.terminal() {
        return Err(A2aError::new(
            -32002,
            "TASK_NOT_CANCELABLE",
            format!("task {task} is already {}", view.state.wire()),
        ));
    }
    app.client
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
    let view = tasks::read(&app.client, &app.me, &tid)
        .await
        .map_err(|e| A2aError::from_read(e, &task))?;
    Ok(view.wire(&app.me, None))
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
    app: Shared,
    id: Value,
    view: TaskView,
    announce_after: Option<u64>,
) -> Response {
    let frame = move |result: Value| -> Result<SseEvent, Infallible> {
        let body = json!({"jsonrpc": "2.0", "id": id, "result": result});
        Ok(SseEvent::default().data(body.to_string()))
    };
    let mut resp = Sse::new(follow(app, view, announce_after, frame)).into_response();
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    resp
}

struct Follow<F> {
    app: Shared,
    frame: F,
    view: TaskView,
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

fn follow<F>(
    app: Shared,
    view: TaskView,
    announce_after: Option<u64>,
    frame: F,
) -> impl futures::Stream<Item = Result<SseEvent, Infallible>>
where
    F: Fn(Value) -> Result<SseEvent, Infallible> + Send + 'static,
{
    let mut queue = std::collections::VecDeque::new();
    queue.push_back(json!({"task": view.wire(&app.me, None)}));
    let (mut sent, mut done) = (view.latest_seq, view.state.settled());
    if let Some(after) = announce_after {
        sent = after;
        done = announce(&app.me, &mut sent, &view, &mut queue);
    }
    let state = Follow {
        sent,
        done,
        app,
        frame,
        view,
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
            let waited = st
                .app
                .client
                .wait_for_change(WaitForChangeParams {
                    conversation_id: st.view.id.conversation.clone(),
                    since_seq: st.view.latest_seq,
                    timeout_ms: POLL_MS,
                })
                .await;
            // The stream ends without its settling update only when the orchestrator cannot
            // be asked; the peer then reads the task with `GetTask` or subscribes again.
            if let Err(e) = waited {
                tracing::warn!(task = %st.view.id.wire(), error = %e, "a task's stream ends: waiting on its conversation failed");
                return None;
            }
            let next = match tasks::read(&st.app.client, &st.app.me, &st.view.id).await {
                Ok(next) => next,
                Err(e) => {
                    tracing::warn!(task = %st.view.id.wire(), error = ?e, "a task's stream ends: reading the task back failed");
                    return None;
                }
            };
            st.done = announce(&st.app.me, &mut st.sent, &next, &mut st.queue);
            st.view = next;
        }
    })
}

/// The most tasks one `ListTasks` page holds, and how many when the caller does not say.
const MAX_PAGE_SIZE: u64 = 100;
const DEFAULT_PAGE_SIZE: u64 = 50;

/// A task's place in the listing (newest status first, then by id, both descending), which a
/// page token carries: the place of the last task of the page before.
type Place = (i64, String);

fn place_of(view: &TaskView) -> Place {
    let ms = chrono::DateTime::parse_from_rfc3339(&view.ts).map_or(0, |t| t.timestamp_millis());
    (ms, view.id.wire())
}

fn encode_token(place: &Place) -> String {
    hex::encode(json!({"ts": place.0, "id": place.1}).to_string())
}

fn decode_token(token: &str) -> Result<Place, A2aError> {
    let bad = || {
        A2aError::invalid_params(format!(
            "pageToken: {token:?} is not a token this server gave"
        ))
    };
    let bytes = hex::decode(token).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    match (v["ts"].as_i64(), v["id"].as_str()) {
        (Some(ts), Some(id)) => Ok((ts, id.to_string())),
        _ => Err(bad()),
    }
}

/// `ListTasks`: the caller's tasks (every message of the adapter's identity that opened one,
/// in every conversation it takes part in, or in `contextId`), newest status first, a page at a
/// time (`pageSize` 1–100, default 50; `nextPageToken` names where the next page starts), with
/// the filters `status` and `statusTimestampAfter` and `historyLength` applied to each task.
pub(crate) async fn list_tasks(app: &App, params: &Value) -> Result<Value, A2aError> {
    let history = history_length(params)?;
    let page_size = match params.get("pageSize") {
        None | Some(Value::Null) => DEFAULT_PAGE_SIZE,
        Some(n) => match n.as_i64() {
            Some(n) if n < 1 => return Err(A2aError::invalid_params("minimum page size is 1")),
            Some(n) if n as u64 > MAX_PAGE_SIZE => {
                return Err(A2aError::invalid_params(format!(
                    "maximum page size is {MAX_PAGE_SIZE}"
                )))
            }
            Some(n) => n as u64,
            None => return Err(A2aError::invalid_params("pageSize must be an integer")),
        },
    };
    let status = match params.get("status") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() || s == "TASK_STATE_UNSPECIFIED" => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(A2aError::invalid_params("status must be a task state")),
    };
    let after_ms = match params.get("statusTimestampAfter") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_str()
                .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
                .map(|t| t.timestamp_millis())
                .ok_or_else(|| {
                    A2aError::invalid_params("statusTimestampAfter must be an RFC 3339 time")
                })?,
        ),
    };
    let after = match params["pageToken"].as_str() {
        None | Some("") => None,
        Some(t) => Some(decode_token(t)?),
    };
    let contexts: Vec<Snapshot> = match params["contextId"].as_str() {
        Some(c) if !c.is_empty() => match app.client.get_conversation(c).await {
            Ok(s) => vec![s],
            Err(e) if e.code() == Some(ErrorCode::ConversationNotFound) => Vec::new(),
            Err(e) => return Err(A2aError::upstream(e)),
        },
        _ => {
            app.client
                .list_conversations()
                .await
                .map_err(A2aError::upstream)?
                .conversations
        }
    };
    // Only conversations the adapter's identity takes part in (it is an admin, and reads more).
    let mine = contexts
        .iter()
        .filter(|s| s.participants.iter().any(|p| p == &app.me));
    let mut placed: Vec<(Place, TaskView)> = Vec::new();
    for snapshot in mine {
        let events = tasks::events_after(&app.client, &snapshot.conversation_id, 0)
            .await
            .map_err(|e| A2aError::from_read(e, &snapshot.conversation_id))?;
        for (i, e) in events.iter().enumerate() {
            if !tasks::opens_task(&app.me, e) {
                continue;
            }
            let id = TaskId {
                conversation: snapshot.conversation_id.clone(),
                start: e.seq,
            };
            let Some(view) = tasks::view(snapshot, &events[i..], &app.me, &id) else {
                continue;
            };
            let place = place_of(&view);
            let wanted = status.as_deref().is_none_or(|s| view.state.wire() == s)
                && after_ms.is_none_or(|t| place.0 >= t);
            if wanted {
                placed.push((place, view));
            }
        }
    }
    placed.sort_by(|a, b| b.0.cmp(&a.0));
    let total = placed.len();
    let start = after.map_or(0, |p| {
        placed.iter().position(|(q, _)| *q < p).unwrap_or(total)
    });
    let end = (start + page_size as usize).min(total);
    let next = if end < total {
        encode_token(&placed[end - 1].0)
    } else {
        String::new()
    };
    let tasks: Vec<Value> = placed[start..end]
        .iter()
        .map(|(_, v)| v.wire(&app.me, history))
        .collect();
    Ok(json!({
        "tasks": tasks,
        "nextPageToken": next,
        "pageSize": page_size,
        "totalSize": total,
    }))
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
