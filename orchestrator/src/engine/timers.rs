//! Timers: turn timeouts, idle timeouts and maximum durations.
//!
//! Every deadline is computed from logged timestamps (the `next_speaker` event, the last
//! event, the `created` event) with the policy recorded in the log, so timers hold across a
//! restart: a deadline that passed while the server was down fires at start. When one passes,
//! the timer appends a system event (`turn_timeout` naming its turn, `idle_timeout`,
//! `max_duration`) through the writer; the state machine decides what it means (skip, end or
//! retry the turn; close the conversation). A `turn_timeout` names its turn, so one that
//! races with the speaker's answer is refused (`TurnClosed`) and changes nothing.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use proto_spec::system::{SystemEvent, TurnTimeout};

use crate::engine::hub::{ConvView, Hub};
use crate::engine::state::AppendRequest;
use crate::engine::state::TurnState;
use crate::engine::store::now_ms;
use crate::engine::writer::WriterHandle;

/// How often deadlines are checked.
pub const TICK: Duration = Duration::from_millis(20);

/// How long after a turn's deadline its `turn_timeout` is written: executors stop their agent
/// at the deadline itself, and their `turn_error` trace lands first.
pub const TURN_TIMEOUT_GRACE_MS: i64 = 100;

/// How long a closed conversation stays in memory on a shared store after a client last
/// named it.
pub const FORGET_IDLE: Duration = Duration::from_secs(300);

/// Checks every conversation's deadlines each [`TICK`] until the server stops.
pub fn spawn(hub: Arc<Hub>, writer: WriterHandle) {
    tokio::spawn(async move {
        let mut closing = hub.closing();
        // What was fired, so that it is not fired again while its append is in flight.
        let mut fired: HashMap<String, (u64, &'static str)> = HashMap::new();
        let mut ticks: u64 = 0;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(TICK) => {}
                _ = closing.wait_for(|c| *c) => return,
            }
            ticks += 1;
            if ticks.is_multiple_of(50) {
                // About once a second: recent events past their window leave memory.
                hub.trim_recent();
            }
            if ticks.is_multiple_of(50 * 60) {
                // About once a minute, on a shared store: closed conversations nobody named
                // lately leave memory (loaded again when named).
                let writer = writer.clone();
                tokio::spawn(async move {
                    if let Ok(n @ 1..) = writer.forget_idle(FORGET_IDLE).await {
                        tracing::debug!(conversations = n, "idle closed conversations let go");
                    }
                });
            }
            let now = now_ms();
            for conv in hub.all() {
                let core = conv.core();
                let Some(event) = due(&conv, &core, now) else {
                    continue;
                };
                let key = (core.head, event.type_name());
                if fired.get(&conv.id) == Some(&key) {
                    continue;
                }
                fired.insert(conv.id.clone(), key);
                match &event {
                    SystemEvent::TurnTimeout(t) => {
                        tracing::info!(conversation = %conv.id, turn = t.turn, speaker = %t.speaker, "turn timed out")
                    }
                    other => {
                        tracing::info!(conversation = %conv.id, event = other.type_name(), "conversation timer fired")
                    }
                }
                // A turn's timeout names its turn: it is refused if that turn already ended.
                let turn = matches!(event, SystemEvent::TurnTimeout(_)).then_some(core.turn);
                let req = AppendRequest::system(&event).with_turn(turn);
                let (writer, id) = (writer.clone(), conv.id.clone());
                tokio::spawn(async move {
                    if let Err(e) = writer.append(id.clone(), req).await {
                        tracing::debug!(conversation = %id, error = %e, "timer event not appended");
                    }
                });
            }
            fired.retain(|id, _| hub.get(id).is_some_and(|c| !c.core().closed));
        }
    });
}

