//! The SQLite store writes every field of every row, whether a batch inserts it in a chunk of
//! rows or alone, and reads it back the same after a sync and after a reopen.

use orchestrator::engine::state::Draft;
use orchestrator::engine::store::sqlite::{SqliteStore, Synchronous};
use orchestrator::engine::store::{NewConversation, NewRow, Store};
use proto_spec::{EventKind, Finality};
use serde_json::value::RawValue;

fn rows(ds: &[Draft]) -> Vec<NewRow<'_>> {
    ds.iter()
        .map(|draft| NewRow {
            conv: 1,
            draft,
            ts_ms: 1_700_000_000_000 + draft.seq as i64,
        })
        .collect()
}

/// Events 1..=n of one conversation, with every optional field set on some and not others.
fn drafts(n: u64) -> Vec<Draft> {
    (1..=n)
        .map(|seq| {
            let message = seq % 3 != 0;
            Draft {
                seq,
                kind: if message {
                    EventKind::Message
                } else {
                    EventKind::Trace
                },
                author: format!("agent-{}", seq % 5),
                turn: 1 + seq / 7,
                finality: match (message, seq % 2) {
                    (false, _) => None,
                    (true, 0) => Some(Finality::None),
                    (true, _) => Some(Finality::Turn),
                },
                payload: RawValue::from_string(format!(r#"{{"text":"row {seq}"}}"#)).unwrap(),
                client_request_id: (seq % 4 == 0).then(|| format!("key-{seq}")),
                hash: (seq % 4 == 0).then_some([seq as u8; 16]),
                doc: false,
            }
        })
        .collect()
}

#[test]
fn every_field_of_every_row_reads_back_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rows.db");
    // 16-row chunks and single rows: 2 chunks and 9 alone in one batch, then 3 alone.
    let all = drafts(44);
    {
        let store = SqliteStore::open(&path, Synchronous::Full).unwrap();
        let mut writer = store.writer().unwrap();
        let mut durability = writer.durability().unwrap();
        let conv = NewConversation {
            id: "c".into(),
            num: 1,
            participants: vec!["agent-0".into()],
            created_by: "admin".into(),
            metadata: None,
            declared: Vec::new(),
        };
        writer.commit(&[conv], &rows(&all[..41])).unwrap();
        assert!(
            store.read_events("c", 0, 100).unwrap().is_empty(),
            "nothing is read before it is synced"
        );
        durability.sync().unwrap();
        writer.commit(&[], &rows(&all[41..])).unwrap();
        durability.sync().unwrap();
        let read = store.read_events("c", 0, 100).unwrap();
        assert_eq!(read.len(), all.len());
        for (e, d) in read.iter().zip(&all) {
            assert_eq!(
                (
                    e.seq,
                    e.kind,
                    &e.author,
                    e.turn,
                    e.finality,
                    e.payload.get(),
                    &e.client_request_id
                ),
                (
                    d.seq,
                    d.kind,
                    &d.author,
                    d.turn,
                    d.finality,
                    d.payload.get(),
                    &d.client_request_id
                )
            );
            assert_eq!(
                e.ts,
                orchestrator::engine::store::format_ts(1_700_000_000_000 + d.seq as i64)
            );
        }
    }
    // Reopened: recovery sees the same rows, digests included.
    let store = SqliteStore::open(&path, Synchronous::Full).unwrap();
    let mut recovered = Vec::new();
    store
        .recover(&mut |record, events| {
            assert_eq!(record.id, "c");
            recovered = events;
        })
        .unwrap();
    assert_eq!(recovered.len(), all.len());
    for (r, d) in recovered.iter().zip(&all) {
        assert_eq!(
            (r.draft.seq, &r.draft.client_request_id, r.draft.hash),
            (d.seq, &d.client_request_id, d.hash)
        );
        assert_eq!(r.ts_ms, 1_700_000_000_000 + d.seq as i64);
    }
}
