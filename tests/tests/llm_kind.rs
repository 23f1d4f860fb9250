//! The `llm` kind against a small server on 127.0.0.1 speaking the OpenAI chat-completions wire
//! format: streamed and not, structured output with slightly broken JSON, 429 then success, a
//! 500 that never ends, a missing model, and a wrong key.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use agent_sdk::proto::*;
use agent_sdk::AgentClient;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use serde_json::{json, Value};
use tests::{create_scenario, full_log, traces, turn_errors, wait_for, TestServer};

/// Calls to the `flaky` model: the first is refused with 429.
static FLAKY: AtomicUsize = AtomicUsize::new(0);

/// The model name picks the behaviour.
async fn completions(calls: Arc<AtomicUsize>, headers: HeaderMap, body: Value) -> Response {
    calls.fetch_add(1, Ordering::SeqCst);
    let model = body["model"].as_str().unwrap_or_default().to_string();
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some("Bearer test-key") {
        return (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": {"message": "Incorrect API key provided"}})),
        )
            .into_response();
    }
    let last_user = body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|x| x["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string();
    let usage = json!({"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17});
    let text = match model.as_str() {
        "missing" => return (StatusCode::NOT_FOUND, axum::Json(json!({"error": {"message": "The model `missing` does not exist"}}))).into_response(),
        "broken" => return (StatusCode::INTERNAL_SERVER_ERROR, "upstream exploded").into_response(),
        "flaky" if FLAKY.fetch_add(1, Ordering::SeqCst) == 0 => return (StatusCode::TOO_MANY_REQUESTS, axum::Json(json!({"error": {"message": "slow down"}}))).into_response(),
        "structured" => "```json\n{\"response_text\": \"Let me add those.\", \"tools_to_invoke\": [{\"tool\": \"add\", \"args\": {\"a\": 2, \"b\": 3},}],}\n```".to_string(),
        _ => format!("You said: {}", last_user.split(": ").nth(1).unwrap_or_default()),
    };
    if body["stream"] == json!(true) && model == "slow" {
        // One word every 250 ms: long enough for progress messages.
        let chunks: Vec<String> = text
            .split_inclusive(' ')
            .map(|w| {
                format!(
                    "data: {}\n\n",
                    json!({"choices": [{"index": 0, "delta": {"content": w}}]})
                )
            })
            .chain([
                format!("data: {}\n\n", json!({"choices": [], "usage": usage})),
                "data: [DONE]\n\n".to_string(),
            ])
            .collect();
        let stream = futures::stream::iter(chunks).then(|c| async move {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            Ok::<_, std::convert::Infallible>(c)
        });
        return (
            [("content-type", "text/event-stream")],
            axum::body::Body::from_stream(stream),
        )
            .into_response();
    }
    if body["stream"] == json!(true) {
        let mut sse = String::new();
        let words: Vec<&str> = text.split_inclusive(' ').collect();
        for w in words {
            sse.push_str(&format!(
                "data: {}\n\n",
                json!({"choices": [{"index": 0, "delta": {"content": w}}]})
            ));
        }
        sse.push_str(&format!(
            "data: {}\n\n",
            json!({"choices": [], "usage": usage})
        ));
        sse.push_str("data: [DONE]\n\n");
        return ([("content-type", "text/event-stream")], sse).into_response();
    }
    axum::Json(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}], "usage": usage})).into_response()
}

