//! `orchestrator token create|list|revoke` and `orchestrator tenant create|list|show`: tokens
//! and tenants made in, listed from and deleted from the database directly (every node checks
//! the tokens its connections hold against it).

use anyhow::Context;
use clap::Subcommand;
use orchestrator::engine::auth;
use orchestrator::engine::store::{self, sqlite::Synchronous};

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Mint a token for an agent; prints it once (only its hash is stored).
    Create {
        /// The agent id the token speaks as.
        #[arg(long, env = "ORCHESTRATOR_TOKEN_AGENT")]
        agent: String,
        /// The tenant the agent belongs to (`tenant create` makes one).
        #[arg(long, env = "ORCHESTRATOR_TOKEN_TENANT", default_value = store::DEFAULT_TENANT)]
        tenant: String,
        /// Let it create conversations and read every conversation of its tenant.
        #[arg(long, env = "ORCHESTRATOR_TOKEN_ADMIN")]
        admin: bool,
        /// Make it an operator's: it administers every tenant, and makes and lists tenants and
        /// their tokens over the protocol.
        #[arg(long, env = "ORCHESTRATOR_TOKEN_OPERATOR")]
        operator: bool,
        /// Stop accepting it after this long (`30d`, `12h`, `90m`); never, by default.
        #[arg(long, env = "ORCHESTRATOR_TOKEN_EXPIRES")]
        expires: Option<String>,
        #[command(flatten)]
        db: ExistingDb,
    },
    /// List the tokens: id, tenant, agent, admin, created, last used, expiry (never the token).
    List {
        /// One JSON object per line instead of a table.
        #[arg(long, env = "ORCHESTRATOR_JSON")]
        json: bool,
        #[command(flatten)]
        db: ExistingDb,
    },
    /// Revoke a token by its id (the ID column of `token list`), or every token of an agent.
    /// Connections and streams that authenticated with it are closed within seconds, on every
    /// node.
    Revoke {
        /// The token's id (at least 8 hex digits of the ID column).
        #[arg(required_unless_present = "agent", conflicts_with = "agent")]
        id: Option<String>,
        /// Every token of this agent instead.
        #[arg(long, env = "ORCHESTRATOR_TOKEN_AGENT")]
        agent: Option<String>,
        #[command(flatten)]
        db: ExistingDb,
    },
}

/// The database of a `token` command: the one given, else `orchestrator.db` only if it exists
/// (a token minted into a new, empty file would be a token no server knows).
#[derive(clap::Args, Debug)]
pub struct ExistingDb {
    /// The database: a SQLite file or postgres://USER@HOST:PORT/DB (default: ./orchestrator.db,
    /// if it exists).
    #[arg(long, env = "ORCHESTRATOR_DB")]
    db: Option<String>,
}

impl ExistingDb {
    pub fn open(&self) -> anyhow::Result<std::sync::Arc<dyn store::Store>> {
        let db = crate::inspect::given_or_default(
            &self.db,
            "the server's, or start `orchestrator serve` here once to create it",
        )?;
        store::open(&db, Synchronous::Full)
            .with_context(|| format!("opening {}", store::display(&db)))
    }
}

