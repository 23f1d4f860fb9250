//! Each tenant's quotas (docs/security.md): open conversations (decided by the writer with
//! each creation, [`QuotaBook::open_cap`]), stored bytes (counted in the database every
//! [`STORED_EVERY`], this node's commits added between), appends a second, WebSocket
//! connections, model tokens a day, and tokens held (decided by the store with each new token). The operator sets
//! defaults (`serve --tenant-…`) and per-tenant values in the database (`setTenantQuotas`,
//! `orchestrator tenant quota`), read again every [`EXCHANGE_EVERY`] while the server runs, so
//! a change holds everywhere without a restart. Every refusal is `TenantQuotaExceeded`
//! (-32033, HTTP 429) with `data: {quota, limit, used}`.
//!
//! On a log several nodes share, a quota is the cluster's, not each node's: every
//! [`EXCHANGE_EVERY`] each node writes what its tenants used (appends in the last interval,
//! connections open, model tokens today) and reads the others' ([`Store::exchange_usage`]). A
//! node lets a tenant append at the quota less what the others appended in their last
//! interval (and never less than its even share), and open connections up to the quota less
//! the others' connections; so the cluster stays within one interval's change of the quota.
//! Model tokens count what every node spent today, runs before a restart included.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use proto_spec::{ErrorCode, RpcError, TenantQuotas};
use serde_json::json;

use crate::engine::shares::{Share, Shares};
use crate::engine::store::{Store, TenantUsage};

/// How often quotas are read again and usage is exchanged with the other nodes.
pub const EXCHANGE_EVERY: Duration = Duration::from_secs(1);

/// How often, while some tenant has a quota of stored bytes, the bytes each tenant's logs hold
/// are counted again in the database (between counts: this node's commits are added).
pub const STORED_EVERY: Duration = Duration::from_secs(300);

/// A tenant's appends, metered.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// This node's count of a tenant's appends and model tokens.
#[derive(Debug, Default)]
struct Counted {
    appends: u64,
    llm_day: i64,
    llm_tokens: u64,
}

/// The quotas in force and what each tenant used, on this node and (on a cluster) the others.
#[derive(Debug)]
pub struct QuotaBook {
    defaults: TenantQuotas,
    set: RwLock<HashMap<String, TenantQuotas>>,
    buckets: Mutex<HashMap<String, Bucket>>,
    counted: Mutex<HashMap<String, Counted>>,
    connections: Arc<Shares<String>>,
    others: RwLock<HashMap<String, TenantUsage>>,
    /// This node in the usage it reports: new at every start, so that a restart's counts add up.
    node: String,
    /// The bytes each tenant's logs held at the last count, and what this node committed since.
    stored: Mutex<Stored>,
    /// Whether any quota is in force: when none is, an append costs one load of this.
    active: std::sync::atomic::AtomicBool,
}

/// Stored bytes per tenant: the database's last count and this node's commits since.
#[derive(Debug, Default)]
struct Stored {
    counted: HashMap<String, u64>,
    since: HashMap<String, u64>,
    /// When the database was last counted (none yet: every tenant's use is unknown).
    at: Option<Instant>,
    /// Whether some tenant has a quota of stored bytes (else nothing is counted).
    metered: bool,
}

/// Today, as days since the epoch (UTC).
pub fn today() -> i64 {
    crate::engine::store::now_ms().div_euclid(86_400_000)
}

fn refuse(quota: &str, limit: u64, used: u64, what: String) -> RpcError {
    RpcError::new(ErrorCode::TenantQuotaExceeded, what)
        .with_data(json!({"quota": quota, "limit": limit, "used": used}))
}

impl QuotaBook {
    /// A book with these defaults and nothing set per tenant yet.
    pub fn new(defaults: TenantQuotas) -> QuotaBook {
        let defaults_empty = defaults.is_empty();
        QuotaBook {
            defaults,
            set: RwLock::default(),
            buckets: Mutex::default(),
            counted: Mutex::default(),
            connections: Arc::default(),
            others: RwLock::default(),
            node: uuid::Uuid::new_v4().simple().to_string(),
            stored: Mutex::default(),
            active: std::sync::atomic::AtomicBool::new(!defaults_empty),
        }
    }