async fn fake_openai() -> (String, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(move |headers: HeaderMap, body: axum::Json<Value>| {
            completions(c.clone(), headers, body.0)
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/v1"), calls)
}

fn llm(base: &str, model: &str, extra: Value) -> Value {
    let mut v = json!({"id": "assistant", "kind": "llm", "baseUrl": base, "model": model, "apiKeyEnv": "LLM_KIND_TEST_KEY", "system": "Be brief.", "timeout": "5s", "retries": 2});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn assistant_messages(log: &[Event]) -> Vec<&Event> {
    log.iter()
        .filter(|e| e.author == "assistant" && e.kind == EventKind::Message)
        .collect()
}

async fn run(server: &TestServer, id: &str, assistant: Value, timeout: &str) -> Vec<Event> {
    let admin = server.sdk("admin", None).await;
    run_as(&admin, id, assistant, timeout).await
}

/// [`run`] as the admin `admin` (of any tenant).
async fn run_as(
    admin: &dyn agent_sdk::AgentClient,
    id: &str,
    assistant: Value,
    timeout: &str,
) -> Vec<Event> {
    let participants = vec![
        json!({"id": "user", "kind": "scripted", "replies": ["hello world"]}),
        assistant,
    ];
    create_scenario(
        admin,
        id,
        json!({"participants": participants, "policy": {"order": "sequence", "sequence": ["user", "assistant"]}, "turn": {"timeout": timeout, "onTimeout": "end"}}),
    )
    .await;
    wait_for(admin, id, "the end", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    full_log(admin, id).await
}

/// A key missing from the environment, and a key the endpoint refuses (401, not retried):
/// each a turn error that says so.
async fn keys_missing_or_refused_are_said_plainly(server: &TestServer, base: &str) {
    let log = run(
        server,
        "badkey",
        llm(base, "echo", json!({"apiKeyEnv": "LLM_KIND_TEST_WRONG"})),
        "3s",
    )
    .await;
    let errors = turn_errors(&log);
    assert!(
        errors.iter().any(|e| e.contains("LLM_KIND_TEST_WRONG")),
        "{errors:?}"
    );
    // A key the endpoint refuses: 401, not retried, said plainly.
    std::env::set_var("LLM_KIND_TEST_BAD_KEY", "not-the-key");
    let refused = llm(
        base,
        "echo",
        json!({"apiKeyEnv": "LLM_KIND_TEST_BAD_KEY", "stream": false}),
    );
    let log = run(server, "refused", refused, "3s").await;
    let errors = turn_errors(&log);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("refused the API key") && e.contains("401")),
        "{errors:?}"
    );
    let statuses: Vec<Value> = traces(&log, "llm_call")
        .iter()
        .map(|t| t["status"].clone())
        .collect();
    assert!(
        !statuses.is_empty() && statuses.iter().all(|s| *s == json!(401)),
        "{statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_streams_answers_retries_and_reports_errors() {
    std::env::set_var("LLM_KIND_TEST_KEY", "test-key");
    let (base, _calls) = fake_openai().await;
    let server = TestServer::start().await;

    // Streamed: progress, then the final text; usage in the trace.
    let log = run(&server, "stream", llm(&base, "echo", json!({})), "20s").await;
    let mine = assistant_messages(&log);
    let last = mine.last().expect("an answer");
    assert_eq!(last.payload_value()["text"], "You said: hello world");
    assert_eq!(last.finality, Some(Finality::Turn));
    let calls = traces(&log, "llm_call");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["model"], "echo");
    assert_eq!(calls[0]["promptTokens"], 12);
    assert_eq!(calls[0]["completionTokens"], 5);
    assert_eq!(calls[0]["status"], 200);

    // A slow stream: progress messages (finality none) with the text so far, then the answer.
    let log = run(&server, "slow", llm(&base, "slow", json!({})), "20s").await;
    let mine = assistant_messages(&log);
    let (last, progress) = mine.split_last().expect("an answer");
    assert_eq!(last.payload_value()["text"], "You said: hello world");
    assert!(!progress.is_empty(), "no progress messages");
    for p in progress {
        assert_eq!(p.finality, Some(Finality::None));
        let so_far = p.payload_value()["text"].as_str().unwrap().to_string();
        assert!("You said: hello world".starts_with(&so_far), "{so_far}");
    }

    // Not streamed, 429 first: retried, both attempts traced.
    let log = run(
        &server,
        "flaky",
        llm(&base, "flaky", json!({"stream": false})),
        "20s",
    )
    .await;
    let statuses: Vec<Value> = traces(&log, "llm_call")
        .iter()
        .map(|t| t["status"].clone())
        .collect();
    assert_eq!(statuses, [json!(429), json!(200)]);
    assert!(log
        .iter()
        .any(|e| e.author == "assistant" && e.payload_value()["text"] == "You said: hello world"));

    // Errors are the turn's, in the log, and say what is wrong.
    for (id, model, expected) in [
        ("broken", "broken", "500"),
        ("missing", "missing", "not found"),
    ] {
        let log = run(
            &server,
            id,
            llm(&base, model, json!({"stream": false})),
            "4s",
        )
        .await;
        let errors = turn_errors(&log);
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{id}: {errors:?}"
        );
        assert!(assistant_messages(&log).is_empty(), "{id}: posted");
    }
    keys_missing_or_refused_are_said_plainly(&server, &base).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_structured_output_is_repaired_and_tool_requests_are_addressed() {
    std::env::set_var("LLM_KIND_TEST_KEY", "test-key");
    let (base, _calls) = fake_openai().await;
    let server = TestServer::start().await;
    let assistant = llm(
        &base,
        "structured",
        json!({"structured": true, "tools": [{"name": "add", "participant": "calc", "description": "adds a and b"}]}),
    );
    let admin = server.sdk("admin", None).await;
    create_scenario(
        &admin,
        "tools",
        json!({
            "participants": [{"id": "user", "kind": "scripted", "replies": ["add 2 and 3"]}, assistant, {"id": "calc", "external": true}],
            "policy": {"order": "sequence", "sequence": ["user", "assistant"]},
            "turn": {"timeout": "20s"}
        }),
    )
    .await;
    wait_for(&admin, "tools", "the end", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    let log = full_log(&admin, "tools").await;
    let said: Vec<Value> = assistant_messages(&log)
        .iter()
        .map(|e| e.payload_value())
        .collect();
    assert_eq!(said.len(), 2, "{said:?}");
    assert_eq!(said[0]["text"], "Let me add those.");
    assert_eq!(said[1]["schema"], "tool.request.v1");
    assert_eq!(said[1]["to"], json!(["calc"]));
    assert_eq!(said[1]["data"]["tool"], "add");
    assert_eq!(said[1]["data"]["args"], json!({"a": 2, "b": 3}));
}

/// A tenant's model tokens a day: the turn that spends the last of them runs; after it, the
/// tenant's model turns fail before any call is made, saying why; another tenant's still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_model_tokens_a_day_are_held_to_its_quota() {
    std::env::set_var("LLM_KIND_TEST_KEY", "test-key");
    let (base, calls) = fake_openai().await;
    let server = TestServer::start().await;
    let operator = server
        .sdk_with(&server.tenant_token("default", "ops", false, true))
        .await;
    let acme = server
        .sdk_with(&server.tenant_token("acme", "admin", true, false))
        .await;
    let globex = server
        .sdk_with(&server.tenant_token("globex", "admin", true, false))
        .await;
    // One answer of the fake model spends 12 + 5 tokens.
    operator
        .set_tenant_quotas(SetTenantQuotasParams {
            tenant: "acme".into(),
            quotas: TenantQuotas {
                llm_tokens_per_day: Some(17),
                ..Default::default()
            },
        })
        .await
        .expect("setTenantQuotas");
    let log = run_as(&acme, "first", llm(&base, "echo", json!({})), "20s").await;
    assert_eq!(traces(&log, "llm_call").len(), 1);
    let before = calls.load(Ordering::SeqCst);
    let log = run_as(&acme, "second", llm(&base, "echo", json!({})), "3s").await;
    assert!(traces(&log, "llm_call").is_empty(), "a model call was made");
    assert_eq!(calls.load(Ordering::SeqCst), before);
    let errors = turn_errors(&log);
    assert!(
        errors.iter().any(|e| e.contains("model tokens today")),
        "{errors:?}"
    );
    let log = run_as(&globex, "second", llm(&base, "echo", json!({})), "20s").await;
    assert_eq!(traces(&log, "llm_call").len(), 1, "globex's turn ran");
}
