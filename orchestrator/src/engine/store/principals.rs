//! The principals a store knows: tenants, and the tokens that speak for an agent of one
//! (stored only as a hash). Every backend implements [`Principals`]; [`super::Store`] extends it.

use proto_spec::{TenantSummary, TokenSummary};

use crate::engine::error::Result;

pub use proto_spec::tenant::{valid_tenant, DEFAULT_TENANT};

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
    /// Stores a token's hash; refused (`Forbidden`) when the agent id is one a scenario
    /// declared as a participant the server runs, and (`InvalidParams`) when its tenant does
    /// not exist.
    fn insert_token(&self, hash: &str, record: &TokenRecord) -> Result<()>;
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