    /// Whether commits are counted for a quota of stored bytes (the writer asks, each batch).
    pub fn meters_stored(&self) -> bool {
        self.stored.lock().is_ok_and(|s| s.metered)
    }

    /// Counts bytes of payload `tenant` committed on this node.
    pub fn stored(&self, tenant: &str, bytes: u64) {
        let mut s = self.stored.lock().unwrap_or_else(|p| p.into_inner());
        *s.since.entry(tenant.to_string()).or_default() += bytes;
    }

    /// Refuses an append of `bytes` once `tenant`'s logs hold its quota of stored bytes.
    pub fn check_stored(&self, tenant: &str, bytes: usize) -> Result<(), RpcError> {
        if !self.active() {
            return Ok(());
        }
        let limit = self.of(tenant).stored_bytes.unwrap_or(0);
        if limit == 0 {
            return Ok(());
        }
        let used = {
            let s = self.stored.lock().unwrap_or_else(|p| p.into_inner());
            s.counted.get(tenant).copied().unwrap_or(0) + s.since.get(tenant).copied().unwrap_or(0)
        };
        if used + bytes as u64 > limit {
            return Err(refuse(
                "storedBytes",
                limit,
                used,
                format!("tenant {tenant}'s conversations hold {used} bytes, its quota is {limit}; nothing more is stored"),
            ));
        }
        Ok(())
    }

    /// Counts each tenant's stored bytes in the database again when some tenant has a quota of
    /// them and the last count is older than [`STORED_EVERY`] (or there is none).
    fn count_stored(&self, store: &dyn Store) -> crate::engine::error::Result<()> {
        let metered = self.defaults.stored_bytes.is_some_and(|n| n > 0)
            || self
                .set
                .read()
                .is_ok_and(|s| s.values().any(|q| q.stored_bytes.is_some_and(|n| n > 0)));
        let due = {
            let mut s = self.stored.lock().unwrap_or_else(|p| p.into_inner());
            s.metered = metered;
            metered && s.at.is_none_or(|at| at.elapsed() >= STORED_EVERY)
        };
        if !due {
            return Ok(());
        }
        // What commits while the database is counted may be counted twice (never missed).
        let since_before = {
            let mut s = self.stored.lock().unwrap_or_else(|p| p.into_inner());
            std::mem::take(&mut s.since)
        };
        match store.stored_bytes() {
            Ok(counted) => {
                let mut s = self.stored.lock().unwrap_or_else(|p| p.into_inner());
                s.counted = counted.into_iter().collect();
                s.at = Some(Instant::now());
                Ok(())
            }
            Err(e) => {
                let mut s = self.stored.lock().unwrap_or_else(|p| p.into_inner());
                for (t, n) in since_before {
                    *s.since.entry(t).or_default() += n;
                }
                Err(e)
            }
        }
    }

    /// The quotas `tenant` is held to (0 or absent: none).
    pub fn of(&self, tenant: &str) -> TenantQuotas {
        match self.set.read().ok().and_then(|s| s.get(tenant).cloned()) {
            Some(over) => self.defaults.overridden_by(&over),
            None => self.defaults.clone(),
        }
    }

    /// Whether any quota is in force anywhere (else nothing is metered or exchanged).
    fn any(&self) -> bool {
        !self.defaults.is_empty() || self.set.read().is_ok_and(|s| !s.is_empty())
    }

    /// Reads the tenants' own quotas from the database (blocking).
    pub fn read_quotas(&self, store: &dyn Store) -> crate::engine::error::Result<()> {
        self.set_from(&store.list_tenants()?);
        Ok(())
    }

    /// The tenants' own quotas, as `listTenants` shows them.
    pub fn set_from(&self, tenants: &[proto_spec::TenantSummary]) {
        self.replace(
            tenants
                .iter()
                .filter(|t| !t.quotas.is_empty())
                .map(|t| (t.name.clone(), t.quotas.clone()))
                .collect(),
        );
    }

    /// The per-tenant values the database holds now.
    pub fn replace(&self, set: HashMap<String, TenantQuotas>) {
        let active = !self.defaults.is_empty() || !set.is_empty();
        if let Ok(mut s) = self.set.write() {
            *s = set;
        }
        self.active
            .store(active, std::sync::atomic::Ordering::Release);
    }

