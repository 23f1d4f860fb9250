//! Identity and tokens: random tokens shown once, stored only as a SHA-256 hash.

use std::sync::Arc;

use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::engine::error::Result;
use crate::engine::state::Authority;
use crate::engine::store::{Store, TokenRecord};

/// Who a connection or request speaks as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The agent id: the author of everything it writes.
    pub agent_id: String,
    /// Admins create conversations and may read every conversation.
    pub admin: bool,
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
            agent_id: agent_id.into(),
            admin,
            scope: None,
        }
    }

    /// The identity of `agent_id` as the scenario of conversation `home` declares it.
    pub fn declared(
        agent_id: impl Into<String>,
        home: impl Into<String>,
        authority: Authority,
    ) -> Self {
        Identity {
            agent_id: agent_id.into(),
            admin: false,
            scope: Some(Arc::new(Scope {
                home: home.into(),
                authority,
            })),
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
    let token = generate_token();
    store.insert_token(
        &hash_token(&token),
        &TokenRecord {
            agent_id: agent_id.to_string(),
            admin,
        },
    )?;
    Ok(token)
}

/// Checks that an agent id is usable: 1–128 characters of `[A-Za-z0-9._:@-]`.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'@' | b'-'))
}
