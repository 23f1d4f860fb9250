//! How clients reach the method core: WebSocket JSON-RPC, `subscribe` push, SSE, long-poll,
//! REST, and the server that hosts them on one port.

pub mod http;
pub mod net;
pub mod push;
pub mod rpc;
pub mod server;
pub mod session;