    /// Whether any quota is in force.
    fn active(&self) -> bool {
        self.active.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The most conversations `tenant` may have open (0: none).
    pub fn open_cap(&self, tenant: &str) -> u32 {
        let cap = self.of(tenant).open_conversations.unwrap_or(0);
        u32::try_from(cap).unwrap_or(u32::MAX)
    }

    /// The most tokens `tenant` may hold, if any.
    pub fn tokens_cap(&self, tenant: &str) -> Option<u64> {
        self.of(tenant).tokens.filter(|&n| n > 0)
    }

    /// What the other nodes used of `tenant`'s quotas (their last reports).
    fn others_of(&self, tenant: &str) -> TenantUsage {
        self.others
            .read()
            .ok()
            .and_then(|o| o.get(tenant).cloned())
            .unwrap_or_default()
    }

    /// Admits one append of `tenant`, or refuses it at its appends a second.
    pub fn admit_append(&self, tenant: &str) -> Result<(), RpcError> {
        if !self.active() {
            return Ok(());
        }
        let limit = self.of(tenant).appends_per_second.unwrap_or(0);
        if limit == 0 {
            return Ok(());
        }
        let others = self.others_of(tenant);
        // The quota less what the others used, never less than an even share.
        let share = limit / (others.nodes + 1).max(1);
        let rate = limit
            .saturating_sub(others.appends_per_second)
            .max(share.max(1)) as f64;
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let b = buckets.entry(tenant.to_string()).or_insert(Bucket {
            tokens: rate,
            at: now,
        });
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * rate).min(rate);
        b.at = now;
        if b.tokens < 1.0 {
            let used = (rate - b.tokens).round() as u64 + others.appends_per_second;
            return Err(refuse(
                "appendsPerSecond",
                limit,
                used,
                format!(
                    "tenant {tenant} appends at most {limit} events a second; wait and send again"
                ),
            ));
        }
        b.tokens -= 1.0;
        drop(buckets);
        self.count(tenant, |c| c.appends += 1);
        Ok(())
    }

    fn count(&self, tenant: &str, f: impl FnOnce(&mut Counted)) {
        let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        f(counted.entry(tenant.to_string()).or_default());
    }

    /// One more WebSocket connection of `tenant`, held while the share lives, or refused at
    /// its quota.
    pub fn connection(&self, tenant: &str) -> Result<Option<Share<String>>, RpcError> {
        if !self.active() {
            return Ok(None);
        }
        let limit = self.of(tenant).connections.unwrap_or(0);
        if limit == 0 {
            return Ok(None);
        }
        let others = self.others_of(tenant).connections;
        let cap = limit.saturating_sub(others) as usize;
        let key = tenant.to_string();
        self.connections.take(&key, cap).map(Some).ok_or_else(|| {
            let used = self.connections.held_by(&key) as u64 + others;
            refuse(
                "connections",
                limit,
                used,
                format!("tenant {tenant} holds {used} connections, its quota; close one first"),
            )
        })
    }

    /// Counts model tokens `tenant`'s participants spent.
    pub fn spent_llm_tokens(&self, tenant: &str, tokens: u64) {
        let day = today();
        self.count(tenant, |c| {
            if c.llm_day != day {
                c.llm_day = day;
                c.llm_tokens = 0;
            }
            c.llm_tokens += tokens;
        });
    }

    /// Refuses a model's turn for `tenant` once its tokens for today are spent.
    pub fn check_llm(&self, tenant: &str) -> Result<(), RpcError> {
        let limit = self.of(tenant).llm_tokens_per_day.unwrap_or(0);
        if limit == 0 {
            return Ok(());
        }
        let day = today();
        let mine = {
            let counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
            counted
                .get(tenant)
                .filter(|c| c.llm_day == day)
                .map_or(0, |c| c.llm_tokens)
        };
        let others = self.others_of(tenant);
        let used = mine
            + if others.llm_day == day {
                others.llm_tokens
            } else {
                0
            };
        if used >= limit {
            return Err(refuse(
                "llmTokensPerDay",
                limit,
                used,
                format!("tenant {tenant} spent {used} model tokens today, its quota of {limit}; its model turns wait for tomorrow (UTC)"),
            ));
        }
        Ok(())
    }

