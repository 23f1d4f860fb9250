//! An HTTP request on the server's routes: any method, path, query, headers (`Authorization`,
//! `Last-Event-ID`, `Idempotency-Key` among those it picks from) and body. Oracle: no panic,
//! no hang; every error status carries the protocol's JSON error with a code from the table.
#![no_main]

use arbitrary::Arbitrary;
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

#[derive(Debug, Arbitrary)]
struct Req {
    method: u8,
    route: u8,
    path: String,
    query: String,
    headers: Vec<(u8, String)>,
    body: Vec<u8>,
}

const METHODS: [&str; 6] = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"];
const ROUTES: [&str; 12] = [
    "/",
    "/me",
    "/healthz",
    "/scenarios",
    "/conversations",
    "/conversations/c1",
    "/conversations/c1/messages",
    "/conversations/c1/events",
    "/conversations/c1/wait",
    "/conversations/c1/pause",
    "/conversations/c1/resume",
    "/rpc",
];
const HEADERS: [&str; 6] = [
    "authorization",
    "last-event-id",
    "idempotency-key",
    "content-type",
    "content-length",
    "upgrade",
];

fuzz_target!(|r: Req| {
    let h = orchestrator_fuzz::harness();
    let method = METHODS[r.method as usize % METHODS.len()];
    // A known route with what follows, or the path as given.
    let path = match ROUTES.get(r.route as usize) {
        Some(route) => format!("{route}{}", r.path),
        None => r.path.clone(),
    };
    let uri = if r.query.is_empty() {
        path
    } else {
        format!("{path}?{}", r.query)
    };
    let mut req = axum::http::Request::builder().method(method).uri(uri);
    for (i, (which, value)) in r.headers.iter().enumerate().take(8) {
        let name = HEADERS[*which as usize % HEADERS.len()];
        // Half the time, a real token.
        let value = if name == "authorization" && i % 2 == 0 {
            format!("Bearer {}", h.tokens[*which as usize % h.tokens.len()])
        } else {
            value.clone()
        };
        req = req.header(name, value);
    }
    let Ok(req) = req.body(axum::body::Body::from(r.body)) else {
        return;
    };
    h.rt.block_on(async {
        let resp = h
            .app
            .clone()
            .oneshot(req)
            .await
            .expect("routes are infallible");
        let status = resp.status();
        // A HEAD answer has no body, by HTTP's rules.
        if (status.is_client_error() || status.is_server_error()) && method != "HEAD" {
            let bytes = resp.into_body().collect().await.expect("a body").to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| panic!("{status}: not JSON: {bytes:?}"));
            let code = v["error"]["code"].as_i64().unwrap_or(0) as i32;
            assert!(
                proto_spec::ErrorCode::from_code(code).is_some(),
                "{status}: {v}"
            );
        }
    });
});
