//! Three nodes behind HAProxy with the configuration docs/cluster.md gives (read from the doc,
//! the ports filled in): clients connect through it round robin, to whichever node it picks;
//! the log stays one log, and when a node stops the clients that connect again are served by
//! the others.

use std::collections::HashMap;
use std::process::Stdio;

use jsonrpsee::core::client::ClientT;
use serde_json::{json, Value};
use tests::{subscribe, test_limits, TestServer, P};

/// The HAProxy configuration of docs/cluster.md, listening on `lb` in front of `ports`.
fn documented_config(lb: u16, ports: &[u16]) -> String {
    let doc = include_str!("../../docs/cluster.md");
    let start = doc
        .find("# /etc/haproxy/haproxy.cfg")
        .expect("docs/cluster.md has the HAProxy configuration");
    let block = &doc[start..];
    let block = &block[..block.find("```").expect("the block ends")];
    let mut cfg = block.replace("bind :7300", &format!("bind 127.0.0.1:{lb}"));
    for (i, port) in ports.iter().enumerate() {
        cfg = cfg.replace(
            &format!("127.0.0.1:{}", 7301 + i),
            &format!("127.0.0.1:{port}"),
        );
    }
    assert!(
        !cfg.contains(":730"),
        "every documented port replaced:\n{cfg}"
    );
    cfg
}

fn port_of(ws_url: &str) -> u16 {
    url::Url::parse(ws_url).expect("url").port().expect("port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_behind_the_documented_haproxy() {
    let a = TestServer::on_postgres(test_limits(), HashMap::new()).await;
    let mut b = a.another_node().await;
    let c = a.another_node().await;
    let ports: Vec<u16> = [&a, &b, &c].iter().map(|n| port_of(&n.url())).collect();
    let lb = tests::procs::free_port();
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("haproxy.cfg");
    std::fs::write(&cfg, documented_config(lb, &ports)).expect("write the configuration");
    let haproxy = which("haproxy");
    let valid = std::process::Command::new(&haproxy)
        .args(["-c", "-q", "-f"])
        .arg(&cfg)
        .status()
        .expect("haproxy -c");
    assert!(
        valid.success(),
        "haproxy refuses the documented configuration"
    );
    let mut proxy = tokio::process::Command::new(&haproxy)
        .arg("-db")
        .arg("-f")
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start haproxy");
    let url = format!("ws://127.0.0.1:{lb}/rpc");
    tests::wait_listening(lb, "haproxy").await;
    let admin = a.client_at(&url, "admin").await;
    let _: Value = admin
        .request(
            "createConversation",
            P(json!({"conversationId": "lb", "participants": ["alice", "bob"]})),
        )
        .await
        .expect("create through the balancer");
    let reader = a.client_at(&url, "bob").await;
    let mut sub = subscribe(&reader, json!({"conversationId": "lb", "sinceSeq": 0})).await;
    // Six writers, round robin over the three nodes.
    let mut sent = 0u64;
    for w in 0..6 {
        let alice = a.client_at(&url, "alice").await;
        for i in 0..10 {
            let _: Value = alice
                .request(
                    "sendMessage",
                    P(
                        json!({"conversationId": "lb", "payload": {"text": format!("{w}.{i}")},
                             "finality": "none", "clientRequestId": format!("{w}.{i}")}),
                    ),
                )
                .await
                .expect("append through the balancer");
            sent += 1;
        }
    }
    for seq in 1..=1 + sent {
        let n = tests::next_event(&mut sub, "through the balancer").await;
        assert_eq!(n["event"]["seq"], seq, "one log, in order");
    }
    // A node stops: clients that connect again are served by the others.
    b.stop().await;
    for i in 0..6 {
        let alice = a.client_at(&url, "alice").await;
        let r: Value = alice
            .request(
                "sendMessage",
                P(
                    json!({"conversationId": "lb", "payload": {"text": format!("after {i}")},
                         "finality": "none"}),
                ),
            )
            .await
            .expect("served while a node is down");
        assert_eq!(r["seq"], 2 + sent + i);
    }
    proxy.kill().await.ok();
    drop(c);
}

fn which(name: &str) -> std::path::PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .chain([std::path::PathBuf::from("/usr/sbin").join(name)])
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!("{name} is not installed (apt-get install {name}); scripts/test installs it")
        })
}
