//! Identity and tokens: random tokens shown once, stored only as a SHA-256 hash.

use std::sync::Arc;

use rand::RngCore;
use sha2::{Digest, Sha256};

use proto_spec::tenant;

use crate::engine::error::Result;
use crate::engine::state::Authority;
use crate::engine::store::{Store, TokenRecord, DEFAULT_TENANT};

/// Who a connection or request speaks as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The tenant it belongs to: a principal is a tenant and an agent id.
    pub tenant: Arc<str>,
    /// The agent id: the author of everything it writes.
    pub agent_id: String,
    /// Admins create conversations and may read every conversation of their tenant.
    pub admin: bool,
    /// An operator runs the server: works across tenants and manages them.
    pub operator: bool,
    /// For an agent the server runs because a scenario declares it: the conversation that
    /// declares it and the authority it acts on. It writes only there and in the
    /// sub-conversations below, and reads elsewhere only what its authority may read.
    pub scope: Option<Arc<Scope>>,
}

/// Where an agent a scenario declares lives, and on whose authority it acts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The conversation whose scenario declares the agent.
    pub home: String,
    /// Whose rights it reads with, and whether it may open sub-conversations that run code.
    pub authority: Authority,
}

impl Identity {
    /// An identity (for in-process callers and tests).
    pub fn new(agent_id: impl Into<String>, admin: bool) -> Self {
        Identity {
            tenant: default_tenant(),
            agent_id: agent_id.into(),
            admin,
            operator: false,
            scope: None,
        }
    }

    /// The identity a stored token speaks as.
    pub fn of_token(t: TokenRecord) -> Self {
        Identity {
            tenant: tenant_arc(&t.tenant),
            agent_id: t.agent_id,
            // An operator administers every tenant.
            admin: t.admin || t.operator,
            operator: t.operator,
            scope: None,
        }
    }

    /// The identity of `agent_id` as the scenario of conversation `home` (its key) declares
    /// it: an agent of that conversation's tenant.
    pub fn declared(
        agent_id: impl Into<String>,
        home: impl Into<String>,
        authority: Authority,
    ) -> Self {
        let home = home.into();
        Identity {
            tenant: tenant_arc(tenant::tenant_of(&home)),
            agent_id: agent_id.into(),
            admin: false,
            operator: false,
            scope: Some(Arc::new(Scope { home, authority })),
        }
    }

    /// The key of the conversation this identity names `asked`: an id of its own tenant, or
    /// `TENANT/ID`, which names a conversation of that tenant (another tenant's for an
    /// operator only). Any other name is a conversation that does not exist for it.
    pub fn key(&self, asked: &str) -> Result<String> {
        self.key_of(asked.to_string())
    }

    /// [`Identity::key`] of an id the caller gave away: in the default tenant, the id itself,
    /// not copied (the path of every append).
    pub fn key_of(&self, asked: String) -> Result<String> {
        let Some((t, id)) = asked.split_once('/') else {
            if &*self.tenant == DEFAULT_TENANT {
                return Ok(asked);
            }
            return Ok(tenant::key(&self.tenant, &asked));
        };
        if (self.operator || t == &*self.tenant) && tenant::valid_tenant(t) && !id.contains('/') {
            Ok(tenant::key(t, id))
        } else {
            Err(crate::engine::error::refuse(
                proto_spec::ErrorCode::ConversationNotFound,
                format!("no conversation {asked}"),
            ))
        }
    }

    /// Whether the conversation of this key is one this identity may see at all: of its own
    /// tenant, or any for an operator.
    pub fn in_tenant(&self, key: &str) -> bool {
        self.operator || tenant::tenant_of(key) == &*self.tenant
    }

    /// This principal's key (its agent id within its tenant): what its rates, shares, open
    /// conversations and executors are counted and found by.
    pub fn principal(&self) -> std::borrow::Cow<'_, str> {
        if &*self.tenant == DEFAULT_TENANT {
            std::borrow::Cow::Borrowed(&self.agent_id)
        } else {
            std::borrow::Cow::Owned(tenant::key(&self.tenant, &self.agent_id))
        }
    }

    /// The authority a conversation this identity creates gives the agents it declares.
    /// `library`: the scenario came from the server's library.
    pub fn authority(&self, library: bool) -> Authority {
        match &self.scope {
            Some(s) => Authority {
                trusted: s.authority.trusted || library,
                ..s.authority.clone()
            },
            None => Authority {
                reader: self.agent_id.clone(),
                admin: self.admin,
                trusted: self.admin || library,
            },
        }
    }
}

