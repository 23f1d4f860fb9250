//! A batch as the arrays the writer's statements take, and rows read back into events, recovered
//! events and records.

use proto_spec::{Event, Finality};
use serde_json::value::RawValue;
use serde_json::Value;
use tokio_postgres::{Client, Row};

use super::statements::Statements;
use crate::engine::error::{Error, Result};
use crate::engine::state::Draft;
use crate::engine::store::{
    finality_from, format_ts, hash_from, kind_from, ConversationRecord, NewConversation, NewRow,
    RecoveredEvent, TurnKey,
};

/// One batch's rows, as the arrays its statements take (owned, to cross to the driver).
pub struct Batch {
    convs: ConvColumns,
    declared: Vec<String>,
    events: EventColumns,
    /// Per conversation written: its number and its head after the batch.
    heads: (Vec<i64>, Vec<i64>),
    /// The conversations the batch closes.
    closing: Vec<i64>,
    ts_ms: i64,
    /// Every conversation written with its new head (`num:head,…`).
    heads_text: String,
    /// The notification: `heads_text`, or `*` when that is too long for one.
    notice: String,
}

/// New conversations as columns: number, id, creator, participants and metadata (JSON).
#[derive(Default)]
struct ConvColumns(
    Vec<i64>,
    Vec<String>,
    Vec<String>,
    Vec<String>,
    Vec<Option<String>>,
);

#[derive(Default)]
struct EventColumns {
    conv: Vec<i64>,
    seq: Vec<i64>,
    kind: Vec<&'static str>,
    author: Vec<String>,
    turn: Vec<i64>,
    finality: Vec<Option<&'static str>>,
    payload: Vec<String>,
    client_request_id: Vec<Option<String>>,
    hash: Vec<Option<Vec<u8>>>,
    ts_ms: Vec<i64>,
    doc: Vec<Option<bool>>,
}

