//! The small, cheaply cloned summary of a conversation the hub publishes with each commit
//! ([`TurnState`]), its one "is this turn still open" rule, and the guidance it gives an agent.

use super::*;

/// The small, cheaply cloned part of a conversation's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnState {
    /// The latest seq (0: empty log).
    pub head: u64,
    /// The current turn (starts at 1).
    pub turn: u64,
    /// Who holds the turn; `None`: open to every participant.
    pub speaker: Option<String>,
    /// The seq of the `next_speaker` event that named the current speaker (0: none yet). The
    /// publisher and recovery read the turn's start from it, without parsing events again.
    pub speaker_seq: u64,
    /// A message with finality `conversation` was appended.
    pub closed: bool,
    /// Paused by an admin.
    pub paused: bool,
    /// How long the current speaker has, from its `next_speaker` event (a policy's turn timeout).
    pub turn_timeout_ms: Option<u64>,
    /// The speaker waiting for approval, while its approver holds the turn.
    pub pending_approval: Option<String>,
    /// In a `sequence` order: the position of the current speaker.
    pub sequence_pos: Option<usize>,
    /// Sub-conversations started and not yet finished (the fan-out limit counts these).
    pub children_open: u32,
    /// In a sub-conversation: the last message of a participant (its result when it closes).
    pub last_said: Option<Arc<LastSaid>>,
    /// Turns in a row that ended by a timeout, with no participant's message closing one.
    pub silent_turns: u32,
    /// The mode the latest turn given to a speaker asks of it (what guidance shows while a
    /// speaker holds the turn; a turn asked again after a timeout asks it again).
    pub mode: Mode,
    /// The mode asked of the speaker waiting for approval, for its turn once approved.
    pub pending_mode: Option<Mode>,
    /// The latest version of each plan and deliverable type (`plan.v1/TYPE`,
    /// `deliverable.v1/TYPE`); shared until one is written.
    pub doc_versions: Arc<std::collections::BTreeMap<String, u64>>,
}

/// A participant's message, kept as a sub-conversation's result.
impl TurnState {
    /// Whether time runs for the conversation: it is open and not paused. Turns are handed
    /// out and timers fire only while it does.
    pub fn is_running(&self) -> bool {
        !self.closed && !self.paused
    }

    /// The turn to hand out, if one is due: the current turn and its speaker, while the
    /// conversation runs and a speaker is named.
    pub fn turn_to_hand_out(&self) -> Option<(&str, u64)> {
        let speaker = self.speaker.as_deref()?;
        self.is_running().then_some((speaker, self.turn))
    }

    /// Whether `agent` still holds turn `turn`: the conversation runs, the turn has not moved
    /// on, and `agent` is its speaker. The one "is this turn still open" rule that offers,
    /// claims and the executor's assignments follow.
    pub fn holds_turn(&self, agent: &str, turn: u64) -> bool {
        self.turn_to_hand_out() == Some((agent, turn))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastSaid {
    /// Its seq.
    pub seq: u64,
    /// Its author.
    pub author: String,
    /// Its payload, as stored.
    pub payload: String,
}

/// Guidance for one agent, from the participants and the core state.
pub fn guidance_for(participants: &[String], c: &TurnState, agent: &str) -> Guidance {
    let (status, reason) = if c.closed {
        (GuidanceStatus::Closed, None)
    } else if c.paused {
        (GuidanceStatus::Wait, Some("paused"))
    } else if !participants.iter().any(|p| p == agent) {
        (GuidanceStatus::Wait, Some("not_a_participant"))
    } else if c.speaker.as_deref().is_some_and(|s| s != agent) {
        (GuidanceStatus::Wait, Some("not_your_turn"))
    } else {
        (GuidanceStatus::MaySpeak, None)
    };
    Guidance {
        status,
        turn: c.turn,
        speaker: c.speaker.clone(),
        deadline: None,
        reason: reason.map(str::to_string),
        mode: c.speaker.as_ref().map(|_| c.mode),
    }
}
