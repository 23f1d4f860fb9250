//! Tokens and tenants over the protocol: a tenant's admins mint, list and revoke the tenant's
//! tokens (`createToken`, `listTokens`, `revokeToken`; REST: `POST /tokens`, `GET /tokens`,
//! `DELETE /tokens/{id}`); an operator does the same for any tenant (`tenant`), and makes and
//! lists tenants (`createTenant`, `listTenants`; `POST /tenants`, `GET /tenants`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `createToken` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateTokenParams {
    /// The agent id it speaks as, in the caller's tenant (1–128 characters of letters, digits
    /// and `. _ : @ -`).
    pub agent_id: String,
    /// Whether it administers the tenant.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
    /// How long it is accepted from now, as a scenario's durations are written: milliseconds,
    /// or text such as `"30d"`, `"12h"`, `"90m"` (at most ten years); until revoked when
    /// absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<Value>")]
    pub expires_in: Option<Value>,
    /// The tenant (operators only; the caller's own by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// `createToken` result: the token, shown this once (only its hash is stored), and what
/// `listTokens` shows of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateTokenResult {
    /// The token.
    pub token: String,
    /// Its id (`revokeToken` takes it).
    pub id: String,
    /// The tenant it belongs to.
    pub tenant: String,
    /// The agent it speaks as.
    pub agent_id: String,
    /// Whether it administers its tenant.
    pub admin: bool,
    /// When it stops being accepted (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<i64>,
}

/// A token as `listTokens` shows it: never the token, nor its whole hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenSummary {
    /// Its id: the first 12 hex digits of its hash (`revokeToken` takes it).
    pub id: String,
    /// The tenant it belongs to.
    pub tenant: String,
    /// The agent it speaks as.
    pub agent_id: String,
    /// Whether it administers its tenant.
    pub admin: bool,
    /// Whether it is an operator's (it administers every tenant).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub operator: bool,
    /// When it was made (ms since the epoch).
    pub created_ms: i64,
    /// When it last authenticated (ms since the epoch; recorded at most once a minute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_used_ms: Option<i64>,
    /// When it stops being accepted (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<i64>,
}

/// `listTokens` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListTokensParams {
    /// The tenant (operators only; the caller's own by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// `listTokens` result: the caller's tenant's tokens, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListTokensResult {
    /// Each token.
    pub tokens: Vec<TokenSummary>,
}

/// `revokeToken` params: a token by its id, or every token of an agent (one of the two).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RevokeTokenParams {
    /// A token's id (at least 8 hex digits of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Every token of this agent instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The tenant (operators only; the caller's own by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// `revokeToken` result. The connections and streams that authenticated with a revoked token
/// are closed at once on the node that revoked it, and within the token recheck on the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevokeTokenResult {
    /// How many tokens were revoked (0: none matched).
    pub revoked: u64,
}

/// `createTenant` params (operators).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateTenantParams {
    /// Its name: 1–64 lowercase letters, digits and `-`, not starting with `-`.
    pub name: String,
}

/// A tenant as `listTenants` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantSummary {
    /// Its name.
    pub name: String,
    /// When it was made (ms since the epoch).
    pub created_ms: i64,
    /// How many tokens it has.
    pub tokens: u64,
    /// The quotas set for it (those not set are the server's defaults).
    #[serde(default, skip_serializing_if = "TenantQuotas::is_empty")]
    pub quotas: TenantQuotas,
}

/// A tenant's quotas: each one given holds it to that limit (0: none), each one absent leaves
/// the server's default (`serve --tenant-…`). Refusals are `TenantQuotaExceeded` (-32033) with
/// `data: {quota, limit, used}`, the quota by its name here.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TenantQuotas {
    /// Conversations open at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_conversations: Option<u64>,
    /// Bytes of payload its conversations' logs hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_bytes: Option<u64>,
    /// Events appended a second (messages and traces, across the cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub appends_per_second: Option<u64>,
    /// WebSocket connections open at once (across the cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    /// Model tokens the tenant's `llm` participants spend a day (UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm_tokens_per_day: Option<u64>,
    /// Tokens (credentials) it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
}

impl TenantQuotas {
    /// Whether none is set.
    pub fn is_empty(&self) -> bool {
        self == &TenantQuotas::default()
    }

    /// `self` with every 0 (no limit) left out.
    pub fn without_zeros(self) -> TenantQuotas {
        let keep = |v: Option<u64>| v.filter(|&n| n > 0);
        TenantQuotas {
            open_conversations: keep(self.open_conversations),
            stored_bytes: keep(self.stored_bytes),
            appends_per_second: keep(self.appends_per_second),
            connections: keep(self.connections),
            llm_tokens_per_day: keep(self.llm_tokens_per_day),
            tokens: keep(self.tokens),
        }
    }

    /// `self`, with what `over` sets in its place.
    pub fn overridden_by(&self, over: &TenantQuotas) -> TenantQuotas {
        TenantQuotas {
            open_conversations: over.open_conversations.or(self.open_conversations),
            stored_bytes: over.stored_bytes.or(self.stored_bytes),
            appends_per_second: over.appends_per_second.or(self.appends_per_second),
            connections: over.connections.or(self.connections),
            llm_tokens_per_day: over.llm_tokens_per_day.or(self.llm_tokens_per_day),
            tokens: over.tokens.or(self.tokens),
        }
    }
}

/// `setTenantQuotas` params (operators): the tenant's quotas, replacing those set before
/// (an absent one goes back to the server's default).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SetTenantQuotasParams {
    /// The tenant.
    pub tenant: String,
    /// Its quotas.
    pub quotas: TenantQuotas,
}

/// `listTenants` params (none).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListTenantsParams {}

/// `listTenants` result: every tenant, by name (operators).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListTenantsResult {
    /// Each tenant.
    pub tenants: Vec<TenantSummary>,
}
