//! `orchestrator tail` and `conversations list|show|export` on the real binary, against the
//! database of a running server directly (`--db`: a SQLite file, or PostgreSQL in the suites'
//! second pass) and against the server itself (`--url`, `--token`).

use std::process::Stdio;
use std::time::Duration;

use jsonrpsee::core::client::ClientT;
use serde_json::{json, Value};
use tests::procs::binary;
use tests::{TestServer, WAIT};
use tokio::io::{AsyncBufReadExt, BufReader};

/// The two ways to look: the database, and the server.
fn targets(server: &TestServer) -> [Vec<String>; 2] {
    [
        vec!["--db".into(), server.db.clone()],
        vec![
            "--url".into(),
            server.url(),
            "--token".into(),
            server.token("admin").to_string(),
        ],
    ]
}

fn cli(args: &[&str], target: &[String]) -> (bool, String, String) {
    let out = std::process::Command::new(binary())
        .args(args)
        .args(target)
        .env_remove("ORCHESTRATOR_DB")
        .output()
        .expect("the orchestrator binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A server with conversation `c` (alice and bob) holding three messages.
async fn with_messages() -> TestServer {
    let server = TestServer::start().await;
    server.create("c", &["alice", "bob"]).await;
    let alice = server.client("alice").await;
    for (i, text) in ["one", "two", "three"].iter().enumerate() {
        tests::ws_send(&alice, "c", text, &format!("k{i}")).await;
    }
    // And `r`, whose turn is bob's.
    let admin = server.sdk("admin", None).await;
    let scenario = json!({"participants": ["alice", "bob"], "policy": {"order": "round_robin", "first": "bob"}});
    tests::create_scenario(&admin, "r", scenario).await;
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_tail_and_export_read_the_database_and_the_server_alike() {
    let server = with_messages().await;
    for target in targets(&server) {
        let (ok, out, err) = cli(&["conversations", "list"], &target);
        assert!(ok, "{target:?}: {err}");
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("CONVERSATION") && lines[0].contains("STATUS"));
        let row = lines
            .iter()
            .find(|l| l.starts_with("c "))
            .expect("conversation c");
        assert!(
            row.contains("alice,bob") && row.contains(" 4 "),
            "{target:?}: {out}"
        );
        // The protocol's word for its status, from the database as from the server.
        assert!(row.contains(" active "), "{target:?}: {out}");
        let r = lines.iter().find(|l| l.starts_with("r ")).expect("r");
        assert!(
            r.contains(" active ") && r.contains(" bob "),
            "the speaker: {target:?}: {out}"
        );

        let (_, out, _) = cli(&["conversations", "list", "--json"], &target);
        let rows: Vec<Value> = serde_json::from_str(&out).expect("one JSON document: an array");
        let c = rows
            .iter()
            .find(|v| v["conversationId"] == "c")
            .expect("c as JSON");
        assert_eq!(c["latestSeq"], 4);
        assert_eq!(c["status"], "active");
        assert_eq!(c["participants"], json!(["alice", "bob"]));

        let (ok, out, err) = cli(&["tail", "c", "--since", "2"], &target);
        assert!(ok, "{err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(
            lines[0].contains("#3") && lines[0].contains("alice: two"),
            "{out}"
        );
        assert!(
            lines[1].contains("#4") && lines[1].contains("alice: three"),
            "{out}"
        );

        let (_, out, _) = cli(&["tail", "c", "--json"], &target);
        let seqs: Vec<u64> = out
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(seqs, [1, 2, 3, 4], "{target:?}");

        let (ok, out, err) = cli(&["conversations", "show", "c"], &target);
        assert!(ok, "{err}");
        assert!(out.starts_with("conversation c\n"), "{out}");
        assert!(out.contains("participants  alice, bob"), "{out}");
        assert!(
            out.contains("alice: one") && out.contains("alice: three"),
            "{out}"
        );

        let (_, out, _) = cli(&["conversations", "export", "c"], &target);
        let exported: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(exported.len(), 4);
        assert_eq!(exported[3]["payload"]["text"], "three");
        assert_eq!(exported[3]["clientRequestId"], "k2");

        let (_, md, _) = cli(
            &["conversations", "export", "c", "--format", "markdown"],
            &target,
        );
        assert!(md.starts_with("# Conversation `c`"), "{md}");
        assert!(md.contains("- participants: alice, bob"), "{md}");
        assert!(
            md.contains("**alice** · turn 1") && md.contains("\n\ntwo\n"),
            "{md}"
        );

        let (ok, _, err) = cli(&["tail", "nope"], &target);
        assert!(!ok, "an unknown conversation is an error");
        assert!(err.contains("nope"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_follow_prints_new_events_until_the_conversation_closes() {
    let server = with_messages().await;
    let alice = server.client("alice").await;
    for (round, target) in targets(&server).into_iter().enumerate() {
        let id = format!("f{round}");
        server.create(&id, &["alice", "bob"]).await;
        let mut child = tokio::process::Command::new(binary())
            .args(["tail", &id, "--follow"])
            .args(&target)
            .env_remove("ORCHESTRATOR_DB")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        // The created event first: the follower is reading.
        let first = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("the first line in time")
            .unwrap()
            .unwrap();
        assert!(first.contains("#1") && first.contains("created"), "{first}");
        tests::ws_send(&alice, &id, "live", &format!("live-{round}")).await;
        let r: Value = alice
            .request(
                "sendMessage",
                tests::P(json!({
                    "conversationId": id,
                    "payload": {"text": "bye"},
                    "finality": "conversation"
                })),
            )
            .await
            .expect("close");
        assert_eq!(r["seq"], 3, "{r}");
        let mut rest = Vec::new();
        tokio::time::timeout(WAIT, async {
            while let Some(l) = lines.next_line().await.unwrap() {
                rest.push(l);
            }
        })
        .await
        .expect("the follower ends when the conversation closes");
        assert_eq!(rest.len(), 2, "{target:?}: {rest:?}");
        assert!(rest[0].contains("alice: live"), "{rest:?}");
        assert!(rest[1].contains("alice: bye ■"), "{rest:?}");
        let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .expect("exited")
            .unwrap();
        assert!(status.success());
    }
}

#[tokio::test]
async fn without_a_database_or_a_server_the_commands_say_what_to_give() {
    let dir = tempfile::tempdir().unwrap();
    for args in [
        vec!["conversations", "list"],
        vec!["tail", "c"],
        vec!["token", "list"],
    ] {
        let out = std::process::Command::new(binary())
            .args(&args)
            .current_dir(dir.path())
            .env_remove("ORCHESTRATOR_DB")
            .env_remove("ORCHESTRATOR_URL")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("no database here") && err.contains("--db"),
            "{args:?}: {err}"
        );
    }
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "nothing created"
    );
    let out = std::process::Command::new(binary())
        .args(["conversations", "list", "--url", "ws://127.0.0.1:1/rpc"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_and_deliverables_show_as_documents_in_export_and_tail() {
    let server = TestServer::start().await;
    server.create("docs", &["alice", "bob"]).await;
    let alice = server.sdk("alice", None).await;
    for (schema, data) in [
        (
            "plan.v1",
            json!({"type": "launch", "format": "markdown", "content": "# Goal\nShip it."}),
        ),
        (
            "deliverable.v1",
            json!({"type": "spec", "format": "json", "content": {"endpoints": ["/status"]}}),
        ),
    ] {
        use agent_sdk::AgentClient;
        alice
            .send_message(proto_spec::SendMessageParams {
                conversation_id: "docs".into(),
                payload: serde_json::from_value(
                    json!({"text": "doc", "schema": schema, "data": data}),
                )
                .unwrap(),
                finality: proto_spec::Finality::None,
                turn_hint: None,
                client_request_id: None,
                after_key: None,
            })
            .await
            .expect("a document");
    }
    for target in targets(&server) {
        let (ok, md, err) = cli(
            &["conversations", "export", "docs", "--format", "markdown"],
            &target,
        );
        assert!(ok, "{err}");
        assert!(
            md.contains(
                "(progress) · **plan launch v1 (markdown, plan mode)**\n\n> # Goal\n> Ship it.\n"
            ),
            "{md}"
        );
        assert!(
            md.contains("**deliverable spec v1 (json, build mode)**\n\n```json\n{\n  \"endpoints\": [\n    \"/status\"\n  ]\n}\n```"),
            "{md}"
        );
        let (_, lines, _) = cli(&["tail", "docs"], &target);
        assert!(
            lines.contains("alice: [plan launch v1 (markdown, plan mode)] …"),
            "{lines}"
        );
        let (_, jsonl, _) = cli(&["conversations", "export", "docs"], &target);
        let last: Value = serde_json::from_str(jsonl.lines().last().unwrap()).unwrap();
        assert_eq!(last["payload"]["data"]["version"], 1);
        assert_eq!(last["payload"]["schema"], "deliverable.v1");
    }
}

/// `conversations delete` goes through the server: who may is the server's to say, and the
/// conversation is gone from every read after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conversations_delete_goes_through_the_server() {
    let server = with_messages().await;
    let [db, url] = targets(&server);
    let as_bob = [
        "--url".to_string(),
        server.url(),
        "--token".into(),
        server.token("bob").to_string(),
    ];
    let (ok, _, err) = cli(&["conversations", "delete", "c"], &as_bob);
    assert!(
        !ok && err.contains("only an admin of its tenant or its creator"),
        "{err}"
    );
    let (ok, out, err) = cli(&["conversations", "delete", "c"], &url[..]);
    assert!(ok, "{err}");
    assert_eq!(out, "deleted c\n");
    for target in [&db, &url] {
        let (ok, out, _) = cli(&["conversations", "list"], target);
        assert!(ok && !out.contains("\nc ") && out.contains("\nr "), "{out}");
    }
    let (ok, _, err) = cli(&["conversations", "delete", "c"], &url[..]);
    assert!(!ok && err.contains("no conversation c"), "{err}");
    // Not on a database directly: its server would not know.
    let (ok, _, err) = cli(&["conversations", "delete", "r"], &db[..]);
    assert!(!ok && err.contains("--url"), "{err}");
}
