//! TLS on `serve` (`--tls-cert`, `--tls-key`), with certificates the test makes: the SDK client
//! over `wss://` trusting the test's CA (and refusing the server without it), curl over
//! `https://`, plain HTTP refused on the TLS port, the certificate reloaded on SIGHUP (new
//! handshakes present the new one, a connection made before keeps working, a pair that cannot
//! be read leaves the one in use), and a start refused with a clear error for a key that does
//! not match its certificate or a certificate without its key. Python's `websockets` and
//! `httpx` are in `tests/python/test_tls.py`; the adapters' listeners in their own tests.

use std::ffi::OsStr;
use std::path::Path;
use std::time::Duration;

use agent_sdk::proto::*;
use agent_sdk::{AgentClient, ClientError, WsConfig, WsJsonRpcClient};
use tests::certs::{self, Certs};
use tests::procs::{binary, duet_library, token, Node};

fn tls_args(c: &Certs) -> [&OsStr; 4] {
    [
        "--tls-cert".as_ref(),
        c.cert.as_os_str(),
        "--tls-key".as_ref(),
        c.key.as_os_str(),
    ]
}

fn wss(node: &Node) -> String {
    format!("wss://127.0.0.1:{}/rpc", node.port)
}

async fn connect(
    url: &str,
    token: &str,
    ca: Option<&Path>,
) -> Result<WsJsonRpcClient, ClientError> {
    let mut config = WsConfig::new(url, token);
    config.ca_file = ca.map(Path::to_owned);
    WsJsonRpcClient::connect(config).await
}

/// Posts `text` to the test's conversation (its own idempotency key).
async fn say(c: &WsJsonRpcClient, text: &str) -> Result<AppendResult, ClientError> {
    c.send_message(SendMessageParams {
        conversation_id: "over-tls".into(),
        payload: MessagePayload::text(text),
        finality: Finality::None,
        turn_hint: None,
        client_request_id: Some(format!("tls {text}")),
        after_key: None,
    })
    .await
}

/// `curl` with `args`: its exit status and what it printed.
fn curl(args: &[&OsStr]) -> (i32, String) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10"])
        .args(args)
        .output()
        .expect("curl (apt-get install curl)");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

