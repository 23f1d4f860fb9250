//! `POST /tokens`, `GET /tokens`, `DELETE /tokens/{id}`: a tenant's admins manage its tokens
//! (the bodies and answers of `createToken`, `listTokens` and `revokeToken`); `POST /tenants`
//! and `GET /tenants`: an operator manages tenants.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use proto_spec::{ListTenantsParams, ListTokensParams, RevokeTokenParams, SetTenantQuotasParams};

use super::{body, ok, ApiResult, Caller, Shared};

/// `POST /tokens`: the token, shown this once (201).
pub(super) async fn create(
    State(s): State<Shared>,
    Caller(who): Caller,
    headers: HeaderMap,
    raw: Body,
) -> ApiResult<Response> {
    let p = body(&s, &headers, raw).await?;
    Ok(ok(StatusCode::CREATED, s.orch.create_token(&who, p).await?))
}

/// `GET /tokens`.
pub(super) async fn list(State(s): State<Shared>, Caller(who): Caller) -> ApiResult<Response> {
    let r = s
        .orch
        .list_tokens(&who, ListTokensParams::default())
        .await?;
    Ok(ok(StatusCode::OK, r))
}

/// `DELETE /tokens/{id}`: `{revoked}` (0 when no token of the tenant has that id).
pub(super) async fn revoke(
    State(s): State<Shared>,
    Caller(who): Caller,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let p = RevokeTokenParams {
        id: Some(id),
        ..RevokeTokenParams::default()
    };
    Ok(ok(StatusCode::OK, s.orch.revoke_token(&who, p).await?))
}

/// `POST /tenants` (operators): 201.
pub(super) async fn create_tenant(
    State(s): State<Shared>,
    Caller(who): Caller,
    headers: HeaderMap,
    raw: Body,
) -> ApiResult<Response> {
    let p = body(&s, &headers, raw).await?;
    Ok(ok(
        StatusCode::CREATED,
        s.orch.create_tenant(&who, p).await?,
    ))
}

/// `GET /tenants` (operators).
pub(super) async fn list_tenants(
    State(s): State<Shared>,
    Caller(who): Caller,
) -> ApiResult<Response> {
    let r = s.orch.list_tenants(&who, ListTenantsParams {}).await?;
    Ok(ok(StatusCode::OK, r))
}

/// `PUT /tenants/{name}/quotas` (operators): the tenant, its quotas set (the body: the quotas).
pub(super) async fn set_quotas(
    State(s): State<Shared>,
    Caller(who): Caller,
    Path(name): Path<String>,
    headers: HeaderMap,
    raw: Body,
) -> ApiResult<Response> {
    let quotas = body(&s, &headers, raw).await?;
    let p = SetTenantQuotasParams {
        tenant: name,
        quotas,
    };
    Ok(ok(StatusCode::OK, s.orch.set_tenant_quotas(&who, p).await?))
}
