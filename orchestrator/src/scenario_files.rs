//! Scenario files and what the agents they declare may reach: the operator's sandbox flags,
//! reading and checking one scenario, and loading a folder of them as the library.

use crate::*;

/// What the agents the server runs for scenarios may reach (docs/security.md).
#[derive(clap::Args, Debug)]
pub(crate) struct SandboxOpts {
    /// An environment variable scenarios may read (an http header's {env}, an llm's
    /// apiKeyEnv) and processes receive; repeat it, or separate names with commas. None by
    /// default.
    #[arg(
        long = "agent-env",
        env = "ORCHESTRATOR_AGENT_ENV",
        value_delimiter = ','
    )]
    agent_env: Vec<String>,
    /// Where http, llm, a2a and MCP-over-HTTP participants may connect: public, loopback,
    /// private, a network such as 10.0.0.0/8, or a host name; repeat it, or separate with
    /// commas. Default: public (loopback, private and link-local addresses refused).
    #[arg(
        long = "agent-net",
        env = "ORCHESTRATOR_AGENT_NET",
        value_delimiter = ',',
        default_value = "public"
    )]
    agent_net: Vec<String>,
    /// Run process participants and MCP servers as this user (name or uid); the server must
    /// be able to switch to it (root).
    #[arg(long = "process-user", env = "ORCHESTRATOR_PROCESS_USER")]
    process_user: Option<String>,
    /// How many functions and processes may run at once.
    #[arg(
        long = "max-running",
        env = "ORCHESTRATOR_MAX_RUNNING",
        default_value_t = 8
    )]
    max_running: usize,
    /// CPU seconds each process may use.
    #[arg(
        long = "process-cpu-secs",
        env = "ORCHESTRATOR_PROCESS_CPU_SECS",
        default_value_t = 60
    )]
    process_cpu_secs: u64,
    /// Memory each process may map, and the most a function's heap may have, in MiB.
    #[arg(
        long = "process-memory-mb",
        env = "ORCHESTRATOR_PROCESS_MEMORY_MB",
        default_value_t = 1024
    )]
    process_memory_mb: u64,
}

impl SandboxOpts {
    pub(crate) fn sandbox(&self) -> anyhow::Result<agent_kinds::Sandbox> {
        use agent_kinds::{NetRule, ProcessUser, Sandbox};
        for name in &self.agent_env {
            anyhow::ensure!(
                !name.is_empty() && !name.contains('='),
                "--agent-env: {name:?} is not a variable name"
            );
        }
        let net = self
            .agent_net
            .iter()
            .map(|r| NetRule::parse(r))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow::anyhow!("--agent-net: {e}"))?;
        let user = match &self.process_user {
            Some(u) => {
                Some(ProcessUser::lookup(u).map_err(|e| anyhow::anyhow!("--process-user: {e}"))?)
            }
            None => None,
        };
        Ok(Sandbox::default()
            .with_env(self.agent_env.iter().cloned())
            .with_net(net)
            .with_process_user(user)
            .with_exec_limits(
                self.max_running,
                self.process_cpu_secs,
                self.process_memory_mb,
            ))
    }
}

/// Reads a scenario (YAML or JSON) and checks it.
pub(crate) fn scenario_value(
    text: &str,
    sandbox: &agent_kinds::Sandbox,
) -> anyhow::Result<serde_json::Value> {
    let v: serde_json::Value =
        serde_norway::from_str(text).map_err(|e| anyhow::anyhow!("not valid YAML: {e}"))?;
    orchestrator::engine::scenario::Scenario::parse(&v, sandbox)
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    Ok(v)
}

/// Every scenario file of a folder, by name (its `name:`, else the file's stem): the default
/// tenant's library; each folder `tenants/NAME/` beside them holds tenant NAME's, keyed
/// `NAME/SCENARIO`. A file that cannot be read or is not a valid scenario is reported (a
/// warning with every such file and its problem) and left out: one broken example does not
/// keep the rest from being served.
pub(crate) fn load_scenarios(
    dir: &std::path::Path,
    sandbox: &agent_kinds::Sandbox,
) -> anyhow::Result<Vec<(String, serde_json::Value)>> {
    let mut out = load_folder(dir, sandbox)?;
    let tenants = dir.join("tenants");
    if tenants.is_dir() {
        let entries = std::fs::read_dir(&tenants)
            .with_context(|| format!("reading {}", tenants.display()))?;
        for entry in entries {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !path.is_dir() || !proto_spec::tenant::valid_tenant(name) {
                tracing::warn!(folder = %path.display(), "not a tenant's scenario folder (tenants/NAME/, NAME a tenant name); left out");
                continue;
            }
            for (scenario, v) in load_folder(&path, sandbox)? {
                out.push((proto_spec::tenant::key(name, &scenario), v));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The scenario files of one folder, by name.
fn load_folder(
    dir: &std::path::Path,
    sandbox: &agent_kinds::Sandbox,
) -> anyhow::Result<Vec<(String, serde_json::Value)>> {
    let mut out = Vec::new();
    let entries = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for entry in entries {
        let path = entry?.path();
        let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !["yaml", "yml", "json"].contains(&ext) {
            continue;
        }
        let loaded = std::fs::read_to_string(&path)
            .map_err(anyhow::Error::from)
            .and_then(|text| scenario_value(&text, sandbox));
        let v = match loaded {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(file = %path.display(), problem = %e, "scenario left out of the library");
                continue;
            }
        };
        let stem = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("scenario");
        let name = v["name"].as_str().unwrap_or(stem).to_string();
        if name.contains('/') {
            // A '/' would name another tenant's library.
            tracing::warn!(file = %path.display(), name, "a scenario's name has no '/'; left out of the library");
            continue;
        }
        out.push((name, v));
    }
    Ok(out)
}
