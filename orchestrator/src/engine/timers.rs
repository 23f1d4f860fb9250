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

use crate::engine::hub::Hub;
use crate::engine::state::AppendRequest;
use crate::engine::store::now_ms;
use crate::engine::writer::WriterHandle;

/// How often deadlines are checked.
pub const TICK: Duration = Duration::from_millis(20);

/// How long after a turn's deadline its `turn_timeout` is written: executors stop their agent
/// at the deadline itself, and their `turn_error` trace lands first.
pub const TURN_TIMEOUT_GRACE_MS: i64 = 100;

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
            let now = now_ms();
            for conv in hub.all() {
                // Only a policy sets timers; most conversations are passed over here.
                let timed = conv.policy().is_some_and(|p| {
                    p.timeout_ms.is_some()
                        || p.idle_timeout_ms.is_some()
                        || p.max_duration_ms.is_some()
                });
                if !timed {
                    continue;
                }
                let core = conv.core();
                if !core.is_running() {
                    continue;
                }
                let (idle, max) = conv.stop_deadlines();
                let due = if max.is_some_and(|m| now >= m) {
                    Some(SystemEvent::MaxDuration)
                } else if idle.is_some_and(|i| now >= i) {
                    Some(SystemEvent::IdleTimeout)
                } else if conv
                    .turn_deadline_ms(&core)
                    .is_some_and(|d| now >= d + TURN_TIMEOUT_GRACE_MS)
                {
                    Some(SystemEvent::TurnTimeout(TurnTimeout {
                        turn: core.turn,
                        speaker: core.speaker.clone().unwrap_or_default(),
                    }))
                } else {
                    None
                };
                let Some(event) = due else { continue };
                let key = (core.head, event.type_name());
                if fired.get(&conv.id) == Some(&key) {
                    continue;
                }
                fired.insert(conv.id.clone(), key);
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
