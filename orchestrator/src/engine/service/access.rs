//! Who may read, write and declare what (docs/security.md): the access checks of the method
//! core, and the checks on the participants a scenario asks the server to run.

use std::sync::Arc;

use proto_spec::*;

use super::Orchestrator;
use crate::engine::auth::Identity;
use crate::engine::error::{refuse, Error, Result};
use crate::engine::hub::ConvView;
use crate::engine::scenario::{runs_code, Scenario};

impl Orchestrator {
    /// The conversation as held here, if `who` may read it. One it may not read is answered
    /// exactly as one that does not exist (`ConversationNotFound`), so that ids cannot be probed.
    pub(super) fn may_read(&self, who: &Identity, id: &str) -> Result<Arc<ConvView>> {
        let not_found = || {
            refuse(
                ErrorCode::ConversationNotFound,
                format!("no conversation {}", proto_spec::tenant::local_id(id)),
            )
        };
        if !who.in_tenant(id) {
            return Err(not_found());
        }
        let conv = self.hub.get(id).ok_or_else(not_found)?;
        if self.may_see(who, &conv) {
            Ok(conv)
        } else {
            Err(not_found())
        }
    }

    /// Whether `who` may read `conv`, a conversation of its tenant (or any, for an operator).
    pub(super) fn may_see(&self, who: &Identity, conv: &ConvView) -> bool {
        match &who.scope {
            None => who.admin || self.takes_part_above(&who.agent_id, conv),
            // An agent a scenario declares reads its own conversation and those below it, and
            // elsewhere only what its authority may read.
            Some(s) => {
                self.within(conv, &s.home)
                    || s.authority.admin
                    || (!s.authority.reader.is_empty()
                        && self.takes_part_above(&s.authority.reader, conv))
            }
        }
    }

    /// Whether `conv` is `home` or a conversation below it in its tree.
    pub(super) fn within(&self, conv: &ConvView, home: &str) -> bool {
        if conv.id == home {
            return true;
        }
        let mut parent = conv.parent().map(str::to_string);
        for _ in 0..64 {
            let Some(p) = parent else { return false };
            if p == home {
                return true;
            }
            parent = self
                .hub
                .get(&p)
                .and_then(|c| c.parent().map(str::to_string));
        }
        false
    }

    /// The key of the conversation `who` names `asked` to write to: one of its own tenant (an
    /// operator reads other tenants' conversations but speaks only in its own; for anyone else
    /// another tenant's conversation does not exist). An agent a scenario declares is refused
    /// outside its own conversation and those below it: it speaks under its id nowhere else.
    pub(super) fn writable_key(&self, who: &Identity, asked: String) -> Result<String> {
        let key = who.key_of(asked)?;
        if proto_spec::tenant::tenant_of(&key) != &*who.tenant {
            return Err(refuse(
                ErrorCode::Forbidden,
                format!(
                    "conversation {key} is of another tenant: an operator reads and pauses it but writes only in its own tenant ({})",
                    who.tenant
                ),
            ));
        }
        let Some(s) = &who.scope else { return Ok(key) };
        let inside = self.hub.get(&key).is_some_and(|c| self.within(&c, &s.home));
        if inside {
            Ok(key)
        } else {
            Err(refuse(
                ErrorCode::Forbidden,
                format!(
                    "{} is declared by conversation {}'s scenario and writes only there and below it",
                    who.agent_id, s.home
                ),
            ))
        }
    }

    /// Whether `agent` takes part in `conv` or in a conversation above it in its tree: whoever
    /// opens a sub-conversation may follow it.
    pub(super) fn takes_part_above(&self, agent: &str, conv: &ConvView) -> bool {
        if conv.is_participant(agent) {
            return true;
        }
        let mut parent = conv.parent().map(str::to_string);
        // A tree is at most a few levels deep; the bound only guards against a bad log.
        for _ in 0..64 {
            let Some(p) = parent.and_then(|id| self.hub.get(&id)) else {
                return false;
            };
            if p.is_participant(agent) {
                return true;
            }
            parent = p.parent().map(str::to_string);
        }
        false
    }

    /// Checks a scenario for a conversation `creator` creates (who takes the place of its
    /// caller participant, if it names one), off the async threads: compiling a `function`'s
    /// source, building HTTP clients, reading a long scenario take time that no other request
    /// should wait for.
    pub(super) async fn check_scenario(
        &self,
        v: serde_json::Value,
        creator: &str,
    ) -> Result<Scenario> {
        let kinds = self.limits.kinds.clone();
        let creator = creator.to_string();
        tokio::task::spawn_blocking(move || Scenario::parse_for(&v, &creator, &*kinds))
            .await?
            .map_err(Error::Rpc)
    }

    /// Refuses a scenario that declares a participant of a kind that runs code: for a
    /// scenario whose authority is not trusted (a participant's inline scenario).
    pub(super) fn check_kinds(v: &serde_json::Value) -> Result<()> {
        let participants = v.get("participants").and_then(serde_json::Value::as_array);
        for (i, p) in participants.into_iter().flatten().enumerate() {
            let Some(kind) = p.get("kind").and_then(serde_json::Value::as_str) else {
                continue;
            };
            if runs_code(kind) {
                let path = format!("scenario.participants[{i}].kind");
                let id = p
                    .get("id")
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or("");
                return Err(Error::Rpc(
                    RpcError::new(
                        ErrorCode::Forbidden,
                        format!(
                            "{path}: only an admin's scenario or one from the server's library may declare a participant the server runs ({id:?} is of kind {kind}); name a library scenario (scenarioName) or make {id:?} external"
                        ),
                    )
                    .with_data(serde_json::json!({"path": path, "kind": kind, "reason": "only an admin's scenario or the server's library may declare it"})),
                ));
            }
        }
        Ok(())
    }

    /// No participant the server runs may have the id of an agent that has a token (which
    /// kinds an authority may declare is `check_kinds`, decided before the scenario is read).
    /// `tenant`: the tenant of the conversation that declares them.
    pub(super) async fn check_declared(&self, s: &Scenario, tenant: &str) -> Result<()> {
        let ids: Vec<(usize, String)> =
            s.internal().map(|(i, id, _)| (i, id.to_string())).collect();
        if ids.is_empty() {
            return Ok(());
        }
        let (store, tenant) = (self.store.clone(), tenant.to_string());
        let holder = tokio::task::spawn_blocking(move || -> Result<Option<(usize, String)>> {
            for (i, id) in ids {
                if store.agent_has_token(&tenant, &id)? {
                    return Ok(Some((i, id)));
                }
            }
            Ok(None)
        })
        .await??;
        if let Some((i, id)) = holder {
            let path = format!("scenario.participants[{i}].id");
            return Err(Error::Rpc(
                RpcError::new(
                    ErrorCode::InvalidParams,
                    format!(
                        "{path}: {id:?} is an agent with a token; a participant the server runs needs an id of its own (an agent id names one principal)"
                    ),
                )
                .with_data(serde_json::json!({"path": path, "reason": "the id of an agent with a token"})),
            ));
        }
        Ok(())
    }
}
