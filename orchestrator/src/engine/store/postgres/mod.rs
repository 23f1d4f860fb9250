//! The PostgreSQL backend (issue 21, in progress). So far: the versioned schema and its
//! migration at start, serialized across nodes by an advisory lock. The storage traits are
//! not implemented on it yet; `--db` still takes a SQLite path only.

pub mod migrations;
