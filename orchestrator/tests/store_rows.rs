//! The SQLite store writes every field of every row, whether a batch inserts it in a chunk of
//! rows or alone, and reads it back the same after a sync and after a reopen.

use orchestrator::engine::config::Limits;
use orchestrator::engine::service::Orchestrator;
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

/// A keyed message of `author` at `seq`.
fn keyed(seq: u64, author: &str, key: &str) -> Draft {
    Draft {
        seq,
        kind: EventKind::Message,
        author: author.into(),
        turn: 1,
        finality: Some(Finality::None),
        payload: RawValue::from_string(format!(r#"{{"text":"row {seq}"}}"#)).unwrap(),
        client_request_id: Some(key.into()),
        hash: Some([seq as u8; 16]),
        doc: false,
    }
}

/// No index keeps an idempotency key once per conversation and author on SQLite (the writer
/// does): a log that holds one twice is refused at the start, naming it; the same key of two
/// authors, or in two conversations, is not a repeat.
#[tokio::test]
async fn a_start_refuses_a_log_with_an_idempotency_key_twice() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.db");
    let conv = |num: i64, id: &str| NewConversation {
        id: id.into(),
        num,
        participants: vec!["agent-0".into(), "agent-1".into()],
        created_by: "admin".into(),
        metadata: None,
        declared: Vec::new(),
    };
    let open = |path: &std::path::Path| {
        let store = SqliteStore::open(path, Synchronous::Full).unwrap();
        Orchestrator::open(std::sync::Arc::new(store), Limits::default())
    };
    {
        let store = SqliteStore::open(&path, Synchronous::Full).unwrap();
        let mut writer = store.writer().unwrap();
        let mut durability = writer.durability().unwrap();
        let a = [keyed(1, "agent-0", "k"), keyed(2, "agent-1", "k")];
        let b = [keyed(1, "agent-0", "k")];
        let mut rows: Vec<NewRow<'_>> = rows(&a);
        rows.extend(b.iter().map(|draft| NewRow {
            conv: 2,
            draft,
            ts_ms: 1_700_000_000_000,
        }));
        writer.commit(&[conv(1, "c"), conv(2, "d")], &rows).unwrap();
        durability.sync().unwrap();
    }
    let orch = open(&path).expect("distinct keys start");
    orch.shutdown().await;
    drop(orch);
    {
        let store = SqliteStore::open(&path, Synchronous::Full).unwrap();
        let mut writer = store.writer().unwrap();
        let mut durability = writer.durability().unwrap();
        let again = [keyed(3, "agent-0", "k")];
        writer.commit(&[], &rows(&again)).unwrap();
        durability.sync().unwrap();
    }
    let refused = open(&path).expect_err("a repeated key is refused");
    let said = refused.to_string();
    assert!(
        said.contains("conversation c: seq 3 repeats the idempotency key \"k\" of agent-0"),
        "{said}"
    );
}
