//! The orchestrator's errors, and the one mapping from them to protocol errors.

use proto_spec::{ErrorCode, RpcError};

/// Everything that can go wrong inside the orchestrator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A protocol error for the caller (a refused request).
    #[error("{0}")]
    Rpc(#[from] RpcError),
    /// The storage failed; the caller sees `Internal`, the details go to the log.
    #[error("storage: {0}")]
    Store(#[from] rusqlite::Error),
    /// An I/O failure (files, sockets).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Stored data that cannot be read back.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// Another process holds the database's writer lock.
    #[error("{0}")]
    Locked(String),
    /// The writer thread is gone (the server is stopping).
    #[error("the log writer has stopped")]
    WriterGone,
}

/// The orchestrator's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The one mapping to a protocol error: refusals pass through; internal failures are
    /// logged here and reach the caller as a bare `Internal`.
    pub fn to_rpc(&self) -> RpcError {
        match self {
            Error::Rpc(e) => e.clone(),
            Error::WriterGone => RpcError::new(ErrorCode::Internal, "the server is shutting down"),
            other => {
                tracing::error!(error = %other, "internal error");
                RpcError::new(ErrorCode::Internal, "internal error")
            }
        }
    }
}

/// Shorthand for a protocol refusal.
pub fn refuse(code: ErrorCode, message: impl Into<String>) -> Error {
    Error::Rpc(RpcError::new(code, message))
}
