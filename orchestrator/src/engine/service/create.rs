//! `createConversation`: who may create what, the scenario (by name or inline, checked
//! whole), the id, the participants and, for a sub-conversation, its parent; then one job for
//! the writer, which decides the rest (an id in use, the depth and fan-out limits) in the
//! transaction that creates it.

use proto_spec::{tenant, *};

use super::Orchestrator;
use crate::engine::auth::{valid_id, Identity};
use crate::engine::error::{refuse, Error, Result};
use crate::engine::scenario::Scenario;
use crate::engine::writer::{ChildOf, CreateJob};

impl Orchestrator {
    /// `createConversation`: admins create any conversation; any agent may open a
    /// sub-conversation of one it takes part in, and start a scenario of the library that names
    /// a caller participant (it speaks as that participant). Only an admin's scenario or the server's
    /// library may declare participants that run code, and no participant the server runs may
    /// have the id of an agent with a token (docs/security.md).
    pub async fn create_conversation(
        &self,
        who: &Identity,
        mut p: CreateConversationParams,
    ) -> Result<CreateConversationResult> {
        // From here on the parent is named by its key.
        p.parent_conversation_id = match p.parent_conversation_id.take() {
            Some(parent) => Some(who.key(&parent)?),
            None => None,
        };
        if let Some(parent) = &p.parent_conversation_id {
            // On a shared store the parent may be one this node does not know yet (created
            // through another node, or not taken in yet since this node started): its view is
            // loaded before the checks read it.
            self.ensure_known(parent).await;
        }
        self.check_creator(who, &p)?;
        let id = new_key(
            who,
            p.conversation_id.take(),
            p.parent_conversation_id.as_deref(),
        )?;
        // Named as the library names it, else by its own `name` (what lists filter by).
        let scenario_name = p.scenario_name.clone().or_else(|| {
            p.scenario
                .as_ref()
                .and_then(|v| v["name"].as_str().map(str::to_string))
        });
        let scenario = self.scenario_of(who, &p, tenant::tenant_of(&id)).await?;
        let top_level = p.parent_conversation_id.is_none();
        let has_caller = scenario.as_ref().is_some_and(|s| s.spec.caller().is_some());
        if top_level && !who.admin && !has_caller {
            return Err(refuse(ErrorCode::Forbidden, ONLY_ADMINS));
        }
        let internal: Vec<String> = scenario
            .as_ref()
            .map(|s| s.internal().map(|(_, id, _)| id.to_string()).collect())
            .unwrap_or_default();
        let (participants, policy) = match scenario {
            Some(s) => (s.participants, s.policy),
            None => (p.participants.unwrap_or_default(), None),
        };
        self.check_participants(&participants)?;
        if let Some(parent) = &p.parent_conversation_id {
            self.check_no_strangers(who, parent, &participants, &internal)?;
        }
        if let Some(m) = &p.metadata {
            if m.to_string().len() > self.limits.max_payload_bytes {
                return Err(refuse(
                    ErrorCode::PayloadTooLarge,
                    "metadata is over the payload limit",
                ));
            }
        }
        let child_of = match p.parent_conversation_id {
            Some(parent) => Some(self.child_of(parent, p.input)?),
            None => None,
        };
        self.writer
            .create(CreateJob {
                id: id.clone(),
                participants,
                metadata: p.metadata,
                created_by: who.agent_id.clone(),
                policy,
                fork: None,
                child_of,
                scenario: scenario_name,
            })
            .await?;
        Ok(CreateConversationResult {
            conversation_id: id,
        })
    }

