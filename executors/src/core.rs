//! The executor core: how one turn is run, whoever triggered it.

use std::collections::HashMap;
use std::future::Future;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_sdk::proto::system::{TurnAttempt, TurnEnd, TurnEndOutcome, TurnError};
use agent_sdk::proto::*;
use agent_sdk::{
    Agent, AgentClient, AgentContext, AgentError, ClientResult, ExecutorClient, TurnOutcome,
};
use tokio::time::Instant;

/// A turn handed to an executor.
#[derive(Debug, Clone)]
pub struct Assignment {
    /// The conversation.
    pub conversation_id: String,
    /// The agent whose turn it is.
    pub agent_id: String,
    /// The turn.
    pub turn: u64,
    /// When the turn must be done.
    pub deadline: Instant,
    /// Context starts after this seq.
    pub since_seq: u64,
    /// The mode the turn asks for.
    pub mode: Mode,
    /// Write `turn_start` and `turn_end` traces (failures are always traced).
    pub traces: bool,
    /// On a cluster: the fence of the claim under which this node runs the turn (its writes
    /// carry it, and are refused once another node has taken the turn over).
    pub claim: Option<i64>,
    /// On a cluster: turns true when the claim is lost; the run stops at once.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// The server granted this turn to this executor a moment ago (a push claim's answer, which
    /// it gives only while the turn is the agent's): the first attempt runs without asking it
    /// again.
    pub granted: bool,
}

impl Assignment {
    /// Attempt `attempt` at this turn, as the executor's traces name it.
    pub fn attempt(&self, attempt: u32) -> TurnAttempt {
        TurnAttempt {
            agent: self.agent_id.clone(),
            turn: self.turn,
            attempt,
        }
    }
}

/// How the core runs a turn.
#[derive(Debug, Clone)]
pub struct ExecPolicy {
    /// How long to wait for the turn to close after the agent returned having posted only
    /// progress (finality `none`).
    pub grace: Duration,
    /// Attempts at most (the first included).
    pub max_attempts: u32,
    /// The first retry's delay; it doubles with each retry.
    pub backoff: Duration,
}

impl Default for ExecPolicy {
    fn default() -> Self {
        ExecPolicy {
            grace: Duration::from_millis(250),
            max_attempts: 3,
            backoff: Duration::from_millis(50),
        }
    }
}

impl ExecPolicy {
    /// How long to wait before the attempt after failed attempt `attempt` (1 for the first):
    /// `backoff`, doubled for each retry before; `None` when the retry would start at or past
    /// `deadline` (the turn's time is up, so the run fails now).
    pub fn retry_after(&self, attempt: u32, now: Instant, deadline: Instant) -> Option<Duration> {
        let delay = self
            .backoff
            .saturating_mul(2u32.saturating_pow(attempt.saturating_sub(1)));
        (now + delay < deadline).then_some(delay)
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunReport {
    /// The agent returned this outcome.
    Done(TurnOutcome),
    /// Another invocation for the same conversation and agent is running.
    AlreadyRunning,
    /// The turn was no longer the agent's (answered elsewhere, closed, paused).
    NotMine,
    /// The deadline passed while the agent ran.
    DeadlineExceeded,
    /// Every attempt failed; the last error.
    Failed(String),
}

impl RunReport {
    /// A short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            RunReport::Done(_) => "done",
            RunReport::AlreadyRunning => "already_running",
            RunReport::NotMine => "not_mine",
            RunReport::DeadlineExceeded => "deadline_exceeded",
            RunReport::Failed(_) => "failed",
        }
    }
}

/// The histogram of executor runs, in seconds, by `outcome` ([`RunReport::label`]); recorded
/// through the `metrics` facade.
pub const RUN_SECONDS: &str = "orchestrator_executor_run_seconds";

/// The executor core. Cheap to share.
#[derive(Debug, Default)]
pub struct ExecutorCore {
    policy: ExecPolicy,
    slots: Mutex<HashMap<(String, String), Arc<Slot>>>,
}

