//! What `serve` logs for an operator, on the real binary: at `info` by default, the addresses
//! it serves, connections opened and closed, requests refused with their code, an agent's failed
//! attempts and turn timeouts; as JSON lines with `--log-format json`; no colour codes when
//! stderr is not a terminal; and a database in use said as such.

use std::process::Stdio;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tests::procs::{binary, connect, free_port, token};
use tests::WAIT;
use tokio::io::{AsyncBufReadExt, BufReader};

/// `serve` on `db` with `args`, its stderr lines gathered as they come.
struct Served {
    child: tokio::process::Child,
    port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

async fn serve(db: &str, args: &[&str]) -> Served {
    serve_logging(db, args, None).await
}

/// `serve` on `db` with `args`, logging at `level` (`ORCHESTRATOR_LOG`) when given.
async fn serve_logging(db: &str, args: &[&str], level: Option<&str>) -> Served {
    let port = free_port();
    let mut command = tokio::process::Command::new(binary());
    if let Some(level) = level {
        command.env("ORCHESTRATOR_LOG", level);
    } else {
        command.env_remove("ORCHESTRATOR_LOG");
    }
    let mut child = command
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--db",
            db,
        ])
        .args(args)
        .env_remove("ORCHESTRATOR_LOG_FORMAT")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("serve");
    let lines = Arc::new(Mutex::new(Vec::new()));
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    let gathered = lines.clone();
    tokio::spawn(async move {
        while let Ok(Some(l)) = err.next_line().await {
            gathered.lock().unwrap().push(l);
        }
    });
    tests::wait_listening(port, "serve").await;
    Served { child, port, lines }
}