    /// Admins create conversations; a participant of an open conversation may open a
    /// sub-conversation of it; only a sub-conversation takes an input.
    fn check_creator(&self, who: &Identity, p: &CreateConversationParams) -> Result<()> {
        match &p.parent_conversation_id {
            Some(parent) => {
                self.writable_key(who, parent.clone())?;
                let conv = self.may_read(who, parent)?;
                if !who.admin && !conv.is_participant(&who.agent_id) {
                    return Err(refuse(
                        ErrorCode::Forbidden,
                        format!(
                            "{} does not take part in conversation {parent}",
                            who.agent_id
                        ),
                    ));
                }
            }
            // An agent may start a library scenario that names a caller (checked once it is
            // read); an agent a scenario declares only works inside its own conversation.
            None if !who.admin && (p.scenario_name.is_none() || who.scope.is_some()) => {
                return Err(refuse(ErrorCode::Forbidden, ONLY_ADMINS));
            }
            None => {}
        }
        if p.input.is_some() && p.parent_conversation_id.is_none() {
            return Err(refuse(
                ErrorCode::InvalidParams,
                "input: only a sub-conversation (with parentConversationId) takes an input",
            ));
        }
        Ok(())
    }

    /// A sub-conversation opened on the authority of an agent that is not an admin names only
    /// participants of its parent, and the participants its scenario has the server run: it
    /// cannot pull an agent that has no part in the parent into a conversation (where its
    /// executors would be offered turns and its answers read by the opener).
    fn check_no_strangers(
        &self,
        who: &Identity,
        parent: &str,
        participants: &[String],
        internal: &[String],
    ) -> Result<()> {
        let admin = who.admin || who.scope.as_ref().is_some_and(|s| s.authority.admin);
        if admin {
            return Ok(());
        }
        let Some(parent_view) = self.hub.get(parent) else {
            return Ok(());
        };
        let stranger = participants.iter().enumerate().find(|(_, a)| {
            !parent_view.is_participant(a) && !internal.contains(a) && **a != who.agent_id
        });
        match stranger {
            None => Ok(()),
            Some((i, a)) => Err(Error::Rpc(
                RpcError::new(
                    ErrorCode::Forbidden,
                    format!(
                        "participants[{i}]: {a:?} does not take part in conversation {parent}; a sub-conversation names participants of its parent (or participants its scenario has the server run)"
                    ),
                )
                .with_data(serde_json::json!({"path": format!("participants[{i}]"), "agentId": a})),
            )),
        }
    }

    /// The scenario by name from `tenant`'s library, if one is named.
    fn named_scenario(
        &self,
        p: &CreateConversationParams,
        tenant: &str,
    ) -> Result<Option<serde_json::Value>> {
        let Some(name) = &p.scenario_name else {
            return Ok(None);
        };
        if p.scenario.is_some() {
            return Err(refuse(
                ErrorCode::InvalidParams,
                "scenarioName: give a scenario by name or inline, not both",
            ));
        }
        // A name within the tenant's library: a '/' would reach into another's.
        let found = self
            .scenarios
            .read()
            .ok()
            .filter(|_| !name.contains('/'))
            .and_then(|s| s.get(&tenant::key(tenant, name)).cloned());
        match found {
            Some(v) => Ok(Some(v)),
            None => Err(Error::Rpc(
                RpcError::new(
                    ErrorCode::InvalidParams,
                    format!("scenarioName: no scenario named {name:?} on this server"),
                )
                .with_data(serde_json::json!({"known": self.scenario_names_of(tenant)})),
            )),
        }
    }

