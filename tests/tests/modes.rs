//! Agent modes and typed documents on the running server: every kind in each of its modes
//! (against small servers on 127.0.0.1 speaking the OpenAI, A2A and plain HTTP wire formats),
//! a mode refused when it is posted, a deliverable that fails its schema retried and never
//! posted, versions that count up, plans selected as context, and `orchestrate` passing one
//! step's deliverable to the next by name.

use std::path::PathBuf;

use agent_sdk::proto::*;
use agent_sdk::{AgentClient, WsJsonRpcClient};
use axum::routing::{get, post};
use serde_json::{json, Value};
use tests::{create_scenario, full_log, wait_for, TestServer};

/// What every double answers, by mode: a greeting, a plan with a `Steps` section, or the
/// deliverable `{"built": WHO}` as JSON text.
fn answer(who: &str, mode: &str) -> String {
    match mode {
        "plan" => format!("# Steps\n1. {who} plans"),
        "build" => format!("```json\n{}\n```", json!({"built": who})),
        _ => format!("{who}: hello"),
    }
}

/// One server on 127.0.0.1 for the kinds that reach out: `/v1/chat/completions` (an
/// OpenAI-compatible model that reads the mode from the system prompt), an A2A 1.0 agent
/// (its card, and `SendMessage` reading the mode from the message's metadata), and `/http`
/// (a plain API that gets the mode in its body). Returns its base URL.
async fn doubles() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let card = json!({
        "name": "builder",
        "supportedInterfaces": [{"url": format!("{base}/a2a"), "protocolBinding": "JSONRPC", "protocolVersion": "1.0"}],
        "capabilities": {"streaming": false}
    });
    let app = axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(|body: axum::Json<Value>| async move {
                let system = body["messages"][0]["content"].as_str().unwrap_or_default();
                let mode = if system.contains("You are asked to plan") {
                    "plan"
                } else if system.contains("You are asked to build") {
                    "build"
                } else {
                    "converse"
                };
                axum::Json(json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": answer("llm", mode)}}]}))
            }),
        )
        .route(
            "/.well-known/agent-card.json",
            get(move || {
                let card = card.clone();
                async move { axum::Json(card) }
            }),
        )
        .route(
            "/a2a",
            post(|body: axum::Json<Value>| async move {
                let mode = body["params"]["message"]["metadata"]["mode"]
                    .as_str()
                    .unwrap_or("converse")
                    .to_string();
                axum::Json(json!({"jsonrpc": "2.0", "id": body["id"], "result": {"message": {
                    "role": "ROLE_AGENT", "messageId": "m1", "parts": [{"text": answer("a2a", &mode)}]
                }}}))
            }),
        )
        .route(
            "/http",
            post(|body: axum::Json<Value>| async move {
                let mode = body["mode"].as_str().unwrap_or_default().to_string();
                axum::Json(json!({"text": answer("http", &mode)}))
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// A plan with a `Steps` section and a JSON deliverable with `built`, declared alike by every
/// participant that converses, plans and builds.
fn declared(mut p: Value) -> Value {
    p["plan"] = json!({"type": "steps", "sections": ["Steps"]});
    p["deliverable"] = json!({"format": "json", "type": "artifact",
        "schema": {"type": "object", "required": ["built"], "properties": {"built": {"type": "string"}}}});
    p
}

fn script(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("agents")
        .join(name)
        .display()
        .to_string()
}

/// Every kind, each answering the user (who addresses it) and handing the turn back.
fn every_kind(base: &str) -> Value {
    let kinds = vec![
        declared(json!({"id": "scripted", "kind": "scripted",
            "replies": [answer("scripted", "converse"), answer("scripted", "plan"), answer("scripted", "build")]})),
        declared(json!({"id": "function", "kind": "function", "source":
            "function handler(input) { const m = input.mode; if (m === 'plan') return {text: '# Steps\\n1. function plans'}; if (m === 'build') return {text: 'built', data: {built: 'function'}}; return {text: 'function: hello'}; }"})),
        declared(
            json!({"id": "process", "kind": "process", "command": ["python3", script("modes.py")]}),
        ),
        declared(
            json!({"id": "http", "kind": "http", "endpoint": format!("{base}/http"), "method": "POST",
            "body": {"mode": "{{$.mode}}"}, "response": {"text": "$.text"}}),
        ),
        declared(
            json!({"id": "llm", "kind": "llm", "baseUrl": format!("{base}/v1"), "model": "m", "stream": false}),
        ),
        declared(json!({"id": "a2a", "kind": "a2a", "url": format!("{base}/"), "stream": false})),
        json!({"id": "tool", "kind": "tool", "builtins": ["calculator"],
            "deliverable": {"format": "json", "type": "result", "schema": {"type": "number"}}}),
        json!({"id": "orchestrate", "kind": "orchestrate",
            "deliverable": {"type": "report", "sections": ["Spec", "Check"]},
            "steps": [
                {"scenario": {"participants": [{"id": "maker", "kind": "function", "modes": ["build"],
                    "deliverable": {"format": "json", "type": "spec", "schema": {"type": "object", "required": ["endpoints"]}},
                    "source": "function handler(input) { return {text: 'spec', data: {endpoints: ['/status', '/health']}}; }"}],
                    "policy": {"order": "sequence", "sequence": ["maker"]}}, "as": "spec"},
                {"scenario": {"participants": [{"id": "checker", "kind": "function",
                    "source": "function handler(input) { const spec = JSON.parse(input.tail[0].text); return {text: 'checked ' + spec.endpoints.length + ' endpoints'}; }"}],
                    "policy": {"order": "sequence", "sequence": ["checker"]}},
                 "as": "check", "input": "{{$.steps.spec.deliverable.content}}"}
            ],
            "reply": "# Spec\nversion {{$.steps.spec.deliverable.version}}: {{$.steps.spec.text}}\n# Check\n{{$.steps.check.text}}"}),
    ];
    let ids: Vec<String> = kinds
        .iter()
        .map(|k| k["id"].as_str().unwrap().to_string())
        .collect();
    let rules: Vec<Value> = ids
        .iter()
        .map(|id| json!({"when": {"author": id}, "next": "carol"}))
        .collect();
    let mut participants = vec![json!({"id": "carol", "external": true})];
    participants.extend(kinds);
    json!({
        "participants": participants,
        "policy": {"order": "addressed", "first": "carol", "rules": rules},
        "turn": {"timeout": "30s"}
    })
}

/// The user asks `agent` for `mode` (and closes the turn); the answer's payload, once the turn
/// is back with the user.
async fn ask(user: &WsJsonRpcClient, conv: &str, agent: &str, mode: Mode, extra: Value) -> Value {
    let mut payload = json!({"text": format!("{agent}, {mode}"), "to": [agent], "mode": mode});
    for (k, v) in extra.as_object().unwrap() {
        payload[k] = v.clone();
    }
    let sent = user
        .send_message(SendMessageParams {
            conversation_id: conv.into(),
            payload: serde_json::from_value(payload).unwrap(),
            finality: Finality::Turn,
            turn_hint: None,
            client_request_id: None,
            after_key: None,
        })
        .await
        .unwrap_or_else(|e| panic!("asking {agent} for {mode}: {e}"));
    let s = wait_for(user, conv, &format!("{agent}'s {mode}"), |s| {
        s.speaker.as_deref() == Some("carol") && s.turn > sent.turn + 1
    })
    .await;
    let log = full_log(user, conv).await;
    let mine = log
        .iter()
        .rev()
        .find(|e| e.author == agent && e.kind == EventKind::Message)
        .unwrap_or_else(|| panic!("{agent} said nothing in {mode} mode (turn {})", s.turn));
    // The turn given to the agent asked for the mode.
    let given = log
        .iter()
        .filter(|e| e.seq > sent.seq && e.seq < mine.seq)
        .find_map(|e| match SystemEvent::parse(e.payload.get()) {
            Some(SystemEvent::NextSpeaker(n)) if n.speaker == agent => Some(n),
            _ => None,
        })
        .expect("a next_speaker for the agent");
    assert_eq!(given.mode.unwrap_or(Mode::Converse), mode, "{agent}");
    mine.payload_value()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_converses_plans_and_builds_its_own_way() {
    let server = TestServer::start().await;
    let base = doubles().await;
    let admin = server.sdk("admin", None).await;
    create_scenario(&admin, "kinds", every_kind(&base)).await;
    let user = server.sdk("carol", None).await;
    let mut versions = Vec::new();
    for kind in ["scripted", "function", "process", "http", "llm", "a2a"] {
        let said = ask(&user, "kinds", kind, Mode::Converse, json!({})).await;
        assert_eq!(said["text"], format!("{kind}: hello"), "{said}");
        assert!(said.get("schema").is_none(), "{said}");

        let plan = ask(&user, "kinds", kind, Mode::Plan, json!({})).await;
        assert_eq!(plan["schema"], PLAN_SCHEMA, "{plan}");
        assert_eq!(plan["text"], format!("# Steps\n1. {kind} plans"));
        let d = DocumentData::parse(plan.get("data")).unwrap();
        assert_eq!(
            (d.doc_type.as_str(), d.format),
            ("steps", DocFormat::Markdown)
        );
        assert_eq!(d.content, json!(plan["text"]));
        versions.push(d.version);

        let built = ask(&user, "kinds", kind, Mode::Build, json!({})).await;
        assert_eq!(built["schema"], DELIVERABLE_SCHEMA, "{built}");
        let d = DocumentData::parse(built.get("data")).unwrap();
        assert_eq!(
            (d.doc_type.as_str(), d.format, d.content),
            ("artifact", DocFormat::Json, json!({"built": kind}))
        );
    }
    // Each new plan of the type is the next version, whoever wrote it.
    assert_eq!(versions, [1, 2, 3, 4, 5, 6]);

    // A tool builds only: its output, normalised into the declared deliverable.
    let request = json!({"schema": "tool.request.v1", "data": {"tool": "calculator", "args": {"op": "mul", "a": 6, "b": 7}}});
    let built = ask(&user, "kinds", "tool", Mode::Build, request).await;
    assert_eq!(built["schema"], DELIVERABLE_SCHEMA, "{built}");
    assert_eq!(built["data"]["content"], json!(42.0));
    assert_eq!(built["data"]["version"], 1);

    // `orchestrate` builds by running its steps; the first step's deliverable reaches the
    // second by name, and the result is the declared Markdown report.
    let report = ask(&user, "kinds", "orchestrate", Mode::Build, json!({})).await;
    assert_eq!(report["schema"], DELIVERABLE_SCHEMA, "{report}");
    assert_eq!(report["data"]["type"], "report");
    assert_eq!(
        report["data"]["content"],
        "# Spec\nversion 1: {\n  \"endpoints\": [\n    \"/status\",\n    \"/health\"\n  ]\n}\n# Check\nchecked 2 endpoints"
    );

    // Guidance tells the speaker which mode its turn asks for.
    let s = admin.get_conversation("kinds").await.unwrap();
    assert_eq!(s.guidance.mode, Some(Mode::Converse));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mode_an_agent_does_not_declare_is_refused_when_posted() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    create_scenario(
        &admin,
        "refuse",
        json!({
            "participants": [
                {"id": "carol", "external": true},
                {"id": "talker", "kind": "scripted", "modes": ["converse"], "replies": ["hi"]},
                {"id": "tool", "kind": "tool", "builtins": ["calculator"]},
                {"id": "bob", "external": true, "modes": ["plan"]}
            ],
            "policy": {"order": "addressed", "first": "carol"}
        }),
    )
    .await;
    let user = server.sdk("carol", None).await;
    let send = |to: &str, mode: &str, finality: Finality| SendMessageParams {
        conversation_id: "refuse".into(),
        payload: serde_json::from_value(json!({"text": "please", "to": [to], "mode": mode}))
            .unwrap(),
        finality,
        turn_hint: None,
        client_request_id: Some(format!("{to}-{mode}")),
        after_key: None,
    };
    // Addressed, or named next speaker: refused before anything is appended.
    let before = full_log(&user, "refuse").await.len();
    for (to, mode) in [("talker", "build"), ("tool", "converse"), ("bob", "build")] {
        let r = user.send_message(send(to, mode, Finality::Turn)).await;
        assert_eq!(
            r.unwrap_err().code(),
            Some(ErrorCode::ModeNotSupported),
            "{to} {mode}"
        );
    }
    let r = user
        .send_message(send("tool", "plan", Finality::None))
        .await;
    assert_eq!(r.unwrap_err().code(), Some(ErrorCode::ModeNotSupported));
    assert_eq!(full_log(&user, "refuse").await.len(), before);
    // The refusal names the agent and its modes.
    let err = user
        .send_message(send("tool", "converse", Finality::Turn))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tool does not support mode converse (its modes: build)"),
        "{err}"
    );
    // Over HTTP the same refusal is 422 with the code.
    let http = tests::http_raw(
        &server.running().local_addr().to_string(),
        "POST /conversations/refuse/messages",
        &format!("Authorization: Bearer {}\r\n", server.token("carol")),
        r#"{"payload": {"text": "x", "to": ["talker"], "mode": "plan"}, "finality": "turn"}"#,
    )
    .await;
    assert!(http.starts_with("HTTP/1.1 422"), "{http}");
    assert!(http.contains("ModeNotSupported"), "{http}");
    // A supported mode goes through, and the turn it gives asks for it.
    user.send_message(send("bob", "plan", Finality::Turn))
        .await
        .unwrap();
    let ext = server.sdk("bob", None).await;
    let s = ext.get_conversation("refuse").await.unwrap();
    assert_eq!(s.speaker.as_deref(), Some("bob"));
    assert_eq!(s.guidance.mode, Some(Mode::Plan));
    // A message asks nothing of a plain reply: the tool's own default is build.
    assert_eq!(
        orchestrator_modes(&admin, "refuse").await,
        vec![(String::from("bob"), Mode::Plan)]
    );
}

/// Each `next_speaker` of a conversation with its mode.
async fn orchestrator_modes(c: &WsJsonRpcClient, conv: &str) -> Vec<(String, Mode)> {
    full_log(c, conv)
        .await
        .iter()
        .filter_map(|e| match SystemEvent::parse(e.payload.get()) {
            Some(SystemEvent::NextSpeaker(n)) if n.speaker != "carol" => {
                Some((n.speaker, n.mode.unwrap_or(Mode::Converse)))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deliverable_that_fails_its_schema_is_retried_and_never_posted() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    // The builder's first attempt misses `endpoints`; the second is right.
    create_scenario(
        &admin,
        "retry",
        json!({
            "participants": [{"id": "builder", "kind": "function", "modes": ["build"],
                "deliverable": {"format": "json", "type": "spec",
                    "schema": {"type": "object", "required": ["endpoints"]}},
                "source": "function handler(input, ctx) { return ctx.attempt === 1 ? {text: '{\"wrong\": 1}'} : {text: '{\"endpoints\": []}'}; }"}],
            "policy": {"order": "sequence", "sequence": ["builder"]},
            "turn": {"timeout": "20s"}
        }),
    )
    .await;
    wait_for(&admin, "retry", "the close", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    let log = full_log(&admin, "retry").await;
    let errors = tests::turn_errors(&log);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("the deliverable does not match its schema"),
        "{errors:?}"
    );
    assert!(errors[0].contains("endpoints"), "{errors:?}");
    let delivered: Vec<Value> = log
        .iter()
        .filter(|e| e.author == "builder" && e.kind == EventKind::Message)
        .map(|e| e.payload_value())
        .collect();
    assert_eq!(delivered.len(), 1, "only the good deliverable is posted");
    assert_eq!(delivered[0]["data"]["content"], json!({"endpoints": []}));
    assert_eq!(delivered[0]["data"]["version"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_are_versioned_by_the_log_and_checked_when_posted() {
    let server = TestServer::start().await;
    server.create("docs", &["alice", "bob"]).await;
    let alice = server.sdk("alice", None).await;
    let post = |data: Value, schema: &str| SendMessageParams {
        conversation_id: "docs".into(),
        payload: serde_json::from_value(json!({"text": "doc", "schema": schema, "data": data}))
            .unwrap(),
        finality: Finality::None,
        turn_hint: None,
        client_request_id: None,
        after_key: None,
    };
    let plan =
        |t: &str, v: u64| json!({"type": t, "format": "markdown", "version": v, "content": "# A"});
    // A writer's version is replaced: each type counts on its own, per schema.
    for (data, schema) in [
        (plan("launch", 9), PLAN_SCHEMA),
        (plan("launch", 0), PLAN_SCHEMA),
        (plan("budget", 0), PLAN_SCHEMA),
        (plan("launch", 0), DELIVERABLE_SCHEMA),
        (plan("launch", 0), PLAN_SCHEMA),
    ] {
        alice.send_message(post(data, schema)).await.unwrap();
    }
    let versions: Vec<(String, String, u64)> = full_log(&alice, "docs")
        .await
        .iter()
        .filter(|e| e.kind == EventKind::Message)
        .map(|e| {
            let p = e.payload_value();
            (
                p["schema"].as_str().unwrap().to_string(),
                p["data"]["type"].as_str().unwrap().to_string(),
                p["data"]["version"].as_u64().unwrap(),
            )
        })
        .collect();
    let v = |s: &str, t: &str, n: u64| (s.to_string(), t.to_string(), n);
    assert_eq!(
        versions,
        [
            v(PLAN_SCHEMA, "launch", 1),
            v(PLAN_SCHEMA, "launch", 2),
            v(PLAN_SCHEMA, "budget", 1),
            v(DELIVERABLE_SCHEMA, "launch", 1),
            v(PLAN_SCHEMA, "launch", 3),
        ]
    );
    // A document without its type, or markdown that is not text, is refused with its reason.
    for (bad, why) in [
        (
            json!({"format": "markdown", "content": "x"}),
            "missing field `type`",
        ),
        (
            json!({"type": "t", "format": "markdown", "content": {"a": 1}}),
            "content is a string",
        ),
        (
            json!({"type": "t", "format": "pdf", "content": "x"}),
            "unknown variant",
        ),
    ] {
        let e = alice
            .send_message(post(bad, PLAN_SCHEMA))
            .await
            .unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
    // After a restart the count goes on from the log.
    let mut server = server;
    server.restart().await;
    let alice = server.sdk("alice", None).await;
    alice
        .send_message(post(plan("launch", 0), PLAN_SCHEMA))
        .await
        .unwrap();
    let last = full_log(&alice, "docs")
        .await
        .last()
        .unwrap()
        .payload_value();
    assert_eq!(last["data"]["version"], 4);
}