/// One (conversation, agent): the invocation running (its turn, 0 for none), and a lock that
/// makes a later turn wait for an earlier invocation to finish.
#[derive(Debug, Default)]
struct Slot {
    lock: tokio::sync::Mutex<()>,
    turn: AtomicU64,
}

struct Running<'a> {
    core: &'a ExecutorCore,
    key: (String, String),
    slot: Arc<Slot>,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.slot.turn.store(0, Ordering::Release);
        if let Ok(mut slots) = self.core.slots.lock() {
            // Forget the slot when nobody waits for it (the map, the running call's own handle
            // and this one are the only holders).
            if Arc::strong_count(&self.slot) <= 3 {
                slots.remove(&self.key);
            }
        }
    }
}

/// Whether `turn` of the conversation is still `agent`'s to take.
pub async fn still_mine(client: &dyn AgentClient, conversation_id: &str, turn: u64) -> bool {
    match client.get_conversation(conversation_id).await {
        Ok(s) => s.turn == turn && s.guidance.status == GuidanceStatus::MaySpeak,
        Err(_) => false,
    }
}

/// Polls `f` once, in the caller's task: what a write's first poll does (queue it) is done
/// when this returns.
async fn poll_once<F: Future + Unpin>(f: &mut F) -> std::task::Poll<F::Output> {
    std::future::poll_fn(|cx| std::task::Poll::Ready(std::pin::Pin::new(&mut *f).poll(cx))).await
}

fn gone(code: Option<ErrorCode>) -> bool {
    matches!(
        code,
        Some(
            ErrorCode::TurnClosed
                | ErrorCode::TurnMismatch
                | ErrorCode::ConversationClosed
                | ErrorCode::NotYourTurn
                | ErrorCode::ConversationPaused
                | ErrorCode::Forbidden
                | ErrorCode::ConversationNotFound
        )
    )
}

/// An attempt's `turn_start` sent ahead of the agent's writes, its answer not yet awaited.
type PendingStart = Pin<Box<dyn Future<Output = ClientResult<AppendResult>> + Send>>;

/// How an attempt's start went.
enum Start {
    /// The agent may run; with the `turn_start` it runs ahead of, when that is not answered yet.
    Running(Option<PendingStart>),
    /// The turn is not the agent's any more.
    NotMine,
    /// The start failed (this error): the next attempt may succeed.
    Failed(String),
}

impl Start {
    /// What the `turn_start`'s answer means for the attempt.
    fn answered(answer: ClientResult<AppendResult>) -> Start {
        match answer {
            Ok(_) => Start::Running(None),
            Err(e) if gone(e.code()) => Start::NotMine,
            Err(e) => Start::Failed(e.to_string()),
        }
    }
}

impl ExecutorCore {
    /// A core with this policy.
    pub fn new(policy: ExecPolicy) -> Self {
        ExecutorCore {
            policy,
            slots: Mutex::default(),
        }
    }

    /// Runs `agent` for the assignment, through `client`. At most one invocation per
    /// (conversation, agent) runs at a time: a call for the turn already running returns
    /// `AlreadyRunning`; a call for another turn waits for the running one to finish.
    pub async fn run(
        &self,
        agent: &dyn Agent,
        client: Arc<dyn ExecutorClient>,
        a: &Assignment,
    ) -> RunReport {
        let started = Instant::now();
        let report = self.run_once(agent, client, a).await;
        if !matches!(report, RunReport::AlreadyRunning) {
            metrics::histogram!(RUN_SECONDS, "outcome" => report.label())
                .record(started.elapsed().as_secs_f64());
        }
        report
    }

