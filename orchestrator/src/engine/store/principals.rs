//! The principals a store knows: tenants, and the tokens that speak for an agent of one
//! (stored only as a hash). Every backend implements [`Principals`]; [`super::Store`] extends it.

use proto_spec::{TenantQuotas, TenantSummary, TokenSummary};

use crate::engine::error::Result;

pub use proto_spec::tenant::{valid_tenant, DEFAULT_TENANT};

/// What one node reports of one tenant (and what it reads of the others, summed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantUsage {
    /// The tenant.
    pub tenant: String,
    /// Events appended in the last interval, a second.
    pub appends_per_second: u64,
    /// WebSocket connections open.
    pub connections: u64,
    /// Model tokens spent today (UTC), and which day (days since the epoch).
    pub llm_tokens: u64,
    /// The day `llm_tokens` counts.
    pub llm_day: i64,
    /// How many nodes the sum is of (1 for one node's report).
    pub nodes: u64,
}

/// A token as stored (only its hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRecord {
    /// The tenant it belongs to.
    pub tenant: String,
    /// The agent it speaks as (within its tenant).
    pub agent_id: String,
    /// Whether it administers its tenant.
    pub admin: bool,
    /// Whether it operates the server: works across tenants and manages them.
    pub operator: bool,
    /// When it stops being accepted (ms since the epoch), if ever.
    pub expires_ms: Option<i64>,
}

/// How many hex digits of a token's hash name it in `token list` and `token revoke` (its id:
/// a prefix of the hash, which cannot be turned back into the token).
pub const TOKEN_ID_LEN: usize = 12;

/// Which tokens `token revoke` takes away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSelector {
    /// The token whose id (the start of its hash: hex digits, at least 8) this is.
    Id(String),
    /// Every token of this agent.
    Agent(String),
}

impl TokenSelector {
    /// A token id as typed: 8 to 64 hex digits; else why not.
    pub fn id(text: &str) -> std::result::Result<TokenSelector, String> {
        let t = text.trim().to_ascii_lowercase();
        if !(8..=64).contains(&t.len()) || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "{text:?} is not a token id: the ID column of `token list` (hex digits, at least 8)"
            ));
        }
        Ok(TokenSelector::Id(t))
    }
}

pub(crate) fn declared_refusal(agent_id: &str) -> crate::engine::error::Error {
    crate::engine::error::refuse(
        proto_spec::ErrorCode::Forbidden,
        format!(
            "{agent_id:?} is a participant a scenario declared for the server to run; an agent id names one principal, so it cannot also have a token"
        ),
    )
}

/// What a store keeps of principals: tenants and tokens.
pub trait Principals {
    /// Makes a tenant; refused (`InvalidParams`) when the name is taken or not usable.
    fn create_tenant(&self, name: &str) -> Result<()>;
    /// Every tenant, by name.
    fn list_tenants(&self) -> Result<Vec<TenantSummary>>;
    /// Sets a tenant's quotas (replacing those set before); refused (`InvalidParams`) when it
    /// does not exist.
    fn set_tenant_quotas(&self, name: &str, quotas: &TenantQuotas) -> Result<()>;
    /// Stores a token's hash; refused (`Forbidden`) when the agent id is one a scenario
    /// declared as a participant the server runs, (`InvalidParams`) when its tenant does
    /// not exist, and (`TenantQuotaExceeded`) when the tenant holds `cap` tokens already.
    fn insert_token(&self, hash: &str, record: &TokenRecord, cap: Option<u64>) -> Result<()>;
    /// Whether some token speaks as `agent_id` of `tenant`.
    fn agent_has_token(&self, tenant: &str, agent_id: &str) -> Result<bool>;
    /// Finds a token by its hash.
    fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>>;
    /// Every token (of `tenant` only, when given), oldest first; never a token nor its whole
    /// hash (its id is the first [`TOKEN_ID_LEN`] hex digits of the hash).
    fn list_tokens(&self, tenant: Option<&str>) -> Result<Vec<TokenSummary>>;
    /// Deletes the tokens `which` names (of `tenant` only, when given); how many.
    fn revoke_tokens(&self, which: &TokenSelector, tenant: Option<&str>) -> Result<usize>;
    /// Records when tokens (by hash) last authenticated.
    fn touch_tokens(&self, used: &[(String, i64)]) -> Result<()>;
    /// Of `hashes`, those still stored and not expired at `now_ms`.
    fn live_tokens(&self, hashes: &[String], now_ms: i64) -> Result<Vec<String>>;
    /// The bytes of payload each tenant's conversations' logs hold (a scan of the log).
    fn stored_bytes(&self) -> Result<Vec<(String, u64)>>;
    /// Records what node `node` used of its tenants' quotas (`mine`), and answers what the
    /// other nodes used, summed per tenant: their appends and connections from reports of the
    /// last [`USAGE_FRESH_MS`], their model tokens of the day each report names. Reports older
    /// than two days are let go.
    fn exchange_usage(
        &self,
        node: &str,
        mine: &[TenantUsage],
        now_ms: i64,
    ) -> Result<Vec<TenantUsage>>;
}

