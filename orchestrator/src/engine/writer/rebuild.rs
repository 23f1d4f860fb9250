//! A conversation's slot rebuilt from its log (at start, or when this node first meets a
//! conversation another node created), and what its view learns once from its `created`
//! event.

use super::*;

/// Gives a conversation's view what its state knows once, from its `created` event: the policy
/// and the parent.
pub(super) fn share_links(state: &ConvMachine, view: &ConvView) {
    if let Some(p) = state.policy() {
        view.set_policy(p.clone());
    }
    if let Some(p) = state.parent() {
        view.set_parent(p.conversation_id.clone());
    }
    if let Some(m) = state.metadata() {
        view.set_metadata(m.clone());
    }
    if let Some(s) = state.scenario() {
        view.set_scenario(s.clone());
    }
}

/// A conversation's slot, its state rebuilt from its events (at start, or when this node first
/// meets a conversation another node created); not yet registered in the hub. A log that holds
/// an idempotency key twice for one author is refused: on SQLite no index stops that, the
/// writer does (its schema step 5), and a start is where a log written otherwise is found.
pub(super) fn slot_from(
    record: crate::engine::store::ConversationRecord,
    events: &[crate::engine::store::RecoveredEvent],
) -> Result<Slot> {
    let mut state = ConvMachine::new(record.id.clone(), record.participants.clone());
    let mut turn_started = 0;
    for e in events {
        if let (Some(key), Some(_)) = (&e.draft.client_request_id, e.draft.hash) {
            if state.knows_key(&e.draft.author, key) {
                return Err(Error::Corrupt(format!(
                    "conversation {}: seq {} repeats the idempotency key {key:?} of {}",
                    record.id, e.draft.seq, e.draft.author
                )));
            }
        }
        state.observe(&e.draft);
        if state.core.speaker_seq == e.draft.seq {
            turn_started = e.ts_ms;
        }
    }
    let shared = Hub::make(
        &record.id,
        state.participants().to_vec(),
        state.core.clone(),
    );
    // Timers count from logged times, so they hold across a restart.
    shared.set_turn_started(turn_started);
    let created_ms = events.first().map_or(0, |e| e.ts_ms);
    let active_ms = events
        .iter()
        .rev()
        .find(|e| e.draft.author != proto_spec::ORCHESTRATOR_AUTHOR)
        .map_or(created_ms, |e| e.ts_ms);
    shared.set_clock(created_ms, active_ms);
    share_links(&state, &shared);
    Ok(Slot::new(record.num, state, shared, record.created_by))
}
