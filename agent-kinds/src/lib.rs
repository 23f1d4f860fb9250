//! Built-in agent kinds, each a plain [`agent_sdk::Agent`], so that a partner can run any of them in
//! its own process too. Scenarios name them with `kind:`.

pub mod a2a;
pub mod context;
pub mod execute;
pub mod function;
pub mod http;
pub mod llm;
pub mod modes;
pub mod orchestrate;
pub mod pipeline;
pub mod process;
pub mod sandbox;
mod scripted;
pub mod settings;
pub mod tool;

pub use a2a::A2a;
pub use context::{assemble, ContextSpec, Fetch, SourceSpec};
pub use execute::{Execute, OutMessage, Reply};
pub use function::Function;
pub use http::Http;
pub use llm::Llm;
pub use modes::Outputs;
pub use orchestrate::Orchestrate;
pub use pipeline::Pipeline;
pub use process::Process;
pub use sandbox::{NetRule, ProcessUser, Sandbox};
pub use scripted::Scripted;
pub use tool::Tool;

use std::sync::Arc;

use serde_json::Value;

use agent_sdk::Agent;

/// Builds the agent a scenario describes (`{"kind": …, settings…}`), held to `sandbox`;
/// `None` for a kind this build does not have or settings the sandbox refuses.
pub fn from_spec(spec: &Value, sandbox: &Sandbox) -> Option<Arc<dyn Agent>> {
    build(spec, sandbox).ok()
}

/// Builds the agent a scenario describes, held to `sandbox` (the environment variables and
/// addresses it may use, how processes and functions run), or says which setting is wrong and
/// why: `path: reason`. Nothing the spec holds runs here.
pub fn build(spec: &Value, sandbox: &Sandbox) -> Result<Arc<dyn Agent>, String> {
    let kind = spec
        .get("kind")
        .and_then(Value::as_str)
        .ok_or("kind: required")?;
    let mut context = match spec.get("context") {
        Some(c) => ContextSpec::from_value(c)?,
        None => ContextSpec::default(),
    };
    // A model's own tokenizer counts its budget, where it is known.
    if let (Some(b), Some(model)) = (
        &mut context.budget,
        spec.get("model").and_then(Value::as_str),
    ) {
        b.tokenizer
            .get_or_insert(context::Tokenizer::for_model(model));
    }
    let outputs = Outputs::from_spec(spec, Some(kind))?;
    let step: Box<dyn Execute> = match kind {
        "scripted" => {
            return Scripted::from_spec(spec)
                .map(|s| Arc::new(s.with_outputs(outputs)) as Arc<dyn Agent>)
                .ok_or_else(|| "replies: a non-empty list of texts".to_string())
        }
        "process" => Box::new(Process::from_spec(spec, sandbox)?),
        "http" => Box::new(Http::from_spec(spec, sandbox)?),
        "tool" => {
            if spec.get("context").is_none() {
                context = Tool::default_context();
            }
            Box::new(Tool::from_spec(spec, sandbox)?)
        }
        "llm" => Box::new(Llm::from_spec(spec, sandbox)?),
        "a2a" => Box::new(A2a::from_spec(spec, sandbox)?),
        "function" => Box::new(Function::from_spec(spec, sandbox)?),
        "orchestrate" => Box::new(Orchestrate::from_spec(spec)?),
        other => return Err(format!("kind: {other:?} is not a built-in kind")),
    };
    Ok(Arc::new(Pipeline::with_outputs(context, step, outputs)))
}
