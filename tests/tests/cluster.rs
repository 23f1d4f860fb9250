//! Several nodes on one PostgreSQL database (whatever the suites' backend): any node serves any
//! client and any conversation, and the log's invariants hold across them.

use std::collections::HashMap;
use std::sync::Arc;

use jsonrpsee::core::client::ClientT;
use serde_json::{json, Value};
use tests::cluster::{counting_agents, create_with_policy, Counting};
use tests::{subscribe, test_limits, ws_log as log, ws_send as send, TestServer, P, WAIT};

/// Writers on two nodes append to one conversation at once, each retrying every append on the
/// other node with the same key: every acknowledged event is in the log once, seq is dense, the
/// retry answers what the first call answered, and a subscriber on a third node sees every
/// event in seq order with no gap and no duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_on_every_node_keep_seq_dense_and_keys_unique() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    let c = a.another_node().await;
    a.create("shared", &["alice", "bob"]).await;
    // Created on A; readable on C at once (C loads what it has not met).
    let carol_view = c.client("alice").await;
    let mut sub = subscribe(
        &carol_view,
        json!({"conversationId": "shared", "sinceSeq": 0}),
    )
    .await;
    const EACH: usize = 60;
    let mut writers = Vec::new();
    for (who, first, second) in [("alice", &a, &b), ("bob", &b, &a)] {
        let (on, retry) = (first.client(who).await, second.client(who).await);
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0..EACH {
                let key = format!("{who}-{i}");
                let r = send(&on, "shared", &format!("{who} {i}"), &key).await;
                let again = send(&retry, "shared", &format!("{who} {i}"), &key).await;
                assert_eq!(
                    r["seq"], again["seq"],
                    "a retry on the other node answers the original"
                );
                acked.push((key, r["seq"].as_u64().expect("seq")));
            }
            acked
        }));
    }
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.expect("writer"));
    }
    let total = 1 + 2 * EACH as u64;
    let events = log(&carol_view, "shared").await;
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=total).collect::<Vec<_>>(), "dense, in order");
    let mut keys = HashMap::new();
    for e in &events {
        if let Some(k) = e["clientRequestId"].as_str() {
            assert_eq!(e["payload"]["text"], k.replace('-', " "), "{e}");
            assert!(
                keys.insert(k.to_string(), e["seq"].as_u64().unwrap())
                    .is_none(),
                "{k} twice"
            );
        }
    }
    for (key, seq) in &acked {
        assert_eq!(
            keys.get(key),
            Some(seq),
            "acknowledged {key} is in the log at its seq"
        );
    }
    let mut expect = 1;
    while expect <= total {
        let n = tests::next_event(&mut sub, "node C").await;
        assert_eq!(n["event"]["seq"], expect, "no gap, no duplicate on node C");
        // Whole events: the payload as it was written, whichever node wrote it.
        if let Some(key) = n["event"]["clientRequestId"].as_str() {
            assert_eq!(n["event"]["payload"]["text"], key.replace('-', " "), "{n}");
        }
        expect += 1;
    }
    // The cluster's own metrics (the recorder is the process's: the three nodes' figures
    // together here; each `serve` process has its own).
    let mut r = http_get(&c, "alice", "/metrics").await;
    let mut text = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut r, &mut text)
        .await
        .expect("the metrics");
    let value = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert!(
        value("orchestrator_cluster_caught_up_events_total") >= total as f64,
        "{text}"
    );
    assert!(value("orchestrator_cluster_refreshes_total{source=\"notification\"}") > 0.0);
    let node = c
        .running()
        .orchestrator()
        .turns()
        .node_name()
        .expect("a cluster node")
        .to_string();
    assert!(
        text.contains(&format!(
            "orchestrator_node_info{{backend=\"postgres\",node=\"{node}\"}} 1"
        )),
        "{text}"
    );
}

