//! Limits that keep one client from starving the others: a request rate per identity (over
//! every connection of it, WebSocket and HTTP), a deadline to authenticate, an idle timeout, and
//! a cap on one agent's open streams. Each answers with its own error or close reason, and the
//! other clients go on. (How far a flood moves another client's latency is measured in the
//! `fairness` benchmark, not asserted here.)

use jsonrpsee::core::client::ClientT;
use orchestrator::engine::config::Limits;
use proto_spec::codes;
use serde_json::{json, Value};
use tests::TestServer;

/// A server with `limits` and the conversation `c1` of alice and bob.
async fn started(limits: Limits) -> TestServer {
    let ts = TestServer::with_limits(limits).await;
    ts.create("c1", &["alice", "bob"]).await;
    ts
}

/// Sends `n` calls at once on `raw` and reads every answer: how many were refused as over the
/// rate, checking each refusal.
async fn flood(raw: &mut tests::RawWs, n: u64, agent: &str) -> usize {
    for id in 1..=n {
        raw.send_text(
            &json!({"jsonrpc": "2.0", "id": id, "method": "getConversation", "params": {"conversationId": "c1"}})
                .to_string(),
        )
        .await;
    }
    let mut refused = 0;
    for _ in 0..n {
        let r: Value = raw.recv().await;
        if r.get("error").is_some() {
            assert_eq!(r["error"]["code"], codes::RATE_LIMITED, "{r}");
            // Counted from the answer, which was held back (it may be due already).
            assert!(r["error"]["data"]["retryAfterMs"].is_u64(), "{r}");
            let message = r["error"]["message"].as_str().unwrap();
            assert!(
                message.contains(agent) && message.contains("retry in"),
                "{r}"
            );
            refused += 1;
        } else {
            assert_eq!(r["result"]["conversationId"], "c1", "{r}");
        }
    }
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_over_its_rate_is_refused_on_every_connection_and_others_go_on() {
    let ts = started(Limits {
        rate_per_identity: 50,
        rate_burst: 20,
        ..tests::test_limits()
    })
    .await;
    let mut alice = ts.raw().await;
    alice.authenticate(ts.token("alice")).await;
    // 200 calls at once: the burst of 20 and what refills meanwhile pass, the rest are refused
    // (the connection is read once per refusal's hold, so its calls wait in its socket).
    let started = std::time::Instant::now();
    let refused = flood(&mut alice, 200, "alice").await;
    let within = |answered: usize, secs: f64| answered as f64 <= 20.0 + 50.0 * secs + 2.0;
    assert!(refused >= 1, "none of 200 refused");
    assert!(
        within(200 - refused, started.elapsed().as_secs_f64()),
        "{} answered in {:?}, over the rate",
        200 - refused,
        started.elapsed()
    );
    // A second connection of the same identity shares its bucket: the two together stay
    // within the rate.
    let mut again = ts.raw().await;
    again.authenticate(ts.token("alice")).await;
    let (one, two) = tokio::join!(
        flood(&mut alice, 60, "alice"),
        flood(&mut again, 60, "alice")
    );
    let answered = 120 - one - two;
    assert!(
        one >= 1 && two >= 1 && within(answered, started.elapsed().as_secs_f64()),
        "a new connection bought alice more: {answered} of 120 answered in {:?}",
        started.elapsed()
    );
    // Bob is not held back by alice.
    let mut bob = ts.raw().await;
    bob.authenticate(ts.token("bob")).await;
    assert_eq!(flood(&mut bob, 10, "bob").await, 0);
    // Over HTTP too: 429 with Retry-After in whole seconds, and the same error body.
    let http = reqwest::Client::new();
    let url = format!("{}/conversations/c1", ts.http_base());
    let mut limited = None;
    for _ in 0..60 {
        let r = http
            .get(&url)
            .bearer_auth(ts.token("alice"))
            .send()
            .await
            .unwrap();
        if r.status() == 429 {
            limited = Some(r);
            break;
        }
    }
    let r = limited.expect("alice is refused over HTTP as well");
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry <= 1, "whole seconds: {retry}");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], codes::RATE_LIMITED, "{body}");
    // The refusals are counted.
    let metrics = http
        .get(format!("{}/metrics", ts.http_base()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("orchestrator_errors_total") && l.contains("RateLimited")),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_authenticate_or_sit_idle_are_closed_busy_ones_stay() {
    let ts = started(Limits {
        auth_timeout: std::time::Duration::from_millis(300),
        idle_timeout: std::time::Duration::from_millis(600),
        ..tests::test_limits()
    })
    .await;
    // Opened, never authenticated: closed with 1008 and the reason.
    let mut silent = ts.raw().await;
    let (code, reason) = silent.closed().await.expect("a close frame");
    assert_eq!(code, 1008);
    assert!(reason.contains("authenticate within"), "{reason}");
    // Authenticated, then nothing: closed as idle. A subscribed connection and a push
    // replica's registration opened at the same moment stay.
    let mut idle = ts.raw().await;
    idle.authenticate(ts.token("alice")).await;
    let mut subscribed = ts.raw().await;
    subscribed.authenticate(ts.token("bob")).await;
    let r = subscribed.subscribe(1, "c1", 0).await;
    assert!(r.get("result").is_some(), "{r}");
    let mut replica = ts.raw().await;
    replica.authenticate(ts.token("alice")).await;
    let r = replica
        .call(1, "registerExecutor", json!({"mode": "push"}))
        .await;
    assert!(r.get("result").is_some(), "{r}");
    let (code, reason) = idle.closed().await.expect("a close frame");
    assert_eq!(code, 1000);
    assert!(reason.contains("idle"), "{reason}");
    // Past the idle timeout, the busy ones still answer.
    for (who, raw) in [("bob", &mut subscribed), ("alice", &mut replica)] {
        raw.send_text(
            &json!({"jsonrpc": "2.0", "id": 7, "method": "getConversation", "params": {"conversationId": "c1"}})
                .to_string(),
        )
        .await;
        // Events of the subscription may come first.
        let r = loop {
            let r = raw.recv().await;
            if r["id"] == 7 {
                break r;
            }
        };
        assert_eq!(r["result"]["conversationId"], "c1", "{who}: {r}");
    }
    ts.assert_dropped(&["auth_timeout", "idle_timeout"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_agent_cannot_hold_every_stream() {
    let ts = started(Limits {
        max_streams_per_agent: 2,
        ..tests::test_limits()
    })
    .await;
    let http = reqwest::Client::new();
    let events = format!("{}/conversations/c1/events", ts.http_base());
    let open = |who: &str| {
        http.get(&events)
            .bearer_auth(ts.token(who).to_string())
            .send()
    };
    // Two streams of alice's are open (their headers came: their slots are taken).
    let first = open("alice").await.unwrap();
    let second = open("alice").await.unwrap();
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let third = open("alice").await.unwrap();
    assert_eq!(third.status(), 429);
    let body: Value = third.json().await.unwrap();
    assert_eq!(body["error"]["code"], codes::RATE_LIMITED, "{body}");
    assert_eq!(body["error"]["data"]["limit"], 2, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("alice has too many open streams"),
        "{body}"
    );
    // Bob's stream is not held back by alice's.
    assert_eq!(open("bob").await.unwrap().status(), 200);
    // A long-poll counts against the same cap.
    let wait = http
        .get(format!("{}/conversations/c1/wait", ts.http_base()))
        .query(&[("sinceSeq", "0"), ("timeoutMs", "10")])
        .bearer_auth(ts.token("alice"))
        .send()
        .await
        .unwrap();
    assert_eq!(wait.status(), 429);
    // So does a WebSocket subscription.
    let mut raw = ts.raw().await;
    raw.authenticate(ts.token("alice")).await;
    let r = raw.subscribe(1, "c1", 0).await;
    assert_eq!(r["error"]["code"], codes::RATE_LIMITED, "{r}");
    drop((first, second));
    // Subscriptions alone, on two connections; one ended gives its place back.
    ts.create("c2", &["carol"]).await;
    let mut one = ts.raw().await;
    one.authenticate(ts.token("carol")).await;
    let mut two = ts.raw().await;
    two.authenticate(ts.token("carol")).await;
    let params = json!({"conversationId": "c2", "sinceSeq": 0});
    let sub = one.request(1, "subscribe", params.clone()).await["result"].clone();
    assert!(sub.is_u64(), "{sub}");
    assert!(two.request(1, "subscribe", params.clone()).await["result"].is_u64());
    let r = two.request(2, "subscribe", params.clone()).await;
    assert_eq!(r["error"]["code"], codes::RATE_LIMITED, "{r}");
    let r = one.request(2, "unsubscribe", json!([sub])).await;
    assert_eq!(r["result"], true, "{r}");
    let again = async {
        for id in 3.. {
            let r = two.request(id, "subscribe", params.clone()).await;
            if r.get("result").is_some() {
                return;
            }
            assert_eq!(r["error"]["code"], codes::RATE_LIMITED, "{r}");
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(tests::WAIT, again)
        .await
        .expect("the ended subscription's place, given back");
}

#[tokio::test]
async fn an_inline_scenario_over_its_size_is_refused() {
    let ts = TestServer::with_limits(Limits {
        max_scenario_bytes: 2048,
        ..tests::test_limits()
    })
    .await;
    let admin = ts.client("admin").await;
    let big = json!({
        "participants": ["alice", "bob"],
        "description": "x".repeat(3000),
    });
    let r = admin
        .request::<Value, _>(
            "createConversation",
            tests::P(json!({"conversationId": "big", "scenario": big})),
        )
        .await;
    let e = match r {
        Err(jsonrpsee::core::ClientError::Call(e)) => e,
        other => panic!("{other:?}"),
    };
    assert_eq!(e.code(), codes::INVALID_PARAMS);
    assert!(
        e.message().contains("over the limit of 2048"),
        "{}",
        e.message()
    );
    let small = json!({"participants": ["alice", "bob"]});
    let r: Value = admin
        .request(
            "createConversation",
            tests::P(json!({"conversationId": "small", "scenario": small})),
        )
        .await
        .expect("a small scenario");
    assert_eq!(r["conversationId"], "small");
}

/// An identity's readers take turns running calls (`transport/turnstile.rs`): its connections
/// with many calls in flight, reads and appends mixed (an append waits on the log after its
/// turn), get every answer, each append lands once, and another identity's calls meanwhile are
/// answered too. (What the turns do for the other identity's latency is measured by the
/// `fairness` benchmark.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identitys_many_connections_take_turns_and_every_call_is_answered() {
    let ts = started(Limits {
        rate_per_identity: 0,
        ..tests::test_limits()
    })
    .await;
    const CONNECTIONS: u64 = 8;
    const CALLS: u64 = 40;
    let mut alices = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut raw = ts.raw().await;
        raw.authenticate(ts.token("alice")).await;
        alices.push(raw);
    }
    let mut bob = ts.raw().await;
    bob.authenticate(ts.token("bob")).await;
    // Every connection's calls written at once: even ids read, odd ids append.
    for (c, raw) in alices.iter_mut().enumerate() {
        for id in 1..=CALLS {
            let frame = if id % 2 == 0 {
                json!({"jsonrpc": "2.0", "id": id, "method": "getConversation",
                       "params": {"conversationId": "c1"}})
            } else {
                json!({"jsonrpc": "2.0", "id": id, "method": "sendMessage",
                       "params": {"conversationId": "c1", "payload": {"text": format!("{c}-{id}")},
                                  "finality": "none", "clientRequestId": format!("k{c}-{id}")}})
            };
            raw.send_text(&frame.to_string()).await;
        }
    }
    // Bob, meanwhile.
    for id in 1..=10u64 {
        bob.send_text(
            &json!({"jsonrpc": "2.0", "id": id, "method": "getConversation",
                    "params": {"conversationId": "c1"}})
            .to_string(),
        )
        .await;
    }
    for _ in 0..10 {
        let r = tokio::time::timeout(tests::WAIT, bob.recv())
            .await
            .expect("bob is answered beside alice's calls");
        assert_eq!(r["result"]["conversationId"], "c1", "{r}");
    }
    let mut seqs = Vec::new();
    for raw in alices.iter_mut() {
        let mut ids = Vec::new();
        for _ in 0..CALLS {
            let r = tokio::time::timeout(tests::WAIT, raw.recv())
                .await
                .expect("every call of every connection is answered");
            assert!(r.get("result").is_some(), "{r}");
            if let Some(seq) = r["result"]["seq"].as_u64() {
                seqs.push(seq);
            }
            ids.push(r["id"].as_u64().expect("an id"));
        }
        ids.sort_unstable();
        assert_eq!(ids, (1..=CALLS).collect::<Vec<_>>());
    }
    seqs.sort_unstable();
    let appended = (CONNECTIONS * CALLS / 2) as usize;
    assert_eq!(seqs.len(), appended);
    seqs.dedup();
    assert_eq!(seqs.len(), appended, "each append landed once");
}
