//! `ListTasks`: the peer's tasks, a page at a time.
//!
//! Only contexts the peer started through the adapter from the scenario it calls are listed
//! (the peer's connection lists only the peer's conversations; each is then checked as every
//! other call checks it). Every task of a context has the same status time, the context's last
//! event, so the listing orders contexts by that time (newest first) and, within a context,
//! tasks by their first seq (newest first); a page token names the last task of the page
//! before. A context's log is read only when it changed since the peer's last listing or when
//! one of its tasks is on the page: what was learned of each context is kept per peer
//! ([`Listed`]), so `totalSize` costs no reads of the contexts that did not change.

use super::*;
use crate::exchange::{history_length, owns};
use crate::peers::{Listed, CACHED_CONTEXTS};

/// The most tasks one `ListTasks` page holds, and how many when the caller does not say.
const MAX_PAGE_SIZE: u64 = 100;
const DEFAULT_PAGE_SIZE: u64 = 50;

/// A task's place in the listing: its context's last event (ms), the context, the task's first
/// seq. The listing runs from the greatest place down.
type Place = (i64, String, u64);

fn encode_token(place: &Place) -> String {
    hex::encode(json!({"ts": place.0, "c": place.1, "s": place.2}).to_string())
}

fn decode_token(token: &str) -> Result<Place, A2aError> {
    let bad = || {
        A2aError::invalid_params(format!(
            "pageToken: {token:?} is not a token this server gave"
        ))
    };
    let bytes = hex::decode(token).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    match (v["ts"].as_i64(), v["c"].as_str(), v["s"].as_u64()) {
        (Some(ts), Some(c), Some(s)) => Ok((ts, c.to_string(), s)),
        _ => Err(bad()),
    }
}

fn millis(ts: Option<&str>) -> i64 {
    ts.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map_or(0, |t| t.timestamp_millis())
}

/// What a `ListTasks` asks for.
struct Query {
    history: Option<usize>,
    page_size: usize,
    status: Option<String>,
    after_ms: Option<i64>,
    from: Option<Place>,
    context: Option<String>,
}

fn read_query(params: &Value) -> Result<Query, A2aError> {
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
    } as usize;
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
    let from = match params["pageToken"].as_str() {
        None | Some("") => None,
        Some(t) => Some(decode_token(t)?),
    };
    let context = params["contextId"]
        .as_str()
        .filter(|c| !c.is_empty())
        .map(str::to_string);
    Ok(Query {
        history,
        page_size,
        status,
        after_ms,
        from,
        context,
    })
}

/// The peer's contexts that may hold tasks the query wants, newest first.
async fn contexts(call: &Call<'_>, q: &Query) -> Result<Vec<Snapshot>, A2aError> {
    let mut found: Vec<Snapshot> = match &q.context {
        Some(c) => match owns(call, c).await {
            Ok(()) => vec![call
                .client()
                .get_conversation(c)
                .await
                .map_err(A2aError::upstream)?],
            Err(_) => Vec::new(),
        },
        None => {
            // The peer's conversations, active since the time asked for.
            let of_peer = ListConversationsParams {
                participant: Some(call.me().to_string()),
                updated_after: q.after_ms.and_then(|t| {
                    chrono::DateTime::from_timestamp_millis(t - 1).map(|d| d.to_rfc3339())
                }),
                ..Default::default()
            };
            let listed = agent_sdk::all_conversations(call.client().as_ref(), of_peer, 100)
                .await
                .map_err(A2aError::upstream)?;
            let mut mine = Vec::new();
            // Only what could be a context the adapter started; each is then checked.
            for s in listed.into_iter().filter(|s| {
                s.conversation_id.starts_with("a2a-")
                    && s.parent_conversation_id.is_none()
                    && s.participants.iter().any(|p| p == call.me())
            }) {
                if owns(call, &s.conversation_id).await.is_ok() {
                    mine.push(s);
                }
            }
            mine
        }
    };
    found.retain(|s| {
        q.after_ms
            .is_none_or(|t| millis(s.last_event_at.as_deref()) >= t)
    });
    found.sort_by(|a, b| {
        let key = |s: &Snapshot| {
            (
                millis(s.last_event_at.as_deref()),
                s.conversation_id.clone(),
            )
        };
        key(b).cmp(&key(a))
    });
    Ok(found)
}