/// Waits (bounded) until a new connection trusting `ca` is accepted: the reload is done by a
/// task of the server once it gets the signal.
async fn until_trusted(url: &str, token: &str, ca: &Path) -> WsJsonRpcClient {
    for _ in 0..100 {
        if let Ok(c) = connect(url, token, Some(ca)).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "the server never presented the certificate {}",
        ca.display()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_speaks_tls_and_reloads_its_certificate_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tls.db").display().to_string();
    let scenarios = duet_library(dir.path(), "duet");
    let admin_token = token(&db, "admin", true);
    let first = certs::make(dir.path(), "first");
    // The files the server reads, overwritten on a renewal.
    let live = Certs {
        ca: first.ca.clone(),
        cert: dir.path().join("server-cert.pem"),
        key: dir.path().join("server-key.pem"),
    };
    std::fs::copy(&first.cert, &live.cert).unwrap();
    std::fs::copy(&first.key, &live.key).unwrap();
    let mut node = Node::new();
    node.start_with(&db, &scenarios, &tls_args(&live)).await;
    let url = wss(&node);

    // The SDK client over wss://, trusting the test's CA: the whole protocol works.
    let admin = connect(&url, &admin_token, Some(&first.ca))
        .await
        .expect("wss");
    admin
        .create_conversation(CreateConversationParams {
            conversation_id: Some("over-tls".into()),
            participants: Some(vec!["admin".into()]),
            ..Default::default()
        })
        .await
        .expect("create over TLS");
    let sent = say(&admin, "sealed").await.expect("send over TLS");
    let log = tests::full_log(&admin, "over-tls").await;
    assert_eq!(log.last().map(|e| e.seq), Some(sent.seq));

    // Without the CA the client refuses the server, and says why.
    let refused = connect(&url, &admin_token, None)
        .await
        .expect_err("untrusted");
    assert!(
        refused.to_string().to_lowercase().contains("certificate"),
        "{refused}"
    );
    // Plain ws:// to the TLS port gets no WebSocket.
    let plain = format!("ws://127.0.0.1:{}/rpc", node.port);
    assert!(connect(&plain, &admin_token, None).await.is_err());

    // curl over https://, with and without the CA; plain HTTP gets no answer.
    let health = format!("https://127.0.0.1:{}/healthz", node.port);
    let (code, body) = curl(&["--cacert".as_ref(), first.ca.as_os_str(), health.as_ref()]);
    assert_eq!(code, 0, "{body}");
    assert!(body.contains("\"status\":\"ok\""), "{body}");
    let (code, body) = curl(&[health.as_ref()]);
    assert_ne!(
        code, 0,
        "curl trusts a certificate of the test's own CA: {body}"
    );
    let (code, body) = curl(&[format!("http://127.0.0.1:{}/healthz", node.port).as_ref()]);
    assert_ne!(code, 0, "plain HTTP answered on the TLS port: {body}");

    // A renewal: a new CA's certificate over the same files, then SIGHUP.
    let second = certs::make(dir.path(), "second");
    std::fs::copy(&second.cert, &live.cert).unwrap();
    std::fs::copy(&second.key, &live.key).unwrap();
    node.signal(nix::sys::signal::Signal::SIGHUP);
    let renewed = until_trusted(&url, &admin_token, &second.ca).await;
    assert!(
        connect(&url, &admin_token, Some(&first.ca)).await.is_err(),
        "a new handshake still presents the old certificate"
    );
    // The connection made before the reload keeps its session.
    say(&admin, "still here")
        .await
        .expect("a connection made before the reload");
    let log = tests::full_log(&renewed, "over-tls").await;
    let last = log.last().expect("the log");
    assert_eq!(last.payload_value()["text"], "still here", "{log:?}");

    // A key that cannot be read: the reload is refused, the certificate in use stays.
    std::fs::write(&live.key, "not a key").unwrap();
    node.signal(nix::sys::signal::Signal::SIGHUP);
    node.logged("TLS certificate not reloaded").await;
    let (code, body) = curl(&["--cacert".as_ref(), second.ca.as_os_str(), health.as_ref()]);
    assert_eq!(
        code, 0,
        "the server still serves the second certificate: {body}"
    );
    node.kill().await;
}

/// `serve` with `args` must refuse to start: what it printed on stderr.
fn refused_start(db: &str, args: &[&OsStr]) -> String {
    let out = std::process::Command::new(binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--db", db])
        .args(args)
        .output()
        .expect("run serve");
    assert!(!out.status.success(), "serve started");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn serve_refuses_a_key_that_does_not_match_or_a_certificate_alone() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("refused.db").display().to_string();
    let a = certs::make(dir.path(), "a");
    let b = certs::make(dir.path(), "b");
    let err = refused_start(
        &db,
        &[
            "--tls-cert".as_ref(),
            a.cert.as_os_str(),
            "--tls-key".as_ref(),
            b.key.as_os_str(),
        ],
    );
    assert!(
        err.contains("a-cert.pem") && err.contains("b-key.pem"),
        "{err}"
    );
    let err = refused_start(&db, &["--tls-cert".as_ref(), a.cert.as_os_str()]);
    assert!(err.contains("--tls-key"), "{err}");
    let missing = dir.path().join("missing.pem");
    let err = refused_start(
        &db,
        &[
            "--tls-cert".as_ref(),
            missing.as_os_str(),
            "--tls-key".as_ref(),
            a.key.as_os_str(),
        ],
    );
    assert!(err.contains("missing.pem"), "{err}");
    // Nothing was created: the certificate is checked before the database is opened.
    assert!(!Path::new(&db).exists());
}