    /// This node's usage to report, the appends counted since the last report (a second's).
    fn report(&self) -> Vec<TenantUsage> {
        let day = today();
        let mut counted = self.counted.lock().unwrap_or_else(|p| p.into_inner());
        let mut tenants: Vec<String> = counted.keys().cloned().collect();
        for t in self
            .set
            .read()
            .map(|s| s.keys().cloned().collect::<Vec<_>>())
            .unwrap_or_default()
        {
            if !tenants.contains(&t) {
                tenants.push(t);
            }
        }
        tenants
            .into_iter()
            .map(|tenant| {
                let c = counted.entry(tenant.clone()).or_default();
                let appends = std::mem::take(&mut c.appends);
                TenantUsage {
                    connections: self.connections.held_by(&tenant) as u64,
                    tenant,
                    appends_per_second: appends,
                    llm_tokens: if c.llm_day == day { c.llm_tokens } else { 0 },
                    llm_day: day,
                    nodes: 1,
                }
            })
            .collect()
    }

    /// Reads the quotas again and exchanges usage with the other nodes (blocking: the
    /// store's calls).
    pub fn exchange(&self, store: &dyn Store) -> crate::engine::error::Result<()> {
        self.read_quotas(store)?;
        if !self.any() {
            return Ok(());
        }
        self.count_stored(store)?;
        let mine = self.report();
        let others = store.exchange_usage(&self.node, &mine, crate::engine::store::now_ms())?;
        if let Ok(mut o) = self.others.write() {
            *o = others.into_iter().map(|u| (u.tenant.clone(), u)).collect();
        }
        Ok(())
    }
}

/// Every [`EXCHANGE_EVERY`], until the server stops: [`QuotaBook::exchange`].
pub(crate) fn spawn_exchange(
    hub: &Arc<crate::engine::hub::Hub>,
    store: &Arc<dyn Store>,
    book: &Arc<QuotaBook>,
) {
    let (store, book) = (store.clone(), book.clone());
    let mut closing = hub.closing();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(EXCHANGE_EVERY) => {}
                _ = closing.wait_for(|c| *c) => return,
            }
            let (store, book) = (store.clone(), book.clone());
            let done = tokio::task::spawn_blocking(move || book.exchange(store.as_ref())).await;
            if let Ok(Err(e)) = done {
                tracing::warn!(error = %e, "could not read the tenants' quotas or exchange their usage");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn book(q: TenantQuotas) -> QuotaBook {
        let b = QuotaBook::new(TenantQuotas::default());
        b.replace([("acme".to_string(), q)].into());
        b
    }

    #[test]
    fn appends_over_the_quota_are_refused_and_other_tenants_carry_on() {
        let b = book(TenantQuotas {
            appends_per_second: Some(3),
            ..Default::default()
        });
        for _ in 0..3 {
            b.admit_append("acme").unwrap();
        }
        let e = b.admit_append("acme").unwrap_err();
        assert_eq!(e.code, ErrorCode::TenantQuotaExceeded);
        let data = e.data.unwrap();
        assert_eq!(
            (data["quota"].as_str(), data["limit"].as_u64()),
            (Some("appendsPerSecond"), Some(3))
        );
        assert!(data["used"].as_u64().unwrap() >= 3, "{data}");
        for _ in 0..100 {
            b.admit_append("globex").unwrap();
        }
    }

    #[test]
    fn the_other_nodes_usage_counts_against_the_quota() {
        let b = book(TenantQuotas {
            connections: Some(3),
            llm_tokens_per_day: Some(1000),
            ..Default::default()
        });
        let other = TenantUsage {
            tenant: "acme".into(),
            connections: 2,
            llm_tokens: 900,
            llm_day: today(),
            nodes: 1,
            ..Default::default()
        };
        b.others.write().unwrap().insert("acme".into(), other);
        let held = b.connection("acme").unwrap();
        let e = b.connection("acme").unwrap_err();
        assert_eq!(e.data.unwrap()["used"], 3);
        drop(held);
        b.check_llm("acme").unwrap();
        b.spent_llm_tokens("acme", 100);
        let e = b.check_llm("acme").unwrap_err();
        assert_eq!(e.data.unwrap()["used"], 1000);
        // A report carries this node's own counts only.
        let mine = b.report();
        assert_eq!(mine[0].llm_tokens, 100);
    }
}