/// `token create|list|revoke`.
pub fn token(command: TokenCommand) -> anyhow::Result<u8> {
    match command {
        TokenCommand::Create {
            agent,
            tenant,
            admin,
            operator,
            expires,
            db,
        } => create_token(
            store::TokenRecord {
                tenant,
                agent_id: agent,
                admin,
                operator,
                expires_ms: None,
            },
            expires.as_deref(),
            &db,
        ),
        TokenCommand::List { json, db } => {
            let tokens = db.open()?.list_tokens(None)?;
            let mut out = std::io::stdout().lock();
            use std::io::Write;
            if json {
                // One document: an array of tokens (never their secrets).
                writeln!(out, "{}", serde_json::to_string_pretty(&tokens)?)?;
                return Ok(0);
            }
            let when = |ms: Option<i64>, none: &str| {
                ms.map_or(none.to_string(), |ms| {
                    chrono::DateTime::from_timestamp_millis(ms)
                        .unwrap_or_default()
                        .format("%Y-%m-%d %H:%M:%SZ")
                        .to_string()
                })
            };
            let rows: Vec<[String; 7]> = tokens
                .iter()
                .map(|t| {
                    [
                        t.id.clone(),
                        t.tenant.clone(),
                        t.agent_id.clone(),
                        if t.admin { "yes" } else { "no" }.to_string(),
                        when(Some(t.created_ms), ""),
                        when(t.last_used_ms, "never"),
                        when(t.expires_ms, "never"),
                    ]
                })
                .collect();
            writeln!(
                out,
                "{}",
                crate::inspect::table(
                    [
                        "ID",
                        "TENANT",
                        "AGENT",
                        "ADMIN",
                        "CREATED",
                        "LAST USED",
                        "EXPIRES"
                    ],
                    &rows
                )
            )?;
            Ok(0)
        }
        TokenCommand::Revoke { id, agent, db } => {
            let which = match (id, agent) {
                (Some(id), _) => store::TokenSelector::id(&id).map_err(anyhow::Error::msg)?,
                (None, Some(agent)) => store::TokenSelector::Agent(agent),
                (None, None) => anyhow::bail!("give a token id (from `token list`) or --agent ID"),
            };
            let n = db.open()?.revoke_tokens(&which, None)?;
            let what = match &which {
                store::TokenSelector::Id(id) => format!("token {id}"),
                store::TokenSelector::Agent(a) => format!("{a}'s tokens"),
            };
            if n == 0 {
                eprintln!("orchestrator: no token matches ({what}); `token list` shows them");
                return Ok(1);
            }
            println!(
                "revoked {n} token{}: {what}; its connections are closed within seconds",
                if n == 1 { "" } else { "s" }
            );
            Ok(0)
        }
    }
}

/// `token create`: prints the token (once).
fn create_token(
    mut record: store::TokenRecord,
    expires: Option<&str>,
    db: &ExistingDb,
) -> anyhow::Result<u8> {
    anyhow::ensure!(
        auth::valid_id(&record.agent_id),
        "--agent: 1-128 characters of letters, digits and . _ : @ -"
    );
    anyhow::ensure!(
        store::valid_tenant(&record.tenant),
        "--tenant: 1-64 lowercase letters, digits and -"
    );
    record.expires_ms = match expires {
        Some(e) => {
            let d = orchestrator::engine::scenario::parse_duration(&serde_json::json!(e))
                .map_err(|m| anyhow::anyhow!("--expires: {m}"))?;
            anyhow::ensure!(!d.is_zero(), "--expires: a token must live a while");
            Some(store::now_ms().saturating_add(d.as_millis() as i64))
        }
        None => None,
    };
    let store = db.open()?;
    let token = auth::mint_token(store.as_ref(), &record)?;
    println!("{token}");
    Ok(0)
}

#[derive(Subcommand, Debug)]
pub enum TenantCommand {
    /// Make a tenant: a namespace of agents, tokens and conversations of its own.
    Create {
        /// Its name: 1-64 lowercase letters, digits and -.
        name: String,
        #[command(flatten)]
        db: ExistingDb,
    },
    /// List the tenants: name, created, tokens.
    List {
        /// One JSON document (an array) instead of a table.
        #[arg(long, env = "ORCHESTRATOR_JSON")]
        json: bool,
        #[command(flatten)]
        db: ExistingDb,
    },
    /// Set a tenant's quotas (replacing those set before; each one not given is the server's
    /// default, `serve --tenant-…`); a running server holds to them within a second.
    Quota {
        /// The tenant.
        name: String,
        #[command(flatten)]
        quotas: QuotaArgs,
        #[command(flatten)]
        db: ExistingDb,
    },
    /// Show one tenant.
    Show {
        /// Its name.
        name: String,
        /// JSON instead of lines.
        #[arg(long, env = "ORCHESTRATOR_JSON")]
        json: bool,
        #[command(flatten)]
        db: ExistingDb,
    },
}

