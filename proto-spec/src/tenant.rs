//! Tenants and the keys that keep their conversations apart.
//!
//! A conversation is named on the wire by its id within its tenant (`c1`); inside the server
//! it is known by its *key*: the id itself in tenant [`DEFAULT_TENANT`], `TENANT/ID` in any
//! other. No valid id or tenant name holds a `/`, so a key says both without ambiguity, and a
//! database from before tenants has its keys unchanged. A principal (an agent of a tenant) has
//! a key made the same way. The server writes ids within the tenant into payloads and answers
//! (serialized through [`local`]), and reads them back within the conversation's own tenant
//! ([`sibling`]).

use std::borrow::Cow;

/// The tenant every database has: where every principal and conversation lives unless told
/// otherwise (a database from before tenants has only it).
pub const DEFAULT_TENANT: &str = "default";

/// Checks that a tenant name is usable: 1–64 characters of lowercase letters, digits and `-`,
/// starting with a letter or a digit (it appears in URLs and in conversation keys).
pub fn valid_tenant(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
}

/// The key of `id` (a conversation's or an agent's id) in `tenant`.
pub fn key(tenant: &str, id: &str) -> String {
    if tenant == DEFAULT_TENANT {
        id.to_string()
    } else {
        format!("{tenant}/{id}")
    }
}

/// The tenant a key belongs to.
pub fn tenant_of(key: &str) -> &str {
    key.split_once('/').map_or(DEFAULT_TENANT, |(t, _)| t)
}

/// The id within its tenant that a key names.
pub fn local_id(key: &str) -> &str {
    key.split_once('/').map_or(key, |(_, id)| id)
}

/// The key of `id` in the tenant of `key`: how a payload's id (a parent, a child, a fork's
/// origin), written within its tenant, is read back by the server.
pub fn sibling<'a>(key: &str, id: &'a str) -> Cow<'a, str> {
    match tenant_of(key) {
        DEFAULT_TENANT => Cow::Borrowed(id),
        t => Cow::Owned(format!("{t}/{id}")),
    }
}

/// Serializes a key as the id within its tenant (`#[serde(serialize_with = "…")]` on every
/// conversation id an answer, an event or a notification carries).
pub fn local<S: serde::Serializer>(key: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(local_id(key))
}

/// [`local`] for a list of keys.
pub fn local_vec<S: serde::Serializer>(keys: &[String], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(keys.len()))?;
    for k in keys {
        seq.serialize_element(local_id(k))?;
    }
    seq.end()
}

/// [`local`] for an optional key.
pub fn local_opt<S: serde::Serializer>(key: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match key {
        Some(k) => s.serialize_str(local_id(k)),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_tenant_and_the_id_and_the_default_tenant_keeps_plain_ids() {
        assert_eq!(key(DEFAULT_TENANT, "c1"), "c1");
        assert_eq!(key("acme", "c1"), "acme/c1");
        assert_eq!((tenant_of("c1"), local_id("c1")), (DEFAULT_TENANT, "c1"));
        assert_eq!((tenant_of("acme/c1"), local_id("acme/c1")), ("acme", "c1"));
        assert_eq!(sibling("acme/c1", "c2"), "acme/c2");
        assert_eq!(sibling("c1", "c2"), "c2");
    }

    #[test]
    fn answers_show_the_id_within_its_tenant() {
        #[derive(serde::Serialize)]
        struct A {
            #[serde(serialize_with = "local")]
            id: String,
            #[serde(serialize_with = "local_opt")]
            parent: Option<String>,
        }
        let a = A {
            id: "acme/c1".into(),
            parent: Some("acme/p".into()),
        };
        assert_eq!(
            serde_json::to_value(&a).unwrap(),
            serde_json::json!({"id": "c1", "parent": "p"})
        );
    }
}