    async fn run_once(
        &self,
        agent: &dyn Agent,
        client: Arc<dyn ExecutorClient>,
        a: &Assignment,
    ) -> RunReport {
        let key = (a.conversation_id.clone(), a.agent_id.clone());
        let slot = {
            let Ok(mut slots) = self.slots.lock() else {
                return RunReport::Failed("executor state poisoned".into());
            };
            slots.entry(key.clone()).or_default().clone()
        };
        if slot.turn.load(Ordering::Acquire) == a.turn {
            return RunReport::AlreadyRunning;
        }
        let Ok(_guard) = tokio::time::timeout_at(a.deadline, slot.lock.lock()).await else {
            return RunReport::DeadlineExceeded;
        };
        slot.turn.store(a.turn, Ordering::Release);
        let _running = Running {
            core: self,
            key,
            slot: slot.clone(),
        };
        self.attempts(agent, client, a).await
    }

    /// Runs the agent until an attempt ends the turn, the turn stops being its own, the
    /// attempts run out or the deadline passes, tracing each attempt.
    async fn attempts(
        &self,
        agent: &dyn Agent,
        client: Arc<dyn ExecutorClient>,
        a: &Assignment,
    ) -> RunReport {
        let mut last_error = String::new();
        for attempt in 1..=self.policy.max_attempts.max(1) {
            // The first attempt comes straight from an assignment, a claim or fresh guidance;
            // its start trace (which names the turn) fails if the turn has moved on since.
            if attempt > 1 && !still_mine(client.as_ref(), &a.conversation_id, a.turn).await {
                return RunReport::Failed(last_error);
            }
            let mut ctx = AgentContext::new(
                client.clone(),
                a.conversation_id.clone(),
                a.turn,
                attempt,
                a.deadline,
                a.since_seq,
            )
            .with_mode(a.mode);
            let pending = match self.start_attempt(&client, &mut ctx, a, attempt).await {
                Start::Running(pending) => pending,
                Start::NotMine => return RunReport::NotMine,
                Start::Failed(e) => {
                    last_error = e;
                    continue;
                }
            };
            let ran = tokio::time::timeout_at(a.deadline, agent.handle_turn(&ctx)).await;
            if let Some(start) = pending {
                // The agent's writes were held to the trace: when it failed, none landed.
                match Start::answered(start.await) {
                    Start::Running(_) => {}
                    Start::NotMine => return RunReport::NotMine,
                    Start::Failed(e) => {
                        last_error = e;
                        continue;
                    }
                }
            }
            match self.after_attempt(client.as_ref(), a, attempt, ran).await {
                ControlFlow::Break(report) => return report,
                ControlFlow::Continue(error) => last_error = error,
            }
        }
        RunReport::Failed(last_error)
    }

    /// Starts an attempt: its `turn_start`, unless the turn is not traced. When the client can
    /// hold the agent's writes to it ([`ExecutorClient::hold_writes_to`]), the trace is queued
    /// and the agent runs at once through the holding client (`ctx.client`): the trace commits
    /// with the agent's first write (or ahead of it), and that write is refused if the trace
    /// is not in the log. Otherwise the agent waits for the trace's answer.
    async fn start_attempt(
        &self,
        client: &Arc<dyn ExecutorClient>,
        ctx: &mut AgentContext,
        a: &Assignment,
        attempt: u32,
    ) -> Start {
        // Whether the turn is known to be the agent's (later attempts asked before).
        let known_mine = attempt > 1 || a.granted;
        if !a.traces {
            if !known_mine && !still_mine(client.as_ref(), &a.conversation_id, a.turn).await {
                return Start::NotMine;
            }
            return Start::Running(None);
        }
        let key = ctx.next_key("x");
        let trace = SendTraceParams {
            conversation_id: a.conversation_id.clone(),
            payload: ExecutorTrace::TurnStart(a.attempt(attempt)).to_value(),
            turn: Some(a.turn),
            client_request_id: Some(key.clone()),
            finality: None,
            after_key: None,
        };
        let Some(held) = client.hold_writes_to(&a.conversation_id, &key) else {
            return Start::answered(client.send_trace(trace).await);
        };
        // The trace no longer says, before the agent runs, that the turn moved on (answered,
        // timed out, paused): the client's view says it instead, as for a turn not traced.
        if !known_mine && !still_mine(client.as_ref(), &a.conversation_id, a.turn).await {
            return Start::NotMine;
        }
        ctx.client = held.clone();
        let mut start: PendingStart = Box::pin(async move { held.send_trace(trace).await });
        // Its first poll queues it, ahead of anything the agent writes.
        match poll_once(&mut start).await {
            std::task::Poll::Ready(answer) => Start::answered(answer),
            std::task::Poll::Pending => Start::Running(Some(start)),
        }
    }

