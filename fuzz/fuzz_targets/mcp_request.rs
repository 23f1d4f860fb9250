//! A request to the MCP adapter's HTTP endpoint: any verb, with the endpoint's token, none or
//! another; in the harness's session, none or an unknown one; any `MCP-Protocol-Version`; a
//! JSON-RPC message whose method is MCP's (or any string), with params built from the input
//! (a tool's arguments for `tools/call`, as JSON or as the text of a message), or the bytes as
//! they are. Oracle: no panic, no hang, never a 500; a JSON-RPC answer (a JSON body or an SSE
//! event) is a response with a result or an error, or a message of the server's own.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};

#[derive(Debug, Arbitrary)]
struct Req {
    verb: u8,
    auth: u8,
    session: u8,
    version: u8,
    method: u8,
    other_method: String,
    tool: u8,
    other_tool: String,
    id: u8,
    raw: bool,
    args: Vec<u8>,
}

const METHODS: [&str; 8] = [
    "tools/call",
    "tools/list",
    "ping",
    "initialize",
    "notifications/initialized",
    "notifications/cancelled",
    "resources/list",
    "prompts/list",
];

const TOOLS: [&str; 4] = [
    "post_message",
    "wait_for_updates",
    "get_conversation",
    "list_conversations",
];

/// The JSON-RPC message `r` makes for `method`: params from its bytes (a tool's arguments for
/// `tools/call`; bytes that are not JSON become a message of their text), an id unless it is a
/// notification (but now and then one anyway).
fn message(r: &Req, method: &str) -> Vec<u8> {
    let args: Value = serde_json::from_slice(&r.args).unwrap_or_else(|_| {
        let finality = ["turn", "none", "conversation"][r.args.len() % 3];
        json!({"conversationId": "c1", "text": String::from_utf8_lossy(&r.args),
               "finality": finality})
    });
    let params = match method {
        "tools/call" => {
            let tool = orchestrator_fuzz::pick(&TOOLS, r.tool, &r.other_tool);
            json!({"name": tool, "arguments": args})
        }
        _ => args,
    };
    let mut m = json!({"jsonrpc": "2.0", "method": method, "params": params});
    if !method.starts_with("notifications/") || r.id % 7 == 0 {
        m["id"] = orchestrator_fuzz::any_id(r.id, 4);
    }
    m.to_string().into_bytes()
}

fuzz_target!(|r: Req| {
    let method = orchestrator_fuzz::pick(&METHODS, r.method, &r.other_method);
    let body = match r.raw {
        true => r.args.clone(),
        false => message(&r, &method),
    };
    let h = orchestrator_fuzz::mcp::mcp();
    let verb = ["POST", "POST", "POST", "GET", "DELETE", "PUT"][r.verb as usize % 6];
    let session = match r.session % 4 {
        0 | 1 => Some(h.session.clone()),
        2 => None,
        _ => Some(format!("s-{}", r.session)),
    };
    let mut req = orchestrator_fuzz::mcp::request(verb, session.as_deref(), body);
    let headers = req.headers_mut();
    match r.auth % 4 {
        0 => {
            headers.remove("authorization");
        }
        1 => {
            headers.insert(
                "authorization",
                "Bearer not-the-token".parse().expect("a header"),
            );
        }
        _ => {}
    }
    match r.version % 4 {
        0 => {
            headers.remove("mcp-protocol-version");
        }
        1 => {
            headers.insert(
                "mcp-protocol-version",
                "1999-01-01".parse().expect("a header"),
            );
        }
        _ => {}
    }
    h.served.rt.block_on(async {
        let answer = orchestrator_fuzz::answer_in_time(&h.app, req).await;
        let status = answer.status().as_u16();
        assert_ne!(status, 500, "{verb} {method}: an internal error");
        if verb == "GET" {
            // A stream of the session's own messages: open until the session ends.
            return;
        }
        if let Some(v) = orchestrator_fuzz::mcp::first_message(answer).await {
            let response = v.get("result").is_some() != v.get("error").is_some();
            let own = v.get("method").is_some();
            let refusal = v.get("error").is_some() || v.get("result").is_none();
            assert!(
                response || own || (status >= 400 && refusal),
                "{verb} {method} ({status}): {v}"
            );
        }
    });
});
