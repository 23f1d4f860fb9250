//! `orchestrator-a2a`: the A2A adapter, a separate process that exposes conversation scenarios
//! as A2A agents (a `contextId` is a conversation, a task one exchange) and speaks the
//! orchestrator's protocol over WebSocket, holding no state a restart could lose.
//!
//! It is built by the adapters issue; until then this binary says so and exits with status 2.

fn main() {
    eprintln!(
        "orchestrator-a2a: the A2A adapter is not built yet (protocol {}); \
         use the orchestrator's JSON-RPC over WebSocket at /rpc",
        agent_sdk::proto::method::names::SEND_MESSAGE
    );
    std::process::exit(2);
}