/// The default tenant's name, shared (most identities are of it).
fn default_tenant() -> Arc<str> {
    static DEFAULT: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    DEFAULT.get_or_init(|| DEFAULT_TENANT.into()).clone()
}

/// A tenant's name as an identity holds it.
fn tenant_arc(name: &str) -> Arc<str> {
    if name == DEFAULT_TENANT {
        default_tenant()
    } else {
        name.into()
    }
}

/// The prefix of every token, so that one is recognisable in a leak scan.
pub const TOKEN_PREFIX: &str = "oct_";

/// A new random token (256 bits).
pub fn generate_token() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{TOKEN_PREFIX}{}", hex::encode(bytes))
}

/// The stored form of a token.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Mints a token for `agent_id`, stores its hash, and returns the token (shown once).
pub fn create_token(store: &dyn Store, agent_id: &str, admin: bool) -> Result<String> {
    create_token_until(store, agent_id, admin, None)
}

/// [`create_token`] for a token that stops being accepted at `expires_ms` (ms since the
/// epoch), if given.
pub fn create_token_until(
    store: &dyn Store,
    agent_id: &str,
    admin: bool,
    expires_ms: Option<i64>,
) -> Result<String> {
    mint_token(
        store,
        &TokenRecord {
            tenant: DEFAULT_TENANT.to_string(),
            agent_id: agent_id.to_string(),
            admin,
            operator: false,
            expires_ms,
        },
    )
}

/// Mints a token for what `record` says (its tenant must exist), stores its hash, and returns
/// the token (shown once).
pub fn mint_token(store: &dyn Store, record: &TokenRecord) -> Result<String> {
    mint_token_within(store, record, None)
}

/// [`mint_token`], refused when the tenant holds `cap` tokens already.
pub fn mint_token_within(
    store: &dyn Store,
    record: &TokenRecord,
    cap: Option<u64>,
) -> Result<String> {
    let token = generate_token();
    store.insert_token(&hash_token(&token), record, cap)?;
    Ok(token)
}

/// How often, at most, a token's last use is written to the database.
pub const LAST_USED_EVERY_MS: i64 = 60_000;

/// What a connection or stream that authenticated with a token holds: it learns here when the
/// token is revoked or expires ([`Tokens::recheck`]).
#[derive(Debug)]
pub struct Grant {
    revoked: std::sync::atomic::AtomicBool,
    changed: tokio::sync::Notify,
}

impl Grant {
    /// Whether the token was revoked or expired since.
    pub fn is_revoked(&self) -> bool {
        self.revoked.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Resolves once the token is revoked or expired.
    pub async fn revoked(&self) {
        loop {
            let changed = self.changed.notified();
            if self.is_revoked() {
                return;
            }
            changed.await;
        }
    }

    fn revoke(&self) {
        self.revoked
            .store(true, std::sync::atomic::Ordering::Release);
        self.changed.notify_waiters();
    }
}

/// The tokens this server has seen lately: those held by open connections and streams (checked
/// against the database every so often, so that a revocation or an expiry reaches them, on
/// every node), and when each was last used.
#[derive(Debug, Default)]
pub struct Tokens {
    held: std::sync::Mutex<std::collections::HashMap<String, Vec<std::sync::Weak<Grant>>>>,
    /// Uses not yet written, and when each token's use was last written.
    used: std::sync::Mutex<Used>,
}

#[derive(Debug, Default)]
struct Used {
    pending: std::collections::HashMap<String, i64>,
    written: std::collections::HashMap<String, i64>,
}

impl Tokens {
    /// Notes that the token with this hash authenticated at `now_ms` (written at the next
    /// recheck, at most once a minute per token).
    pub fn used(&self, hash: &str, now_ms: i64) {
        let Ok(mut u) = self.used.lock() else { return };
        let due = u
            .written
            .get(hash)
            .is_none_or(|&at| now_ms - at >= LAST_USED_EVERY_MS);
        if due {
            u.pending.insert(hash.to_string(), now_ms);
        }
    }