    /// The scenario, by name or inline, checked whole: who may declare what first (before any
    /// setting is looked at), then every setting, then the ids it declares; its policy records
    /// on whose authority its agents act.
    async fn scenario_of(
        &self,
        who: &Identity,
        p: &CreateConversationParams,
        tenant: &str,
    ) -> Result<Option<Scenario>> {
        let named = self.named_scenario(p, tenant)?;
        let Some(v) = named.as_ref().or(p.scenario.as_ref()) else {
            return Ok(None);
        };
        if named.is_none() {
            let size = v.to_string().len();
            let limit = self.limits.max_scenario_bytes;
            if size > limit {
                return Err(Error::Rpc(
                    RpcError::new(
                        ErrorCode::InvalidParams,
                        format!("scenario: {size} bytes, over the limit of {limit} (a library scenario, by scenarioName, has none)"),
                    )
                    .with_data(serde_json::json!({"path": "scenario", "limit": limit})),
                ));
            }
        }
        if p.participants.is_some() {
            return Err(refuse(
                ErrorCode::InvalidParams,
                "participants: give them in the scenario or as participants, not both",
            ));
        }
        let authority = who.authority(named.is_some());
        if !authority.trusted {
            Self::check_kinds(v)?;
        }
        let mut s = self.check_scenario(v.clone(), &who.agent_id).await?;
        self.check_declared(&s, tenant).await?;
        if let Some(policy) = &mut s.policy {
            policy.authority = Some(authority);
        }
        Ok(Some(s))
    }

    /// At least one participant, within the limit, each a usable id listed once.
    fn check_participants(&self, participants: &[String]) -> Result<()> {
        if participants.is_empty() {
            return Err(refuse(
                ErrorCode::InvalidParams,
                "participants: at least one agent id is needed",
            ));
        }
        if participants.len() > self.limits.max_participants {
            return Err(refuse(
                ErrorCode::InvalidParams,
                format!(
                    "participants: at most {} agents",
                    self.limits.max_participants
                ),
            ));
        }
        for (i, a) in participants.iter().enumerate() {
            if !valid_id(a) || a == ORCHESTRATOR_AUTHOR {
                return Err(refuse(
                    ErrorCode::InvalidParams,
                    format!("participants[{i}]: {a:?} is not a usable agent id"),
                ));
            }
            if participants[..i].contains(a) {
                return Err(refuse(
                    ErrorCode::InvalidParams,
                    format!("participants[{i}]: {a:?} is listed twice"),
                ));
            }
        }
        Ok(())
    }

    /// A sub-conversation's link to `parent`, its input checked as a payload, and the limits
    /// the writer holds it to.
    fn child_of(&self, parent: String, input: Option<MessagePayload>) -> Result<ChildOf> {
        let input = input.map(|i| serde_json::to_value(i).unwrap_or_default());
        if let Some(i) = &input {
            self.check_payload(&i.to_string())?;
        }
        Ok(ChildOf {
            parent,
            input,
            max_depth: self.limits.max_depth,
            max_children: self.limits.max_children,
        })
    }
}

/// Why a top-level conversation is refused to an agent that is not an admin.
const ONLY_ADMINS: &str = "only admins create conversations; an agent may start a library scenario that names a caller participant (scenarioName), or open a sub-conversation (parentConversationId) of one it takes part in";

/// The key of the new conversation: the id asked for (checked) or a new one, in the tenant of
/// its parent (a sub-conversation) or of its creator, or in the tenant an operator names
/// (`TENANT/ID`).
fn new_key(who: &Identity, asked: Option<String>, parent: Option<&str>) -> Result<String> {
    let (tenant, id) = match asked {
        Some(a) if a.contains('/') && parent.is_none() => {
            let key = who.key(&a).map_err(|_| bad_id(&a))?;
            let (t, id) = (tenant::tenant_of(&key), tenant::local_id(&key));
            (t.to_string(), Some(id.to_string()))
        }
        asked => {
            let t = parent.map_or(&*who.tenant, tenant::tenant_of);
            (t.to_string(), asked)
        }
    };
    let id = match id {
        Some(id) if valid_id(&id) => id,
        Some(id) => return Err(bad_id(&id)),
        None => uuid::Uuid::new_v4().simple().to_string(),
    };
    Ok(tenant::key(&tenant, &id))
}

fn bad_id(id: &str) -> Error {
    refuse(
        ErrorCode::InvalidParams,
        format!("conversationId {id:?}: 1-128 characters of letters, digits and . _ : @ -"),
    )
}