/// A subscription to all of an agent's conversations on one node follows conversations created
/// on another, and a turn hint is one compare-and-set across nodes: of two replies to the same
/// turn sent to different nodes, one lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_conversations_and_turn_hints_hold_across_nodes() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    let bob_on_b = b.client("bob").await;
    let mut all = subscribe(&bob_on_b, json!({"sinceSeq": 0})).await;
    a.create("made-on-a", &["alice", "bob"]).await;
    let first = tests::next_event(&mut all, "B hears of A's conversation").await;
    assert_eq!(first["conversationId"], "made-on-a");
    assert_eq!(first["event"]["seq"], 1);
    // Both reply to turn 1, one through each node: exactly one lands.
    let alice_on_a = a.client("alice").await;
    let alice_on_b = b.client("alice").await;
    let reply = |text: &str| json!({"conversationId": "made-on-a", "payload": {"text": text}, "finality": "turn", "turnHint": {"turn": 1}});
    let (x, y) = tokio::join!(
        alice_on_a.request::<Value, _>("sendMessage", P(reply("from A"))),
        alice_on_b.request::<Value, _>("sendMessage", P(reply("from B"))),
    );
    assert_eq!(
        x.is_ok() as u8 + y.is_ok() as u8,
        1,
        "one reply per turn: {x:?} {y:?}"
    );
    let events = log(&bob_on_b, "made-on-a").await;
    let replies = events
        .iter()
        .filter(|e| e["kind"] == "message" && e["turn"] == 1)
        .count();
    assert_eq!(replies, 1, "{events:?}");
}

