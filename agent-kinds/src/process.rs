//! `process`: any executable that speaks JSON lines on stdin and stdout, one per turn: the way
//! to write an agent in any language.
//!
//! Each turn starts the command, writes one line, `{"conversationId", "agentId", "turn",
//! "deadline", "context"}` (the assembled context), closes stdin, and reads one line back: a
//! message `{"text", "data"?, "schema"?, "tags"?, "to"?, "finality"?}`, several
//! `{"messages": [...]}`, or `{"error": "..."}`. The process runs as the server's
//! [`Sandbox`] says: in a process group of its own, which is killed whole (children included)
//! at the turn's deadline, once it has replied, or as soon as the turn is given up; with a
//! minimal environment, CPU time and memory limits, and a cap on how many run at once. What it
//! wrote to stderr goes into the error.
//!
//! ```yaml
//! - id: calculator
//!   kind: process
//!   command: ["python3", "calc.py"]
//!   context: { tail: 5 }
//! ```

use std::process::Stdio;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::execute::{parse_reply, Execute, Reply};
use super::sandbox::{GroupKill, Sandbox};
use agent_sdk::{AgentContext, AgentError};

/// The most of a reply line read, and of stderr kept for an error.
const MAX_LINE: usize = 4 * 1024 * 1024;
const STDERR_KEPT: usize = 2048;

/// The `process` step.
#[derive(Debug, Clone)]
pub struct Process {
    command: Vec<String>,
    sandbox: Sandbox,
}

impl Process {
    /// A step that runs `command` (program, then arguments).
    pub fn new(command: Vec<String>, sandbox: &Sandbox) -> Result<Process, String> {
        if command.is_empty() || command[0].is_empty() {
            return Err("command: the program and its arguments, as a non-empty list".into());
        }
        Ok(Process {
            command,
            sandbox: sandbox.clone(),
        })
    }

    /// From a participant's settings: `command: [program, args…]`.
    pub fn from_spec(spec: &Value, sandbox: &Sandbox) -> Result<Process, String> {
        let command = spec
            .get("command")
            .and_then(Value::as_array)
            .and_then(|a| {
                a.iter()
                    .map(|x| x.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
            })
            .ok_or("command: the program and its arguments, as a list of strings")?;
        Process::new(command, sandbox)
    }
}

#[async_trait]
impl Execute for Process {
    fn kind(&self) -> &'static str {
        "process"
    }

    async fn execute(&self, ctx: &AgentContext, context: Value) -> Result<Reply, AgentError> {
        // At most the sandbox's number of processes and functions run at once.
        let _slot = tokio::time::timeout_at(ctx.deadline, self.sandbox.run_slot())
            .await
            .map_err(|_| "process: no run slot was free before the turn's deadline")?;
        let mut child = self
            .sandbox
            .command(&self.command[0], &self.command[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("process {:?} could not start: {e}", self.command[0]))?;
        // The whole group goes when this turn is done with it, however it ends.
        let mut group = GroupKill::new(child.id());
        let request = json!({
            "conversationId": ctx.conversation_id,
            "agentId": ctx.agent_id,
            "turn": ctx.turn,
            "deadlineMs": ctx.remaining().as_millis() as u64,
            "context": context,
        });
        let mut stdin = child.stdin.take().ok_or("process: no stdin")?;
        let stdout = child.stdout.take().ok_or("process: no stdout")?;
        let mut stderr = child.stderr.take().ok_or("process: no stderr")?;
        let talk = async move {
            let mut line = request.to_string();
            line.push('\n');
            // A process that exits without reading its request is judged by what it prints.
            let _ = stdin.write_all(line.as_bytes()).await;
            drop(stdin);
            let mut reply = String::new();
            let mut reader = BufReader::new(stdout).take(MAX_LINE as u64);
            reader.read_line(&mut reply).await?;
            Ok::<_, std::io::Error>(reply)
        };
        let reply = match tokio::time::timeout_at(ctx.deadline, talk).await {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => return Err(format!("process: reading its reply failed: {e}").into()),
            Err(_) => {
                group.kill();
                let _ = child.kill().await;
                return Err("process: no reply before the turn's deadline; it was killed".into());
            }
        };
        if reply.trim().is_empty() {
            let _ = child.wait().await;
            // What it left running would hold stderr open.
            group.kill();
            let mut err = Vec::new();
            let _ = (&mut stderr).take(64 * 1024).read_to_end(&mut err).await;
            let err = String::from_utf8_lossy(&err);
            let tail: String = err
                .chars()
                .rev()
                .take(STDERR_KEPT)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            return Err(format!("process: exited without a reply; stderr: {}", tail.trim()).into());
        }
        // One reply per turn: the process and whatever it started are done.
        group.kill();
        let _ = child.kill().await;
        let value: Value = serde_json::from_str(reply.trim())
            .map_err(|e| format!("process: its reply is not JSON ({e}): {}", reply.trim()))?;
        parse_reply(value)
    }
}
