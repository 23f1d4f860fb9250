//! The routes of one conversation's life: list, create, read, post, pause, resume and
//! delete (each the protocol method of the same name).

use super::*;

pub(super) async fn list(
    State(s): State<Shared>,
    Caller(who): Caller,
    uri: Uri,
) -> ApiResult<Response> {
    let p: ListConversationsParams = query(&uri)?;
    ok_within(&s, s.orch.list_conversations(&who, p).await?)
}

pub(super) async fn create(
    State(s): State<Shared>,
    Caller(who): Caller,
    headers: HeaderMap,
    raw: Body,
) -> ApiResult<Response> {
    let p: CreateConversationParams = body(&s, &headers, raw).await?;
    let r = s.orch.create_conversation(&who, p).await?;
    Ok(ok(StatusCode::CREATED, r))
}

pub(super) async fn snapshot(
    State(s): State<Shared>,
    Caller(who): Caller,
    PathId(id): PathId,
) -> ApiResult<Response> {
    let snap = s
        .orch
        .get_conversation(
            &who,
            ConversationParams {
                conversation_id: id,
            },
        )
        .await?;
    Ok(ok(StatusCode::OK, snap))
}

pub(super) async fn post_message(
    State(s): State<Shared>,
    Caller(who): Caller,
    PathId(id): PathId,
    headers: HeaderMap,
    raw: Body,
) -> ApiResult<Response> {
    let b: PostMessageBody = body(&s, &headers, raw).await?;
    let header_key = headers
        .get(headers::IDEMPOTENCY_KEY)
        .map(|v| {
            v.to_str()
                .map(str::to_string)
                .map_err(|_| api_error(ErrorCode::InvalidParams, "Idempotency-Key: not text"))
        })
        .transpose()?;
    let client_request_id = match (header_key, b.client_request_id) {
        (Some(h), Some(k)) if h != k => {
            return Err(api_error(
                ErrorCode::InvalidParams,
                "Idempotency-Key and clientRequestId differ; give one, or the same value",
            ))
        }
        (h, k) => h.or(k),
    };
    let r = s
        .orch
        .send_message(
            &who,
            SendMessageParams {
                conversation_id: id,
                payload: b.payload,
                finality: b.finality,
                turn_hint: b.turn_hint,
                client_request_id,
                after_key: None,
            },
        )
        .await?;
    let status = if r.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok(ok(status, r))
}

async fn set_paused(s: Shared, who: Identity, id: String, pause: bool) -> ApiResult<Response> {
    let p = ConversationParams {
        conversation_id: id,
    };
    let r = if pause {
        s.orch.pause_conversation(&who, p).await?
    } else {
        s.orch.resume_conversation(&who, p).await?
    };
    Ok(ok(StatusCode::OK, r))
}

pub(super) async fn delete(
    State(s): State<Shared>,
    Caller(who): Caller,
    PathId(id): PathId,
) -> ApiResult<Response> {
    let p = ConversationParams {
        conversation_id: id,
    };
    let r = s.orch.delete_conversation(&who, p).await?;
    Ok(ok(StatusCode::OK, r))
}

pub(super) async fn pause(
    State(s): State<Shared>,
    Caller(who): Caller,
    PathId(id): PathId,
) -> ApiResult<Response> {
    set_paused(s, who, id, true).await
}

pub(super) async fn resume(
    State(s): State<Shared>,
    Caller(who): Caller,
    PathId(id): PathId,
) -> ApiResult<Response> {
    set_paused(s, who, id, false).await
}