    /// What follows an attempt the agent returned from (or ran out of time in): the run's
    /// report, or the error to try again after (having waited the retry's delay).
    async fn after_attempt(
        &self,
        client: &dyn ExecutorClient,
        a: &Assignment,
        attempt: u32,
        ran: Result<Result<TurnOutcome, AgentError>, tokio::time::error::Elapsed>,
    ) -> ControlFlow<RunReport, String> {
        match ran {
            Err(_) => {
                self.trace_error(client, a, attempt, "deadline exceeded")
                    .await;
                ControlFlow::Break(RunReport::DeadlineExceeded)
            }
            Ok(Err(e)) => {
                let error = e.to_string();
                self.trace_error(client, a, attempt, &error).await;
                let Some(delay) = self.policy.retry_after(attempt, Instant::now(), a.deadline)
                else {
                    return ControlFlow::Break(RunReport::Failed(error));
                };
                tokio::time::sleep(delay).await;
                ControlFlow::Continue(error)
            }
            Ok(Ok(outcome)) => {
                if outcome == TurnOutcome::Posted && !self.closed_within_grace(client, a).await {
                    // Progress only: the turn is still open. Try again while there is time.
                    self.trace_end(client, a, attempt, TurnEndOutcome::Incomplete, false)
                        .await;
                    return ControlFlow::Continue(
                        "the agent posted progress but did not close its turn".into(),
                    );
                }
                // A reply that closed the turn moved it on: the trace goes straight to the
                // current turn, not first to the closed one (which refuses it).
                let moved_on = outcome == TurnOutcome::Posted;
                self.trace_end(client, a, attempt, outcome.as_trace(), moved_on)
                    .await;
                ControlFlow::Break(RunReport::Done(outcome))
            }
        }
    }

    /// `turn_error` for a failed attempt (written whether or not the turn is traced).
    async fn trace_error(
        &self,
        client: &dyn ExecutorClient,
        a: &Assignment,
        attempt: u32,
        error: &str,
    ) {
        tracing::info!(
            agent = %a.agent_id,
            conversation = %a.conversation_id,
            turn = a.turn,
            attempt,
            max_attempts = self.policy.max_attempts,
            error,
            "an agent's attempt failed"
        );
        let trace = ExecutorTrace::TurnError(TurnError {
            attempt: a.attempt(attempt),
            error: error.to_string(),
        });
        self.trace_in(client, a, trace, true).await;
    }

    /// `turn_end` for an attempt that returned, when the turn is traced; straight into the
    /// current turn when the attempt's turn is known to have closed (`moved_on`).
    async fn trace_end(
        &self,
        client: &dyn ExecutorClient,
        a: &Assignment,
        attempt: u32,
        outcome: TurnEndOutcome,
        moved_on: bool,
    ) {
        if a.traces {
            let trace = ExecutorTrace::TurnEnd(TurnEnd {
                attempt: a.attempt(attempt),
                outcome,
            });
            self.trace_in(client, a, trace, !moved_on).await;
        }
    }

