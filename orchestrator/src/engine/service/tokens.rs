//! `createToken`, `listTokens` and `revokeToken`: a tenant's admins manage the tenant's tokens
//! over the protocol, as the operator does with `orchestrator token` on the database.

use proto_spec::*;

use super::Orchestrator;
use crate::engine::auth::{hash_token, mint_token, valid_id, Identity};
use crate::engine::error::{refuse, Result};
use crate::engine::store::{now_ms, TokenInfo, TokenRecord, TokenSelector, TOKEN_ID_LEN};

/// The longest life `createToken` gives a token: ten years, in milliseconds.
const MAX_EXPIRES_IN_MS: u64 = 10 * 366 * 24 * 3_600_000;

fn summary(t: TokenInfo) -> TokenSummary {
    TokenSummary {
        id: t.id,
        tenant: t.tenant,
        agent_id: t.agent_id,
        admin: t.admin,
        created_ms: t.created_ms,
        last_used_ms: t.last_used_ms,
        expires_ms: t.expires_ms,
    }
}

impl Orchestrator {
    /// Refuses anyone but an admin of a tenant (an agent a scenario declares never is one).
    fn check_tenant_admin(who: &Identity) -> Result<()> {
        if who.admin && who.scope.is_none() {
            return Ok(());
        }
        Err(refuse(
            ErrorCode::Forbidden,
            "only an admin of the tenant manages its tokens",
        ))
    }

    /// `createToken`: a token of the caller's tenant, shown this once.
    pub async fn create_token(
        &self,
        who: &Identity,
        p: CreateTokenParams,
    ) -> Result<CreateTokenResult> {
        Self::check_tenant_admin(who)?;
        if !valid_id(&p.agent_id) || p.agent_id == ORCHESTRATOR_AUTHOR {
            return Err(refuse(
                ErrorCode::InvalidParams,
                "agentId: 1-128 characters of letters, digits and . _ : @ - (not `orchestrator`)",
            ));
        }
        let expires_ms = match p.expires_in_ms {
            Some(0) => {
                return Err(refuse(
                    ErrorCode::InvalidParams,
                    "expiresInMs: a token must live a while",
                ))
            }
            Some(ms) if ms > MAX_EXPIRES_IN_MS => {
                return Err(refuse(
                    ErrorCode::InvalidParams,
                    format!("expiresInMs: at most {MAX_EXPIRES_IN_MS} (ten years)"),
                ))
            }
            Some(ms) => Some(now_ms().saturating_add(ms as i64)),
            None => None,
        };
        let record = TokenRecord {
            tenant: who.tenant.to_string(),
            agent_id: p.agent_id,
            admin: p.admin,
            operator: false,
            expires_ms,
        };
        let store = self.store.clone();
        let stored = record.clone();
        let token =
            tokio::task::spawn_blocking(move || mint_token(store.as_ref(), &stored)).await??;
        tracing::info!(
            tenant = %record.tenant,
            agent = %record.agent_id,
            admin = record.admin,
            by = %who.agent_id,
            "token created"
        );
        Ok(CreateTokenResult {
            info: TokenSummary {
                id: hash_token(&token)[..TOKEN_ID_LEN].to_string(),
                tenant: record.tenant,
                agent_id: record.agent_id,
                admin: record.admin,
                created_ms: now_ms(),
                last_used_ms: None,
                expires_ms,
            },
            token,
        })
    }

    /// `listTokens`: the caller's tenant's tokens, oldest first.
    pub async fn list_tokens(
        &self,
        who: &Identity,
        _p: ListTokensParams,
    ) -> Result<ListTokensResult> {
        Self::check_tenant_admin(who)?;
        let store = self.store.clone();
        let all = tokio::task::spawn_blocking(move || store.list_tokens()).await??;
        Ok(ListTokensResult {
            tokens: all
                .into_iter()
                .filter(|t| *t.tenant == *who.tenant)
                .map(summary)
                .collect(),
        })
    }

    /// `revokeToken`: tokens of the caller's tenant, by id or by agent; the connections and
    /// streams that authenticated with them here are closed at once (on other nodes within
    /// the token recheck).
    pub async fn revoke_token(
        &self,
        who: &Identity,
        p: RevokeTokenParams,
    ) -> Result<RevokeTokenResult> {
        Self::check_tenant_admin(who)?;
        let which = match (p.id, p.agent_id) {
            (Some(id), None) => TokenSelector::id(&id)
                .map_err(|m| refuse(ErrorCode::InvalidParams, format!("id: {m}")))?,
            (None, Some(agent)) => TokenSelector::Agent(agent),
            _ => {
                return Err(refuse(
                    ErrorCode::InvalidParams,
                    "give a token's id or an agentId (one of the two)",
                ))
            }
        };
        let store = self.store.clone();
        let tokens = self.tokens.clone();
        let tenant = who.tenant.to_string();
        let revoked = tokio::task::spawn_blocking(move || -> Result<usize> {
            let n = store.revoke_tokens(&which, Some(&tenant))?;
            if n > 0 {
                tokens.recheck(store.as_ref(), now_ms())?;
            }
            Ok(n)
        })
        .await??;
        Ok(RevokeTokenResult {
            revoked: revoked as u64,
        })
    }
}
