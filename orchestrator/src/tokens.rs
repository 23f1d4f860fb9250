//! `orchestrator token create|list|revoke`: tokens minted into, listed from and deleted from
//! the database directly (every node checks the tokens its connections hold against it).

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
        /// Let it create conversations and read every conversation.
        #[arg(long, env = "ORCHESTRATOR_TOKEN_ADMIN")]
        admin: bool,
        /// Stop accepting it after this long (`30d`, `12h`, `90m`); never, by default.
        #[arg(long, env = "ORCHESTRATOR_TOKEN_EXPIRES")]
        expires: Option<String>,
        #[command(flatten)]
        db: ExistingDb,
    },
    /// List the tokens: id, agent, admin, created, last used, expiry (never the token).
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
    fn open(&self) -> anyhow::Result<std::sync::Arc<dyn store::Store>> {
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
            admin,
            expires,
            db,
        } => {
            anyhow::ensure!(
                auth::valid_id(&agent),
                "--agent: 1-128 characters of letters, digits and . _ : @ -"
            );
            let expires_ms = match expires {
                Some(e) => {
                    let d = orchestrator::engine::scenario::parse_duration(&serde_json::json!(e))
                        .map_err(|m| anyhow::anyhow!("--expires: {m}"))?;
                    anyhow::ensure!(!d.is_zero(), "--expires: a token must live a while");
                    Some(store::now_ms().saturating_add(d.as_millis() as i64))
                }
                None => None,
            };
            let store = db.open()?;
            let token = auth::create_token_until(store.as_ref(), &agent, admin, expires_ms)?;
            println!("{token}");
            Ok(0)
        }
        TokenCommand::List { json, db } => {
            let tokens = db.open()?.list_tokens()?;
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
            let rows: Vec<[String; 6]> = tokens
                .iter()
                .map(|t| {
                    [
                        t.id.clone(),
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
                    ["ID", "AGENT", "ADMIN", "CREATED", "LAST USED", "EXPIRES"],
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
            let n = db.open()?.revoke_tokens(&which)?;
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
