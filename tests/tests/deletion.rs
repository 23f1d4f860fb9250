//! `deleteConversation` (and `DELETE /conversations/{id}`): a conversation and its
//! sub-conversations leave the log. Every read answers `ConversationNotFound` after; parked
//! waits, WebSocket subscriptions and SSE streams are told; the id may be used again; who may
//! delete; and what a restart finds (on the suites' backend).

use jsonrpsee::core::client::ClientT;
use jsonrpsee::ws_client::WsClient;
use serde_json::{json, Value};
use tests::{TestServer, P};

async fn call(c: &WsClient, method: &str, params: Value) -> Result<Value, (i64, String)> {
    c.request::<Value, _>(method, P(params))
        .await
        .map_err(|e| match e {
            jsonrpsee::core::ClientError::Call(e) => (e.code() as i64, e.message().to_string()),
            other => panic!("{method}: {other}"),
        })
}

fn code<T: std::fmt::Debug>(r: Result<T, (i64, String)>) -> i64 {
    r.expect_err("refused").0
}

/// `id` with alice and bob, two messages, and a sub-conversation `{id}-sub` below it that has
/// one of its own, `{id}-sub-sub`.
async fn tree(server: &TestServer, id: &str) {
    let admin = server.client("admin").await;
    server.create(id, &["alice", "bob"]).await;
    let alice = server.client("alice").await;
    for text in ["one", "two"] {
        call(
            &alice,
            "sendMessage",
            json!({"conversationId": id, "payload": {"text": text}, "finality": "none"}),
        )
        .await
        .expect("send");
    }
    let sub = format!("{id}-sub");
    for (child, parent) in [(sub.clone(), id.to_string()), (format!("{sub}-sub"), sub)] {
        call(
            &admin,
            "createConversation",
            json!({"conversationId": child, "participants": ["alice", "bob"], "parentConversationId": parent}),
        )
        .await
        .expect("a sub-conversation");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_tree_is_gone_from_every_read_and_its_id_is_free_again() {
    let server = TestServer::start().await;
    tree(&server, "c1").await;
    server.create("other", &["alice"]).await;
    let admin = server.client("admin").await;
    let alice = server.client("alice").await;

    // A sub-conversation whose parent is open goes with the conversation above it.
    let (c, message) = call(
        &admin,
        "deleteConversation",
        json!({"conversationId": "c1-sub"}),
    )
    .await
    .expect_err("its parent is open");
    assert_eq!(c, -32602, "{message}");
    assert!(message.contains("c1"), "{message}");

    let r = call(
        &admin,
        "deleteConversation",
        json!({"conversationId": "c1"}),
    )
    .await
    .expect("delete");
    assert_eq!(r, json!({"deleted": ["c1", "c1-sub", "c1-sub-sub"]}));

    for id in ["c1", "c1-sub", "c1-sub-sub"] {
        for (method, params) in [
            ("getConversation", json!({"conversationId": id})),
            ("tail", json!({"conversationId": id, "sinceSeq": 0})),
            (
                "waitForChange",
                json!({"conversationId": id, "sinceSeq": 0, "timeoutMs": 10}),
            ),
            (
                "sendMessage",
                json!({"conversationId": id, "payload": {"text": "late"}, "finality": "none"}),
            ),
            ("deleteConversation", json!({"conversationId": id})),
        ] {
            assert_eq!(
                code(call(&alice, method, params.clone()).await),
                -32003,
                "{method} {id}"
            );
            assert_eq!(
                code(call(&admin, method, params).await),
                -32003,
                "{method} {id}"
            );
        }
    }
    let http = tests::http_raw(
        &server.running().local_addr().to_string(),
        "GET /conversations/c1",
        &format!("Authorization: Bearer {}\r\n", server.token("admin")),
        "",
    )
    .await;
    assert!(http.starts_with("HTTP/1.1 404"), "{http}");
    let listed = call(&admin, "listConversations", json!({}))
        .await
        .expect("list");
    let ids: Vec<&str> = listed["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["conversationId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["other"]);

    // The id is free: a new conversation starts from its first event.
    server.create("c1", &["carol"]).await;
    let carol = server.client("carol").await;
    let t = call(
        &carol,
        "tail",
        json!({"conversationId": "c1", "sinceSeq": 0}),
    )
    .await
    .expect("tail");
    assert_eq!(t["latestSeq"], 1, "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_tenants_admin_or_the_creator_deletes_and_over_http_too() {
    let server = TestServer::start().await;
    let alice = server.client("alice").await;
    let bob = server.client("bob").await;
    // Alice creates `mine` below `p`, which then closes.
    server.create("p", &["alice", "bob"]).await;
    call(
        &alice,
        "createConversation",
        json!({"conversationId": "mine", "participants": ["alice", "bob"], "parentConversationId": "p"}),
    )
    .await
    .expect("create");
    call(
        &alice,
        "sendMessage",
        json!({"conversationId": "p", "payload": {"text": "done"}, "finality": "conversation"}),
    )
    .await
    .expect("close p");
    // A participant that did not create it may not; another tenant's agents do not see it.
    assert_eq!(
        code(
            call(
                &bob,
                "deleteConversation",
                json!({"conversationId": "mine"})
            )
            .await
        ),
        -32002
    );
    let acme_admin = server
        .client_with(&server.tenant_token("acme", "admin", true, false))
        .await;
    assert_eq!(
        code(
            call(
                &acme_admin,
                "deleteConversation",
                json!({"conversationId": "mine"})
            )
            .await
        ),
        -32003
    );
    // Its creator may.
    let r = call(
        &alice,
        "deleteConversation",
        json!({"conversationId": "mine"}),
    )
    .await
    .expect("the creator deletes");
    assert_eq!(r["deleted"], json!(["mine"]));

    // `DELETE /conversations/{id}`, an admin's.
    server.create("web", &["alice"]).await;
    let host = server.running().local_addr().to_string();
    let auth = |who: &str| format!("Authorization: Bearer {}\r\n", server.token(who));
    let refused = tests::http_raw(&host, "DELETE /conversations/web", &auth("bob"), "").await;
    assert!(
        refused.starts_with("HTTP/1.1 404"),
        "bob does not read it: {refused}"
    );
    let done = tests::http_raw(&host, "DELETE /conversations/web", &auth("admin"), "").await;
    assert!(done.starts_with("HTTP/1.1 200"), "{done}");
    assert!(done.ends_with(r#"{"deleted":["web"]}"#), "{done}");
    let again = tests::http_raw(&host, "DELETE /conversations/web", &auth("admin"), "").await;
    assert!(again.starts_with("HTTP/1.1 404"), "{again}");
}

/// Readers parked on a conversation when it is deleted are told: a `waitForChange`, an HTTP
/// long-poll, a WebSocket subscription (its last notification carries the error) and an SSE
/// stream (an `error` event, then the end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_a_deleted_conversation_are_told_not_left_waiting() {
    let server = TestServer::start().await;
    server.create("w", &["alice", "bob"]).await;
    let host = server.running().local_addr().to_string();
    let auth = format!("Authorization: Bearer {}\r\n", server.token("bob"));
    let bob = server.client("bob").await;
    let waited = {
        let bob = &bob;
        async move {
            call(
                bob,
                "waitForChange",
                json!({"conversationId": "w", "sinceSeq": 1, "timeoutMs": 30000}),
            )
            .await
        }
    };
    let polled = tests::http_raw(
        &host,
        "GET /conversations/w/wait?sinceSeq=1&timeoutMs=30000",
        &auth,
        "",
    );
    let sse_headers = format!("{auth}Accept: text/event-stream\r\n");
    let streamed = tests::http_raw(
        &host,
        "GET /conversations/w/events?sinceSeq=0",
        &sse_headers,
        "",
    );
    let mut ws = server.raw().await;
    ws.authenticate(server.token("bob")).await;
    let sub = ws.subscribe(1, "w", 0).await;
    assert!(sub["result"].is_number(), "{sub}");
    let deleting = async {
        server.wait_for_waiters("w", 2).await;
        server.wait_for_live("w").await;
        let admin = server.client("admin").await;
        call(&admin, "deleteConversation", json!({"conversationId": "w"})).await
    };
    let (waited, polled, streamed, deleted) = tokio::join!(waited, polled, streamed, deleting);
    deleted.expect("delete");
    let (c, message) = waited.expect_err("the wait ends with an error");
    assert_eq!(
        (c, message.as_str()),
        (-32003, "conversation w was deleted")
    );
    assert!(polled.starts_with("HTTP/1.1 404"), "{polled}");
    assert!(polled.contains("was deleted"), "{polled}");
    assert!(
        streamed.contains("event: error\ndata: {\"code\":-32003"),
        "{streamed}"
    );
    // The subscription's frames: the created event, then its end with the error.
    let ended = loop {
        let frame = ws.recv().await;
        if frame["params"]["error"].is_object() {
            break frame;
        }
        assert_eq!(frame["method"], "event", "{frame}");
    };
    assert_eq!(ended["params"]["subscription"], sub["result"], "{ended}");
    assert_eq!(ended["params"]["error"]["code"], -32003, "{ended}");
    assert_eq!(ended["params"]["error"]["data"]["deleted"], true, "{ended}");
}

/// What a restart finds: the deleted conversations stay gone, the others are whole, and new
/// appends follow (on SQLite the log's last place stays taken when the last row was deleted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_finds_the_deletion_and_the_log_goes_on() {
    let mut server = TestServer::start().await;
    server.create("keep", &["alice"]).await;
    tree(&server, "gone").await;
    let admin = server.client("admin").await;
    // `gone` holds the log's last rows.
    call(
        &admin,
        "deleteConversation",
        json!({"conversationId": "gone"}),
    )
    .await
    .expect("delete");
    // Appended right after, before any restart: the log numbers it after the deleted rows.
    let alice = server.client("alice").await;
    call(
        &alice,
        "sendMessage",
        json!({"conversationId": "keep", "payload": {"text": "right after"}, "finality": "none"}),
    )
    .await
    .expect("send right after");
    server.restart().await;
    let alice = server.client("alice").await;
    assert_eq!(
        code(
            call(
                &alice,
                "tail",
                json!({"conversationId": "gone", "sinceSeq": 0})
            )
            .await
        ),
        -32003
    );
    for text in ["after", "the restart"] {
        call(
            &alice,
            "sendMessage",
            json!({"conversationId": "keep", "payload": {"text": text}, "finality": "none"}),
        )
        .await
        .expect("send after");
    }
    server.restart().await;
    let alice = server.client("alice").await;
    let t = call(
        &alice,
        "tail",
        json!({"conversationId": "keep", "sinceSeq": 0}),
    )
    .await
    .expect("tail");
    assert_eq!(t["latestSeq"], 4, "{t}");
    let texts: Vec<&str> = t["events"].as_array().unwrap()[1..]
        .iter()
        .map(|e| e["payload"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["right after", "after", "the restart"]);
}

/// Deletions asked at once share a transaction and each is answered with its own tree; the
/// same conversation asked twice at once is deleted once (the other asker: not found).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletions_at_once_are_each_answered_and_a_conversation_goes_once() {
    let server = TestServer::start().await;
    for i in 0..40 {
        server.create(&format!("m{i}"), &["alice"]).await;
    }
    let admin = server.client("admin").await;
    let asks = (0..40)
        .map(|i| format!("m{i}"))
        .chain(["m7".to_string(), "m7".to_string()]);
    let answers = futures::future::join_all(asks.map(|id| {
        let admin = &admin;
        async move {
            let r = call(admin, "deleteConversation", json!({"conversationId": id})).await;
            (id, r)
        }
    }))
    .await;
    let mut m7 = (0, 0);
    for (id, r) in answers {
        match r {
            Ok(v) => {
                assert_eq!(v, json!({"deleted": [id]}));
                if id == "m7" {
                    m7.0 += 1;
                }
            }
            Err((c, _)) => {
                assert_eq!((id.as_str(), c), ("m7", -32003));
                m7.1 += 1;
            }
        }
    }
    assert_eq!(m7, (1, 2), "m7: deleted once, then not found twice");
    let listed = call(&admin, "listConversations", json!({}))
        .await
        .expect("list");
    assert_eq!(listed["conversations"], json!([]));
}
