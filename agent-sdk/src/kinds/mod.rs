//! Built-in agent kinds, each a plain [`crate::Agent`], so that a partner can run any of them in
//! its own process too. Scenarios name them with `kind:`.

mod scripted;

pub use scripted::Scripted;

use std::sync::Arc;

use serde_json::Value;

use crate::Agent;

/// Builds the agent a scenario describes (`{"kind": …, settings…}`); `None` for a kind this
/// build does not have.
pub fn from_spec(spec: &Value) -> Option<Arc<dyn Agent>> {
    match spec.get("kind").and_then(Value::as_str)? {
        "scripted" => Scripted::from_spec(spec).map(|s| Arc::new(s) as Arc<dyn Agent>),
        _ => None,
    }
}
