//! Tenants and tokens in the SQLite file ([`Principals`]).

use proto_spec::{TenantQuotas, TenantSummary, TokenSummary};
use rusqlite::{params, OptionalExtension};

use super::SqliteStore;
use crate::engine::error::Result;
use crate::engine::store::{
    Principals, TenantUsage, TokenRecord, TokenSelector, TOKEN_ID_LEN, USAGE_KEPT_MS,
};

impl Principals for SqliteStore {
    fn create_tenant(&self, name: &str) -> Result<()> {
        let conn = self.files.open(false)?;
        let made = conn.execute(
            "INSERT INTO tenants (name, created_ms) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            params![name, super::super::now_ms()],
        )?;
        if made == 0 {
            return Err(super::super::tenant_taken(name));
        }
        Ok(())
    }

    fn list_tenants(&self) -> Result<Vec<TenantSummary>> {
        self.with_reader(|conn| {
            let mut st = conn.prepare_cached(
                "SELECT t.name, t.created_ms, (SELECT count(*) FROM tokens k WHERE k.tenant = t.name), \
                 t.quotas FROM tenants t ORDER BY t.name",
            )?;
            let rows = st.query_map([], |r| {
                Ok(TenantSummary {
                    name: r.get(0)?,
                    created_ms: r.get(1)?,
                    tokens: r.get::<_, i64>(2)? as u64,
                    quotas: super::super::quotas_of(r.get::<_, Option<String>>(3)?.as_deref()),
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn set_tenant_quotas(&self, name: &str, quotas: &TenantQuotas) -> Result<()> {
        let conn = self.files.open(false)?;
        let json = (!quotas.is_empty()).then(|| serde_json::to_string(quotas).unwrap_or_default());
        let set = conn.execute(
            "UPDATE tenants SET quotas = ?2 WHERE name = ?1",
            params![name, json],
        )?;
        if set == 0 {
            return Err(super::super::no_tenant(name));
        }
        Ok(())
    }

    fn insert_token(&self, hash: &str, record: &TokenRecord, cap: Option<u64>) -> Result<()> {
        let mut conn = self.files.open(false)?;
        // The check and the insert in one write transaction: a conversation declaring the id
        // commits either before (and the token is refused) or after (and it is refused).
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let tenant: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM tenants WHERE name = ?1)",
            [&record.tenant],
            |r| r.get(0),
        )?;
        if !tenant {
            return Err(super::super::no_tenant(&record.tenant));
        }
        let declared: bool = tx.query_row(
            "SELECT EXISTS (SELECT 1 FROM declared_agents WHERE agent_id = ?1)",
            [proto_spec::tenant::key(&record.tenant, &record.agent_id)],
            |r| r.get(0),
        )?;
        if declared {
            return Err(super::super::declared_refusal(&record.agent_id));
        }
        if let Some(cap) = cap {
            let held: i64 = tx.query_row(
                "SELECT count(*) FROM tokens WHERE tenant = ?1",
                [&record.tenant],
                |r| r.get(0),
            )?;
            if held as u64 >= cap {
                return Err(super::super::tokens_quota(&record.tenant, cap, held as u64));
            }
        }
        tx.execute(
            "INSERT INTO tokens (hash, tenant, agent_id, admin, operator, created_ms, expires_ms) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                hash,
                record.tenant,
                record.agent_id,
                record.admin,
                record.operator,
                super::super::now_ms(),
                record.expires_ms
            ],
        )?;
        tx.commit()?;
        Ok(())
    }

    fn agent_has_token(&self, tenant: &str, agent_id: &str) -> Result<bool> {
        self.with_reader(|conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM tokens WHERE tenant = ?1 AND agent_id = ?2)",
                )?
                .query_row([tenant, agent_id], |r| r.get(0))?)
        })
    }

    fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>> {
        self.with_reader(|conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT tenant, agent_id, admin, operator, expires_ms FROM tokens WHERE hash = ?1",
                )?
                .query_row([hash], |r| {
                    Ok(TokenRecord {
                        tenant: r.get(0)?,
                        agent_id: r.get(1)?,
                        admin: r.get(2)?,
                        operator: r.get(3)?,
                        expires_ms: r.get(4)?,
                    })
                })
                .optional()?)
        })
    }

    fn list_tokens(&self, tenant: Option<&str>) -> Result<Vec<TokenSummary>> {
        self.with_reader(|conn| {
            let mut st = conn.prepare_cached(
                "SELECT substr(hash, 1, ?1), tenant, agent_id, admin, operator, created_ms, \
                 last_used_ms, expires_ms FROM tokens WHERE ?2 IS NULL OR tenant = ?2 \
                 ORDER BY created_ms, hash",
            )?;
            let rows = st.query_map(params![TOKEN_ID_LEN as i64, tenant], |r| {
                Ok(TokenSummary {
                    id: r.get(0)?,
                    tenant: r.get(1)?,
                    agent_id: r.get(2)?,
                    admin: r.get(3)?,
                    operator: r.get(4)?,
                    created_ms: r.get(5)?,
                    last_used_ms: r.get(6)?,
                    expires_ms: r.get(7)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }

    fn revoke_tokens(&self, which: &TokenSelector, tenant: Option<&str>) -> Result<usize> {
        let conn = self.files.open(false)?;
        Ok(match which {
            TokenSelector::Id(id) => conn.execute(
                "DELETE FROM tokens WHERE substr(hash, 1, length(?1)) = ?1 \
                 AND (?2 IS NULL OR tenant = ?2)",
                params![id, tenant],
            )?,
            TokenSelector::Agent(agent) => conn.execute(
                "DELETE FROM tokens WHERE agent_id = ?1 AND (?2 IS NULL OR tenant = ?2)",
                params![agent, tenant],
            )?,
        })
    }

    fn touch_tokens(&self, used: &[(String, i64)]) -> Result<()> {
        if used.is_empty() {
            return Ok(());
        }
        let mut conn = self.files.open(false)?;
        let tx = conn.transaction()?;
        {
            let mut st =
                tx.prepare_cached("UPDATE tokens SET last_used_ms = ?2 WHERE hash = ?1")?;
            for (hash, at) in used {
                st.execute(params![hash, at])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    fn live_tokens(&self, hashes: &[String], now_ms: i64) -> Result<Vec<String>> {
        self.with_reader(|conn| {
            let mut st = conn.prepare_cached(
                "SELECT hash FROM tokens WHERE hash = ?1 AND (expires_ms IS NULL OR expires_ms > ?2)",
            )?;
            let mut live = Vec::new();
            for h in hashes {
                if let Some(found) = st
                    .query_row(params![h, now_ms], |r| r.get::<_, String>(0))
                    .optional()?
                {
                    live.push(found);
                }
            }
            Ok(live)
        })
    }

    fn exchange_usage(
        &self,
        node: &str,
        mine: &[TenantUsage],
        now_ms: i64,
    ) -> Result<Vec<TenantUsage>> {
        let mut conn = self.files.open(false)?;
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        {
            // SQLite numbers `$1`…`$7` in the order they appear: as PostgreSQL does.
            let mut put = tx.prepare_cached(super::super::USAGE_PUT)?;
            for u in mine {
                put.execute(params![
                    node,
                    u.tenant,
                    u.appends_per_second as i64,
                    u.connections as i64,
                    u.llm_day,
                    u.llm_tokens as i64,
                    now_ms
                ])?;
            }
        }
        tx.execute(super::super::USAGE_FORGET, [now_ms - USAGE_KEPT_MS])?;
        let rows = {
            let mut st = tx.prepare_cached(super::super::USAGE_OTHERS)?;
            let rows = st.query_map([node], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })?;
            rows.collect::<rusqlite::Result<Vec<_>>>()?
        };
        tx.commit()?;
        Ok(super::super::sum_usage(rows, now_ms))
    }

    fn stored_bytes(&self) -> Result<Vec<(String, u64)>> {
        // `instr` is SQLite's `strpos`.
        let tenant = super::super::TENANT_OF_ID.replace("strpos", "instr");
        self.with_reader(|conn| {
            let mut st = conn.prepare(&format!(
                "SELECT {tenant} AS t, sum(length(e.payload)) FROM events e JOIN conversations c ON c.num = e.conv GROUP BY t"
            ))?;
            let rows = st.query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)?.max(0) as u64)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
    }
}