/// Two internal agents take turns in conversations served by three nodes that all see every
/// pending turn: each turn runs on exactly one node (the claim), once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_internal_turn_runs_once_across_nodes() {
    let with_commit = || {
        orchestrator::engine::telemetry::render()
            .lines()
            .find(|l| l.starts_with(r#"orchestrator_cluster_claims_total{result="with_commit"}"#))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let claimed_before = with_commit();
    let agent = Arc::new(Counting::default());
    let a = TestServer::on_postgres(test_limits(), counting_agents(&agent)).await;
    let b = a.another_node().await;
    let c = a.another_node().await;
    for i in 0..4 {
        create_with_policy([&a, &b, &c][i % 3], &format!("duo-{i}"), &["bot1", "bot2"]).await;
    }
    let admin = c.client("admin").await;
    for i in 0..4 {
        let id = format!("duo-{i}");
        tests::eventually(&format!("{id} reaches turn 12"), || {
            agent
                .runs
                .lock()
                .map(|r| r.keys().filter(|(c, _)| *c == id).count() >= 12)
                .unwrap_or(false)
        })
        .await;
        let events = log(&admin, &id).await;
        let replies: Vec<u64> = events
            .iter()
            .filter(|e| e["kind"] == "message")
            .map(|e| e["turn"].as_u64().unwrap())
            .collect();
        let mut dedup = replies.clone();
        dedup.dedup();
        assert_eq!(replies, dedup, "at most one reply per turn in {id}");
    }
    drop((a, b));
    let runs = agent.runs.lock().unwrap().clone();
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "turns run more than once: {twice:?}");
    // A turn is claimed by the commit that opens it, for the node whose commit that is (the
    // creation's, or the reply's that closed the turn before): its run asks the database
    // nothing more. (A renewal that ran between the commit and its publication makes the run
    // ask, and it is granted its own claim again; so not every one of the 48 turns.)
    let claimed = with_commit() - claimed_before;
    assert!(
        claimed >= 40.0,
        "{claimed} turns claimed with the commit that opened them"
    );
    // On a shared log an executor waits for its `turn_start` before the agent runs (the trace,
    // decided under the row lock, says the turn is still the agent's): the in-process client
    // offers no writes held to it (docs/decisions.md).
    let inside = orchestrator::host::client::InProcessClient::new(
        c.running().orchestrator().clone(),
        orchestrator::engine::auth::Identity::new("bot1", false),
    );
    assert!(agent_sdk::ExecutorClient::hold_writes_to(&inside, "duo-0", "t1.a1.x0").is_none());
}

/// A node cut off from the database (a proxy that stops forwarding, connections left open)
/// while it runs an internal agent's turn: it stops the run before its lease could have run
/// out, another node takes the turn over and answers it, and when the proxy forwards again the
/// cut-off node appends nothing for that turn (a write under its old claim is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_database_appends_nothing_after_a_takeover() {
    let (url, _pg) = tests::postgres_database().await;
    let direct = url::Url::parse(&url).expect("url");
    let upstream = format!(
        "{}:{}",
        direct.host_str().expect("host"),
        direct.port().expect("port")
    );
    let proxy = tests::proxy::Proxy::start(upstream.parse().expect("addr")).await;
    let mut via = direct.clone();
    via.set_port(Some(proxy.addr().port())).expect("port");
    let agent = Arc::new(Counting::default());
    agent.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let cut = TestServer::on_url(
        via.to_string(),
        None,
        test_limits(),
        counting_agents(&agent),
    )
    .await;
    create_with_policy(&cut, "cut", &["bot1", "alice"]).await;
    tests::eventually("bot1's first run starts on the node to be cut off", || {
        agent.total.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    let other = cut.another_node_via(url.clone()).await;
    let alice_on_cut = cut.client("alice").await;
    proxy.stall();
    // A write on the cut-off node is not acknowledged: it gets a clear error once the database
    // has not answered for a while.
    let unanswered = tokio::spawn(async move {
        alice_on_cut
            .request::<Value, _>(
                "sendMessage",
                P(
                    json!({"conversationId": "cut", "payload": {"text": "while cut off"},
                         "finality": "none", "clientRequestId": "cut-off-write"}),
                ),
            )
            .await
    });
    // The takeover: once the cut-off node's lease has run out, the other node runs the turn.
    tests::eventually("the other node takes the turn over", || {
        agent.total.load(std::sync::atomic::Ordering::SeqCst) == 2
    })
    .await;
    agent.hold.store(false, std::sync::atomic::Ordering::SeqCst);
    agent.release.notify_waiters();
    let alice = other.client("alice").await;
    tests::ws_log_until(&alice, "cut", "the turn answered", |log| {
        log.iter().any(|e| e["kind"] == "message")
    })
    .await;
    let refused = tokio::time::timeout(std::time::Duration::from_secs(30), unanswered)
        .await
        .expect("the cut-off node answers within its database timeout")
        .expect("the writer task");
    assert_internal_error(refused);
    // Forwarding again: the cut-off node's first run was stopped, and a write under its claim
    // (fence) is refused.
    proxy.resume();
    assert_lost_claim_refused(&cut).await;
    let events = log(&alice, "cut").await;
    let replies: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "message" && e["turn"] == 1)
        .collect();
    assert_eq!(replies.len(), 1, "{events:?}");
    assert_eq!(
        replies[0]["payload"]["text"], "run 2",
        "the takeover's answer"
    );
    assert!(
        !events
            .iter()
            .any(|e| e["payload"]["text"] == "run 1" || e["payload"]["type"] == "late"),
        "{events:?}"
    );
    // The cut-off node's run was stopped when its lease could no longer be renewed: it never
    // went on to answer (the release woke every run still waiting).
    assert_eq!(agent.answered.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A write the cut-off node could not commit: "the database is unavailable", and on the wire
/// the protocol's internal error, -32603, as JSON-RPC names it.
fn assert_internal_error(refused: Result<Value, jsonrpsee::core::ClientError>) {
    let message = format!("{refused:?}");
    assert!(
        refused.is_err() && message.contains("the database is unavailable"),
        "{message}"
    );
    match refused {
        Err(jsonrpsee::core::ClientError::Call(e)) => assert_eq!(e.code(), -32603, "{message}"),
        other => panic!("a JSON-RPC error object, not {other:?}"),
    }
}

/// A trace bot1 writes into turn 1 of `cut` under the first claim (fence 1), which another
/// node has taken over since, is refused with `ClaimNotFound`.
async fn assert_lost_claim_refused(node: &TestServer) {
    let stale = node
        .running()
        .orchestrator()
        .send_trace_for(
            &orchestrator::engine::auth::Identity::new("bot1", false),
            proto_spec::SendTraceParams {
                conversation_id: "cut".into(),
                payload: json!({"type": "late"}),
                turn: Some(1),
                client_request_id: None,
                finality: None,
                after_key: None,
            },
            orchestrator::engine::service::ForTurn {
                fence: Some(orchestrator::engine::store::Fence { turn: 1, fence: 1 }),
                ..Default::default()
            },
        )
        .await;
    let refused = stale.expect_err("a write under a lost claim");
    assert_eq!(
        refused.to_rpc().code,
        proto_spec::ErrorCode::ClaimNotFound,
        "{refused}"
    );
}

/// Push replicas of one agent connected to two different nodes: each node offers the turn to
/// its own replica, and one claim is granted cluster-wide, so each turn runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_turn_is_granted_once_across_nodes() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    let agent = Arc::new(Counting::default());
    let mut replicas = Vec::new();
    for node in [&a, &b] {
        let client: Arc<dyn agent_sdk::ExecutorClient> = Arc::new(node.sdk("bob", None).await);
        let push = executors::ExternalExecutor::new(
            client,
            agent.clone(),
            Arc::new(executors::ExecutorCore::default()),
        );
        replicas.push(tokio::spawn(async move { push.run_push().await }));
        let turns = node.running().orchestrator().turns().clone();
        tests::eventually("a replica registers", || turns.replicas_of("bob") == 1).await;
    }
    create_with_policy(&a, "pushed", &["alice", "bob"]).await;
    let alice = b.client("alice").await;
    for i in 0..6u64 {
        // Alice speaks in her turns (odd), bob's replicas answer in theirs (even).
        let turn = 2 * i + 1;
        let _: Value = alice
            .request(
                "sendMessage",
                P(
                    json!({"conversationId": "pushed", "payload": {"text": format!("ask {i}")},
                         "finality": "turn", "turnHint": {"turn": turn}}),
                ),
            )
            .await
            .expect("alice's turn");
        tests::ws_log_until(&alice, "pushed", "bob answered the turn", |log| {
            log.iter()
                .any(|e| e["kind"] == "message" && e["turn"] == turn + 1)
        })
        .await;
    }
    for r in replicas {
        r.abort();
    }
    let runs = agent.runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 6, "{runs:?}");
    assert!(runs.values().all(|n| *n == 1), "a turn ran twice: {runs:?}");
}

/// An HTTP/1.1 GET on node `at` as `agent`; the open connection's reader, past the headers.
async fn http_get(
    at: &TestServer,
    agent: &str,
    path: &str,
) -> tokio::io::BufReader<tokio::net::TcpStream> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let addr = at.running().local_addr();
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n",
        at.token(agent)
    );
    s.write_all(req.as_bytes()).await.expect("send");
    let mut r = tokio::io::BufReader::new(s);
    let mut status = String::new();
    r.read_line(&mut status).await.expect("status");
    assert!(status.contains(" 200 "), "{status}");
    loop {
        let mut line = String::new();
        r.read_line(&mut line).await.expect("header");
        if line == "\r\n" {
            return r;
        }
    }
}

