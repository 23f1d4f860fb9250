//! The HTTP routes beside `/rpc`: SSE, long-poll, REST, `/me`, `/metrics`, `/openapi.json`
//! and the console page. Each route is a thin shell over the method core in [`crate::engine::service`],
//! like the JSON-RPC methods.
//!
//! Every route that touches a conversation needs `Authorization: Bearer <token>`. Errors are
//! `{"error": {code, message, data}}` with the protocol's code and the HTTP status of
//! [`ErrorCode::http_status`]. Bodies and queries are parsed here so that a bad one gets the
//! protocol's error (`ParseError` for broken JSON, `InvalidParams` for a missing or unknown
//! field, `PayloadTooLarge` over the body limit), never a bare text rejection.

mod conversations;
use conversations as conv;
mod tokens;

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use proto_spec::http::headers;
use proto_spec::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::engine::auth::Identity;
use crate::engine::service::Orchestrator;
use crate::engine::telemetry;
use crate::transport::sse;

/// How often an idle SSE stream sends a keep-alive comment.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);

static OPENAPI: LazyLock<String> = LazyLock::new(|| spec::to_pretty(&spec::openapi()));

/// What the HTTP handlers share.
#[derive(Debug)]
pub struct HttpState {
    orch: Arc<Orchestrator>,
}

type Shared = Arc<HttpState>;

/// The routes, ready to merge into the host's router.
pub fn router(orch: Arc<Orchestrator>) -> Router {
    let state = Arc::new(HttpState { orch });
    Router::new()
        .route("/", get(crate::transport::console::page))
        .route("/console/{name}", get(crate::transport::console::file))
        .route("/me", get(me))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .route("/scenarios", get(scenarios))
        .route("/conversations", get(conv::list).post(conv::create))
        .route(
            "/conversations/{id}",
            get(conv::snapshot).delete(conv::delete),
        )
        .route("/conversations/{id}/messages", post(conv::post_message))
        .route("/conversations/{id}/events", get(events))
        .route("/conversations/{id}/wait", get(wait))
        .route("/conversations/{id}/pause", post(conv::pause))
        .route("/conversations/{id}/resume", post(conv::resume))
        .route("/tokens", get(tokens::list).post(tokens::create))
        .route("/tokens/{id}", axum::routing::delete(tokens::revoke))
        .route(
            "/tenants",
            get(tokens::list_tenants).post(tokens::create_tenant),
        )
        .route(
            "/tenants/{name}/quotas",
            axum::routing::put(tokens::set_quotas),
        )
        .fallback(no_route)
        .with_state(state)
}

/// A protocol error as an HTTP response.
#[derive(Debug)]
pub struct ApiError(pub RpcError, pub Option<StatusCode>);

impl From<RpcError> for ApiError {
    fn from(e: RpcError) -> Self {
        ApiError(e, None)
    }
}

impl From<crate::engine::error::Error> for ApiError {
    fn from(e: crate::engine::error::Error) -> Self {
        ApiError(e.to_rpc(), None)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.1.unwrap_or_else(|| {
            StatusCode::from_u16(self.0.code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        });
        error_response(status, &self.0)
    }
}

/// A protocol error as an HTTP answer with `status`: `{"error": {code, message, data}}`, with
/// `WWW-Authenticate` on 401 and `Retry-After` on a rate refusal; counted as a refusal.
pub fn error_response(status: StatusCode, e: &RpcError) -> Response {
    telemetry::refused(e, "http");
    let mut resp = (status, Json(HttpError { error: e.to_wire() })).into_response();
    if status == StatusCode::UNAUTHORIZED {
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    // A rate limit says when to come back, in whole seconds (RFC 9110 §10.2.3).
    let retry_ms = e.data.as_ref().and_then(|d| d["retryAfterMs"].as_u64());
    if let Some(ms) = retry_ms.filter(|_| e.code == ErrorCode::RateLimited) {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(ms.div_ceil(1000)));
    }
    resp
}

type ApiResult<T> = Result<T, ApiError>;

fn api_error(code: ErrorCode, message: impl Into<String>) -> ApiError {
    ApiError(RpcError::new(code, message), None)
}

/// The conversation id in the path, refused in the protocol's error shape when it is no string.
#[derive(Debug)]
pub struct PathId(pub String);

impl FromRequestParts<Shared> for PathId {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<PathId, Response> {
        let Path(id) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                api_error(
                    ErrorCode::InvalidParams,
                    format!("the conversation id in the path: {}", e.body_text()),
                )
                .into_response()
            })?;
        Ok(PathId(id))
    }
}

/// The caller, from `Authorization: Bearer <token>`.
#[derive(Debug)]
pub struct Caller(pub Identity);