    /// A grant for a connection or stream that authenticated with the token of this hash.
    pub fn hold(&self, hash: &str) -> Arc<Grant> {
        let grant = Arc::new(Grant {
            revoked: Default::default(),
            changed: Default::default(),
        });
        if let Ok(mut held) = self.held.lock() {
            let list = held.entry(hash.to_string()).or_default();
            list.retain(|g| g.strong_count() > 0);
            list.push(Arc::downgrade(&grant));
        }
        grant
    }

    /// Writes the pending uses, then revokes the grants whose token the database no longer
    /// has or that expired; how many grants were revoked. Blocking (the store's calls).
    pub fn recheck(&self, store: &dyn Store, now_ms: i64) -> Result<usize> {
        let pending: Vec<(String, i64)> = match self.used.lock() {
            Ok(mut u) => {
                let p: Vec<(String, i64)> = u.pending.drain().collect();
                for (h, at) in &p {
                    u.written.insert(h.clone(), *at);
                }
                p
            }
            Err(_) => Vec::new(),
        };
        store.touch_tokens(&pending)?;
        let hashes: Vec<String> = match self.held.lock() {
            Ok(mut held) => {
                held.retain(|_, list| {
                    list.retain(|g| g.strong_count() > 0);
                    !list.is_empty()
                });
                held.keys().cloned().collect()
            }
            Err(_) => return Ok(0),
        };
        if hashes.is_empty() {
            return Ok(0);
        }
        let live: std::collections::HashSet<String> =
            store.live_tokens(&hashes, now_ms)?.into_iter().collect();
        Ok(self.revoke_unless_live(&hashes, &live))
    }

    /// Revokes the grants of the tokens `checked` that are not `live`; how many. A token first
    /// held while the database was asked (a connection that authenticated meanwhile) was not
    /// checked, and is left for the next recheck.
    fn revoke_unless_live(
        &self,
        checked: &[String],
        live: &std::collections::HashSet<String>,
    ) -> usize {
        let checked: std::collections::HashSet<&String> = checked.iter().collect();
        let mut revoked = 0;
        if let Ok(mut held) = self.held.lock() {
            held.retain(|hash, list| {
                if live.contains(hash) || !checked.contains(hash) {
                    return true;
                }
                for g in list.iter().filter_map(std::sync::Weak::upgrade) {
                    g.revoke();
                    revoked += 1;
                }
                false
            });
        }
        revoked
    }
}

/// Checks that an agent id is usable: 1–128 characters of `[A-Za-z0-9._:@-]`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'-'))
}

/// Every `every`, until the server stops: writes the tokens' last uses and revokes the grants
/// of tokens revoked or expired since (on this node or another, or by `token revoke`).
pub(crate) fn spawn_token_recheck(
    hub: &std::sync::Arc<crate::engine::hub::Hub>,
    store: &std::sync::Arc<dyn crate::engine::store::Store>,
    tokens: &std::sync::Arc<Tokens>,
    every: std::time::Duration,
) {
    let (store, tokens) = (store.clone(), tokens.clone());
    let mut closing = hub.closing();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = closing.wait_for(|c| *c) => return,
            }
            let (store, tokens) = (store.clone(), tokens.clone());
            let checked = tokio::task::spawn_blocking(move || {
                tokens.recheck(store.as_ref(), crate::engine::store::now_ms())
            })
            .await;
            match checked {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => {
                    tracing::info!(
                        connections = n,
                        "a token was revoked or expired; its connections and streams lose it"
                    )
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "could not check the tokens in use"),
                Err(e) => tracing::warn!(error = %e, "the token check stopped"),
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recheck revokes only what it asked the database about: a token first held while the
    /// database was being asked (a connection that authenticated meanwhile) keeps its grant.
    #[test]
    fn a_recheck_revokes_only_the_tokens_it_checked() {
        let tokens = Tokens::default();
        let checked = tokens.hold("checked");
        let live = tokens.hold("live");
        let newer = tokens.hold("newer");
        let asked = vec!["checked".to_string(), "live".to_string()];
        let answered: std::collections::HashSet<String> = ["live".to_string()].into();
        assert_eq!(tokens.revoke_unless_live(&asked, &answered), 1);
        assert!(checked.is_revoked());
        assert!(!live.is_revoked());
        assert!(
            !newer.is_revoked(),
            "held after the check began: left for the next"
        );
    }
}
