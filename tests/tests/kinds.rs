//! Built-in agent kinds on the one pipeline, on the running server: `process` agents (small
//! Python scripts speaking JSON lines), declared context sources assembled exactly as declared,
//! and a misbehaving process stopped and reported.

use std::path::PathBuf;

use agent_sdk::proto::*;
use agent_sdk::AgentClient;
use serde_json::{json, Value};
use tests::{create_scenario, full_log, wait_for, TestServer};

fn script(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("agents")
        .join(name)
        .display()
        .to_string()
}

fn messages(log: &[Event]) -> Vec<(String, String)> {
    log.iter()
        .filter(|e| e.kind == EventKind::Message)
        .map(|e| {
            (
                e.author.clone(),
                e.payload_value()["text"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_agent_answers_each_turn_from_its_context() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    create_scenario(
        &admin,
        "calc",
        json!({
            "participants": [
                {"id": "asker", "kind": "scripted", "replies": ["2 + 3", "7 * 6", "thanks TERMINATE"]},
                {"id": "calc", "kind": "process", "command": ["python3", script("calc.py")], "context": {"tail": 1}}
            ],
            "policy": {"order": "round_robin", "first": "asker"},
            "stop": {"onText": "TERMINATE"},
            "turn": {"timeout": "20s"}
        }),
    )
    .await;
    wait_for(&admin, "calc", "the end", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    let log = full_log(&admin, "calc").await;
    let said = messages(&log);
    assert_eq!(
        said[..5],
        [
            ("asker".to_string(), "2 + 3".to_string()),
            ("calc".into(), "= 5".into()),
            ("asker".into(), "7 * 6".into()),
            ("calc".into(), "= 42".into()),
            ("asker".into(), "thanks TERMINATE".into()),
        ]
    );
    let answer = log
        .iter()
        .find(|e| e.author == "calc" && e.kind == EventKind::Message)
        .unwrap()
        .payload_value();
    assert_eq!(answer["data"], json!({"value": 5}));
    assert_eq!(answer["schema"], "calc.result.v1");
}

/// A conversation `notes` of four messages, three tagged `finding`, for the reader to read.
async fn notes_to_read(server: &TestServer, alice: &agent_sdk::WsJsonRpcClient) {
    server.create("notes", &["alice", "reader"]).await;
    for (i, tags) in [
        (1, json!(["finding"])),
        (2, json!(["chatter"])),
        (3, json!(["finding"])),
        (4, json!(["finding"])),
    ] {
        alice
            .send_message(SendMessageParams {
                conversation_id: "notes".into(),
                payload: serde_json::from_value(json!({"text": format!("note {i}"), "tags": tags}))
                    .unwrap(),
                finality: Finality::None,
                turn_hint: None,
                client_request_id: None,
                after_key: None,
            })
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn context_sources_assemble_exactly_what_they_declare() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    let alice = server.sdk("alice", None).await;
    let bob = server.sdk("bob", None).await;
    // Another conversation the agent reads from.
    notes_to_read(&server, &alice).await;
    create_scenario(
        &admin,
        "ctx",
        json!({
            "participants": [
                {"id": "alice", "external": true},
                {"id": "bob", "external": true},
                {"id": "reader", "kind": "process", "command": ["python3", script("echo_context.py")], "context": {
                    "tail": 2,
                    "sources": [
                        {"name": "request", "select": {"schema": "tool.request.v1"}, "fetch": "latest"},
                        {"name": "fromBob", "select": {"author": "bob"}, "fetch": "all"},
                        {"name": "big", "select": {"match": [{"path": "$.data.n", "op": "exists"}]}, "fetch": {"recent": 2}},
                        {"name": "findings", "conversation": "notes", "select": {"tags": ["finding"]}, "fetch": {"recent": 2}},
                        {"name": "missing", "select": {"schema": "nothing.v1"}, "fetch": "latest"}
                    ]
                }}
            ],
            "policy": {"order": "sequence", "sequence": ["alice", "bob", "alice", "reader"]},
            "turn": {"timeout": "20s"}
        }),
    )
    .await;
    let post = |who: &agent_sdk::WsJsonRpcClient, payload: Value| {
        let p = SendMessageParams {
            conversation_id: "ctx".into(),
            payload: serde_json::from_value(payload).unwrap(),
            finality: Finality::Turn,
            turn_hint: None,
            client_request_id: None,
            after_key: None,
        };
        let who = who.clone();
        async move { who.send_message(p).await.unwrap() }
    };
    post(&alice, json!({"text": "first", "data": {"n": 1}})).await;
    post(
        &bob,
        json!({"text": "call it", "schema": "tool.request.v1", "data": {"tool": "calc", "n": 2}}),
    )
    .await;
    post(
        &alice,
        json!({"text": "third", "data": {"n": 3}, "tags": ["x"]}),
    )
    .await;
    wait_for(&admin, "ctx", "the reader's answer", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    let log = full_log(&admin, "ctx").await;
    let ctx = log
        .iter()
        .find(|e| e.author == "reader" && e.kind == EventKind::Message)
        .expect("the reader answered")
        .payload_value()["data"]
        .clone();
    let seq_of = |text: &str| {
        log.iter()
            .find(|e| e.payload_value()["text"] == text)
            .unwrap()
            .seq
    };
    let (first, call, third) = (seq_of("first"), seq_of("call it"), seq_of("third"));
    let bob_msg = json!({"seq": call, "author": "bob", "turn": 2, "text": "call it", "schema": "tool.request.v1", "data": {"tool": "calc", "n": 2}});
    let third_msg = json!({"seq": third, "author": "alice", "turn": 3, "text": "third", "data": {"n": 3}, "tags": ["x"]});
    let notes = full_log(&admin, "notes").await;
    let note = |n: u64| {
        let e = notes
            .iter()
            .find(|e| e.payload_value()["text"] == format!("note {n}"))
            .unwrap();
        json!({"seq": e.seq, "author": "alice", "turn": e.turn, "text": format!("note {n}"), "tags": ["finding"]})
    };
    assert_eq!(
        ctx,
        json!({
            "tail": [bob_msg.clone(), third_msg.clone()],
            "request": bob_msg.clone(),
            "fromBob": [bob_msg.clone()],
            "big": [bob_msg, third_msg],
            "findings": [note(3), note(4)],
            "missing": null,
            "mode": "converse",
        })
    );
    assert!(first < call);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misbehaving_process_is_stopped_and_reported() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    for how in ["sleep", "crash", "garbage"] {
        let id = format!("bad-{how}");
        create_scenario(
            &admin,
            &id,
            json!({
                "participants": [
                    {"id": "asker", "kind": "scripted", "replies": ["go"]},
                    {"id": "worker", "kind": "process", "command": ["python3", script("misbehave.py"), how]}
                ],
                "policy": {"order": "round_robin", "first": "asker"},
                "turn": {"timeout": "1500ms", "onTimeout": "end"}
            }),
        )
        .await;
        wait_for(&admin, &id, "the turn to end", |s| {
            s.status == ConversationStatus::Closed
        })
        .await;
        let log = full_log(&admin, &id).await;
        let errors: Vec<String> = log
            .iter()
            .filter(|e| e.kind == EventKind::Trace && e.payload_value()["type"] == "turn_error")
            .map(|e| e.payload_value().to_string())
            .collect();
        assert!(!errors.is_empty(), "{how}: no turn_error trace in {log:?}");
        let expected = match how {
            "sleep" => "deadline",
            "crash" => "the calculator is on fire",
            _ => "not JSON",
        };
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{how}: {errors:?}"
        );
        assert!(
            !messages(&log).iter().any(|(a, _)| a == "worker"),
            "{how}: the worker posted"
        );
    }
    // The sleeping process was killed at the deadline, not left behind.
    let left = std::process::Command::new("pgrep")
        .args(["-f", "misbehave.py sleep"])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty(), "a process outlived its turn");
}

/// A local API for the `http` kind: the first call answers 503; later ones check the token and
/// answer a forecast for the city in the body.
async fn forecast_api() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let app = axum::Router::new()
        .route(
            "/forecast",
            post(move |headers: HeaderMap, body: axum::Json<Value>| {
                let n = counter.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"error": "warming up"})));
                    }
                    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Bearer s3cret") {
                        return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "bad token"})));
                    }
                    let city = body["city"].as_str().unwrap_or("?").to_string();
                    (
                        StatusCode::OK,
                        axum::Json(json!({"summary": format!("Sunny in {city}"), "forecast": {"city": city, "days": body["days"]}, "echo": body.0})),
                    )
                }
            }),
        )
        .route(
            "/missing",
            post(|| async { (StatusCode::NOT_FOUND, "no such thing") }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_agent_calls_an_api_with_retries_and_maps_the_answer() {
    // The token comes from the environment only.
    std::env::set_var("KINDS_TEST_WEATHER_TOKEN", "s3cret");
    let (api, calls) = forecast_api().await;
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    let weather = |endpoint: String, token_var: &str| {
        json!({
            "id": "weather", "kind": "http",
            "endpoint": endpoint,
            "headers": {"Authorization": {"env": token_var, "prefix": "Bearer "}, "X-Caller": "orchestrator-test"},
            "body": {"city": "{{$.last.text}}", "days": 3, "note": "asked by {{$.last.author}}"},
            "response": {"text": "$.summary", "data": "$.forecast", "schema": "weather.v1"},
            "timeout": "5s",
            "retries": 2
        })
    };
    create_scenario(
        &admin,
        "api",
        json!({
            "participants": [{"id": "asker", "kind": "scripted", "replies": ["Paris"]}, weather(format!("{api}/forecast"), "KINDS_TEST_WEATHER_TOKEN")],
            "policy": {"order": "sequence", "sequence": ["asker", "weather"]},
            "turn": {"timeout": "20s"}
        }),
    )
    .await;
    wait_for(&admin, "api", "the answer", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    let log = full_log(&admin, "api").await;
    let answer = log
        .iter()
        .find(|e| e.author == "weather" && e.kind == EventKind::Message)
        .expect("the weather agent answered")
        .payload_value();
    assert_eq!(answer["text"], "Sunny in Paris");
    assert_eq!(answer["data"], json!({"city": "Paris", "days": 3}));
    assert_eq!(answer["schema"], "weather.v1");
    let statuses: Vec<Value> = log
        .iter()
        .filter(|e| e.kind == EventKind::Trace && e.payload_value()["type"] == "http_call")
        .map(|e| e.payload_value()["status"].clone())
        .collect();
    assert_eq!(
        statuses,
        [json!(503), json!(200)],
        "one retry after the 503"
    );
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);

    // A 404 and a missing secret are the agent's errors, in the log; nothing is posted.
    for (id, endpoint, var, expected) in [
        (
            "api-404",
            format!("{api}/missing"),
            "KINDS_TEST_WEATHER_TOKEN",
            "404",
        ),
        (
            "api-secret",
            format!("{api}/forecast"),
            "KINDS_TEST_NOT_SET",
            "KINDS_TEST_NOT_SET",
        ),
    ] {
        create_scenario(
            &admin,
            id,
            json!({
                "participants": [{"id": "asker", "kind": "scripted", "replies": ["Oslo"]}, weather(endpoint, var)],
                "policy": {"order": "sequence", "sequence": ["asker", "weather"]},
                "turn": {"timeout": "1500ms", "onTimeout": "end"}
            }),
        )
        .await;
        wait_for(&admin, id, "the end", |s| {
            s.status == ConversationStatus::Closed
        })
        .await;
        let log = full_log(&admin, id).await;
        let errors: Vec<String> = log
            .iter()
            .filter(|e| e.kind == EventKind::Trace && e.payload_value()["type"] == "turn_error")
            .map(|e| e.payload_value().to_string())
            .collect();
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{id}: {errors:?}"
        );
        assert!(
            !messages(&log).iter().any(|(a, _)| a == "weather"),
            "{id}: posted"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_kind_settings_are_refused_with_the_field() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    for (participant, field) in [
        (
            json!({"id": "w", "kind": "http", "endpoint": "ftp://x"}),
            "participants[0].endpoint",
        ),
        (
            json!({"id": "w", "kind": "http", "endpoint": "http://x", "timeout": "soon"}),
            "participants[0].timeout",
        ),
        (
            json!({"id": "p", "kind": "process", "command": []}),
            "participants[0].command",
        ),
        (
            json!({"id": "p", "kind": "process", "command": ["x"], "context": {"sources": [{"name": "tail"}]}}),
            "participants[0].context",
        ),
    ] {
        let r = admin
            .create_conversation(CreateConversationParams {
                conversation_id: Some("bad".into()),
                scenario: Some(json!({"participants": [participant.clone(), "other"]})),
                ..Default::default()
            })
            .await;
        let e = r.expect_err("refused");
        let msg = e.to_string();
        assert!(msg.contains(field), "{participant}: {msg}");
    }
}

/// A `function` participant in a conversation of its own, answering `asker`'s one message
/// within `timeout`.
fn function_scenario(source: &str, timeout: &str) -> Value {
    json!({
        "participants": [
            {"id": "asker", "kind": "scripted", "replies": ["3 and 4"]},
            {"id": "fn", "kind": "function", "source": source, "timeout": timeout, "memoryMb": 8}
        ],
        "policy": {"order": "round_robin", "first": "asker"},
        "stop": {"maxTurns": 2},
        "turn": {"timeout": "5s", "onTimeout": "end"}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_agents_misbehave_in_a_sandbox_and_are_reported_while_others_go_on() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    // The memory hog has time enough to reach its limit on a loaded machine: a time limit
    // reached first would be reported as the loop's is.
    let bad = [
        ("loops", "function handler() { for (;;) {} }", "200ms", "ran past its time limit"),
        (
            "hogs",
            "function handler() { const keep = []; for (;;) { keep.push('x'.repeat(65536) + keep.length); } }",
            "3s",
            "ran out of its 8 MiB of memory",
        ),
        ("throws", "function handler() { throw new Error('boom'); }", "200ms", "threw: Error: boom"),
        (
            "reads",
            "function handler() { return std.loadFile('/etc/passwd'); }",
            "200ms",
            "ReferenceError: std is not defined",
        ),
    ];
    for (id, source, timeout, _) in &bad {
        create_scenario(&admin, id, function_scenario(source, timeout)).await;
    }
    // A well-behaved function runs beside them, unaffected.
    create_scenario(
        &admin,
        "good",
        function_scenario(
            "function handler(input, ctx) { const [a, b] = input.tail[0].text.split(' and ').map(Number); \
             return { text: 'sum ' + (a + b), data: { sum: a + b, turn: ctx.turn } }; }",
            "2s",
        ),
    )
    .await;
    let good = wait_for(&admin, "good", "the good function answers", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    assert_eq!(good.status, ConversationStatus::Closed);
    let log = full_log(&admin, "good").await;
    let answer = log
        .iter()
        .find(|e| e.author == "fn" && e.kind == EventKind::Message)
        .expect("an answer")
        .payload_value();
    assert_eq!(answer["text"], "sum 7");
    assert_eq!(answer["data"], json!({"sum": 7, "turn": 2}));

    for (id, _, _, error) in &bad {
        let log = tests::log_until(&admin, id, "an error logged", |log| {
            log.iter()
                .any(|e| e.kind == EventKind::Trace && e.payload_value()["type"] == "turn_error")
        })
        .await;
        let errors: Vec<String> = log
            .iter()
            .filter(|e| e.kind == EventKind::Trace && e.payload_value()["type"] == "turn_error")
            .map(|e| {
                e.payload_value()["error"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        assert!(
            !log.iter()
                .any(|e| e.author == "fn" && e.kind == EventKind::Message),
            "{id}: nothing is posted for a failed run"
        );
        assert!(errors[0].contains(error), "{id}: {errors:?}");
    }
    // The server still answers.
    assert!(
        admin
            .list_conversations(Default::default())
            .await
            .unwrap()
            .conversations
            .len()
            >= 5
    );
}

/// A `scripted` agent's next reply follows the log, not only what its own value said: when the
/// same agent speaks through two values by turns (two nodes of a cluster, or an executor run
/// again), each says the next reply, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_agent_spoken_for_by_two_values_says_each_reply_once() {
    use agent_sdk::{Agent, AgentContext};
    use orchestrator::engine::auth::Identity;
    use orchestrator::host::client::InProcessClient;
    let server = TestServer::start().await;
    server.create("duo", &["bot", "alice"]).await;
    let orch = server.running().orchestrator().clone();
    let bot: std::sync::Arc<dyn AgentClient> = std::sync::Arc::new(InProcessClient::new(
        orch.clone(),
        Identity::new("bot", false),
    ));
    let alice = server.sdk("alice", None).await;
    let replies: Vec<String> = ["one", "two", "three", "four"].map(String::from).to_vec();
    let values = [
        agent_kinds::Scripted::new(replies.clone()),
        agent_kinds::Scripted::new(replies),
    ];
    for (i, value) in [0usize, 1, 0, 0, 1].into_iter().enumerate() {
        let snapshot = alice.get_conversation("duo").await.expect("snapshot");
        let ctx = AgentContext::new(
            bot.clone(),
            "duo",
            snapshot.turn,
            1,
            tokio::time::Instant::now() + std::time::Duration::from_secs(10),
            snapshot.latest_seq,
        );
        values[value].handle_turn(&ctx).await.expect("a turn");
        alice
            .send_message(SendMessageParams::text(
                "duo",
                format!("alice {i}"),
                Finality::Turn,
            ))
            .await
            .expect("alice answers");
    }
    let said: Vec<String> = messages(&full_log(&alice, "duo").await)
        .into_iter()
        .filter(|(who, _)| who == "bot")
        .map(|(_, text)| text)
        .collect();
    // The fifth turn has no reply left: the agent yields.
    assert_eq!(said, ["one", "two", "three", "four"]);
}