impl Batch {
    pub fn new(convs: &[NewConversation], rows: &[NewRow<'_>]) -> Batch {
        let mut b = Batch {
            convs: Default::default(),
            declared: Vec::new(),
            events: EventColumns::default(),
            heads: Default::default(),
            closing: Vec::new(),
            ts_ms: rows.first().map_or(0, |r| r.ts_ms),
            heads_text: String::new(),
            notice: String::new(),
        };
        for c in convs {
            b.convs.0.push(c.num);
            b.convs.1.push(c.id.clone());
            b.convs.2.push(c.created_by.clone());
            b.convs
                .3
                .push(serde_json::to_string(&c.participants).unwrap_or_default());
            b.convs.4.push(c.metadata.as_ref().map(Value::to_string));
            b.declared.extend(c.declared.iter().cloned());
        }
        let e = &mut b.events;
        for r in rows {
            let d = r.draft;
            e.conv.push(r.conv);
            e.seq.push(d.seq as i64);
            e.kind.push(d.kind.as_str());
            e.author.push(d.author.clone());
            e.turn.push(d.turn as i64);
            e.finality.push(d.finality.map(|f| f.as_str()));
            e.payload.push(d.payload.get().to_string());
            e.client_request_id.push(d.client_request_id.clone());
            e.hash.push(d.hash.map(|h| h.to_vec()));
            e.ts_ms.push(r.ts_ms);
            e.doc.push(r.document().then_some(true));
            let h = &mut b.heads;
            // Rows come grouped by conversation, in seq order.
            if h.0.last() == Some(&r.conv) {
                let last = h.1.len() - 1;
                h.1[last] = d.seq as i64;
            } else {
                h.0.push(r.conv);
                h.1.push(d.seq as i64);
            }
            if d.finality == Some(Finality::Conversation) {
                b.closing.push(r.conv);
            }
        }
        b.heads_text = heads_text(&b.heads.0, &b.heads.1);
        b.notice = if b.heads_text.len() > super::NOTIFY_MAX {
            "*".into()
        } else {
            b.heads_text.clone()
        };
        b
    }

    /// Writes the batch in the open transaction (or one it begins): conversations,
    /// declarations, events (failing, as a whole, when another node has written one of their
    /// seqs: the (conversation, seq) primary key is the compare-and-set on each head), the
    /// conversations it closes, the record of the commit and the notification; then, with
    /// `commit`, the COMMIT (without it, the transaction is left open for the caller to end).
    pub async fn write(
        &self,
        c: &Client,
        st: &Statements,
        begin: bool,
        lock: &[i64],
        claims: Option<&Claims>,
        commit: bool,
    ) -> Result<Vec<(TurnKey, i64)>> {
        let ConvColumns(n, i, b, p, m) = &self.convs;
        let conv_params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [n, i, b, p, m];
        let e = &self.events;
        let event_params: [&(dyn tokio_postgres::types::ToSql + Sync); 11] = [
            &e.conv,
            &e.seq,
            &e.kind,
            &e.author,
            &e.turn,
            &e.finality,
            &e.payload,
            &e.client_request_id,
            &e.hash,
            &e.ts_ms,
            &e.doc,
        ];
        let closing: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&self.closing];
        let declared: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&self.declared];
        let notice_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&self.notice];
        let commit_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] =
            [&self.ts_ms, &self.heads_text];
        // Sent together, in this order (the driver pipelines them: one round trip and the
        // commit's sync): a statement that fails aborts the transaction, and the COMMIT after
        // it then rolls back — the batch fails as a whole, and the error says why.
        let began = async {
            if begin {
                c.batch_execute("BEGIN").await?;
            }
            Ok::<_, tokio_postgres::Error>(())
        };
        // The rows of conversations the batch did not lock before deciding, before anything is
        // written: every writer of a conversation holds its lock when it inserts its events.
        let locked = async {
            if !lock.is_empty() {
                c.query(&st.lock_convs, &[&lock]).await?;
            }
            Ok(())
        };
        let convs = async {
            if !n.is_empty() {
                c.execute(&st.insert_convs, &conv_params).await?;
            }
            Ok(())
        };
        // After the locks and the new rows: none of the conversations written was deleted.
        let written: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&self.heads.0];
        let checked = async {
            if !self.heads.0.is_empty() {
                c.query(&st.check_convs, &written).await?;
            }
            Ok(())
        };
        let declare = async {
            if !self.declared.is_empty() {
                // Serialized with token creation for the same ids (`insert_token`).
                c.execute(&st.lock_ids, &declared).await?;
                c.execute(&st.declare, &declared).await?;
            }
            Ok(())
        };
        let inserted = c.execute(&st.insert_events, &event_params);
        // The batch holds these rows' locks already (it locks every conversation it writes);
        // sent after the events, which it reads.
        let closed = async {
            if !self.closing.is_empty() {
                c.execute(&st.close_convs, &closing).await?;
            }
            Ok(())
        };
        let claimed = async {
            match claims {
                Some(k) => {
                    c.query(
                        &st.claim_turns,
                        &[&k.convs, &k.turns, &k.holder, &k.lease_ms],
                    )
                    .await
                }
                None => Ok(Vec::new()),
            }
        };
        let notified = c.execute(&st.notify, &notice_params);
        let recorded = c.execute(&st.record_commit, &commit_params);
        let committed = async {
            if commit {
                c.batch_execute("COMMIT").await?;
            }
            Ok(())
        };
        let (.., claimed, _, _, ()) = futures::try_join!(
            began, locked, convs, checked, declare, inserted, closed, claimed, notified, recorded,
            committed
        )?;
        Ok(claimed
            .iter()
            .map(|r| {
                let key = TurnKey {
                    conversation_id: r.get(0),
                    turn: r.get::<_, i64>(1) as u64,
                };
                (key, r.get(2))
            })
            .collect())
    }
}

/// Turns a commit claims for the node that will run them (`LogWriter::claim_with_commit`).
#[derive(Debug)]
pub struct Claims {
    convs: Vec<String>,
    turns: Vec<i64>,
    holder: String,
    lease_ms: i64,
}

impl Claims {
    pub fn new(holder: &str, turns: Vec<TurnKey>, lease: std::time::Duration) -> Claims {
        let (convs, turns) = turns
            .into_iter()
            .map(|k| (k.conversation_id, k.turn as i64))
            .unzip();
        Claims {
            convs,
            turns,
            holder: holder.to_string(),
            lease_ms: lease.as_millis() as i64,
        }
    }
}