    /// Waits up to the grace window for the turn to stop being the agent's.
    async fn closed_within_grace(&self, client: &dyn ExecutorClient, a: &Assignment) -> bool {
        let until = (Instant::now() + self.policy.grace).min(a.deadline);
        loop {
            let Ok(s) = client.get_conversation(&a.conversation_id).await else {
                return true;
            };
            if s.turn != a.turn || s.guidance.status != GuidanceStatus::MaySpeak {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let waited = client
                .wait_for_change(WaitForChangeParams {
                    conversation_id: a.conversation_id.clone(),
                    since_seq: s.latest_seq,
                    timeout_ms: left.as_millis().max(1) as u64,
                })
                .await;
            if waited.is_err() {
                return true;
            }
        }
    }

    /// Writes an executor trace. Once the agent closed its turn the trace lands in the current
    /// turn (a closed turn takes no traces); its payload names the turn it reports on. Its key
    /// makes it appear once even if the run is repeated.
    ///
    /// `in_turn`: try the turn the trace reports on first; else the current turn at once.
    async fn trace_in(
        &self,
        client: &dyn ExecutorClient,
        a: &Assignment,
        trace: ExecutorTrace,
        in_turn: bool,
    ) {
        let what = match trace {
            ExecutorTrace::TurnStart(_) => "start",
            ExecutorTrace::TurnEnd(_) => "end",
            ExecutorTrace::TurnError(_) => "err",
        };
        let key = format!("t{}.a{}.{what}", a.turn, trace.attempt().attempt);
        let held = (!in_turn)
            .then(|| client.hold_writes_to(&a.conversation_id, &key))
            .flatten();
        let mut p = SendTraceParams {
            conversation_id: a.conversation_id.clone(),
            payload: trace.to_value(),
            turn: in_turn.then_some(a.turn),
            client_request_id: Some(key),
            finality: None,
            after_key: None,
        };
        if let Some(held) = held {
            // Into the current turn, through a client that lets it trail: it is queued here
            // (the first poll), in order with this run's writes, and the run ends without
            // waiting for it; it commits with the next write that comes.
            let mut write = Box::pin(async move {
                if let Err(e) = held.send_trace(p).await {
                    tracing::debug!(error = %e, "executor trace not written");
                }
            });
            if poll_once(&mut write).await.is_pending() {
                tokio::spawn(write);
            }
            return;
        }
        match client.send_trace(p.clone()).await {
            Err(e) if e.code() == Some(ErrorCode::TurnClosed) => {
                p.turn = None;
                if let Err(e) = client.send_trace(p).await {
                    tracing::debug!(error = %e, "executor trace not written");
                }
            }
            Err(e) => tracing::debug!(error = %e, "executor trace not written"),
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn retries_back_off_doubling_until_the_deadline() {
        let policy = ExecPolicy {
            backoff: Duration::from_millis(50),
            ..ExecPolicy::default()
        };
        let start = Instant::now();
        let deadline = start + Duration::from_millis(300);
        // 50 ms after the first failure, 100 after the second, 200 after the third.
        assert_eq!(
            policy.retry_after(1, start, deadline),
            Some(Duration::from_millis(50))
        );
        assert_eq!(
            policy.retry_after(2, start, deadline),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            policy.retry_after(3, start, deadline),
            Some(Duration::from_millis(200))
        );
        // A retry that would start at the deadline or later is not made.
        assert_eq!(
            policy.retry_after(3, start + Duration::from_millis(100), deadline),
            None
        );
        assert_eq!(policy.retry_after(4, start, deadline), None);
        // On the paused clock, a run that keeps failing waits 50 ms, then 100 ms, and then
        // stops: a third retry would start 350 ms in, past the 300 ms deadline.
        let mut now = start;
        let mut waits = Vec::new();
        let mut attempt = 1;
        while let Some(wait) = policy.retry_after(attempt, now, deadline) {
            tokio::time::sleep(wait).await;
            now = Instant::now();
            waits.push(wait);
            attempt += 1;
        }
        assert_eq!(
            waits,
            [Duration::from_millis(50), Duration::from_millis(100)]
        );
        assert_eq!(now - start, Duration::from_millis(150));
    }
}