impl Served {
    /// Waits (at most [`WAIT`]) for a log line that `matches`; the line.
    async fn line(&self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        let until = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(l) = self.lines.lock().unwrap().iter().find(|l| matches(l)) {
                return l.clone();
            }
            assert!(
                tokio::time::Instant::now() < until,
                "no log line for {what} in:\n{}",
                self.lines.lock().unwrap().join("\n")
            );
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// Waits for a JSON log line whose message is `message` and that `matches`.
    async fn json(&self, message: &str, matches: impl Fn(&Value) -> bool) -> Value {
        let line = self
            .line(message, |l| {
                serde_json::from_str::<Value>(l)
                    .is_ok_and(|v| v["fields"]["message"] == message && matches(&v))
            })
            .await;
        serde_json::from_str(&line).unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_logs_what_an_operator_needs_as_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("o.db").display().to_string();
    let admin = token(&db, "admin", true);
    let served = serve(&db, &["--log-format", "json"]).await;
    let port = served.port;

    let start = served.json("serving", |_| true).await;
    assert_eq!(start["level"], "INFO");
    let f = &start["fields"];
    assert_eq!(f["websocket"], format!("ws://127.0.0.1:{port}/rpc"));
    assert_eq!(f["console"], format!("http://127.0.0.1:{port}/"));
    assert_eq!(f["http"], format!("http://127.0.0.1:{port}/"));

    // A refused request: its code, over HTTP.
    let answer = tests::http_raw(
        &format!("127.0.0.1:{port}"),
        "GET /me",
        "Authorization: Bearer oct_nope\r\n",
        "",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    let refused = served
        .json("request refused", |v| v["fields"]["transport"] == "http")
        .await;
    assert_eq!(refused["fields"]["code"], "Unauthenticated");
    assert_eq!(refused["fields"]["number"], -32001);

    // An agent that fails, in a scenario whose turn timeout moves on.
    let client = connect(&format!("ws://127.0.0.1:{port}/rpc"), &admin).await;
    served
        .json("authenticated", |v| v["fields"]["agent"] == "admin")
        .await;
    tests::create_scenario(
        &client,
        "broken",
        json!({
            "participants": [
                {"id": "bob", "kind": "function", "source": "function handler() { throw new Error('bob is broken'); }"}
            ],
            "policy": {"order": "round_robin", "first": "bob"},
            "turn": {"timeout": "300ms", "onTimeout": "end"}
        }),
    )
    .await;
    let failed = served
        .json("an agent's attempt failed", |v| v["fields"]["attempt"] == 1)
        .await;
    let f = &failed["fields"];
    assert_eq!(f["agent"], "bob");
    assert_eq!(f["conversation"], "broken");
    assert!(
        f["error"].as_str().unwrap().contains("bob is broken"),
        "{failed}"
    );
    let timed_out = served.json("turn timed out", |_| true).await;
    assert_eq!(timed_out["fields"]["speaker"], "bob");

    // A trace that names a turn already over is refused (`TurnClosed`) as an executor's late
    // trace is in normal work: counted, logged at `debug` only.
    tests::create_scenario(
        &client,
        "late",
        json!({"participants": ["admin", "x"], "policy": {"order": "round_robin", "first": "admin"}}),
    )
    .await;
    use agent_sdk::proto::{Finality, MessagePayload, SendMessageParams, SendTraceParams};
    use agent_sdk::AgentClient;
    client
        .send_message(SendMessageParams {
            conversation_id: "late".into(),
            payload: MessagePayload::text("done"),
            finality: Finality::Turn,
            turn_hint: None,
            client_request_id: None,
            after_key: None,
        })
        .await
        .expect("admin closes turn 1");
    let late = client
        .send_trace(SendTraceParams {
            conversation_id: "late".into(),
            payload: json!({"type": "note"}),
            turn: Some(1),
            client_request_id: None,
            finality: None,
            after_key: None,
        })
        .await
        .unwrap_err();
    assert_eq!(late.code(), Some(agent_sdk::proto::ErrorCode::TurnClosed));

    // Every line is one JSON object; connections coming and going are not logged at `info`
    // (they are at `debug`), nor is a write that named a turn already over (`TurnClosed`).
    for l in served.lines.lock().unwrap().iter() {
        assert!(serde_json::from_str::<Value>(l).is_ok(), "not JSON: {l}");
        assert!(
            !l.contains("connection opened") && !l.contains("connection closed"),
            "{l}"
        );
        assert!(!l.contains("TurnClosed"), "{l}");
    }
    drop(served.child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_have_no_colour_codes_off_a_terminal_and_a_database_in_use_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("o.db").display().to_string();
    let served = serve(&db, &[]).await;
    let start = served.line("the start", |l| l.contains("serving")).await;
    assert!(start.contains(" INFO "), "{start}");
    assert!(
        start.contains(&format!("console=http://127.0.0.1:{}/", served.port)),
        "{start}"
    );
    for l in served.lines.lock().unwrap().iter() {
        assert!(!l.contains('\x1b'), "a colour code off a terminal: {l:?}");
    }
    // A second server on the same file says why it cannot start.
    let second = tokio::process::Command::new(binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--db", &db])
        .output()
        .await
        .unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("is in use by another orchestrator"), "{err}");
    assert!(!err.contains("internal error"), "{err}");
    drop(served.child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_log_level_writes_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("o.db").display().to_string();
    let admin = token(&db, "admin", true);
    let served = serve_logging(&db, &[], Some("trace")).await;
    let host = format!("127.0.0.1:{}", served.port);
    // Over WebSocket, over HTTP POST /rpc, and as a bearer token.
    let client = connect(&format!("ws://{host}/rpc"), &admin).await;
    served
        .line("authenticated", |l| l.contains("authenticated"))
        .await;
    let body =
        json!({"jsonrpc": "2.0", "id": 1, "method": "authenticate", "params": {"token": admin}})
            .to_string();
    let answer = tests::http_raw(
        &host,
        "POST /rpc",
        "Content-Type: application/json\r\n",
        &body,
    )
    .await;
    assert!(answer.contains(r#""ok":true"#), "{answer}");
    let answer = tests::http_raw(
        &host,
        "GET /me",
        &format!("Authorization: Bearer {admin}\r\n"),
        "",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // A token minted over the protocol: in the answer only.
    use agent_sdk::AgentClient;
    let minted = client
        .create_token(agent_sdk::proto::CreateTokenParams {
            agent_id: "minted".into(),
            ..Default::default()
        })
        .await
        .expect("createToken")
        .token;
    served
        .line("token created", |l| l.contains("token created"))
        .await;
    drop(client);
    // Both HTTP requests' connections closed, the WebSocket's too.
    let until = tokio::time::Instant::now() + WAIT;
    let lines = loop {
        let lines = served.lines.lock().unwrap().clone();
        if lines
            .iter()
            .filter(|l| l.contains("connection closed"))
            .count()
            >= 3
        {
            break lines;
        }
        assert!(tokio::time::Instant::now() < until, "{lines:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(lines.iter().any(|l| l.contains("TRACE")), "{lines:?}");
    for secret in [&admin, &minted] {
        let secret = secret.trim_start_matches("oct_");
        for l in &lines {
            assert!(!l.contains(secret), "a log line holds a token: {l}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_scenario_file_is_reported_and_the_rest_of_the_library_is_served() {
    // The examples folder as it is, where two scenarios call a model on 127.0.0.1, which a
    // server refuses without `--agent-net loopback`, and a file that is not even YAML.
    let dir = tempfile::tempdir().unwrap();
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/scenarios");
    let library = dir.path().join("library");
    std::fs::create_dir(&library).unwrap();
    for entry in std::fs::read_dir(examples).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, library.join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(library.join("torn.yaml"), "participants: [unclosed").unwrap();
    // A tenant's own library, and a folder that names no tenant.
    let acme = library.join("tenants").join("acme");
    std::fs::create_dir_all(&acme).unwrap();
    std::fs::write(
        acme.join("desk.yaml"),
        "participants:\n  - {id: peer, external: true, caller: true}\n  - {id: desk, kind: scripted, replies: [ok]}\n",
    )
    .unwrap();
    std::fs::create_dir_all(library.join("tenants").join("Not_A_Tenant")).unwrap();
    let db = dir.path().join("o.db").display().to_string();
    let admin = token(&db, "admin", true);
    let made = tests::procs::run_in(dir.path(), &["tenant", "create", "acme", "--db", &db]);
    assert!(made.status.success());
    let acme_admin = tests::procs::run_in(
        dir.path(),
        &[
            "token", "create", "--agent", "boss", "--tenant", "acme", "--admin", "--db", &db,
        ],
    );
    let acme_admin = String::from_utf8(acme_admin.stdout)
        .unwrap()
        .trim()
        .to_string();
    let served = serve(&db, &["--scenarios", library.to_str().unwrap()]).await;
    for file in ["torn.yaml", "llm-tools.yaml", "plan-build-llm.yaml"] {
        let line = served
            .line(file, |l| {
                l.contains("scenario left out of the library") && l.contains(file)
            })
            .await;
        assert!(line.contains(" WARN "), "{line}");
    }
    let line = served
        .line("the reason", |l| l.contains("llm-tools.yaml"))
        .await;
    assert!(
        line.contains("--agent-net"),
        "says what would let it in: {line}"
    );
    let client = connect(&format!("ws://127.0.0.1:{}/rpc", served.port), &admin).await;
    let listed = agent_sdk::AgentClient::list_scenarios(&client)
        .await
        .expect("the library");
    let names: Vec<&str> = listed.scenarios.iter().map(|s| s.name.as_str()).collect();
    for name in ["plan-build", "planner", "helpdesk", "tool-routing"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    assert!(!names.contains(&"llm-tools"), "{names:?}");
    // The tenant's library is its own: acme sees its `desk` only, the default tenant not it.
    assert!(!names.contains(&"desk"), "{names:?}");
    let line = served
        .line("the folder that names no tenant", |l| {
            l.contains("Not_A_Tenant")
        })
        .await;
    assert!(line.contains(" WARN "), "{line}");
    let acme = connect(&format!("ws://127.0.0.1:{}/rpc", served.port), &acme_admin).await;
    let listed = agent_sdk::AgentClient::list_scenarios(&acme)
        .await
        .expect("acme's library");
    let names: Vec<&str> = listed.scenarios.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["desk"]);
    drop(served.child);
}
