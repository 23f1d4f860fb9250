//! `orchestrator-mcp`: the MCP adapter, a separate process that bridges MCP hosts to the
//! orchestrator's protocol over WebSocket (tools `wait_for_updates`, `post_message`,
//! `list_conversations`, `get_conversation`), holding no state a restart could lose.
//!
//! It is built by the adapters issue; until then this binary says so and exits with status 2.

fn main() {
    eprintln!(
        "orchestrator-mcp: the MCP adapter is not built yet (protocol {}); \
         use the orchestrator's JSON-RPC over WebSocket at /rpc",
        agent_sdk::proto::method::names::SEND_MESSAGE
    );
    std::process::exit(2);
}
