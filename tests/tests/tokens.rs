//! Token lifecycle: `token create|list|revoke` on a database file (and on PostgreSQL in the
//! suites' second pass), a revocation reaching an open WebSocket connection and an SSE stream
//! of a running server, expiry, and the last use recorded.

use std::process::Output;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use orchestrator::engine::auth;
use orchestrator::engine::config::Limits;
use serde_json::{json, Value};
use tests::procs::binary;
use tests::{open_store, test_limits, TestServer, WAIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

fn token_cmd(dir: &std::path::Path, args: &[&str]) -> Output {
    tests::procs::run_in(dir, &[&["token"], args].concat())
}

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

#[test]
fn token_commands_work_on_a_database_file_and_never_show_a_token_again() {
    let dir = tempfile::tempdir().unwrap();
    // No database here: create says what to do and makes no file.
    let o = token_cmd(dir.path(), &["create", "--agent", "alice"]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("no database here") && text(&o.stderr).contains("--db"),
        "{}",
        text(&o.stderr)
    );
    assert!(!dir.path().join("orchestrator.db").exists());

    let db = dir.path().join("t.db");
    let db = db.to_str().unwrap();
    let alice = token_cmd(dir.path(), &["create", "--agent", "alice", "--db", db]);
    assert!(alice.status.success(), "{}", text(&alice.stderr));
    let alice = text(&alice.stdout).trim().to_string();
    let admin = token_cmd(
        dir.path(),
        &[
            "create",
            "--agent",
            "admin",
            "--admin",
            "--expires",
            "30d",
            "--db",
            db,
        ],
    );
    let admin = text(&admin.stdout).trim().to_string();
    assert!(alice.starts_with("oct_") && admin.starts_with("oct_"));

    let table = token_cmd(dir.path(), &["list", "--db", db]);
    let table = text(&table.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    for h in ["ID", "AGENT", "ADMIN", "CREATED", "LAST USED", "EXPIRES"] {
        assert!(lines[0].contains(h), "{table}");
    }
    assert!(
        lines[1].contains("alice") && lines[1].contains(" no "),
        "{table}"
    );
    assert!(
        lines[1].trim_end().ends_with("never"),
        "alice never expires: {table}"
    );
    assert!(
        lines[2].contains("admin") && lines[2].contains(" yes "),
        "{table}"
    );
    let json: Vec<Value> = serde_json::from_str(&text(
        &token_cmd(dir.path(), &["list", "--json", "--db", db]).stdout,
    ))
    .expect("one JSON document: an array");
    assert_eq!(json.len(), 2);
    let expires = json[1]["expiresMs"].as_i64().expect("the admin's expiry");
    let created = json[1]["createdMs"].as_i64().unwrap();
    assert!(
        (expires - created - 30 * 86_400_000).abs() < 60_000,
        "30 days: {json:?}"
    );
    assert!(json[0]["lastUsedMs"].is_null());
    for shown in [&table, &serde_json::to_string(&json).unwrap()] {
        for t in [&alice, &admin] {
            assert!(!shown.contains(&t[4..]), "a token shown again: {shown}");
            assert!(
                !shown.contains(&auth::hash_token(t)),
                "a whole hash shown: {shown}"
            );
        }
    }

    // Revoke by id, then by agent; an unknown id says so.
    let id = json[0]["id"].as_str().unwrap();
    let o = token_cmd(dir.path(), &["revoke", id, "--db", db]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = token_cmd(dir.path(), &["revoke", id, "--db", db]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("no token matches"),
        "{}",
        text(&o.stderr)
    );
    let o = token_cmd(dir.path(), &["revoke", "zz", "--db", db]);
    assert!(
        text(&o.stderr).contains("is not a token id"),
        "{}",
        text(&o.stderr)
    );
    let o = token_cmd(dir.path(), &["revoke", "--agent", "admin", "--db", db]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let store = open_store(db);
    assert!(store.list_tokens(None).unwrap().is_empty());
    for t in [&alice, &admin] {
        assert!(store.find_token(&auth::hash_token(t)).unwrap().is_none());
    }
}

/// `authenticate` with `token` is refused as `Unauthenticated`, saying `why`.
async fn refused(ws: &mut tests::RawWs, token: &str, why: &str) {
    let r = ws.call(1, "authenticate", json!({"token": token})).await;
    assert_eq!(r["error"]["code"], -32001, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains(why), "{r}");
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Waits for the server to close `ws` with 1008 because its token was revoked.
async fn closed_for_revocation(ws: &mut Ws) {
    let closed = tokio::time::timeout(WAIT, async {
        while let Some(m) = ws.next().await {
            match m {
                Ok(Message::Close(frame)) => return frame,
                Ok(_) => continue,
                Err(e) => panic!("the connection broke instead of closing: {e}"),
            }
        }
        panic!("the connection ended without a close frame");
    })
    .await
    .expect("closed in time");
    let frame = closed.expect("a close frame with a code");
    assert_eq!(u16::from(frame.code), 1008);
    assert!(frame.reason.contains("revoked"), "{frame:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_reaches_a_connection_on_another_node() {
    let limits = Limits {
        token_recheck: Duration::from_millis(100),
        ..test_limits()
    };
    let first = TestServer::on_postgres(limits, Default::default()).await;
    let second = first.another_node().await;
    let alice = first.token("alice").to_string();
    let (mut ws, _) = tokio_tungstenite::connect_async(second.url())
        .await
        .unwrap();
    let call =
        json!({"jsonrpc": "2.0", "id": 1, "method": "authenticate", "params": {"token": alice}});
    ws.send(Message::text(call.to_string())).await.unwrap();
    let answer = tokio::time::timeout(WAIT, async {
        loop {
            if let Message::Text(t) = ws.next().await.expect("an answer").unwrap() {
                return t.to_string();
            }
        }
    })
    .await
    .expect("authenticated in time");
    assert!(answer.contains("\"ok\":true"), "{answer}");
    // Revoked in the database the nodes share: the connection on the second node closes.
    let o = std::process::Command::new(binary())
        .args(["token", "revoke", "--agent", "alice", "--db", &first.db])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    closed_for_revocation(&mut ws).await;
    refused(&mut second.raw().await, &alice, "revoked").await;
}

/// A server whose tokens are checked every 100 ms.
async fn server() -> TestServer {
    TestServer::with_limits(Limits {
        token_recheck: Duration::from_millis(100),
        ..test_limits()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_closes_its_websocket_and_its_sse_stream_and_is_refused_after() {
    let server = server().await;
    server.create("c", &["alice", "bob"]).await;
    let alice = server.token("alice").to_string();
    let bob = server.token("bob").to_string();
    // alice on a WebSocket, subscribed; bob on another, who keeps his token.
    let (mut ws, _) = tokio_tungstenite::connect_async(server.url())
        .await
        .unwrap();
    for (i, (method, params)) in [
        ("authenticate", json!({"token": alice})),
        ("subscribe", json!({"conversationId": "c"})),
    ]
    .into_iter()
    .enumerate()
    {
        let call = json!({"jsonrpc": "2.0", "id": i, "method": method, "params": params});
        ws.send(Message::text(call.to_string())).await.unwrap();
    }
    let mut bob_ws = server.raw().await;
    bob_ws.authenticate(&bob).await;
    // alice's SSE stream, over a plain socket.
    let addr = server.running().local_addr();
    let mut sse = tokio::net::TcpStream::connect(addr).await.unwrap();
    sse.write_all(
        format!(
            "GET /conversations/c/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {alice}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = vec![0u8; 4096];
    let n = tokio::time::timeout(WAIT, sse.read(&mut head))
        .await
        .expect("the stream's head in time")
        .unwrap();
    assert!(
        text(&head[..n]).starts_with("HTTP/1.1 200"),
        "{}",
        text(&head[..n])
    );

    let o = std::process::Command::new(binary())
        .args(["token", "revoke", "--agent", "alice", "--db", &server.db])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));

    // The WebSocket is closed with 1008 within the recheck interval.
    closed_for_revocation(&mut ws).await;
    // The SSE stream ends.
    tokio::time::timeout(WAIT, async {
        let mut buf = vec![0u8; 4096];
        loop {
            match sse.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) if text(&buf[..n]).contains("0\r\n\r\n") => return,
                Ok(_) => continue,
            }
        }
    })
    .await
    .expect("the SSE stream ends in time");
    // The token authenticates no more; bob's connection is untouched.
    refused(&mut server.raw().await, &alice, "revoked").await;
    let r = bob_ws
        .call(2, "getConversation", json!({"conversationId": "c"}))
        .await;
    assert_eq!(r["result"]["conversationId"], "c", "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_refused_and_a_use_is_recorded() {
    let server = server().await;
    let store = open_store(&server.db);
    let past = orchestrator::engine::store::now_ms() - 1;
    let expired = auth::create_token_until(store.as_ref(), "carol", false, Some(past)).unwrap();
    let mut ws = server.raw().await;
    refused(&mut ws, &expired, "expired").await;
    // Over HTTP too.
    let addr = server.running().local_addr().to_string();
    let answer = tests::http_raw(
        &addr,
        "GET /me",
        &format!("Authorization: Bearer {expired}\r\n"),
        "",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");

    // alice authenticates: her last use is written at the next recheck.
    ws.authenticate(server.token("alice")).await;
    let hash = auth::hash_token(server.token("alice"));
    let id = &hash[..orchestrator::engine::store::TOKEN_ID_LEN];
    tests::eventually("alice's last use recorded", || {
        store
            .list_tokens(None)
            .unwrap()
            .iter()
            .any(|t| t.id == id && t.last_used_ms.is_some_and(|at| at >= past))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_wait_ends_when_its_token_is_revoked_and_answers_no_events() {
    let server = server().await;
    server.create("c", &["alice", "bob"]).await;
    let addr = server.running().local_addr().to_string();
    let bearer = format!("Authorization: Bearer {}\r\n", server.token("alice"));
    let head = server.view("c").head();
    let parked = tokio::spawn(async move {
        let wait = format!("GET /conversations/c/wait?sinceSeq={head}&timeoutMs=30000");
        tests::http_raw(&addr, &wait, &bearer, "").await
    });
    server.wait_for_waiters("c", 1).await;
    let o = std::process::Command::new(binary())
        .args(["token", "revoke", "--agent", "alice", "--db", &server.db])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    // bob speaks once the token is gone from the database: the wait must not carry it out.
    let mut bob = server.raw().await;
    bob.authenticate(server.token("bob")).await;
    let said = bob
        .call(
            1,
            "sendMessage",
            json!({"conversationId": "c", "payload": {"text": "secret"}, "finality": "none"}),
        )
        .await;
    assert!(said["result"]["seq"].is_u64(), "{said}");
    let answer = tokio::time::timeout(WAIT, parked)
        .await
        .expect("the wait ends in time")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(!answer.contains("secret"), "{answer}");
}
