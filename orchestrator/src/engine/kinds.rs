//! The agent kinds, as the engine sees them: it checks the participants a scenario declares
//! through this trait and links none of the kinds itself. The host implements it with the
//! kinds it runs and the operator's allow-lists (`host::kinds`, over the built-in kinds' sandbox).

use serde_json::Value;

/// What the engine asks of the agent kinds a server runs.
pub trait AgentKinds: Send + Sync + std::fmt::Debug {
    /// Checks what a participant declares about its modes, plans and deliverables, whatever its
    /// kind (`None`: external). The message starts with the setting's path.
    fn check_outputs(&self, settings: &Value, kind: Option<&str>) -> Result<(), String>;

    /// Checks the settings of a participant the server would run (its `kind` among them)
    /// against the kinds it runs and what the operator allows. The message starts with the
    /// setting's path.
    fn check_agent(&self, settings: &Value) -> Result<(), String>;

    /// The implementation, for the host that made it (to run the agents it checked).
    fn as_any(&self) -> &dyn std::any::Any;
}