impl FromRequestParts<Shared> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> ApiResult<Caller> {
        let who = state.orch.authenticate(bearer(parts)?).await?;
        state.orch.admit(&who).await.map_err(ApiError::from)?;
        Ok(Caller(who))
    }
}

/// The caller of a stream that stays open (SSE), with the grant that ends it when the token is
/// revoked or expires.
#[derive(Debug)]
pub struct StreamCaller(pub Identity, pub Arc<crate::engine::auth::Grant>);

impl FromRequestParts<Shared> for StreamCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> ApiResult<StreamCaller> {
        let (who, grant) = state.orch.authenticate_held(bearer(parts)?).await?;
        state.orch.admit(&who).await.map_err(ApiError::from)?;
        Ok(StreamCaller(who, grant))
    }
}

/// The token of `Authorization: Bearer <token>`.
fn bearer(parts: &Parts) -> ApiResult<&str> {
    bearer_of(&parts.headers)
}

/// The token of the `Authorization: Bearer <token>` of `headers`.
fn bearer_of(headers: &axum::http::HeaderMap) -> ApiResult<&str> {
    {
        let value = headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| {
                api_error(
                    ErrorCode::Unauthenticated,
                    "send Authorization: Bearer <token>",
                )
            })?
            .to_str()
            .map_err(|_| {
                api_error(
                    ErrorCode::Unauthenticated,
                    "the Authorization header is not text",
                )
            })?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                api_error(
                    ErrorCode::Unauthenticated,
                    "the Authorization header must be `Bearer <token>`",
                )
            })?;
        Ok(token)
    }
}

/// Parses a query into `T`, refusing a bad one with `InvalidParams`.
fn query<T: DeserializeOwned>(uri: &Uri) -> ApiResult<T> {
    Query::<T>::try_from_uri(uri).map(|q| q.0).map_err(|e| {
        api_error(
            ErrorCode::InvalidParams,
            format!("query: {}", e.body_text()),
        )
    })
}

/// Reads a JSON body of at most the frame limit into `T`.
async fn body<T: DeserializeOwned>(
    state: &HttpState,
    headers: &HeaderMap,
    body: Body,
) -> ApiResult<T> {
    let limit = state.orch.limits().max_frame_bytes as usize;
    let too_large = || {
        ApiError::from(
            RpcError::new(
                ErrorCode::PayloadTooLarge,
                format!("the body is over the limit of {limit} bytes"),
            )
            .with_data(serde_json::json!({"limit": limit})),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let bytes = read_body(body, limit, state.orch.limits().header_timeout)
        .await?
        .map_err(|e| {
            let over_limit =
                std::iter::successors(Some(&e as &(dyn std::error::Error + 'static)), |err| {
                    err.source()
                })
                .any(|err| err.is::<http_body_util::LengthLimitError>());
            if over_limit {
                too_large()
            } else {
                api_error(
                    ErrorCode::InvalidRequest,
                    format!("the body could not be read: {e}"),
                )
            }
        })?;
    serde_json::from_slice(&bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::from(
            RpcError::new(ErrorCode::InvalidParams, format!("invalid body: {e}")).with_data(
                serde_json::json!({"hint": "the body is one JSON object with camelCase fields; see /openapi.json"}),
            ),
        ),
        _ => api_error(ErrorCode::ParseError, format!("the body is not JSON: {e}")),
    })
}

/// Reads a body of at most `limit` bytes, refusing one that has not arrived within `timeout`
/// (`408`, so that a missing or unfinished body does not hold a connection).
pub async fn read_body(
    body: Body,
    limit: usize,
    timeout: Duration,
) -> ApiResult<Result<axum::body::Bytes, axum::Error>> {
    tokio::time::timeout(timeout, axum::body::to_bytes(body, limit))
        .await
        .map_err(|_| {
            ApiError(
                RpcError::new(
                    ErrorCode::InvalidRequest,
                    format!("the body did not arrive within {} s", timeout.as_secs_f64()),
                ),
                Some(StatusCode::REQUEST_TIMEOUT),
            )
        })
}

fn ok<T: Serialize>(status: StatusCode, value: T) -> Response {
    (status, Json(value)).into_response()
}

/// An answer that may be long (events, a list), refused with `ResponseTooLarge` over the
/// answer limit that every transport shares.
fn ok_within<T: Serialize>(s: &HttpState, value: T) -> ApiResult<Response> {
    let body =
        serde_json::to_vec(&value).map_err(|e| api_error(ErrorCode::Internal, e.to_string()))?;
    let max = s.orch.limits().max_response_bytes();
    if body.len() > max {
        return Err(ApiError::from(
            RpcError::new(
                ErrorCode::ResponseTooLarge,
                format!(
                    "the answer is {} bytes, over the limit of {max}: ask for fewer events",
                    body.len()
                ),
            )
            .with_data(serde_json::json!({"limit": max})),
        ));
    }
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

async fn metrics() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        telemetry::render(),
    )
        .into_response()
}

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        OPENAPI.as_str(),
    )
        .into_response()
}