/// SSE and long-poll readers on node B see what is written through node A, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_and_long_poll_on_one_node_follow_writes_on_another() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    a.create("web", &["alice", "bob"]).await;
    let mut sse = http_get(&b, "bob", "/conversations/web/events?sinceSeq=0").await;
    let alice = a.client("alice").await;
    // A long-poll parked on node B, woken by writes through node A with what came after its
    // cursor.
    let poll = async {
        let mut r = http_get(
            &b,
            "bob",
            "/conversations/web/wait?sinceSeq=1&timeoutMs=10000",
        )
        .await;
        let mut body = String::new();
        r.read_to_string(&mut body).await.expect("read");
        body
    };
    let write = async {
        // The long-poll waits on the head; the SSE stream takes events from the publisher.
        b.wait_for_waiters("web", 1).await;
        b.wait_for_live("web").await;
        for i in 0..5 {
            send(&alice, "web", &format!("web {i}"), &format!("web-{i}")).await;
        }
    };
    let (body, ()) = tokio::time::timeout(WAIT, async { tokio::join!(poll, write) })
        .await
        .expect("the long-poll answers in time");
    let json: Value = serde_json::from_str(body.split("\r\n\r\n").last().unwrap_or(&body).trim())
        .or_else(|_| {
            // A chunked body: the JSON is the line that starts with `{`.
            let line = body
                .lines()
                .find(|l| l.starts_with('{'))
                .unwrap_or_default();
            serde_json::from_str(line)
        })
        .expect("a JSON body");
    let first = &json["events"][0];
    assert_eq!(first["seq"], 2, "{body}");
    assert_eq!(first["payload"]["text"], "web 0");
    // The SSE stream carries every event, ids in seq order.
    let mut ids = Vec::new();
    while ids.len() < 6 {
        let mut line = String::new();
        tokio::time::timeout(WAIT, sse.read_line(&mut line))
            .await
            .expect("an SSE line in time")
            .expect("read");
        if let Some(id) = line.trim().strip_prefix("id:") {
            ids.push(id.trim().parse::<u64>().expect("an id"));
        }
        if let Some(data) = line.trim().strip_prefix("data:") {
            let e: Value = serde_json::from_str(data.trim()).expect("data is JSON");
            if let Some(key) = e["clientRequestId"].as_str() {
                assert_eq!(e["payload"]["text"], key.replace('-', " "));
            }
        }
    }
    assert_eq!(ids, (1..=6).collect::<Vec<u64>>());
}

