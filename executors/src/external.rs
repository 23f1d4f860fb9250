//! [`ExternalExecutor`]: runs an agent in a partner's process, in pull or push-claim mode.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agent_sdk::proto::*;
use agent_sdk::{Agent, ClientResult, ExecutorClient};
use tokio::time::Instant;

use crate::core::{Assignment, ExecutorCore};

/// Runs one agent for one identity, taking turns as they come.
#[derive(Clone)]
pub struct ExternalExecutor {
    client: Arc<dyn ExecutorClient>,
    agent: Arc<dyn Agent>,
    core: Arc<ExecutorCore>,
    /// The deadline used when the server names none (pull mode without a turn timeout).
    pub default_timeout: Duration,
}

impl std::fmt::Debug for ExternalExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalExecutor")
            .field("agent", &self.client.agent_id())
            .finish()
    }
}

fn deadline_from(rfc3339: Option<&str>, default: Duration) -> Instant {
    let now = Instant::now();
    let Some(at) = rfc3339.and_then(|d| chrono::DateTime::parse_from_rfc3339(d).ok()) else {
        return now + default;
    };
    let left = at.timestamp_millis() - chrono::Utc::now().timestamp_millis();
    now + Duration::from_millis(left.max(0) as u64)
}

impl ExternalExecutor {
    /// An executor for `agent`, speaking through `client` (usually a [`agent_sdk::WsJsonRpcClient`]).
    pub fn new(
        client: Arc<dyn ExecutorClient>,
        agent: Arc<dyn Agent>,
        core: Arc<ExecutorCore>,
    ) -> Self {
        ExternalExecutor {
            client,
            agent,
            core,
            default_timeout: Duration::from_secs(60),
        }
    }

    /// Push-claim mode: registers for `request_turn` offers, claims each one, and runs the
    /// agent on every claim granted. The reply carries the claimed turn as `turnHint`, so a
    /// replica that lost its claim cannot post a second reply. Returns when the registration
    /// ends (the client closed).
    pub async fn run_push(&self) -> ClientResult<()> {
        let mut offers = self
            .client
            .register_executor(RegisterExecutorParams {
                mode: ExecutorMode::Push,
            })
            .await?;
        while let Some(offer) = offers.next().await {
            let me = self.clone();
            tokio::spawn(async move {
                let claimed = me
                    .client
                    .claim_turn(ClaimTurnParams {
                        claim_id: offer.claim_id.clone(),
                    })
                    .await;
                let claim = match claimed {
                    Ok(c) if c.granted => c,
                    Ok(_) => return,
                    Err(e) => {
                        tracing::debug!(error = %e, claim = %offer.claim_id, "claim not granted");
                        return;
                    }
                };
                let a = Assignment {
                    conversation_id: claim.conversation_id,
                    agent_id: offer.agent_id,
                    turn: claim.turn,
                    deadline: deadline_from(
                        Some(&claim.deadline),
                        Duration::from_millis(offer.deadline_ms),
                    ),
                    since_seq: offer.since_seq,
                    mode: offer.mode.unwrap_or(Mode::Converse),
                    traces: true,
                    claim: None,
                    stop: None,
                    granted: true,
                };
                let report = me.core.run(me.agent.as_ref(), me.client.clone(), &a).await;
                tracing::debug!(conversation = %a.conversation_id, turn = a.turn, ?report, "claimed turn ran");
            });
        }
        Ok(())
    }

    /// Pull mode: follows every conversation the agent takes part in (new ones included) and
    /// runs the agent on each turn its guidance gives it. Each turn is taken at most once by
    /// this executor; after a reconnect the client replays what it missed, so no turn is missed.
    pub async fn run_pull(&self) -> ClientResult<()> {
        let mut events = self.client.subscribe(SubscribeParams::default()).await?;
        // The last turn taken, per conversation.
        let mut handled: HashMap<String, u64> = HashMap::new();
        // Turns open now, in the open conversations the agent takes part in.
        let open = ListConversationsParams {
            status: Some(ListStatus::Open),
            participant: Some(self.client.agent_id().to_string()),
            ..Default::default()
        };
        for s in agent_sdk::all_conversations(self.client.as_ref(), open, 1_000).await? {
            self.consider(&s, &mut handled);
        }
        while let Some(n) = events.next().await {
            let e = &n.event;
            let relevant = match e.kind {
                EventKind::System => true,
                EventKind::Message => e.finality != Some(Finality::None),
                EventKind::Trace => false,
            };
            if !relevant {
                continue;
            }
            match self.client.get_conversation(&n.conversation_id).await {
                Ok(s) => self.consider(&s, &mut handled),
                Err(err) => tracing::debug!(error = %err, "guidance not read"),
            }
        }
        Ok(())
    }

    /// Runs the agent if this snapshot says the turn is its own and it was not taken yet.
    fn consider(&self, s: &Snapshot, handled: &mut HashMap<String, u64>) {
        let me = self.client.agent_id();
        if s.guidance.status != GuidanceStatus::MaySpeak || s.speaker.as_deref() != Some(me) {
            return;
        }
        let last = handled.entry(s.conversation_id.clone()).or_insert(0);
        if *last >= s.turn {
            return;
        }
        *last = s.turn;
        let a = Assignment {
            conversation_id: s.conversation_id.clone(),
            agent_id: me.to_string(),
            turn: s.turn,
            deadline: deadline_from(s.guidance.deadline.as_deref(), self.default_timeout),
            since_seq: 0,
            mode: s.guidance.mode.unwrap_or(Mode::Converse),
            traces: true,
            claim: None,
            stop: None,
            granted: false,
        };
        let this = self.clone();
        tokio::spawn(async move {
            let report = this
                .core
                .run(this.agent.as_ref(), this.client.clone(), &a)
                .await;
            tracing::debug!(conversation = %a.conversation_id, turn = a.turn, ?report, "pulled turn ran");
        });
    }
}
