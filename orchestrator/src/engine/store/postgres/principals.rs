//! Tenants and tokens in the shared database ([`Principals`]).

use proto_spec::{TenantQuotas, TenantSummary, TokenSummary};

use super::PgStore;
use crate::engine::error::Result;
use crate::engine::store::{
    Principals, TenantUsage, TokenRecord, TokenSelector, TOKEN_ID_LEN, USAGE_KEPT_MS,
};

impl Principals for PgStore {
    fn create_tenant(&self, name: &str) -> Result<()> {
        let name = name.to_string();
        self.with_client(move |c| async move {
            let made = c
                .execute(
                    "INSERT INTO tenants (name, created_ms) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                    &[&name, &super::super::now_ms()],
                )
                .await?;
            if made == 0 {
                return Err(super::super::tenant_taken(&name));
            }
            Ok(())
        })
    }

    fn list_tenants(&self) -> Result<Vec<TenantSummary>> {
        self.with_client(move |c| async move {
            let rows = c
                .query(
                    "SELECT t.name, t.created_ms, (SELECT count(*) FROM tokens k WHERE k.tenant = t.name), \
                     t.quotas FROM tenants t ORDER BY t.name",
                    &[],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| TenantSummary {
                    name: r.get(0),
                    created_ms: r.get(1),
                    tokens: r.get::<_, i64>(2) as u64,
                    quotas: super::super::quotas_of(r.get::<_, Option<String>>(3).as_deref()),
                })
                .collect())
        })
    }

    fn set_tenant_quotas(&self, name: &str, quotas: &TenantQuotas) -> Result<()> {
        let name = name.to_string();
        let json = (!quotas.is_empty()).then(|| serde_json::to_string(quotas).unwrap_or_default());
        self.with_client(move |c| async move {
            let set = c
                .execute(
                    "UPDATE tenants SET quotas = $2 WHERE name = $1",
                    &[&name, &json],
                )
                .await?;
            if set == 0 {
                return Err(super::super::no_tenant(&name));
            }
            Ok(())
        })
    }

    fn insert_token(&self, hash: &str, record: &TokenRecord, cap: Option<u64>) -> Result<()> {
        let (hash, record) = (hash.to_string(), record.clone());
        self.with_client(move |mut c| async move {
            let tx = c.transaction().await?;
            // Serialized with the writers' declarations of the same id (see `commit`).
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                &[&record.agent_id],
            )
            .await?;
            let tenant: bool = tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM tenants WHERE name = $1)",
                    &[&record.tenant],
                )
                .await?
                .get(0);
            if !tenant {
                return Err(super::super::no_tenant(&record.tenant));
            }
            let principal = proto_spec::tenant::key(&record.tenant, &record.agent_id);
            let declared: bool = tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM declared_agents WHERE agent_id = $1)",
                    &[&principal],
                )
                .await?
                .get(0);
            if declared {
                return Err(super::super::declared_refusal(&record.agent_id));
            }
            if let Some(cap) = cap {
                // One count at a time per tenant, across the nodes.
                let lock = format!("tenant tokens {}", record.tenant);
                tx.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", &[&lock])
                    .await?;
                let held: i64 = tx
                    .query_one("SELECT count(*) FROM tokens WHERE tenant = $1", &[&record.tenant])
                    .await?
                    .get(0);
                if held as u64 >= cap {
                    return Err(super::super::tokens_quota(&record.tenant, cap, held as u64));
                }
            }
            tx.execute(
                "INSERT INTO tokens (hash, tenant, agent_id, admin, operator, created_ms, expires_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    &hash,
                    &record.tenant,
                    &record.agent_id,
                    &record.admin,
                    &record.operator,
                    &super::super::now_ms(),
                    &record.expires_ms,
                ],
            )
            .await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn agent_has_token(&self, tenant: &str, agent_id: &str) -> Result<bool> {
        let (tenant, id) = (tenant.to_string(), agent_id.to_string());
        self.with_client(move |c| async move {
            Ok(c.query_one(
                "SELECT EXISTS (SELECT 1 FROM tokens WHERE tenant = $1 AND agent_id = $2)",
                &[&tenant, &id],
            )
            .await?
            .get(0))
        })
    }

    fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let hash = hash.to_string();
        self.with_client(move |c| async move {
            let st = c
                .prepare_cached(
                    "SELECT tenant, agent_id, admin, operator, expires_ms FROM tokens WHERE hash = $1",
                )
                .await?;
            Ok(c.query_opt(&st, &[&hash]).await?.map(|r| TokenRecord {
                tenant: r.get(0),
                agent_id: r.get(1),
                admin: r.get(2),
                operator: r.get(3),
                expires_ms: r.get(4),
            }))
        })
    }

    fn list_tokens(&self, tenant: Option<&str>) -> Result<Vec<TokenSummary>> {
        let tenant = tenant.map(str::to_string);
        self.with_client(move |c| async move {
            let rows = c
                .query(
                    "SELECT substr(hash, 1, $1), tenant, agent_id, admin, operator, created_ms, \
                     last_used_ms, expires_ms FROM tokens WHERE $2::text IS NULL OR tenant = $2 \
                     ORDER BY created_ms, hash",
                    &[&(TOKEN_ID_LEN as i32), &tenant],
                )
                .await?;
            Ok(rows
                .iter()
                .map(|r| TokenSummary {
                    id: r.get(0),
                    tenant: r.get(1),
                    agent_id: r.get(2),
                    admin: r.get(3),
                    operator: r.get(4),
                    created_ms: r.get(5),
                    last_used_ms: r.get(6),
                    expires_ms: r.get(7),
                })
                .collect())
        })
    }

    fn revoke_tokens(&self, which: &TokenSelector, tenant: Option<&str>) -> Result<usize> {
        let which = which.clone();
        let tenant = tenant.map(str::to_string);
        self.with_client(move |c| async move {
            let n = match &which {
                TokenSelector::Id(id) => {
                    c.execute(
                        "DELETE FROM tokens WHERE substr(hash, 1, length($1)) = $1 \
                         AND ($2::text IS NULL OR tenant = $2)",
                        &[id, &tenant],
                    )
                    .await?
                }
                TokenSelector::Agent(agent) => {
                    c.execute(
                        "DELETE FROM tokens WHERE agent_id = $1 AND ($2::text IS NULL OR tenant = $2)",
                        &[agent, &tenant],
                    )
                    .await?
                }
            };
            Ok(n as usize)
        })
    }

    fn touch_tokens(&self, used: &[(String, i64)]) -> Result<()> {
        if used.is_empty() {
            return Ok(());
        }
        let hashes: Vec<String> = used.iter().map(|u| u.0.clone()).collect();
        let at: Vec<i64> = used.iter().map(|u| u.1).collect();
        self.with_client(move |c| async move {
            c.execute(
                "UPDATE tokens t SET last_used_ms = u.a \
                 FROM unnest($1::text[], $2::bigint[]) AS u(h, a) WHERE t.hash = u.h",
                &[&hashes, &at],
            )
            .await?;
            Ok(())
        })
    }

    fn live_tokens(&self, hashes: &[String], now_ms: i64) -> Result<Vec<String>> {
        let hashes = hashes.to_vec();
        self.with_client(move |c| async move {
            Ok(c.query(
                "SELECT hash FROM tokens WHERE hash = ANY($1::text[]) \
                 AND (expires_ms IS NULL OR expires_ms > $2)",
                &[&hashes, &now_ms],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect())
        })
    }

    fn exchange_usage(
        &self,
        node: &str,
        mine: &[TenantUsage],
        now_ms: i64,
    ) -> Result<Vec<TenantUsage>> {
        let node = node.to_string();
        let mine = mine.to_vec();
        self.with_client(move |mut c| async move {
            let tx = c.transaction().await?;
            for u in &mine {
                tx.execute(
                    super::super::USAGE_PUT,
                    &[
                        &node,
                        &u.tenant,
                        &(u.appends_per_second as i64),
                        &(u.connections as i64),
                        &u.llm_day,
                        &(u.llm_tokens as i64),
                        &now_ms,
                    ],
                )
                .await?;
            }
            tx.execute(super::super::USAGE_FORGET, &[&(now_ms - USAGE_KEPT_MS)])
                .await?;
            let rows = tx.query(super::super::USAGE_OTHERS, &[&node]).await?;
            tx.commit().await?;
            Ok(super::super::sum_usage(
                rows.iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5))),
                now_ms,
            ))
        })
    }

    fn stored_bytes(&self) -> Result<Vec<(String, u64)>> {
        let sql = format!(
            "SELECT {} AS t, sum(octet_length(e.payload))::bigint FROM events e JOIN conversations c ON c.num = e.conv GROUP BY t",
            super::super::TENANT_OF_ID
        );
        self.with_client(move |c| async move {
            let rows = c.query(&sql, &[]).await?;
            Ok(rows
                .iter()
                .map(|r| (r.get(0), r.get::<_, i64>(1).max(0) as u64))
                .collect())
        })
    }
}