/// Every task of a context with its view, read from its log (and noted in the peer's cache).
async fn read_context(call: &Call<'_>, snapshot: &Snapshot) -> Result<Vec<TaskView>, A2aError> {
    let conversation = &snapshot.conversation_id;
    let events = tasks::events_after(call.client(), conversation, 0)
        .await
        .map_err(|e| A2aError::from_read(e, conversation))?;
    let latest = events.last().map_or(0, |e| e.seq);
    let mut views = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if !tasks::opens_task(call.me(), e) {
            continue;
        }
        let id = TaskId {
            conversation: conversation.clone(),
            start: e.seq,
        };
        if let Some(view) = tasks::view(snapshot, &events[i..], call.me(), &id) {
            views.push(view);
        }
    }
    views.reverse();
    let mut listed = call.peer.listed.lock().unwrap_or_else(|e| e.into_inner());
    if listed.len() >= CACHED_CONTEXTS {
        listed.clear();
    }
    let tasks = views.iter().map(|v| (v.id.start, v.state.wire())).collect();
    listed.insert(
        conversation.clone(),
        Listed {
            seq: latest.max(snapshot.latest_seq),
            tasks,
        },
    );
    Ok(views)
}

/// A context's tasks (first seq and state, newest first), from the cache when the context did
/// not change since; with their views when its log was read for them.
async fn summary(call: &Call<'_>, snapshot: &Snapshot) -> Result<Summary, A2aError> {
    let cached = {
        let listed = call.peer.listed.lock().unwrap_or_else(|e| e.into_inner());
        listed
            .get(&snapshot.conversation_id)
            .filter(|l| l.seq == snapshot.latest_seq)
            .map(|l| l.tasks.clone())
    };
    if let Some(tasks) = cached {
        return Ok((tasks, None));
    }
    let views = read_context(call, snapshot).await?;
    let tasks = views.iter().map(|v| (v.id.start, v.state.wire())).collect();
    Ok((tasks, Some(views)))
}

/// A context's tasks (first seq and state), and their views if they were read.
type Summary = (Vec<(u64, &'static str)>, Option<Vec<TaskView>>);

/// `ListTasks`: the peer's tasks, newest status first, a page at a time (`pageSize` 1–100,
/// default 50; `nextPageToken` names where the next page starts), with the filters `contextId`,
/// `status` and `statusTimestampAfter` and `historyLength` applied to each task.
pub(crate) async fn list_tasks(call: &Call<'_>, params: &Value) -> Result<Value, A2aError> {
    let q = read_query(params)?;
    let wanted = |state: &str| q.status.as_deref().is_none_or(|s| s == state);
    let mut total = 0usize;
    let mut page: Vec<Value> = Vec::new();
    let mut last: Option<Place> = None;
    let mut more = false;
    for snapshot in contexts(call, &q).await? {
        let ms = millis(snapshot.last_event_at.as_deref());
        let places = |start: u64| (ms, snapshot.conversation_id.clone(), start);
        let (summary, read) = summary(call, &snapshot).await?;
        let on_page: Vec<u64> = summary
            .iter()
            .filter(|(start, state)| {
                wanted(state) && q.from.as_ref().is_none_or(|f| places(*start) < *f)
            })
            .map(|(start, _)| *start)
            .collect();
        total += summary.iter().filter(|(_, state)| wanted(state)).count();
        let room = q.page_size.saturating_sub(page.len());
        if on_page.is_empty() || room == 0 {
            more |= !on_page.is_empty();
            continue;
        }
        more |= on_page.len() > room;
        let views = match read {
            Some(views) => views,
            None => read_context(call, &snapshot).await?,
        };
        for start in on_page.into_iter().take(room) {
            if let Some(v) = views.iter().find(|v| v.id.start == start) {
                page.push(v.wire(call.me(), q.history));
                last = Some(places(start));
            }
        }
    }
    let next = match (&last, more) {
        (Some(place), true) => encode_token(place),
        _ => String::new(),
    };
    Ok(json!({
        "tasks": page,
        "nextPageToken": next,
        "pageSize": q.page_size,
        "totalSize": total,
    }))
}
