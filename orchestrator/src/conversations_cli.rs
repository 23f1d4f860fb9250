//! `orchestrator conversations list|show|export|delete`: the first three read a database
//! directly or ask a running server (see [`crate::inspect`]); a deletion goes through the
//! server, which tells the conversation's readers.

use agent_sdk::{AgentClient, WsConfig, WsJsonRpcClient};
use anyhow::Context;
use clap::{Subcommand, ValueEnum};

use crate::inspect::{header, json_line, line, markdown, out, table, Target};

#[derive(Subcommand, Debug)]
pub enum ConversationsCommand {
    /// Every conversation (every one the token may read, on a server): id, status, events,
    /// participants.
    List {
        /// One JSON object per line instead of a table.
        #[arg(long, env = "ORCHESTRATOR_JSON")]
        json: bool,
        #[command(flatten)]
        target: Target,
    },
    /// One conversation: what it is, then its events as text.
    Show {
        /// The conversation.
        conversation: String,
        #[command(flatten)]
        target: Target,
    },
    /// Deletes a conversation with its sub-conversations, through the server at `--url` (so
    /// that its readers are told): its tenant's admins, or its creator.
    Delete {
        /// The conversation.
        conversation: String,
        /// The server (ws://HOST:PORT/rpc).
        #[arg(long, env = "ORCHESTRATOR_URL")]
        url: String,
        /// The token to delete with.
        #[arg(long, env = "ORCHESTRATOR_TOKEN", hide_env_values = true)]
        token: String,
    },
    /// One conversation's events as JSON lines (every event) or as a Markdown document
    /// (messages and decisions).
    Export {
        /// The conversation.
        conversation: String,
        /// jsonl or markdown.
        #[arg(long, env = "ORCHESTRATOR_EXPORT_FORMAT", value_enum, default_value_t = ExportFormat::Jsonl)]
        format: ExportFormat,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ExportFormat {
    Jsonl,
    Markdown,
}

/// `conversations list|show|export|delete`.
pub async fn conversations(command: ConversationsCommand) -> anyhow::Result<u8> {
    match command {
        ConversationsCommand::List { json, target } => {
            let rows = target.open().await?.list().await?;
            if json {
                // One document: an array of rows.
                out(&serde_json::to_string_pretty(&rows)?)?;
                return Ok(0);
            }
            let cells: Vec<[String; 6]> = rows
                .iter()
                .map(|r| {
                    [
                        r.conversation_id.clone(),
                        r.status.clone(),
                        r.latest_seq.to_string(),
                        r.participants.join(","),
                        r.speaker.clone().unwrap_or_else(|| "-".into()),
                        r.last_activity.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            out(&table(
                [
                    "CONVERSATION",
                    "STATUS",
                    "EVENTS",
                    "PARTICIPANTS",
                    "SPEAKER",
                    "LAST ACTIVITY",
                ],
                &cells,
            ))?;
            Ok(0)
        }
        ConversationsCommand::Show {
            conversation,
            target,
        } => {
            let source = target.open().await?;
            let events = source.all_events(&conversation, 0).await?;
            let rows = source.list().await?;
            if let Some(r) = rows.iter().find(|r| r.conversation_id == conversation) {
                out(&header(r))?;
            }
            for e in &events {
                out(&line(e))?;
            }
            Ok(0)
        }
        ConversationsCommand::Delete {
            conversation,
            url,
            token,
        } => {
            let client = WsJsonRpcClient::connect(WsConfig::new(url.clone(), &token))
                .await
                .with_context(|| format!("connecting to {url}"))?;
            let r = client
                .delete_conversation(&conversation)
                .await
                .with_context(|| format!("deleting {conversation}"))?;
            for id in &r.deleted {
                out(&format!("deleted {id}"))?;
            }
            Ok(0)
        }
        ConversationsCommand::Export {
            conversation,
            format,
            target,
        } => {
            let source = target.open().await?;
            let events = source.all_events(&conversation, 0).await?;
            match format {
                ExportFormat::Jsonl => {
                    for e in &events {
                        out(&json_line(e))?;
                    }
                }
                ExportFormat::Markdown => {
                    let rows = source.list().await?;
                    let row = rows.iter().find(|r| r.conversation_id == conversation);
                    out(&markdown(&conversation, row, &events))?;
                }
            }
            Ok(0)
        }
    }
}
