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
    /// PostgreSQL failed (the connection, a statement, a constraint); the caller sees
    /// `Internal`, the details go to the log.
    #[error("database: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// An I/O failure (files, sockets).
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Stored data that cannot be read back (the log is damaged; the server refuses to serve
    /// it rather than guess).
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// The database was written by a newer build.
    #[error("the database has schema version {found}, newer than this build's {supported}; run a newer build")]
    SchemaTooNew {
        /// The database's schema version.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The orchestrator was opened outside a tokio runtime.
    #[error("the orchestrator needs a tokio runtime (open it from inside one)")]
    NoRuntime,
    /// A task the request waited on ended without an answer (it panicked or was cancelled).
    #[error("a background task ended without an answer: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// A value could not be turned into JSON.
    #[error("could not encode JSON: {0}")]
    Encode(#[from] serde_json::Error),
    /// A lock was poisoned by a thread that panicked while holding it.
    #[error("{0} is unusable: a thread panicked while holding it")]
    Poisoned(&'static str),
    /// The server could not be put together (a method registered twice, say).
    #[error("setting up the server: {0}")]
    Setup(String),
    /// Writing the live transcript of a run failed (its output closed).
    #[error("writing the transcript: {0}")]
    Transcript(#[source] std::io::Error),
    /// A run was interrupted (Ctrl-C, SIGTERM) before it ended.
    #[error("interrupted")]
    Interrupted,
    /// Another process holds the database's writer lock.
    #[error("{0}")]
    Locked(String),
    /// The database cannot be used (unreachable, or it did not answer in time): nothing was
    /// acknowledged; the caller may retry, on this node or another.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// A batch decided on a view of a conversation that another node had already moved past:
    /// the database refused it as a whole (a seq written twice), and nothing of it was written.
    /// The writer catches up and runs the batch again.
    #[error("another node wrote first: {0}")]
    Conflict(String),
    /// A batch wrote to a conversation another node deleted (number `0`) after this node last
    /// looked: nothing of it was written; the writer lets go of the conversation and runs the
    /// batch again.
    #[error("conversation number {0} was deleted by another node")]
    Deleted(i64),
    /// The writer thread is gone (the server is stopping).
    #[error("the log writer has stopped")]
    WriterGone,
}

/// What a caller is told when the database cannot be used: nothing was acknowledged.
pub const UNAVAILABLE: &str =
    "the database is unavailable; nothing was written: retry (on this node or another)";

/// What a caller is told when the disk (SQLite's or PostgreSQL's) had no room for a commit.
pub const DISK_FULL: &str =
    "the disk is full: nothing of this request was written; retry once there is space";

impl Error {
    /// Whether the storage refused a write for lack of space (`SQLITE_FULL`, or PostgreSQL's
    /// `disk_full`): the commit rolled back and nothing of it was written.
    pub fn is_disk_full(&self) -> bool {
        match self {
            Error::Store(rusqlite::Error::SqliteFailure(f, _)) => {
                f.code == rusqlite::ErrorCode::DiskFull
            }
            Error::Postgres(e) => e.code() == Some(&tokio_postgres::error::SqlState::DISK_FULL),
            _ => false,
        }
    }
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
            Error::Unavailable(why) => {
                tracing::warn!(error = %why, "the database is unavailable");
                RpcError::new(ErrorCode::Internal, UNAVAILABLE)
            }
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

/// What a reader of conversation `key` is told once it was deleted.
pub fn deleted(key: &str) -> Error {
    Error::Rpc(
        RpcError::new(
            ErrorCode::ConversationNotFound,
            format!(
                "conversation {} was deleted",
                proto_spec::tenant::local_id(key)
            ),
        )
        .with_data(serde_json::json!({"deleted": true})),
    )
}
