//! Every example scenario under `examples/scenarios/` runs to its end on the real server.

use std::time::Duration;

use agent_sdk::proto::*;
use agent_sdk::{AgentClient, WsJsonRpcClient};
use orchestrator::engine::scenario::Scenario;
use serde_json::Value;
use tests::{full_log, wait_for, TestServer, WAIT};

fn example(name: &str) -> Value {
    let path = format!(
        "{}/../examples/scenarios/{name}.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("example file");
    let v: Value = serde_norway::from_str(&text).expect("yaml");
    Scenario::parse(&v, &*tests::test_limits().kinds).expect("a valid scenario");
    v
}

async fn start(server: &TestServer, id: &str, scenario: Value) -> WsJsonRpcClient {
    let admin = server.sdk("admin", None).await;
    tests::create_scenario(&admin, id, scenario).await;
    admin
}

async fn closed_log(admin: &WsJsonRpcClient, id: &str) -> Vec<Event> {
    wait_for(admin, id, "the close", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    full_log(admin, id).await
}

fn said(log: &[Event]) -> Vec<String> {
    log.iter()
        .filter(|e| e.kind == EventKind::Message)
        .map(|e| {
            format!(
                "{}: {}",
                e.author,
                e.payload_value()["text"].as_str().unwrap_or("")
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_round_robin_debate_runs_to_its_stop_word() {
    let server = TestServer::start().await;
    let admin = start(&server, "debate", example("debate")).await;
    let log = closed_log(&admin, "debate").await;
    let lines = said(&log);
    let speakers: Vec<&str> = lines.iter().map(|l| l.split(':').next().unwrap()).collect();
    assert_eq!(
        speakers,
        [
            "moderator",
            "proponent",
            "opponent",
            "moderator",
            "proponent",
            "opponent",
            "moderator",
            "orchestrator"
        ]
    );
    assert_eq!(
        log.last().unwrap().payload_value()["data"]["reason"],
        "on_text"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_routing_sends_the_turn_to_the_tool_by_a_selector_rule() {
    let server = TestServer::start().await;
    let admin = start(&server, "tools", example("tool-routing")).await;
    let log = closed_log(&admin, "tools").await;
    assert_eq!(
        said(&log),
        [
            "user: What is 6 times 7?",
            "assistant: calc: 6 * 7",
            "calc: 42",
            "assistant: 6 times 7 is 42. DONE",
            "orchestrator: The conversation ended: on text."
        ]
    );
}

/// Waits until `who` holds a turn of `conv` (it may speak), then answers "approve".
async fn approve(who: &WsJsonRpcClient, conv: &str) {
    let s = tests::wait_for(who, conv, "an approval requested", |s| {
        s.speaker.as_deref() == Some(who.agent_id())
    })
    .await;
    assert_eq!(s.guidance.status, GuidanceStatus::MaySpeak);
    who.send_message(SendMessageParams {
        conversation_id: conv.into(),
        payload: MessagePayload::text("approve"),
        finality: Finality::Turn,
        turn_hint: Some(TurnHint { turn: s.turn }),
        client_request_id: None,
        after_key: None,
    })
    .await
    .expect("approve");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_waits_for_the_external_approver() {
    let server =
        TestServer::with_options(Default::default(), Default::default(), Default::default()).await;
    // alice is the external approver: give the test's alice token to the scenario's alice.
    let admin = start(&server, "approval", example("approval")).await;
    let alice = server.sdk("alice", None).await;
    // The writer drafts, then the turn comes to alice for approval.
    approve(&alice, "approval").await;
    let log = closed_log(&admin, "approval").await;
    assert_eq!(
        said(&log),
        [
            "writer: Draft: Release 1.2 ships on Friday.",
            "alice: approve",
            "publisher: Published. TERMINATE",
            "orchestrator: The conversation ended: on text."
        ]
    );
    let types: Vec<String> = log
        .iter()
        .filter(|e| e.kind == EventKind::System)
        .map(|e| e.payload_value()["type"].as_str().unwrap_or("").to_string())
        .collect();
    assert!(types.contains(&"approval_requested".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_planner_runs_researchers_in_parallel_then_the_writer_after_approval() {
    let server = TestServer::start().await;
    server
        .running()
        .orchestrator()
        .set_scenarios(vec![
            ("research".into(), example("research")),
            ("write".into(), example("write")),
        ])
        .expect("the children's scenarios");
    let admin = start(&server, "plan", example("planner")).await;
    let alice = server.sdk("alice", None).await;
    alice
        .send_message(SendMessageParams {
            conversation_id: "plan".into(),
            payload: MessagePayload::text("tea"),
            finality: Finality::Turn,
            turn_hint: None,
            client_request_id: None,
            after_key: None,
        })
        .await
        .expect("alice gives the topic");
    // Both researchers ran in sub-conversations; the planner asks alice before writing.
    let s = wait_for(&alice, "plan", "the approval request", |s| {
        s.speaker.as_deref() == Some("alice") && s.turn == 3
    })
    .await;
    let log = full_log(&alice, "plan").await;
    let ask = said(&log).pop().unwrap();
    assert_eq!(
        ask,
        "planner: Research is in. Notes on the history of tea: three sources agree. \
         Notes on the trade in tea: three sources agree. Approve to write the report, or reject to stop."
    );
    alice
        .send_message(SendMessageParams {
            conversation_id: "plan".into(),
            payload: MessagePayload::text("approve"),
            finality: Finality::Turn,
            turn_hint: Some(TurnHint { turn: s.turn }),
            client_request_id: None,
            after_key: None,
        })
        .await
        .expect("approve");
    let log = closed_log(&admin, "plan").await;
    let said = said(&log);
    assert_eq!(
        said[said.len() - 2],
        "planner: Report (2 parts): Notes on the history of tea: three sources agree. \
         Notes on the trade in tea: three sources agree."
    );
    // The tree is in the log: three children, each started and finished, the writer last.
    let tree: Vec<(String, String)> = log
        .iter()
        .filter(|e| e.kind == EventKind::System)
        .map(|e| e.payload_value())
        .filter(|p| {
            p["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("subconversation_"))
        })
        .map(|p| {
            (
                p["type"].as_str().unwrap().to_string(),
                p["child"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(tree.len(), 6, "{tree:?}");
    // The writer starts after both researchers finished (alice approved in between).
    assert_eq!(tree[4].0, "subconversation_started");
    assert_eq!(tree[5].0, "subconversation_finished");
    let writer = &tree[5].1;
    assert_eq!(&tree[4].1, writer);
    let child = admin
        .get_conversation(writer)
        .await
        .expect("the writer's conversation");
    assert_eq!(child.parent_conversation_id.as_deref(), Some("plan"));
    assert_eq!(child.participants, ["writer"]);
}

/// A stand-in for the model of the llm-tools example, speaking the OpenAI wire format: it asks
/// for the calculator, then for `word_count`, then answers with both results.
async fn scripted_model() -> String {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(|body: axum::Json<Value>| async move {
            let results: Vec<Value> = body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["content"].as_str())
                .filter(|c| c.starts_with("tools: "))
                .filter_map(|c| c.split("(data: ").nth(1))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim_end_matches(')')).ok())
                .map(|d| d["output"].clone())
                .collect();
            let answer = match results.len() {
                0 => serde_json::json!({"response_text": "", "tools_to_invoke": [{"tool": "calculator", "args": {"op": "mul", "a": 6, "b": 7}}]}),
                1 => serde_json::json!({"tools_to_invoke": [{"tool": "word_count", "args": {"text": "the quick brown fox"}}]}),
                _ => serde_json::json!({"response_text": format!("6 times 7 is {} and the phrase has {} words. DONE", results[0], results[1])}),
            };
            axum::Json(serde_json::json!({
                "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.to_string()}}],
                "usage": {"prompt_tokens": 30, "completion_tokens": 10}
            }))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

/// The Python that runs the example's MCP server: `ORCHESTRATOR_TEST_PYTHON` (scripts/test
/// points it at its virtual environment, which has the `mcp` SDK), else `python3`.
fn python_with_mcp() -> String {
    let python = std::env::var("ORCHESTRATOR_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(&python)
        .args(["-c", "import mcp.server.mcpserver"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{python} cannot import the mcp SDK: run scripts/test, or set ORCHESTRATOR_TEST_PYTHON to a Python with `pip install mcp`"
    );
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llm_tools_asks_a_builtin_and_an_mcp_tool_then_answers() {
    let model = scripted_model().await;
    let python = python_with_mcp();
    let server = TestServer::start().await;
    let mut scenario = example("llm-tools");
    let root = format!("{}/..", env!("CARGO_MANIFEST_DIR"));
    for p in scenario["participants"].as_array_mut().unwrap() {
        if p["id"] == "assistant" {
            p["baseUrl"] = Value::String(model.clone());
            p["model"] = Value::String("scripted".into());
        }
        if p["id"] == "tools" {
            p["mcp"][0]["command"] =
                serde_json::json!([python, format!("{root}/examples/scenarios/tools_server.py")]);
        }
    }
    let admin = start(&server, "llm-tools", scenario).await;
    let log = closed_log(&admin, "llm-tools").await;
    let lines = said(&log);
    assert_eq!(
        lines,
        [
            "user: What is 6 times 7, and how many words are in 'the quick brown fox'?",
            "assistant: calculator {\"a\":6,\"b\":7,\"op\":\"mul\"}",
            "tools: 42.0",
            "assistant: word_count {\"text\":\"the quick brown fox\"}",
            "tools: 4",
            "assistant: 6 times 7 is 42.0 and the phrase has 4 words. DONE",
            "orchestrator: The conversation ended: on text.",
        ],
        "{lines:#?}"
    );
    let responses: Vec<Value> = log
        .iter()
        .filter(|e| e.payload_value()["schema"] == "tool.response.v1")
        .map(|e| e.payload_value()["data"].clone())
        .collect();
    assert_eq!(responses[0]["status"], "ok");
    assert_eq!(responses[1]["tool"], "word_count");
    let request_seqs: Vec<u64> = log
        .iter()
        .filter(|e| e.payload_value()["schema"] == "tool.request.v1")
        .map(|e| e.seq)
        .collect();
    assert_eq!(
        responses
            .iter()
            .map(|r| r["requestSeq"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        request_seqs,
        "each response names its request by seq"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_participant_reaches_an_mcp_server_over_streamable_http() {
    let python = python_with_mcp();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let root = format!("{}/..", env!("CARGO_MANIFEST_DIR"));
    let mut mcp = tokio::process::Command::new(&python)
        .args([
            format!("{root}/examples/scenarios/tools_server.py"),
            "http".into(),
            port.to_string(),
        ])
        .kill_on_drop(true)
        .spawn()
        .expect("the MCP server starts");
    // Wait for it to listen.
    let until = tokio::time::Instant::now() + WAIT;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < until,
            "the MCP server did not listen"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    let bob = server.sdk("bob", None).await;
    tests::create_scenario(
        &admin,
        "mcp-http",
        serde_json::json!({
            "participants": [
                {"id": "bob", "external": true},
                {"id": "tools", "kind": "tool", "mcp": [{"url": format!("http://127.0.0.1:{port}/mcp")}]}
            ],
            "policy": {"order": "sequence", "sequence": ["bob", "tools"]},
            "turn": {"timeout": "20s"}
        }),
    )
    .await;
    bob.send_message(SendMessageParams {
        conversation_id: "mcp-http".into(),
        payload: serde_json::from_value(serde_json::json!({
            "text": "count", "schema": "tool.request.v1",
            "data": {"tool": "word_count", "args": {"text": "one two three"}, "requestId": "r1"}
        }))
        .unwrap(),
        finality: Finality::Turn,
        turn_hint: None,
        client_request_id: None,
        after_key: None,
    })
    .await
    .expect("the request");
    let log = closed_log(&admin, "mcp-http").await;
    let response = log
        .iter()
        .find(|e| e.payload_value()["schema"] == "tool.response.v1")
        .expect("a tool response")
        .payload_value();
    assert_eq!(response["data"]["status"], "ok");
    assert_eq!(response["data"]["output"], 3);
    assert_eq!(response["data"]["requestId"], "r1");
    assert_eq!(response["to"], serde_json::json!(["bob"]));
    let _ = mcp.kill().await;
}

/// Each participant's turns with the mode each asked for, and each plan or deliverable as
/// `author: title`.
fn modes_and_documents(log: &[Event]) -> (Vec<String>, Vec<String>) {
    let mut turns = Vec::new();
    let mut documents = Vec::new();
    for e in log {
        if let Some(SystemEvent::NextSpeaker(n)) = SystemEvent::parse(e.payload.get()) {
            turns.push(format!(
                "{} {}",
                n.speaker,
                n.mode.unwrap_or(Mode::Converse)
            ));
        }
        if let Some((mode, d)) = proto_spec::document::document_of(&e.payload_value()) {
            documents.push(format!("{}: {}", e.author, d.title(mode)));
        }
    }
    (turns, documents)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_build_plans_waits_for_approval_builds_from_the_plan_and_reviews() {
    let server = TestServer::start().await;
    let admin = start(&server, "launch", example("plan-build")).await;
    let alice = server.sdk("alice", None).await;
    approve(&alice, "launch").await;
    let log = closed_log(&admin, "launch").await;
    let (turns, documents) = modes_and_documents(&log);
    assert_eq!(
        turns,
        [
            "planner plan",
            "alice converse",
            "api-builder build",
            "docs-builder build",
            "reviewer converse"
        ]
    );
    assert_eq!(
        documents,
        [
            "planner: plan launch-plan v1 (markdown, plan mode)",
            "api-builder: deliverable api-spec v1 (json, build mode)",
            "docs-builder: deliverable launch-note v1 (markdown, build mode)",
        ]
    );
    // The builders built from the plan: the spec names the plan's endpoints and version, the
    // note the plan's goal and the spec's endpoints.
    let doc = |author: &str| {
        log.iter()
            .find(|e| e.author == author && e.kind == EventKind::Message)
            .map(|e| e.payload_value()["data"]["content"].clone())
            .unwrap()
    };
    assert_eq!(
        doc("api-builder"),
        serde_json::json!({"endpoints": [{"method": "GET", "path": "/status"}, {"method": "GET", "path": "/health"}], "fromPlan": 1})
    );
    assert_eq!(
        doc("docs-builder"),
        "# Summary\nLaunch the status page.\n\n# Endpoints\n- `GET /status`\n- `GET /health`"
    );
    let said = said(&log);
    assert_eq!(
        said[said.len() - 2..],
        [
            "reviewer: Reviewed api-spec v1 by api-builder and launch-note v1 by docs-builder: ready to ship.",
            "orchestrator: The conversation ended: sequence done."
        ]
    );
}

/// A model that plans and builds as it is prompted: the plan with the declared sections; the
/// deliverable first without `endpoints` (refused by its schema, so retried), then right.
async fn planning_model() -> String {
    use axum::routing::post;
    let builds = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(move |body: axum::Json<Value>| {
            let builds = builds.clone();
            async move {
                let system = body["messages"][0]["content"].as_str().unwrap_or_default();
                let answer = if system.contains("You are asked to plan") {
                    "# Goal\nShip the status page.\n# Steps\n1. GET /status\n# Risks\nNone."
                        .to_string()
                } else if system.contains("You are asked to build") {
                    let n = builds.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if n == 0 {
                        "{\"paths\": [\"/status\"]}".to_string()
                    } else {
                        "```json\n{\"endpoints\": [{\"method\": \"GET\", \"path\": \"/status\"}]}\n```".to_string()
                    }
                } else {
                    "Hello.".to_string()
                };
                axum::Json(serde_json::json!({
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]
                }))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/v1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_build_with_a_model_is_prompted_per_mode_and_a_bad_deliverable_is_retried() {
    let server = TestServer::start().await;
    let mut scenario = example("plan-build-llm");
    let base = planning_model().await;
    for p in scenario["participants"].as_array_mut().unwrap() {
        if p["kind"] == "llm" {
            p["baseUrl"] = serde_json::json!(base);
        }
    }
    let admin = start(&server, "launch-llm", scenario).await;
    let alice = server.sdk("alice", None).await;
    alice
        .send_message(SendMessageParams::text(
            "launch-llm",
            "Plan the status page launch.",
            Finality::Turn,
        ))
        .await
        .expect("alice opens");
    approve(&alice, "launch-llm").await;
    let log = closed_log(&admin, "launch-llm").await;
    let (turns, documents) = modes_and_documents(&log);
    assert_eq!(
        turns,
        [
            "alice converse",
            "planner plan",
            "alice converse",
            "builder build",
            "reviewer converse"
        ]
    );
    assert_eq!(
        documents,
        [
            "planner: plan launch-plan v1 (markdown, plan mode)",
            "builder: deliverable api-spec v1 (json, build mode)",
        ]
    );
    let errors = tests::turn_errors(&log);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("the deliverable does not match its schema"),
        "{errors:?}"
    );
    assert!(said(&log)
        .iter()
        .any(|l| l == "reviewer: The API spec v1 has 1 endpoints. TERMINATE"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_agent_starts_the_helpdesk_and_speaks_as_its_caller() {
    let server = TestServer::start().await;
    server.set_library(vec![("helpdesk", example("helpdesk"))]);
    let bob = server.sdk("bob", None).await;
    bob.create_conversation(CreateConversationParams {
        conversation_id: Some("desk".into()),
        scenario_name: Some("helpdesk".into()),
        ..Default::default()
    })
    .await
    .expect("bob, not an admin, starts the help desk");
    for text in ["I need a ticket", "File it please", "Thanks"] {
        wait_for(&bob, "desk", "bob's turn", |s| {
            s.status == ConversationStatus::Closed || s.guidance.status == GuidanceStatus::MaySpeak
        })
        .await;
        bob.send_message(SendMessageParams::text("desk", text, Finality::Turn))
            .await
            .unwrap();
    }
    let log = closed_log(&bob, "desk").await;
    assert_eq!(
        said(&log)[..6],
        [
            "bob: I need a ticket",
            "assistant: Hello! What do you need?",
            "bob: File it please",
            "assistant: Done: your ticket is filed.",
            "bob: Thanks",
            "assistant: Goodbye. TERMINATE"
        ]
    );
}