/// What a batch wrote: `num:head` per conversation.
fn heads_text(nums: &[i64], heads: &[i64]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for (n, h) in nums.iter().zip(heads) {
        if !s.is_empty() {
            s.push(',');
        }
        let _ = write!(s, "{n}:{h}");
    }
    s
}

/// Rows of `read_many` (`conv` then [`CATCH_UP_COLUMNS`], ordered by conversation and seq),
/// grouped by conversation.
pub fn by_conversation(rows: &[Row]) -> Result<Vec<(i64, Vec<RecoveredEvent>)>> {
    let mut out: Vec<(i64, Vec<RecoveredEvent>)> = Vec::new();
    for r in rows {
        let num: i64 = r.try_get(0)?;
        let event = recovered_from(r, 1)?;
        match out.last_mut() {
            Some((n, events)) if *n == num => events.push(event),
            _ => out.push((num, vec![event])),
        }
    }
    Ok(out)
}

/// A conversation row (`num, id, created_by, participants, metadata`).
pub fn record_from(r: &Row) -> Result<ConversationRecord> {
    let participants: String = r.try_get(3)?;
    let metadata: Option<String> = r.try_get(4)?;
    Ok(ConversationRecord {
        num: r.try_get(0)?,
        id: r.try_get(1)?,
        created_by: r.try_get(2)?,
        participants: serde_json::from_str(&participants)
            .map_err(|e| Error::Corrupt(format!("participants: {e}")))?,
        metadata: metadata.and_then(|m| serde_json::from_str(&m).ok()),
    })
}

/// An event for the state machine, from [`RECOVER_COLUMNS`] starting at column `at`.
pub fn recovered_from(r: &Row, at: usize) -> Result<RecoveredEvent> {
    let payload: Option<String> = r.try_get(at + 5)?;
    let payload = match payload {
        Some(p) => RawValue::from_string(p).map_err(|e| Error::Corrupt(e.to_string()))?,
        None => RawValue::NULL.to_owned(),
    };
    let kind = kind_from(r.try_get(at + 1)?)?;
    Ok(RecoveredEvent {
        draft: Draft {
            seq: r.try_get::<_, i64>(at)? as u64,
            kind,
            doc: Draft::doc_of(kind, payload.get()),
            author: r.try_get(at + 2)?,
            turn: r.try_get::<_, i64>(at + 3)? as u64,
            finality: finality_from(r.try_get(at + 4)?)?,
            payload,
            client_request_id: r.try_get(at + 6)?,
            hash: hash_from(r.try_get(at + 7)?),
        },
        ts_ms: r.try_get(at + 8)?,
    })
}

/// A wire event (`seq, kind, author, turn, finality, payload, client_request_id, ts_ms`).
pub fn event_from(conversation: &str, r: &Row) -> Result<Event> {
    Ok(Event {
        conversation_id: conversation.to_string(),
        seq: r.try_get::<_, i64>(0)? as u64,
        kind: kind_from(r.try_get(1)?)?,
        author: r.try_get(2)?,
        turn: r.try_get::<_, i64>(3)? as u64,
        finality: finality_from(r.try_get(4)?)?,
        payload: RawValue::from_string(r.try_get(5)?).map_err(|e| Error::Corrupt(e.to_string()))?,
        client_request_id: r.try_get(6)?,
        ts: format_ts(r.try_get(7)?),
        json: Default::default(),
    })
}

/// Conversation rows with their events (rows of `conv, RECOVER_COLUMNS` or `conv,
/// CATCH_UP_COLUMNS`, ordered by
/// conversation then seq, conversations in the same order as `convs`), paired.
pub fn with_events(
    convs: &[Row],
    events: Vec<Row>,
) -> Result<Vec<(ConversationRecord, Vec<RecoveredEvent>)>> {
    let mut events = events.into_iter().peekable();
    let mut out = Vec::with_capacity(convs.len());
    for r in convs {
        let record = record_from(r)?;
        let mut mine = Vec::new();
        while let Some(e) = events.next_if(|e| e.get::<_, i64>(0) == record.num) {
            mine.push(recovered_from(&e, 1)?);
        }
        out.push((record, mine));
    }
    if let Some(e) = events.next() {
        return Err(Error::Corrupt(format!(
            "events of unknown conversation {}",
            e.get::<_, i64>(0)
        )));
    }
    Ok(out)
}