/// What timer event is due for `conv` at `now` (ms since the epoch), if any: its maximum
/// duration, then its idle timeout, then its turn's timeout (a grace after the deadline). The
/// whole decision, from logged times and the recorded policy; nothing is due while the
/// conversation is closed or paused.
pub fn due(conv: &ConvView, core: &TurnState, now: i64) -> Option<SystemEvent> {
    // Only a policy sets timers; most conversations are passed over here.
    let timed = conv.policy().is_some_and(|p| {
        p.timeout_ms.is_some() || p.idle_timeout_ms.is_some() || p.max_duration_ms.is_some()
    });
    if !timed || !core.is_running() {
        return None;
    }
    let (idle, max) = conv.stop_deadlines();
    if max.is_some_and(|m| now >= m) {
        Some(SystemEvent::MaxDuration)
    } else if idle.is_some_and(|i| now >= i) {
        Some(SystemEvent::IdleTimeout)
    } else if conv
        .turn_deadline_ms(core)
        .is_some_and(|d| now >= d + TURN_TIMEOUT_GRACE_MS)
    {
        Some(SystemEvent::TurnTimeout(TurnTimeout {
            turn: core.turn,
            speaker: core.speaker.clone().unwrap_or_default(),
        }))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use proto_spec::system::SystemEvent;

    use super::*;
    use crate::engine::scenario::Scenario;
    use crate::engine::state::{AppendRequest, Applied, ConvMachine};

    /// A conversation of this scenario, created at `created_ms`, as the hub holds it.
    fn conversation(scenario: serde_json::Value, created_ms: i64) -> (ConvMachine, Arc<ConvView>) {
        let s = Scenario::parse(&scenario, &*crate::engine::config::Limits::default().kinds)
            .expect("scenario");
        let mut state = ConvMachine::new("c", s.participants.clone());
        let created =
            ConvMachine::created_event_with(&s.participants, None, "admin", s.policy.as_ref());
        assert!(matches!(state.apply(created), Ok(Applied::Append(..))));
        let view = Hub::make("c", s.participants.clone(), state.core.clone());
        if let Some(p) = state.policy() {
            view.set_policy(p.clone());
        }
        view.set_clock(created_ms, created_ms);
        view.set_turn_started(created_ms);
        (state, view)
    }

    #[test]
    fn a_turn_times_out_a_grace_after_its_logged_deadline() {
        let (state, view) = conversation(
            serde_json::json!({"participants": ["a", "b"], "policy": {"order": "round_robin"}, "turn": {"timeout": "1s"}}),
            1_000_000,
        );
        let core = state.core.clone();
        assert_eq!(core.speaker.as_deref(), Some("a"));
        let deadline = 1_001_000;
        assert_eq!(due(&view, &core, deadline), None);
        assert_eq!(
            due(&view, &core, deadline + TURN_TIMEOUT_GRACE_MS - 1),
            None
        );
        assert_eq!(
            due(&view, &core, deadline + TURN_TIMEOUT_GRACE_MS),
            Some(SystemEvent::TurnTimeout(TurnTimeout {
                turn: 1,
                speaker: "a".into()
            }))
        );
    }

    #[test]
    fn idleness_and_the_maximum_duration_come_from_logged_times_and_wait_while_paused() {
        let (mut state, view) = conversation(
            serde_json::json!({"participants": ["a", "b"], "stop": {"idleTimeout": "5s", "maxDuration": "1m"}}),
            1_000_000,
        );
        let core = state.core.clone();
        assert_eq!(due(&view, &core, 1_004_999), None);
        assert_eq!(due(&view, &core, 1_005_000), Some(SystemEvent::IdleTimeout));
        // A participant spoke at 1,004,000: idleness counts from there; the duration from
        // creation.
        view.set_clock(0, 1_004_000);
        assert_eq!(due(&view, &core, 1_008_999), None);
        assert_eq!(due(&view, &core, 1_060_000), Some(SystemEvent::MaxDuration));
        // Paused, nothing is due.
        let paused = AppendRequest::system(&SystemEvent::Paused(proto_spec::system::ChangedBy {
            by: "admin".into(),
        }));
        assert!(matches!(state.apply(paused), Ok(Applied::Append(..))));
        assert_eq!(due(&view, &state.core, 2_000_000), None);
    }

    #[test]
    fn a_conversation_without_timers_is_never_due() {
        let (state, view) = conversation(serde_json::json!({"participants": ["a", "b"]}), 0);
        assert_eq!(due(&view, &state.core, i64::MAX / 2), None);
    }
}