/// Every node runs the timers of every conversation, and each timeout fires once: a second
/// node's `turn_timeout` for the same turn is refused under the conversation's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_timeout_fires_once_whichever_nodes_run_timers() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    let c = a.another_node().await;
    let admin = c.client("admin").await;
    let _: Value = admin
        .request(
            "createConversation",
            P(json!({"conversationId": "silent", "scenario": {
                "participants": ["alice", "bob"], "policy": {"order": "round_robin"},
                "turn": {"timeout": "200ms", "onTimeout": "skip"}}})),
        )
        .await
        .expect("create");
    let reader = b.client("alice").await;
    // Nobody answers: each turn times out, and after a round of silence the conversation ends
    // (`no_answer`).
    let events = tests::ws_log_until(&reader, "silent", "the conversation ended", |log| {
        log.last().is_some_and(|e| e["finality"] == "conversation")
    })
    .await;
    let mut per_turn: HashMap<u64, usize> = HashMap::new();
    for e in events
        .iter()
        .filter(|e| e["payload"]["type"] == "turn_timeout")
    {
        *per_turn
            .entry(e["payload"]["turn"].as_u64().unwrap())
            .or_default() += 1;
    }
    assert!(per_turn.len() >= 2, "{per_turn:?}");
    assert!(per_turn.values().all(|n| *n == 1), "{per_turn:?}");
    let ends = events
        .iter()
        .filter(|e| e["finality"] == "conversation")
        .count();
    assert_eq!(ends, 1, "{events:?}");
    drop((a, c));
}