/// A tenant's quotas as `tenant quota` takes them.
#[derive(clap::Args, Debug)]
pub struct QuotaArgs {
    /// Conversations open at once (0: none).
    #[arg(long, env = "ORCHESTRATOR_QUOTA_OPEN_CONVERSATIONS")]
    open_conversations: Option<u64>,
    /// Bytes of payload its conversations' logs hold (0: none).
    #[arg(long, env = "ORCHESTRATOR_QUOTA_STORED_BYTES")]
    stored_bytes: Option<u64>,
    /// Events appended a second, across the cluster (0: none).
    #[arg(long, env = "ORCHESTRATOR_QUOTA_APPENDS_PER_SECOND")]
    appends_per_second: Option<u64>,
    /// WebSocket connections open at once, across the cluster (0: none).
    #[arg(long, env = "ORCHESTRATOR_QUOTA_CONNECTIONS")]
    connections: Option<u64>,
    /// Model tokens its `llm` participants spend a day, UTC (0: none).
    #[arg(long, env = "ORCHESTRATOR_QUOTA_LLM_TOKENS_PER_DAY")]
    llm_tokens_per_day: Option<u64>,
    /// Tokens it may hold (0: none).
    #[arg(long, env = "ORCHESTRATOR_QUOTA_TOKENS")]
    tokens: Option<u64>,
}

impl QuotaArgs {
    fn quotas(self) -> proto_spec::TenantQuotas {
        proto_spec::TenantQuotas {
            open_conversations: self.open_conversations,
            stored_bytes: self.stored_bytes,
            appends_per_second: self.appends_per_second,
            connections: self.connections,
            llm_tokens_per_day: self.llm_tokens_per_day,
            tokens: self.tokens,
        }
    }
}

/// `tenant create|list|quota|show`.
pub fn tenant(command: TenantCommand) -> anyhow::Result<u8> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match command {
        TenantCommand::Create { name, db } => {
            anyhow::ensure!(
                store::valid_tenant(&name),
                "{name:?}: a tenant's name is 1-64 lowercase letters, digits and -"
            );
            db.open()?.create_tenant(&name)?;
            writeln!(out, "tenant {name} made")?;
            Ok(0)
        }
        TenantCommand::List { json, db } => {
            let tenants = db.open()?.list_tenants()?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&tenants)?)?;
                return Ok(0);
            }
            let rows: Vec<[String; 3]> = tenants
                .iter()
                .map(|t| [t.name.clone(), when(t.created_ms), t.tokens.to_string()])
                .collect();
            let table = crate::inspect::table(["NAME", "CREATED", "TOKENS"], &rows);
            writeln!(out, "{table}")?;
            Ok(0)
        }
        TenantCommand::Quota { name, quotas, db } => {
            let quotas = quotas.quotas();
            db.open()?.set_tenant_quotas(&name, &quotas)?;
            writeln!(
                out,
                "tenant {name}: quotas {}",
                serde_json::to_string(&quotas)?
            )?;
            Ok(0)
        }
        TenantCommand::Show { name, json, db } => {
            let tenants = db.open()?.list_tenants()?;
            let Some(t) = tenants.into_iter().find(|t| t.name == name) else {
                eprintln!("orchestrator: no tenant {name:?}; `tenant list` shows them");
                return Ok(1);
            };
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&t)?)?;
            } else {
                writeln!(out, "name     {}", t.name)?;
                writeln!(out, "created  {}", when(t.created_ms))?;
                writeln!(out, "tokens   {}", t.tokens)?;
                writeln!(out, "quotas   {}", serde_json::to_string(&t.quotas)?)?;
            }
            Ok(0)
        }
    }
}

/// A time as the tables show it (UTC, to the second).
fn when(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .unwrap_or_default()
        .format("%Y-%m-%d %H:%M:%SZ")
        .to_string()
}
