//! How clients reach the method core: WebSocket JSON-RPC, `subscribe` push, SSE, long-poll,
//! REST, and the server that hosts them on one port.

pub mod accept;
pub mod console;
pub mod http;
pub mod jsonrpc;
pub mod net;
pub mod push;
pub mod refusal;
pub mod rpc;
pub mod server;
pub mod session;
pub mod sse;
pub mod turnstile;
pub mod ws;
