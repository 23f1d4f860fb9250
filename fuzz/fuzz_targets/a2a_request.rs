//! An A2A JSON-RPC request to the adapter: a method from the protocol's (or any string), any
//! id, params built from the input as JSON (or the bytes as they are), with or without the
//! `A2A-Version` header, on the scenario's endpoint or the root. Oracle: no panic, no hang;
//! every answer is a JSON-RPC response with a result or an error (a code of A2A's table), or
//! an SSE stream for the streaming methods.
#![no_main]

use arbitrary::Arbitrary;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

#[derive(Debug, Arbitrary)]
struct Req {
    method: u8,
    other_method: String,
    id: u8,
    version: u8,
    root: bool,
    raw: bool,
    params: Vec<u8>,
}

const METHODS: [&str; 10] = [
    "SendMessage",
    "SendStreamingMessage",
    "GetTask",
    "ListTasks",
    "CancelTask",
    "SubscribeToTask",
    "CreateTaskPushNotificationConfig",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
];

/// Codes an A2A JSON-RPC answer may carry: A2A's table, and the adapter's own for a caller
/// without credentials (-32040) and a peer over one of its caps (-32050).
const CODES: [i64; 16] = [
    -32700, -32600, -32601, -32602, -32603, -32001, -32002, -32003, -32004, -32005, -32006, -32007,
    -32008, -32009, -32040, -32050,
];

fuzz_target!(|r: Req| {
    let h = orchestrator_fuzz::a2a::a2a();
    let method = orchestrator_fuzz::pick(&METHODS, r.method, &r.other_method);
    let id = orchestrator_fuzz::any_id(r.id, 5);
    let body = if r.raw {
        r.params.clone()
    } else {
        let params: Value = serde_json::from_slice(&r.params).unwrap_or_else(|_| {
            // Bytes that are not JSON become a message of that text.
            json!({"message": {"messageId": format!("m{}", r.params.len()), "role": "ROLE_USER",
                   "parts": [{"text": String::from_utf8_lossy(&r.params)}]},
                   "configuration": {"returnImmediately": r.params.len() % 2 == 0}})
        });
        json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
            .to_string()
            .into_bytes()
    };
    let mut req = axum::http::Request::post(if r.root { "/" } else { "/expert/" })
        .header("content-type", "application/json");
    match r.version % 3 {
        0 => req = req.header("A2A-Version", "1.0"),
        1 => req = req.header("A2A-Version", "0.3"),
        _ => {}
    }
    // Most requests carry the peer's token; some none (anonymous: 401).
    if r.version < 224 {
        req = req.header("Authorization", format!("Bearer {}", h.served.token));
    }
    let req = req.body(axum::body::Body::from(body)).expect("a request");
    h.served.rt.block_on(async {
        let answer = orchestrator_fuzz::answer_in_time(&h.app, req).await;
        let sse = answer
            .headers()
            .get("content-type")
            .is_some_and(|c| c.as_bytes().starts_with(b"text/event-stream"));
        if sse {
            return;
        }
        let bytes = answer
            .into_body()
            .collect()
            .await
            .expect("a body")
            .to_bytes();
        let v: Value = serde_json::from_slice(&bytes).expect("every answer is JSON");
        assert!(v.get("result").is_some() != v.get("error").is_some(), "{v}");
        if let Some(code) = v["error"]["code"].as_i64() {
            assert!(CODES.contains(&code), "a code of A2A's table: {v}");
        }
    });
});