/// The longest request target (path and query) served; a longer one is answered `414`.
pub const MAX_URI: usize = 8 * 1024;

/// Refuses a request target over [`MAX_URI`] with the protocol's error (hyper's own limit, at
/// 64 KiB, answers with an empty body).
pub async fn limit_uri(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if len > MAX_URI {
        return ApiError(
            RpcError::new(
                ErrorCode::InvalidRequest,
                format!("the request target is {len} bytes, over the limit of {MAX_URI}"),
            )
            .with_data(serde_json::json!({"limit": MAX_URI})),
            Some(StatusCode::URI_TOO_LONG),
        )
        .into_response();
    }
    next.run(req).await
}

/// A route asked with a method it does not take: `405` with the protocol's error.
pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError(
        RpcError::new(
            ErrorCode::MethodNotFound,
            format!("{} does not take {method}; see /openapi.json", uri.path()),
        ),
        Some(StatusCode::METHOD_NOT_ALLOWED),
    )
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    api_error(
        ErrorCode::MethodNotFound,
        format!("no route {method} {}; see /openapi.json", uri.path()),
    )
}

async fn me(State(s): State<Shared>, Caller(who): Caller) -> Response {
    ok(StatusCode::OK, s.orch.who_am_i(&who))
}

/// `GET /conversations`: a page of `listConversations`, its params in the query.
async fn wait(
    State(s): State<Shared>,
    StreamCaller(who, grant): StreamCaller,
    PathId(id): PathId,
    uri: Uri,
    headers: axum::http::HeaderMap,
) -> ApiResult<Response> {
    let q: WaitQuery = query(&uri)?;
    let _slot = s.orch.open_stream(&who, "longpoll")?;
    let revoked = || {
        ApiError::from(RpcError::new(
            ErrorCode::Unauthenticated,
            "the token this request carries was revoked or has expired",
        ))
    };
    // The wait ends when the token is revoked or expires (as the node's recheck learns it).
    let started = std::time::Instant::now();
    let r = tokio::select! {
        r = s.orch.wait_events(&who, &id, q) => r?,
        () = grant.revoked() => return Err(revoked()),
    };
    // A wait that parked asks the database again before it answers: the token may have gone
    // since the wait began, sooner than the recheck would say.
    if started.elapsed() >= PARKED {
        let token = bearer_of(&headers)?;
        s.orch.authenticate(token).await.map_err(|_| revoked())?;
    }
    ok_within(&s, r)
}

/// A long-poll that took this long waited for something (it did not answer at once), and checks
/// its token again before it answers.
const PARKED: std::time::Duration = std::time::Duration::from_millis(1);

/// `GET /scenarios`: the scenario library (admins).
async fn scenarios(State(s): State<Shared>, Caller(who): Caller) -> ApiResult<Response> {
    Ok(ok(StatusCode::OK, s.orch.list_scenarios(&who)?))
}

/// The SSE stream: the log after the cursor (`Last-Event-ID`, else `sinceSeq`, else 0), then
/// live events. It reads at its own pace from the conversation's ring or the store, so a slow
/// reader never holds anyone back and never skips; it ends when the server stops.
async fn events(
    State(s): State<Shared>,
    StreamCaller(who, grant): StreamCaller,
    PathId(id): PathId,
    headers: HeaderMap,
    uri: Uri,
) -> ApiResult<Response> {
    let q: EventsQuery = query(&uri)?;
    let resume_after = headers
        .get(headers::LAST_EVENT_ID)
        .map(|v| {
            v.to_str()
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    api_error(
                        ErrorCode::InvalidParams,
                        "Last-Event-ID: the seq of the last event received (a number)",
                    )
                })
        })
        .transpose()?;
    let since = resume_after.or(q.since_seq).unwrap_or(0);
    let slot = s.orch.open_stream(&who, "sse")?;
    let feed = s
        .orch
        .subscribe(
            &who,
            SubscribeParams {
                conversation_id: Some(id),
                since_seq: Some(since),
                cursors: None,
            },
        )
        .await?;
    let Ok((conv, cursor)) = feed.into_one() else {
        // A feed of one conversation starts with nothing read.
        return Err(api_error(
            ErrorCode::Internal,
            "the stream of one conversation could not be opened",
        ));
    };
    let follow = sse::Follow::new(
        s.orch.store().clone(),
        s.orch.hub(),
        conv,
        cursor,
        grant,
        KEEP_ALIVE,
        slot,
    );
    let mut resp = Response::new(Body::from_stream(follow.into_stream()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(resp)
}
