//! `createToken`, `listTokens` and `revokeToken`: a tenant's admins manage the tenant's tokens
//! over the protocol, as the operator does with `orchestrator token` on the database; an
//! operator manages any tenant's (`tenant`), makes and lists tenants (`createTenant`,
//! `listTenants`) and sets their quotas (`setTenantQuotas`).

use proto_spec::*;

use super::Orchestrator;
use crate::engine::auth::{hash_token, mint_token_within, valid_id, Identity};
use crate::engine::error::{refuse, Result};
use crate::engine::store::{now_ms, valid_tenant, TokenRecord, TokenSelector, TOKEN_ID_LEN};

/// The longest life `createToken` gives a token: ten years, in milliseconds.
const LONGEST_LIFE_MS: u64 = 10 * 366 * 24 * 3_600_000;

impl Orchestrator {
    /// The tenant whose tokens `who` manages: `asked` for an operator, else its own, for an
    /// admin of it (an agent a scenario declares never is one); refused otherwise.
    fn token_tenant(who: &Identity, asked: Option<String>) -> Result<String> {
        if who.operator && who.scope.is_none() {
            return Ok(asked.unwrap_or_else(|| who.tenant.to_string()));
        }
        if !who.admin || who.scope.is_some() {
            return Err(refuse(
                ErrorCode::Forbidden,
                "only an admin of the tenant manages its tokens",
            ));
        }
        match asked {
            Some(t) if *t != *who.tenant => Err(refuse(
                ErrorCode::Forbidden,
                "only an operator manages another tenant's tokens",
            )),
            _ => Ok(who.tenant.to_string()),
        }
    }

    /// Refuses anyone but an operator.
    fn check_operator(who: &Identity) -> Result<()> {
        if who.operator && who.scope.is_none() {
            return Ok(());
        }
        Err(refuse(
            ErrorCode::Forbidden,
            "only an operator manages tenants",
        ))
    }

    /// `createTenant` (operators).
    pub async fn create_tenant(
        &self,
        who: &Identity,
        p: CreateTenantParams,
    ) -> Result<TenantSummary> {
        Self::check_operator(who)?;
        if !valid_tenant(&p.name) {
            return Err(refuse(
                ErrorCode::InvalidParams,
                "name: 1-64 lowercase letters, digits and -, not starting with -",
            ));
        }
        let store = self.store.clone();
        let name = p.name.clone();
        tokio::task::spawn_blocking(move || store.create_tenant(&name)).await??;
        tracing::info!(tenant = %p.name, by = %who.agent_id, "tenant created");
        Ok(TenantSummary {
            name: p.name,
            created_ms: now_ms(),
            tokens: 0,
            quotas: TenantQuotas::default(),
        })
    }

    /// `setTenantQuotas` (operators): the tenant's quotas, in force on this node at once and
    /// on the others within [`crate::engine::quotas::EXCHANGE_EVERY`].
    pub async fn set_tenant_quotas(
        &self,
        who: &Identity,
        p: SetTenantQuotasParams,
    ) -> Result<TenantSummary> {
        Self::check_operator(who)?;
        let store = self.store.clone();
        let (name, quotas) = (p.tenant.clone(), p.quotas.clone());
        let tenants = tokio::task::spawn_blocking(move || {
            store.set_tenant_quotas(&name, &quotas)?;
            store.list_tenants()
        })
        .await??;
        self.quotas.set_from(&tenants);
        tracing::info!(tenant = %p.tenant, quotas = ?p.quotas, by = %who.agent_id, "tenant quotas set");
        tenants
            .into_iter()
            .find(|t| t.name == p.tenant)
            .ok_or_else(|| crate::engine::store::no_tenant(&p.tenant))
    }

    /// `listTenants` (operators).
    pub async fn list_tenants(
        &self,
        who: &Identity,
        _p: ListTenantsParams,
    ) -> Result<ListTenantsResult> {
        Self::check_operator(who)?;
        let store = self.store.clone();
        let tenants = tokio::task::spawn_blocking(move || store.list_tenants()).await??;
        Ok(ListTenantsResult { tenants })
    }

    /// `createToken`: a token of the caller's tenant, shown this once.
    pub async fn create_token(
        &self,
        who: &Identity,
        p: CreateTokenParams,
    ) -> Result<CreateTokenResult> {
        let tenant = Self::token_tenant(who, p.tenant)?;
        if !valid_id(&p.agent_id) || p.agent_id == ORCHESTRATOR_AUTHOR {
            return Err(refuse(
                ErrorCode::InvalidParams,
                "agentId: 1-128 characters of letters, digits and . _ : @ - (not `orchestrator`)",
            ));
        }
        let expires_ms = match &p.expires_in {
            None => None,
            Some(v) => {
                let life = crate::engine::scenario::parse_duration(v)
                    .map_err(|m| refuse(ErrorCode::InvalidParams, format!("expiresIn: {m}")))?;
                if life.is_zero() || life.as_millis() > u128::from(LONGEST_LIFE_MS) {
                    return Err(refuse(
                        ErrorCode::InvalidParams,
                        "expiresIn: more than nothing and at most ten years (\"3660d\")",
                    ));
                }
                Some(now_ms().saturating_add(life.as_millis() as i64))
            }
        };
        let record = TokenRecord {
            tenant,
            agent_id: p.agent_id,
            admin: p.admin,
            operator: false,
            expires_ms,
        };
        let store = self.store.clone();
        let stored = record.clone();
        let cap = self.quotas.tokens_cap(&record.tenant);
        let token =
            tokio::task::spawn_blocking(move || mint_token_within(store.as_ref(), &stored, cap))
                .await??;
        tracing::info!(
            tenant = %record.tenant,
            agent = %record.agent_id,
            admin = record.admin,
            by = %who.agent_id,
            "token created"
        );
        Ok(CreateTokenResult {
            id: hash_token(&token)[..TOKEN_ID_LEN].to_string(),
            tenant: record.tenant,
            agent_id: record.agent_id,
            admin: record.admin,
            expires_ms,
            token,
        })
    }

    /// `listTokens`: the caller's tenant's tokens, oldest first.
    pub async fn list_tokens(
        &self,
        who: &Identity,
        p: ListTokensParams,
    ) -> Result<ListTokensResult> {
        let tenant = Self::token_tenant(who, p.tenant)?;
        let store = self.store.clone();
        let tokens =
            tokio::task::spawn_blocking(move || store.list_tokens(Some(&tenant))).await??;
        Ok(ListTokensResult { tokens })
    }

    /// `revokeToken`: tokens of the caller's tenant, by id or by agent; the connections and
    /// streams that authenticated with them here are closed at once (on other nodes within
    /// the token recheck).
    pub async fn revoke_token(
        &self,
        who: &Identity,
        p: RevokeTokenParams,
    ) -> Result<RevokeTokenResult> {
        let tenant = Self::token_tenant(who, p.tenant)?;
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