/// A graceful stop lets go of the node's claims at once (their lease ends now, not a lease
/// from now), so another node takes its turns without waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_hands_its_turns_over_at_once() {
    let agent = Arc::new(Counting::default());
    agent.hold.store(true, std::sync::atomic::Ordering::SeqCst);
    let first = TestServer::on_postgres(test_limits(), counting_agents(&agent)).await;
    // The second node meets the conversation from the first one's commits (not at its start),
    // and either may take the turn: the one holding it is stopped.
    let second = first.another_node().await;
    create_with_policy(&first, "handover", &["bot1", "alice"]).await;
    tests::eventually("one node runs bot1's turn", || {
        agent.total.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    let db = tests::pg::connect(&second.db).await.expect("a connection");
    let claim = || async {
        let row = db
            .query_one(
                "SELECT holder, lease_until_ms FROM turn_claims WHERE conversation_id = 'handover' AND turn = 1",
                &[],
            )
            .await
            .expect("the claim");
        (row.get::<_, String>(0), row.get::<_, i64>(1))
    };
    let name = |node: &TestServer| {
        let turns = node.running().orchestrator().turns().clone();
        turns.node_name().expect("a cluster node").to_string()
    };
    let (holder, _) = claim().await;
    let (mut stopping, _staying) = if holder == name(&first) {
        (first, second)
    } else {
        (second, first)
    };
    let stopped = name(&stopping);
    assert_eq!(holder, stopped);
    stopping.stop().await;
    let (holder, lease) = claim().await;
    // Let go (lease 0), or already taken by the other node: not held by the stopped node
    // until its lease would have run out.
    assert!(lease == 0 || holder != stopped, "{holder} {lease}");
    tests::eventually("the other node takes the turn", || {
        agent.total.load(std::sync::atomic::Ordering::SeqCst) == 2
    })
    .await;
    agent.hold.store(false, std::sync::atomic::Ordering::SeqCst);
    agent.release.notify_waiters();
}

/// Plans written at once through two nodes are numbered densely across them (the version is
/// decided where seq is, under the conversation's lock, on a state caught up with the other
/// node's writes), and a mode a participant does not declare is refused on a node that did not
/// create the conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn document_versions_and_modes_hold_across_nodes() {
    use agent_sdk::AgentClient;
    use proto_spec::{ErrorCode, Finality, SendMessageParams};
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let b = a.another_node().await;
    a.create("plans", &["alice", "bob"]).await;
    const EACH: usize = 15;
    let mut writers = Vec::new();
    for (who, node) in [("alice", &a), ("bob", &b)] {
        let client = node.sdk(who, None).await;
        writers.push(tokio::spawn(async move {
            for i in 0..EACH {
                let payload = json!({"text": "plan", "schema": "plan.v1",
                    "data": {"type": "launch", "format": "markdown", "content": format!("# {who} {i}")}});
                client
                    .send_message(SendMessageParams { after_key: None,
                        conversation_id: "plans".into(),
                        payload: serde_json::from_value(payload).unwrap(),
                        finality: Finality::None,
                        turn_hint: None,
                        client_request_id: Some(format!("{who}-{i}")),
                    })
                    .await
                    .expect("a plan");
            }
        }));
    }
    for w in writers {
        w.await.expect("writer");
    }
    let reader = a.client("alice").await;
    let versions: Vec<u64> = log(&reader, "plans")
        .await
        .iter()
        .filter(|e| e["kind"] == "message")
        .map(|e| e["payload"]["data"]["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, (1..=2 * EACH as u64).collect::<Vec<_>>());

    let admin = a.sdk("admin", None).await;
    tests::create_scenario(
        &admin,
        "modes",
        json!({"participants": ["alice", {"id": "bob", "external": true, "modes": ["plan"]}],
               "policy": {"order": "round_robin", "first": "alice"}}),
    )
    .await;
    let alice_on_b = b.sdk("alice", None).await;
    let ask = |mode: &str| SendMessageParams {
        conversation_id: "modes".into(),
        payload: serde_json::from_value(json!({"text": "go", "mode": mode})).unwrap(),
        finality: Finality::Turn,
        turn_hint: None,
        client_request_id: None,
        after_key: None,
    };
    let refused = alice_on_b.send_message(ask("build")).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::ModeNotSupported));
    let asked = alice_on_b
        .send_message(ask("plan"))
        .await
        .expect("plan mode");
    // Node a shows node b's commit once b's notification reached it: read it there once a has
    // the policy's decision that followed the message.
    let bob_on_a = a.sdk("bob", None).await;
    let s = tests::wait_for(&bob_on_a, "modes", "node a shows node b's commit", |s| {
        s.latest_seq > asked.seq
    })
    .await;
    assert_eq!(s.guidance.mode, Some(proto_spec::Mode::Plan));
}
