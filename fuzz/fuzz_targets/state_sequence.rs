//! A sequence of requests from several identities on one new conversation (three agents taking
//! turns round robin), through the method core and the state machine. Oracle: every invariant
//! of the log, read back at the end: seq dense from 1; every acknowledged append is in the log
//! at its seq, by its author; a key retried by its author answers the original seq; nothing is
//! appended after the conversation's final message; a turn closes once.
#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

#[derive(Debug, Arbitrary)]
enum Op {
    Message {
        who: u8,
        finality: u8,
        hint: Option<u8>,
        key: Option<u8>,
        text: u8,
    },
    Trace {
        who: u8,
        key: Option<u8>,
    },
    Pause,
    Resume,
    Claim {
        who: u8,
    },
}

fuzz_target!(|ops: Vec<Op>| {
    static N: AtomicU64 = AtomicU64::new(0);
    let h = orchestrator_fuzz::harness();
    let id = format!("s{}", N.fetch_add(1, Ordering::Relaxed));
    // Sessions authenticated once per harness: an input only calls methods through them.
    let admin = h.shared_session(4);
    let made = h.call(
        &admin,
        "createConversation",
        json!({"conversationId": id, "scenario": {
            "participants": ["alice", "bob", "carol"],
            "policy": {"order": "round_robin"},
            "stop": {"maxTurns": 20}
        }}),
    );
    assert!(made.get("result").is_some(), "{made}");
    let sessions: Vec<_> = (1..=3).map(|who| h.shared_session(who)).collect();
    // What was acknowledged: seq → (author, text); key → seq.
    let mut acked = std::collections::BTreeMap::new();
    let mut keys = std::collections::HashMap::new();
    for op in ops.iter().take(64) {
        let (who, method, params, key) = match op {
            Op::Message {
                who,
                finality,
                hint,
                key,
                text,
            } => {
                let finality = ["none", "turn", "conversation"][*finality as usize % 3];
                let mut p = json!({"conversationId": id, "payload": {"text": format!("t{text}")}, "finality": finality});
                if let Some(hint) = hint {
                    p["turnHint"] = json!(*hint as u64 % 8);
                }
                if let Some(k) = key {
                    p["clientRequestId"] = json!(format!("k{k}"));
                }
                (*who as usize % 3, "sendMessage", p, *key)
            }
            Op::Trace { who, key } => {
                let mut p = json!({"conversationId": id, "payload": {"text": "trace"}});
                if let Some(k) = key {
                    p["clientRequestId"] = json!(format!("k{k}"));
                }
                (*who as usize % 3, "sendTrace", p, *key)
            }
            Op::Pause => (
                usize::MAX,
                "pauseConversation",
                json!({"conversationId": id}),
                None,
            ),
            Op::Resume => (
                usize::MAX,
                "resumeConversation",
                json!({"conversationId": id}),
                None,
            ),
            Op::Claim { who } => (
                *who as usize % 3,
                "claimTurn",
                json!({"conversationId": id, "turn": 1}),
                None,
            ),
        };
        let session = sessions.get(who).unwrap_or(&admin);
        let r = h.call(session, method, params.clone());
        let Some(seq) = r["result"]["seq"].as_u64() else {
            continue;
        };
        // A key is the author's own (PROTOCOL.md §8: unique per conversation and author).
        if let Some(key) = key.map(|k| (who, k)) {
            if let Some(first) = keys.get(&key) {
                if r["result"]["duplicate"] == true {
                    assert_eq!(*first, seq, "a retried key answers its original seq: {r}");
                    continue;
                }
            }
            keys.entry(key).or_insert(seq);
        }
        if method == "sendMessage" || method == "sendTrace" {
            let author = ["alice", "bob", "carol"][who];
            let prev = acked.insert(seq, (author, params["payload"].clone()));
            assert!(prev.is_none(), "seq {seq} acknowledged twice: {r}");
        }
    }
    // The log, read back whole.
    let log: Vec<Value> = {
        let r = h.call(
            &admin,
            "tail",
            json!({"conversationId": id, "sinceSeq": 0, "limit": 1000}),
        );
        r["result"]["events"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    for (i, e) in log.iter().enumerate() {
        assert_eq!(e["seq"], i as u64 + 1, "seq dense: {e}");
    }
    for (seq, (author, payload)) in &acked {
        let e = &log[*seq as usize - 1];
        assert_eq!(e["author"], *author, "{e}");
        assert_eq!(e["payload"], *payload, "{e}");
    }
    if let Some(last) = log
        .iter()
        .position(|e| e["kind"] == "message" && e["finality"] == "conversation")
    {
        assert!(
            log[last + 1..]
                .iter()
                .all(|e| e["author"] == "orchestrator" || e["kind"] == "system"),
            "an append after the final message: {:?}",
            &log[last + 1..]
        );
    }
});
