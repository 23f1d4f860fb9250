//! The fold: how each committed event moves a conversation's state. Recovery replays the log
//! through it; the writer runs every event it appends through it.

use std::sync::Arc;

use proto_spec::system::SystemEvent;
use proto_spec::{tenant, EventKind, Finality, Mode};

use super::docs::document_version;
use super::{ConvMachine, Draft, IdemRecord, LastSaid, Members, ParentLink, Seeded};

impl ConvMachine {
    /// Moves the state past one committed event. Recovery calls this for every event in the log.
    pub fn observe(&mut self, d: &Draft) {
        let c = &mut self.core;
        c.head = d.seq;
        match d.kind {
            EventKind::Message => match d.finality {
                Some(Finality::Turn) => {
                    c.turn = d.turn + 1;
                    c.speaker = None;
                    c.turn_timeout_ms = None;
                    c.silent_turns = 0;
                }
                Some(Finality::Conversation) => c.closed = true,
                _ => {}
            },
            EventKind::System => match SystemEvent::parse(d.payload.get()) {
                Some(SystemEvent::Created(created)) => {
                    self.participants = created.participants;
                    self.members = Members::new(&self.participants);
                    self.policy = created.policy.and_then(|p| serde_json::from_value(p).ok());
                    self.metadata = created.metadata.filter(|m| !m.is_null()).map(Arc::new);
                    self.scenario = created.scenario.map(Arc::from);
                    // The payload names the parent within the tenant; the state, by its key.
                    self.parent = created.parent.map(|p| ParentLink {
                        conversation_id: tenant::sibling(&self.id, &p.conversation_id).into_owned(),
                        root: p.root.map(|r| tenant::sibling(&self.id, &r).into_owned()),
                        ..p
                    });
                }
                Some(SystemEvent::NextSpeaker(next)) => {
                    c.turn_timeout_ms = next.timeout_ms;
                    if next.reason.is_none() {
                        c.pending_approval = None;
                        c.pending_mode = None;
                    }
                    c.mode = next.mode.unwrap_or(Mode::Converse);
                    if let Some(p) = next.position {
                        c.sequence_pos = Some(p as usize);
                    }
                    c.speaker = Some(next.speaker);
                    c.speaker_seq = d.seq;
                }
                Some(SystemEvent::ApprovalRequested(ask)) => {
                    c.pending_approval = Some(ask.for_speaker);
                    c.pending_mode = ask.mode;
                    if let Some(p) = ask.position {
                        c.sequence_pos = Some(p as usize);
                    }
                }
                Some(SystemEvent::TurnTimeout(_)) => {
                    // The turn ends without an answer; the policy decides what follows.
                    c.turn = d.turn + 1;
                    c.speaker = None;
                    c.turn_timeout_ms = None;
                    c.silent_turns = c.silent_turns.saturating_add(1);
                }
                // A fork of a sub-conversation stands on its own.
                Some(SystemEvent::ForkedFrom(_)) => self.parent = None,
                Some(SystemEvent::Paused(_)) => c.paused = true,
                Some(SystemEvent::Resumed(_)) => c.paused = false,
                Some(SystemEvent::SubconversationStarted(_)) => c.children_open += 1,
                Some(SystemEvent::SubconversationFinished(_)) => {
                    c.children_open = c.children_open.saturating_sub(1)
                }
                Some(SystemEvent::IdleTimeout | SystemEvent::MaxDuration) | None => {}
            },
            EventKind::Trace => {}
        }
        if d.kind == EventKind::Message {
            if let Some((key, version)) = d.doc.then(|| document_version(d.payload.get())).flatten()
            {
                let versions = Arc::make_mut(&mut self.core.doc_versions);
                let v = versions.entry(key).or_insert(0);
                *v = (*v).max(version);
            }
        }
        // A sub-conversation keeps its last participant message: its result when it closes
        // (not its input, which its opener wrote and need not be a participant).
        if d.kind == EventKind::Message && self.parent.is_some() && self.is_participant(&d.author) {
            self.core.last_said = Some(Arc::new(LastSaid {
                seq: d.seq,
                author: d.author.clone(),
                payload: d.payload.get().to_string(),
            }));
        }
        if let (Some(key), Some(hash)) = (&d.client_request_id, d.hash) {
            let rec = IdemRecord {
                hash,
                seq: d.seq,
                turn: d.turn,
            };
            match self.idem.get_mut(d.author.as_str()) {
                Some(keys) => {
                    keys.insert(key.clone(), rec);
                }
                None => {
                    let mut keys = Seeded::default();
                    keys.insert(key.clone(), rec);
                    self.idem.insert(d.author.clone(), keys);
                }
            }
        }
    }

    /// Forgets idempotency keys recorded at or after `seq` (undo of an uncommitted batch).
    pub fn forget_keys_from(&mut self, seq: u64) {
        self.idem.retain(|_, keys| {
            keys.retain(|_, r| r.seq < seq);
            !keys.is_empty()
        });
    }
}