/// Records one node's report of one tenant (`$1` node … `$7` when), on both backends.
pub(crate) const USAGE_PUT: &str =
    "INSERT INTO tenant_usage (node, tenant, appends, connections, llm_day, llm_tokens, at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (node, tenant) DO UPDATE SET \
     appends = excluded.appends, connections = excluded.connections, \
     llm_day = excluded.llm_day, llm_tokens = excluded.llm_tokens, at_ms = excluded.at_ms";
/// The tenant a conversation's key names, in SQL (`c.id`), on both backends.
pub(crate) const TENANT_OF_ID: &str =
    "CASE WHEN strpos(c.id, '/') > 0 THEN substr(c.id, 1, strpos(c.id, '/') - 1) ELSE 'default' END";

/// Lets go of reports older than `$1` (ms since the epoch).
pub(crate) const USAGE_FORGET: &str = "DELETE FROM tenant_usage WHERE at_ms < $1";
/// The other nodes' reports (`$1`: this node).
pub(crate) const USAGE_OTHERS: &str =
    "SELECT tenant, appends, connections, llm_day, llm_tokens, at_ms FROM tenant_usage WHERE node <> $1";

/// How recent another node's report must be for its appends and connections to count.
pub const USAGE_FRESH_MS: i64 = 3_000;

/// How long reports are kept (a day's model tokens must outlive the nodes that spent them).
pub const USAGE_KEPT_MS: i64 = 2 * 86_400_000;

/// A tenant's quotas as the database keeps them (JSON; none set when absent or unreadable).
pub(crate) fn quotas_of(stored: Option<&str>) -> TenantQuotas {
    stored
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default()
}

/// The refusal of a token over the tenant's quota of tokens.
pub(crate) fn tokens_quota(tenant: &str, cap: u64, held: u64) -> crate::engine::error::Error {
    crate::engine::error::Error::Rpc(
        proto_spec::RpcError::new(
            proto_spec::ErrorCode::TenantQuotaExceeded,
            format!("tenant {tenant} holds {held} tokens, its quota; revoke one first"),
        )
        .with_data(serde_json::json!({"quota": "tokens", "limit": cap, "used": held})),
    )
}

/// Folds the rows of other nodes' reports (tenant, appends, connections, day, model tokens,
/// when) into one sum per tenant.
pub(crate) fn sum_usage(
    rows: impl IntoIterator<Item = (String, i64, i64, i64, i64, i64)>,
    now_ms: i64,
) -> Vec<TenantUsage> {
    let today = now_ms.div_euclid(86_400_000);
    let mut sums: std::collections::BTreeMap<String, TenantUsage> = Default::default();
    for (tenant, appends, connections, day, llm, at) in rows {
        let u = sums.entry(tenant.clone()).or_insert_with(|| TenantUsage {
            tenant,
            llm_day: today,
            ..TenantUsage::default()
        });
        if now_ms - at <= USAGE_FRESH_MS {
            u.appends_per_second += appends.max(0) as u64;
            u.connections += connections.max(0) as u64;
            u.nodes += 1;
        }
        if day == today {
            u.llm_tokens += llm.max(0) as u64;
        }
    }
    sums.into_values().collect()
}

/// The refusal of a tenant that does not exist.
pub(crate) fn no_tenant(name: &str) -> crate::engine::error::Error {
    crate::engine::error::refuse(
        proto_spec::ErrorCode::InvalidParams,
        format!("no tenant {name:?} (`orchestrator tenant create {name}` makes it)"),
    )
}

/// The refusal of a tenant name that is taken.
pub(crate) fn tenant_taken(name: &str) -> crate::engine::error::Error {
    crate::engine::error::refuse(
        proto_spec::ErrorCode::InvalidParams,
        format!("tenant {name:?} exists already"),
    )
}
