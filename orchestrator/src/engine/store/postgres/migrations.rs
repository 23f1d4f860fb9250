//! The PostgreSQL schema, versioned. Each entry moves the schema from version `i` to `i + 1`;
//! the version lives in `orchestrator_schema`. Every node runs [`migrate`] at start: the
//! pending steps run in one transaction that first takes a transaction-scoped advisory lock, so
//! nodes starting together run them once, one after the other, and a node that finds the
//! schema newer than it knows refuses to start.

use tokio_postgres::Client;

use crate::engine::error::{Error, Result};

/// The advisory lock the migration holds (an arbitrary constant: "orch" in ASCII).
pub const MIGRATION_LOCK: i64 = 0x6f72_6368;

/// The schema steps, oldest first. Never edit a released step: add a new one.
pub const MIGRATIONS: &[&str] = &[
    // 1: conversations, the event log, tokens and declared agents, as on SQLite, but with the
    // (conversation, seq) primary key as the last line of defence: several nodes write here,
    // and a second writer of the same seq must fail in the database, not be trusted away.
    r#"
    CREATE SEQUENCE conversation_num;
    CREATE TABLE conversations (
        num          BIGINT PRIMARY KEY,
        id           TEXT NOT NULL UNIQUE,
        created_by   TEXT NOT NULL,
        participants JSONB NOT NULL,
        metadata     JSONB,
        -- The seq of its last event: what a node compares with its own view, under the row's
        -- lock, before it decides anything for the conversation.
        head         BIGINT NOT NULL DEFAULT 0,
        closed       BOOLEAN NOT NULL DEFAULT false,
        updated_ms   BIGINT NOT NULL DEFAULT 0
    );
    CREATE INDEX conversations_open ON conversations (num) WHERE NOT closed;
    CREATE INDEX conversations_updated ON conversations (updated_ms);
    CREATE TABLE events (
        conv              BIGINT NOT NULL REFERENCES conversations(num),
        seq               BIGINT NOT NULL,
        kind              TEXT NOT NULL,
        author            TEXT NOT NULL,
        turn              BIGINT NOT NULL,
        finality          TEXT,
        payload           TEXT NOT NULL,
        client_request_id TEXT,
        request_hash      BYTEA,
        ts_ms             BIGINT NOT NULL,
        PRIMARY KEY (conv, seq)
    );
    CREATE UNIQUE INDEX events_idempotency ON events (conv, author, client_request_id)
        WHERE client_request_id IS NOT NULL;
    CREATE TABLE tokens (
        hash       TEXT PRIMARY KEY,
        agent_id   TEXT NOT NULL,
        admin      BOOLEAN NOT NULL,
        created_ms BIGINT NOT NULL
    );
    CREATE INDEX tokens_agent ON tokens (agent_id);
    CREATE TABLE declared_agents (
        agent_id TEXT PRIMARY KEY
    );
    -- Who runs a turn, cluster-wide: the node running an internal agent's turn, or the push
    -- replica that claimed it. `fence` is new at every grant to another holder (a sequence:
    -- never reused); a write made for the turn carries the fence it was granted and is
    -- refused once another holder has it.
    CREATE SEQUENCE turn_fence;
    CREATE TABLE turn_claims (
        conversation_id TEXT NOT NULL,
        turn            BIGINT NOT NULL,
        holder          TEXT NOT NULL,
        fence           BIGINT NOT NULL,
        lease_until_ms  BIGINT NOT NULL,
        PRIMARY KEY (conversation_id, turn)
    );
    "#,
    // 2: a head's move updates no index (a HOT update: no new index entries for every
    // conversation of every batch), so the poll for other nodes' commits no longer reads an
    // index on `updated_ms` but `commits`: one row per batch with every conversation it wrote
    // and its new head (`num:head,…`, the notification's text, which a notification truncates
    // to `*` past 7,000 bytes), kept a few minutes.
    r#"
    DROP INDEX conversations_updated;
    ALTER TABLE conversations SET (fillfactor = 70);
    CREATE TABLE commits (
        at_ms BIGINT NOT NULL,
        heads TEXT NOT NULL
    );
    CREATE INDEX commits_at ON commits (at_ms);
    "#,
    // 3: the (conversation, seq) primary key is the compare-and-set of every batch: a batch
    // inserts each conversation's next seqs after the head it decided on, so it commits only if
    // no other node appended to that conversation since (a second insert of a seq fails in the
    // database). No head to move per conversation and batch, no row lock for a conversation
    // only this node writes, no foreign key checked per event (every event's conversation is
    // one the writer read or created in the same transaction); `closed` moves once, when a
    // batch closes a conversation.
    r#"
    ALTER TABLE events DROP CONSTRAINT IF EXISTS events_conv_fkey;
    ALTER TABLE conversations DROP COLUMN head, DROP COLUMN updated_ms;
    "#,
    // 4: a token may expire, and records when it last authenticated (at most once a minute).
    r#"
    ALTER TABLE tokens ADD COLUMN expires_ms BIGINT, ADD COLUMN last_used_ms BIGINT;
    "#,
    // 5: messages that may be plans or deliverables are marked, so that recovery reads their
    // payload (the state numbers documents) without reading every message's.
    r#"
    ALTER TABLE events ADD COLUMN doc BOOLEAN;
    UPDATE events SET doc = true WHERE kind = 'message'
        AND (strpos(payload, '"plan.v1"') > 0 OR strpos(payload, '"deliverable.v1"') > 0);
    "#,
    // 6: the events that move a conversation's state past its head (every one but a
    // participant's message or trace that ends no turn, carries no idempotency key and is no
    // plan or deliverable), indexed: a batch that locks a conversation other nodes wrote reads
    // those in full and of the rest only the last one's seq and time.
    r#"
    CREATE INDEX events_marked ON events (conv, seq)
        WHERE kind = 'system' OR author = 'orchestrator' OR finality IN ('turn', 'conversation') OR client_request_id IS NOT NULL OR doc;
    "#,
    // 7: tenants. Every token belongs to one (a database from before them: all to `default`),
    // and may make an operator, who works across tenants.
    r#"
    CREATE TABLE tenants (
        name       TEXT PRIMARY KEY,
        created_ms BIGINT NOT NULL
    );
    INSERT INTO tenants (name, created_ms)
        VALUES ('default', (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
    ALTER TABLE tokens ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default',
        ADD COLUMN operator BOOLEAN NOT NULL DEFAULT false;
    "#,
    // 8: each tenant's quotas (JSON, those set), and what each node used of them lately: the
    // nodes exchange it to hold a quota across the cluster.
    r#"
    ALTER TABLE tenants ADD COLUMN quotas TEXT;
    CREATE TABLE tenant_usage (
        node        TEXT NOT NULL,
        tenant      TEXT NOT NULL,
        appends     BIGINT NOT NULL,
        connections BIGINT NOT NULL,
        llm_day     BIGINT NOT NULL,
        llm_tokens  BIGINT NOT NULL,
        at_ms       BIGINT NOT NULL,
        PRIMARY KEY (node, tenant)
    );
    "#,
    // 9: the closed conversations found by an index of their own: a list loads those of its
    // caller that the node does not hold, and among a million open ones a scan for them took
    // 50 ms a list.
    r#"
    CREATE INDEX conversations_closed ON conversations (num) WHERE closed;
    "#,
    // 10: closed conversations read page by page in list order: the commit that closes one
    // records its place (its participants' last event, else its creation) and what filters
    // read; before, a list loaded every closed conversation of its caller first. The index
    // of step 9 goes: while the statistics say few are closed, PostgreSQL chose it for a
    // page and sorted every closed conversation (11 ms a page at 20,000).
    r#"
    DROP INDEX conversations_closed;
    ALTER TABLE conversations ADD COLUMN active_ms BIGINT, ADD COLUMN created_ms BIGINT,
        ADD COLUMN scenario TEXT;
    UPDATE conversations c SET created_ms = (SELECT ts_ms FROM events WHERE conv = c.num AND seq = 1), scenario = (SELECT payload::jsonb ->> 'scenario' FROM events WHERE conv = c.num AND seq = 1), active_ms = COALESCE((SELECT ts_ms FROM events WHERE conv = c.num AND author <> 'orchestrator' ORDER BY seq DESC LIMIT 1), (SELECT ts_ms FROM events WHERE conv = c.num AND seq = 1), 0) WHERE closed;
    CREATE INDEX conversations_closed_listed ON conversations ((CASE WHEN strpos(id, '/') > 0 THEN split_part(id, '/', 1) ELSE 'default' END), active_ms DESC, id) WHERE closed;
    "#,
];

/// The schema version this build writes.
pub fn latest() -> i64 {
    MIGRATIONS.len() as i64
}

/// Brings the schema to [`latest`], once across every node that starts at the same time;
/// answers the version found before.
pub async fn migrate(client: &mut Client) -> Result<i64> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS orchestrator_schema (version BIGINT NOT NULL)")
        .await?;
    let found: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM orchestrator_schema",
            &[],
        )
        .await?
        .get(0);
    if found > latest() {
        return Err(Error::SchemaTooNew {
            found,
            supported: latest(),
        });
    }
    for (i, step) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.batch_execute(step).await?;
        tx.execute(
            "INSERT INTO orchestrator_schema (version) VALUES ($1)",
            &[&(i as i64 + 1)],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    /// PostgreSQL uses the partial index only for a query that names its predicate in the same
    /// words: the catch-up under the locks says [`super::super::statements::MARKED`].
    #[test]
    fn the_marked_index_is_named_as_the_catch_up_names_it() {
        let step = super::MIGRATIONS[5];
        assert!(step.contains("CREATE INDEX events_marked"));
        assert!(step.contains(&format!("WHERE {};", super::super::statements::MARKED)));
    }
}
