//! The versioned schema. Each entry moves the schema from version `i` to `i + 1`; the version
//! lives in `PRAGMA user_version` and every pending step runs at open, in one transaction.

/// The schema steps, oldest first. Never edit a released step: add a new one.
pub const MIGRATIONS: &[&str] = &[
    // 1: conversations, the event log with its idempotency index, tokens. The log is ordered by
    // rowid (the global commit order), so appends only ever write at the end of the table; the
    // per-conversation order (seq -> rowid) is kept in memory and rebuilt at start. The unique
    // (conv, seq) index of the first draft cost 85% of the write throughput with 1,000 busy
    // conversations (BENCHMARKS.md), so uniqueness of seq rests on the single writer and is
    // checked again at every start.
    r#"
    CREATE TABLE conversations (
        num          INTEGER PRIMARY KEY,
        id           TEXT NOT NULL UNIQUE,
        created_by   TEXT NOT NULL,
        participants TEXT NOT NULL,
        metadata     TEXT
    );
    CREATE TABLE events (
        pos               INTEGER PRIMARY KEY,
        conv              INTEGER NOT NULL REFERENCES conversations(num),
        seq               INTEGER NOT NULL,
        kind              TEXT NOT NULL,
        author            TEXT NOT NULL,
        turn              INTEGER NOT NULL,
        finality          TEXT,
        payload           TEXT NOT NULL,
        client_request_id TEXT,
        request_hash      BLOB,
        ts_ms             INTEGER NOT NULL
    );
    CREATE UNIQUE INDEX events_idempotency ON events (conv, author, client_request_id)
        WHERE client_request_id IS NOT NULL;
    CREATE TABLE tokens (
        hash       TEXT PRIMARY KEY,
        agent_id   TEXT NOT NULL,
        admin      INTEGER NOT NULL,
        created_ms INTEGER NOT NULL
    );
    "#,
    // 2: the ids of participants the server runs, so that no token is made for one (an agent
    // id names one principal: docs/security.md); filled from the `created` events so far.
    r#"
    CREATE TABLE declared_agents (
        agent_id TEXT PRIMARY KEY
    ) WITHOUT ROWID;
    INSERT OR IGNORE INTO declared_agents (agent_id)
        SELECT DISTINCT j.key FROM events e, json_each(e.payload, '$.policy.agents') j
        WHERE e.seq = 1 AND e.kind = 'system';
    CREATE INDEX tokens_agent ON tokens (agent_id);
    "#,
    // 3: a token may expire, and records when it last authenticated (at most once a minute).
    r#"
    ALTER TABLE tokens ADD COLUMN expires_ms INTEGER;
    ALTER TABLE tokens ADD COLUMN last_used_ms INTEGER;
    "#,
    // 4: messages that may be plans or deliverables are marked, so that recovery reads their
    // payload (the state numbers documents) without reading every message's.
    r#"
    ALTER TABLE events ADD COLUMN doc INTEGER;
    UPDATE events SET doc = 1 WHERE kind = 'message'
        AND (instr(payload, '"plan.v1"') OR instr(payload, '"deliverable.v1"'));
    "#,
    // 5: no index on idempotency keys. As with seq (step 1), uniqueness rests on the single
    // writer, which keeps every conversation's keys in memory and refuses a reused one, and is
    // checked again at every start (a key twice in one conversation's log stops the start).
    // Its entries land all over the index (a key is the client's string, not a counter), so
    // each batch of keyed writes over many conversations rewrote an index page per
    // conversation into the WAL: with every SDK and executor write keyed, half of the turn
    // loop's rate at 1,000 turns a conversation (BENCHMARKS.md). PostgreSQL keeps its unique
    // index: there, several nodes write.
    r#"
    DROP INDEX IF EXISTS events_idempotency;
    "#,
    // 6: tenants. Every token belongs to one (a database from before them: all to `default`),
    // and may make an operator, who works across tenants.
    r#"
    CREATE TABLE tenants (
        name       TEXT PRIMARY KEY,
        created_ms INTEGER NOT NULL
    ) WITHOUT ROWID;
    INSERT INTO tenants (name, created_ms)
        VALUES ('default', CAST(strftime('%s', 'now') AS INTEGER) * 1000);
    ALTER TABLE tokens ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE tokens ADD COLUMN operator INTEGER NOT NULL DEFAULT 0;
    "#,
    // 7: each tenant's quotas (JSON, those set), and what each run of the server used of them
    // (model tokens a day outlive a restart).
    r#"
    ALTER TABLE tenants ADD COLUMN quotas TEXT;
    CREATE TABLE tenant_usage (
        node        TEXT NOT NULL,
        tenant      TEXT NOT NULL,
        appends     INTEGER NOT NULL,
        connections INTEGER NOT NULL,
        llm_day     INTEGER NOT NULL,
        llm_tokens  INTEGER NOT NULL,
        at_ms       INTEGER NOT NULL,
        PRIMARY KEY (node, tenant)
    ) WITHOUT ROWID;
    "#,
];

/// The schema version this build writes.
pub fn latest() -> i64 {
    MIGRATIONS.len() as i64
}
