//! Methods, subscriptions and access over WebSocket, driven by the jsonrpsee client.

use std::collections::HashSet;

use jsonrpsee::core::client::{ClientT, SubscriptionClientT};
use proto_spec::codes;
use serde_json::{json, Value};
use tests::{error_code, TestServer, P, WAIT};

async fn send(c: &jsonrpsee::ws_client::WsClient, conv: &str, text: &str, finality: &str) -> Value {
    c.request(
        "sendMessage",
        P(json!({"conversationId": conv, "payload": {"text": text}, "finality": finality})),
    )
    .await
    .expect("sendMessage")
}

/// `tail` reads the four events in seq order, and `limit` caps a page.
async fn tail_reads_in_order(bob: &jsonrpsee::ws_client::WsClient) {
    let tail: Value = bob
        .request("tail", P(json!({"conversationId": "c1", "sinceSeq": 0})))
        .await
        .unwrap();
    let seqs: Vec<u64> = tail["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, vec![1, 2, 3, 4]);
    assert_eq!(tail["latestSeq"], 4);
    assert_eq!(tail["events"][0]["kind"], "system");
    assert_eq!(tail["events"][1]["author"], "alice");
    let limited: Value = bob
        .request(
            "tail",
            P(json!({"conversationId": "c1", "sinceSeq": 1, "limit": 2})),
        )
        .await
        .unwrap();
    assert_eq!(limited["events"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn append_read_and_guidance() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    let alice = ts.client("alice").await;
    let bob = ts.client("bob").await;

    let r = send(&alice, "c1", "hello", "none").await;
    assert_eq!(r, json!({"seq": 2, "turn": 1, "duplicate": false}));
    let r = send(&alice, "c1", "hello, done", "turn").await;
    assert_eq!(r, json!({"seq": 3, "turn": 1, "duplicate": false}));
    let tr: Value = bob
        .request(
            "sendTrace",
            P(json!({"conversationId": "c1", "payload": {"type": "thinking"}})),
        )
        .await
        .unwrap();
    assert_eq!(tr["turn"], 2);

    tail_reads_in_order(&bob).await;

    let snap: Value = bob
        .request("getConversation", P(json!({"conversationId": "c1"})))
        .await
        .unwrap();
    assert_eq!(snap["status"], "active");
    assert_eq!(snap["turn"], 2);
    assert_eq!(snap["latestSeq"], 4);
    assert_eq!(snap["guidance"]["status"], "may_speak");

    // getUpdatesOrGuidance returns messages only, and a cursor past the traces.
    let up: Value = bob
        .request(
            "getUpdatesOrGuidance",
            P(json!({"conversationId": "c1", "sinceSeq": 1})),
        )
        .await
        .unwrap();
    assert_eq!(up["messages"].as_array().unwrap().len(), 2);
    assert_eq!(up["latestSeq"], 4);
    assert_eq!(up["timedOut"], false);

    // A stale turn hint is refused; the current one is accepted.
    let stale = bob
        .request::<Value, _>(
            "sendMessage",
            P(json!({"conversationId": "c1", "payload": {"text": "x"}, "finality": "turn", "turnHint": {"turn": 1}})),
        )
        .await;
    assert_eq!(error_code(stale), codes::TURN_MISMATCH);
    let ok: Value = bob
        .request(
            "sendMessage",
            P(json!({"conversationId": "c1", "payload": {"text": "bye"}, "finality": "conversation", "turnHint": {"turn": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(ok["seq"], 5);
    // Nothing after finality conversation; guidance says closed.
    assert_eq!(
        error_code(alice.request::<Value, _>("sendMessage", P(json!({"conversationId": "c1", "payload": {"text": "late"}, "finality": "turn"}))).await),
        codes::CONVERSATION_CLOSED
    );
    assert_eq!(
        error_code(
            alice
                .request::<Value, _>(
                    "sendTrace",
                    P(json!({"conversationId": "c1", "payload": {}}))
                )
                .await
        ),
        codes::CONVERSATION_CLOSED
    );
    let snap: Value = alice
        .request("getConversation", P(json!({"conversationId": "c1"})))
        .await
        .unwrap();
    assert_eq!(snap["status"], "closed");
    assert_eq!(snap["guidance"]["status"], "closed");
}

#[tokio::test]
async fn idempotent_retries_and_invariant_errors() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    let alice = ts.client("alice").await;
    let msg = json!({"conversationId": "c1", "payload": {"text": "once"}, "finality": "turn", "clientRequestId": "r-1"});
    let first: Value = alice.request("sendMessage", P(msg.clone())).await.unwrap();
    let retry: Value = alice.request("sendMessage", P(msg.clone())).await.unwrap();
    assert_eq!(first["duplicate"], false);
    assert_eq!(
        retry,
        json!({"seq": first["seq"], "turn": first["turn"], "duplicate": true})
    );
    let mut other = msg.clone();
    other["payload"]["text"] = json!("twice");
    assert_eq!(
        error_code(alice.request::<Value, _>("sendMessage", P(other)).await),
        codes::IDEMPOTENCY_KEY_REUSED
    );
    // The same key from another author is another key.
    let bob = ts.client("bob").await;
    let b: Value = bob.request("sendMessage", P(msg)).await.unwrap();
    assert_eq!(b["duplicate"], false);
    // A trace with finality, and a trace for a closed turn.
    assert_eq!(
        error_code(
            alice
                .request::<Value, _>(
                    "sendTrace",
                    P(json!({"conversationId": "c1", "payload": {}, "finality": "turn"}))
                )
                .await
        ),
        codes::INVALID_FINALITY
    );
    assert_eq!(
        error_code(
            alice
                .request::<Value, _>(
                    "sendTrace",
                    P(json!({"conversationId": "c1", "payload": {}, "turn": 1}))
                )
                .await
        ),
        codes::TURN_CLOSED
    );
    let tail: Value = alice
        .request("tail", P(json!({"conversationId": "c1", "sinceSeq": 0})))
        .await
        .unwrap();
    assert_eq!(
        tail["latestSeq"], 3,
        "refused and retried requests appended nothing"
    );
}

/// `afterKey`: a write held to the same agent's earlier write lands only once that write is in
/// the log; sent right behind it on one connection without waiting (as an executor sends its
/// `turn_start`, then runs the agent), both land, in that order.
#[tokio::test]
async fn a_write_held_to_an_earlier_one_lands_only_after_it() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    let alice = ts.client("alice").await;
    let held = |key: &str| {
        json!({"conversationId": "c1", "payload": {"text": "held"}, "finality": "none",
               "clientRequestId": key, "afterKey": "t1.a1.x0"})
    };
    let refused = |method: &'static str, p: Value| {
        let alice = &alice;
        async move { error_code(alice.request::<Value, _>(method, P(p)).await) }
    };
    // Nothing with that key in the log: refused, nothing appended.
    assert_eq!(
        refused("sendMessage", held("m1")).await,
        codes::INVALID_PARAMS
    );
    // Another agent's write with that key does not stand for alice's.
    let bob = ts.client("bob").await;
    let _: Value = bob
        .request(
            "sendTrace",
            P(json!({"conversationId": "c1", "payload": {"type": "turn_start"}, "clientRequestId": "t1.a1.x0"})),
        )
        .await
        .expect("bob's trace");
    assert_eq!(
        refused("sendMessage", held("m1")).await,
        codes::INVALID_PARAMS
    );
    let trace =
        json!({"conversationId": "c1", "payload": {"type": "note"}, "afterKey": "t1.a1.x0"});
    assert_eq!(refused("sendTrace", trace).await, codes::INVALID_PARAMS);
    // A key that could never name a write.
    for bad in [String::new(), "k".repeat(257)] {
        let mut p = held("m2");
        p["afterKey"] = json!(bad);
        assert_eq!(refused("sendMessage", p).await, codes::INVALID_PARAMS);
    }
    let log = tests::ws_log(&alice, "c1").await;
    assert_eq!(log.len(), 2, "`created` and bob's trace only: {log:?}");

    // The SDK's client holds its writes through `hold_writes_to`: the trace and a write held
    // to it, queued one behind the other without waiting, land in that order.
    use agent_sdk::ExecutorClient;
    let sdk = ts.sdk("alice", None).await;
    let through = sdk
        .hold_writes_to("c1", "t1.a1.x0")
        .expect("over WebSocket");
    let start = proto_spec::SendTraceParams {
        conversation_id: "c1".into(),
        payload: json!({"type": "turn_start"}),
        turn: None,
        client_request_id: Some("t1.a1.x0".into()),
        finality: None,
        after_key: None,
    };
    let reply = proto_spec::SendMessageParams::text("c1", "held", proto_spec::Finality::None);
    let (start, reply) = tokio::join!(through.send_trace(start), through.send_message(reply));
    let (start, reply) = (start.expect("the trace"), reply.expect("the held write"));
    assert_eq!(reply.seq, start.seq + 1);
    // The same held write again, now that the trace is in: it lands.
    let again: Value = alice
        .request("sendMessage", P(held("m3")))
        .await
        .expect("held to a write in the log");
    assert_eq!(again["seq"], reply.seq + 1);
}

/// A wrong token is refused, and so is every call on that connection.
async fn a_wrong_token_is_refused(ts: &TestServer) {
    let c = jsonrpsee::ws_client::WsClientBuilder::default()
        .build(ts.url())
        .await
        .unwrap();
    assert_eq!(
        error_code(
            c.request::<Value, _>("authenticate", P(json!({"token": "oct_wrong"})))
                .await
        ),
        codes::UNAUTHENTICATED
    );
    assert_eq!(
        error_code(
            c.request::<Value, _>("tail", P(json!({"conversationId": "c1", "sinceSeq": 0})))
                .await
        ),
        codes::UNAUTHENTICATED
    );
}

#[tokio::test]
async fn access_is_checked() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    let carol = ts.client("carol").await;
    let alice = ts.client("alice").await;
    for (m, p) in [
        ("getConversation", json!({"conversationId": "c1"})),
        ("tail", json!({"conversationId": "c1", "sinceSeq": 0})),
        (
            "sendMessage",
            json!({"conversationId": "c1", "payload": {"text": "hi"}, "finality": "turn"}),
        ),
        ("sendTrace", json!({"conversationId": "c1", "payload": {}})),
        (
            "waitForChange",
            json!({"conversationId": "c1", "sinceSeq": 0, "timeoutMs": 10}),
        ),
    ] {
        // Not carol's: answered as a conversation that does not exist.
        assert_eq!(
            error_code(carol.request::<Value, _>(m, P(p)).await),
            codes::CONVERSATION_NOT_FOUND,
            "{m}"
        );
    }
    assert_eq!(
        error_code(
            carol
                .subscribe::<Value, _>(
                    "subscribe",
                    P(json!({"conversationId": "c1"})),
                    "unsubscribe"
                )
                .await
        ),
        codes::CONVERSATION_NOT_FOUND
    );
    assert_eq!(
        error_code(
            alice
                .request::<Value, _>("createConversation", P(json!({"participants": ["alice"]})))
                .await
        ),
        codes::FORBIDDEN
    );
    assert_eq!(
        error_code(
            alice
                .request::<Value, _>("getConversation", P(json!({"conversationId": "nope"})))
                .await
        ),
        codes::CONVERSATION_NOT_FOUND
    );
    let admin = ts.client("admin").await;
    assert_eq!(
        error_code(
            admin
                .request::<Value, _>(
                    "createConversation",
                    P(json!({"conversationId": "c1", "participants": ["alice"]}))
                )
                .await
        ),
        codes::CONVERSATION_EXISTS
    );
    assert_eq!(
        error_code(
            admin
                .request::<Value, _>("createConversation", P(json!({"participants": []})))
                .await
        ),
        codes::INVALID_PARAMS
    );
    let generated: Value = admin
        .request("createConversation", P(json!({"participants": ["bob"]})))
        .await
        .unwrap();
    assert!(generated["conversationId"].as_str().unwrap().len() >= 16);
    // An admin reads any conversation.
    let snap: Value = admin
        .request("getConversation", P(json!({"conversationId": "c1"})))
        .await
        .unwrap();
    assert_eq!(snap["latestSeq"], 1);
    a_wrong_token_is_refused(&ts).await;
}

#[tokio::test]
async fn wait_for_change_wakes_on_append_and_times_out() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    let alice = ts.client("alice").await;
    let bob = ts.client("bob").await;
    let waiter = tokio::spawn(async move {
        let r: Value = bob
            .request(
                "waitForChange",
                P(json!({"conversationId": "c1", "sinceSeq": 1, "timeoutMs": 5000})),
            )
            .await
            .unwrap();
        r
    });
    // Parked before the append that wakes it: the wake-up is what is tested, not an answer
    // from the log.
    ts.wait_for_waiters("c1", 1).await;
    send(&alice, "c1", "wake", "turn").await;
    let r = tokio::time::timeout(WAIT, waiter).await.unwrap().unwrap();
    assert_eq!(r, json!({"latestSeq": 2, "timedOut": false}));
    // How long the wait lasts is tested on tokio's paused clock (orchestrator/tests/waits.rs).
    let r: Value = alice
        .request(
            "waitForChange",
            P(json!({"conversationId": "c1", "sinceSeq": 2, "timeoutMs": 200})),
        )
        .await
        .unwrap();
    assert_eq!(r, json!({"latestSeq": 2, "timedOut": true}));
    // getUpdatesOrGuidance waits for a message, skipping traces.
    let alice2 = ts.client("alice").await;
    let bob2 = ts.client("bob").await;
    let waiter = tokio::spawn(async move {
        let r: Value = alice2
            .request(
                "getUpdatesOrGuidance",
                P(json!({"conversationId": "c1", "sinceSeq": 2, "timeoutMs": 5000})),
            )
            .await
            .unwrap();
        r
    });
    // The waiter is parked on the head before the trace and the answer are appended.
    ts.wait_for_waiters("c1", 1).await;
    let _: Value = bob2
        .request(
            "sendTrace",
            P(json!({"conversationId": "c1", "payload": {"type": "t"}})),
        )
        .await
        .unwrap();
    send(&bob2, "c1", "answer", "turn").await;
    let r = tokio::time::timeout(WAIT, waiter).await.unwrap().unwrap();
    assert_eq!(r["messages"].as_array().unwrap().len(), 1, "{r}");
    assert_eq!(r["messages"][0]["payload"]["text"], "answer");
    assert_eq!(r["latestSeq"], 4);
}

#[tokio::test]
async fn subscribe_replays_then_follows_without_gap_or_duplicate() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    let alice = ts.client("alice").await;
    for i in 0..50 {
        send(&alice, "c1", &format!("m{i}"), "none").await;
    }
    let bob = ts.client("bob").await;
    let mut sub = bob
        .subscribe::<Value, _>(
            "subscribe",
            P(json!({"conversationId": "c1", "sinceSeq": 10})),
            "unsubscribe",
        )
        .await
        .unwrap();
    let writer = tokio::spawn(async move {
        for i in 50..150 {
            send(&alice, "c1", &format!("m{i}"), "none").await;
        }
    });
    let mut expect = 11u64;
    while expect <= 151 {
        let n = tokio::time::timeout(WAIT, sub.next())
            .await
            .expect("event in time")
            .unwrap()
            .unwrap();
        assert_eq!(n["conversationId"], "c1");
        assert_eq!(n["event"]["seq"], expect, "no gap, no duplicate");
        expect += 1;
    }
    writer.await.unwrap();
}

#[tokio::test]
async fn subscribe_without_conversation_follows_all_of_mine_and_new_ones() {
    let ts = TestServer::start().await;
    ts.create("a", &["alice", "bob"]).await;
    ts.create("b", &["alice", "carol"]).await;
    ts.create("not-mine", &["bob", "carol"]).await;
    let alice = ts.client("alice").await;
    let carol = ts.client("carol").await;
    send(&alice, "a", "before", "none").await;
    let mut sub = alice
        .subscribe::<Value, _>("subscribe", P(json!({"sinceSeq": 0})), "unsubscribe")
        .await
        .unwrap();
    ts.create("c-new", &["alice"]).await;
    send(&alice, "c-new", "in the new one", "turn").await;
    send(&carol, "not-mine", "hidden", "turn").await;
    send(&carol, "b", "visible", "turn").await;
    let mut seen = HashSet::new();
    let mut per_conv: std::collections::HashMap<String, u64> = Default::default();
    while seen.len() < 6 {
        let n = tokio::time::timeout(WAIT, sub.next())
            .await
            .expect("event in time")
            .unwrap()
            .unwrap();
        let conv = n["conversationId"].as_str().unwrap().to_string();
        let seq = n["event"]["seq"].as_u64().unwrap();
        assert_ne!(conv, "not-mine");
        let last = per_conv.entry(conv.clone()).or_insert(0);
        assert_eq!(seq, *last + 1, "in order per conversation");
        *last = seq;
        assert!(seen.insert((conv, seq)));
    }
    // a: created + before; b: created + visible; c-new: created + its message; nothing of not-mine.
    let expected: HashSet<(String, u64)> = [
        ("a", 1),
        ("a", 2),
        ("b", 1),
        ("b", 2),
        ("c-new", 1),
        ("c-new", 2),
    ]
    .iter()
    .map(|(c, s)| (c.to_string(), *s))
    .collect();
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn stop_ends_open_subscriptions_promptly() {
    let mut ts = TestServer::start().await;
    ts.create("c1", &["alice"]).await;
    let alice = ts.client("alice").await;
    let mut sub = alice
        .subscribe::<Value, _>(
            "subscribe",
            P(json!({"conversationId": "c1"})),
            "unsubscribe",
        )
        .await
        .unwrap();
    let waiting = {
        let c = ts.client("alice").await;
        tokio::spawn(async move {
            c.request::<Value, _>(
                "waitForChange",
                P(json!({"conversationId": "c1", "sinceSeq": 1, "timeoutMs": 60000})),
            )
            .await
        })
    };
    // The wait is parked on the conversation's head.
    ts.wait_for_waiters("c1", 1).await;
    // The server stops without waiting out the minute-long wait (bounded by WAIT, far below it).
    tokio::time::timeout(WAIT, ts.stop())
        .await
        .expect("the server stops while a wait is parked");
    let end = tokio::time::timeout(WAIT, sub.next())
        .await
        .expect("subscription ended");
    assert!(end.is_none() || end.unwrap().is_err());
    let _ = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("wait ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_does_not_read_holds_back_neither_the_writer_nor_others() {
    let ts = TestServer::start().await;
    ts.create("c1", &["alice", "bob"]).await;
    // A raw subscriber that stops reading its socket after subscribing.
    let mut slow = ts.raw().await;
    slow.authenticate(ts.token("bob")).await;
    let r = slow
        .call(
            1,
            "subscribe",
            json!({"conversationId": "c1", "sinceSeq": 0}),
        )
        .await;
    assert!(r["result"].is_number(), "{r}");
    let bob = ts.client("bob").await;
    let mut fast = bob
        .subscribe::<Value, _>(
            "subscribe",
            P(json!({"conversationId": "c1", "sinceSeq": 0})),
            "unsubscribe",
        )
        .await
        .unwrap();
    // Far more than the socket buffers and the connection's message buffer hold.
    let n = 3000u64;
    let text = "z".repeat(4000);
    let alice = ts.client("alice").await;
    let writer = async {
        let mut pending = futures::stream::FuturesUnordered::new();
        for i in 0..n {
            let p = P(
                json!({"conversationId": "c1", "payload": {"text": format!("{i} {text}")}, "finality": "none"}),
            );
            pending.push(alice.request::<Value, _>("sendMessage", p));
            if pending.len() == 64 {
                futures::StreamExt::next(&mut pending)
                    .await
                    .unwrap()
                    .unwrap();
            }
        }
        while let Some(r) = futures::StreamExt::next(&mut pending).await {
            r.unwrap();
        }
    };
    // The other subscriber reads as events come.
    let reader = tokio::spawn(async move {
        for expect in 1..=n + 1 {
            let ev = tokio::time::timeout(WAIT, fast.next())
                .await
                .expect("the other subscriber keeps up");
            assert_eq!(ev.unwrap().unwrap()["event"]["seq"], expect);
        }
    });
    tokio::time::timeout(WAIT * 3, writer)
        .await
        .expect("the writer is not held back by a stalled subscriber");
    tokio::time::timeout(WAIT, reader)
        .await
        .expect("the other subscriber got everything")
        .unwrap();
    // The stalled one, reading at last, gets everything in order: no gap, no duplicate.
    for expect in 1..=n + 1 {
        let msg = slow.recv().await;
        assert_eq!(msg["params"]["result"]["event"]["seq"], expect);
    }
}
