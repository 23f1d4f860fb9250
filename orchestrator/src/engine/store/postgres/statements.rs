//! The writer's statements: their SQL, and their preparation once per connection.

use tokio_postgres::{Client, Statement};

use crate::engine::error::Result;

/// The columns of an event read back for the state machine (the payload of system events,
/// and of messages marked as possible plans or deliverables, which the state numbers), in the
/// order `rows::recovered_from` reads them.
pub const RECOVER_COLUMNS: &str = "seq, kind, author, turn, finality, \
     CASE WHEN kind = 'system' OR doc THEN payload END, client_request_id, request_hash, ts_ms";

/// The same columns with every payload: events caught up on from other nodes are published
/// to readers here, so they must be whole.
pub const CATCH_UP_COLUMNS: &str =
    "seq, kind, author, turn, finality, payload, client_request_id, request_hash, ts_ms";

/// The events that move a conversation's state past its head, as the partial index
/// `events_marked` (schema version 6) names them: a query must say it in these words for
/// PostgreSQL to use the index.
pub const MARKED: &str = "kind = 'system' OR author = 'orchestrator' OR finality IN ('turn', 'conversation') OR client_request_id IS NOT NULL OR doc";

/// A conversation's lock key, from its number `n`: two 32-bit keys (numbers below 2^62 map one
/// to one), a space of PostgreSQL's advisory locks apart from the one-key locks on ids and on
/// the migration.
pub const CONV_LOCK_KEY: &str = "(n / 2147483648)::int4, (n % 2147483648)::int4";

/// The writer's statements, prepared once per connection.
pub struct Statements {
    pub lock_ids: Statement,
    pub existing_ids: Statement,
    pub lock_convs: Statement,
    pub try_lock_convs: Statement,
    pub claim_turns: Statement,
    pub lock_fences: Statement,
    pub read_many: Statement,
    pub read_marked: Statement,
    pub read_heads: Statement,
    pub find_conv: Statement,
    pub open_among: Statement,
    pub open_after: Statement,
    pub events_of: Statement,
    pub whole_events_of: Statement,
    pub changed_since: Statement,
    pub take_nums: Statement,
    pub insert_convs: Statement,
    pub declare: Statement,
    pub insert_events: Statement,
    pub close_convs: Statement,
    pub check_convs: Statement,
    pub notify: Statement,
    pub record_commit: Statement,
}

impl Statements {
    /// Prepares every statement on `c`.
    pub async fn prepare(c: &Client) -> Result<Statements> {
        Ok(Statements {
            lock_ids: c.prepare(LOCK_IDS).await?,
            existing_ids: c.prepare(EXISTING_IDS).await?,
            lock_convs: c.prepare(&lock_convs_sql()).await?,
            try_lock_convs: c.prepare(&try_lock_convs_sql()).await?,
            claim_turns: c.prepare(CLAIM_TURNS).await?,
            lock_fences: c.prepare(LOCK_FENCES).await?,
            read_many: c.prepare(&read_many_sql()).await?,
            read_marked: c.prepare(&read_marked_sql()).await?,
            read_heads: c.prepare(READ_HEADS).await?,
            find_conv: c.prepare(FIND_CONV).await?,
            open_among: c.prepare(OPEN_AMONG).await?,
            open_after: c.prepare(OPEN_AFTER).await?,
            events_of: c.prepare(&events_of_sql()).await?,
            whole_events_of: c.prepare(&whole_events_of_sql()).await?,
            changed_since: c.prepare(CHANGED_SINCE).await?,
            take_nums: c.prepare(TAKE_NUMS).await?,
            insert_convs: c.prepare(INSERT_CONVS).await?,
            declare: c.prepare(DECLARE).await?,
            insert_events: c.prepare(INSERT_EVENTS).await?,
            close_convs: c.prepare(&close_convs_sql()).await?,
            check_convs: c.prepare(CHECK_CONVS).await?,
            notify: c.prepare(&notify_sql()).await?,
            record_commit: c.prepare(RECORD_COMMIT).await?,
        })
    }
}

const LOCK_IDS: &str = "SELECT pg_advisory_xact_lock(h) FROM \
                     (SELECT DISTINCT hashtextextended(i, 0) AS h FROM unnest($1::text[]) i ORDER BY 1) l";

const EXISTING_IDS: &str = "SELECT id FROM conversations WHERE id = ANY($1::text[])";

/// A conversation's lock is a transaction advisory lock on its number (in the
/// two-key space, apart from the ids' one-key locks): no tuple written, no WAL, held
/// until the transaction ends, taken in the order of the numbers. Only the locks
/// (waiting for another node's batch that holds one): the events past the writer's
/// view are read by the next statement, whose snapshot is taken once these are held,
/// so that it sees what that batch committed.
fn lock_convs_sql() -> String {
    format!(
        "SELECT pg_advisory_xact_lock({CONV_LOCK_KEY}) FROM \
                     (SELECT DISTINCT n FROM unnest($1::bigint[]) n ORDER BY 1) l"
    )
}

/// The same, each only if no other transaction holds it: answers those it took.
fn try_lock_convs_sql() -> String {
    format!(
        "SELECT n FROM (SELECT DISTINCT n FROM unnest($1::bigint[]) n ORDER BY 1) l \
                     WHERE pg_try_advisory_xact_lock({CONV_LOCK_KEY})"
    )
}

/// A turn the batch opens, for the node that runs it (as `claim_turn` grants one,
/// by the database's clock); one that is claimed already is left as it is.
const CLAIM_TURNS: &str =
    "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms)
                     INSERT INTO turn_claims (conversation_id, turn, holder, fence, lease_until_ms)
                     SELECT u.c, u.t, $3, nextval('turn_fence'), now.ms + $4
                     FROM unnest($1::text[], $2::bigint[]) AS u(c, t), now
                     ON CONFLICT (conversation_id, turn) DO NOTHING
                     RETURNING conversation_id, turn, fence";

const LOCK_FENCES: &str = "SELECT t.conversation_id, t.turn, t.fence FROM turn_claims t
                     JOIN unnest($1::text[], $2::bigint[]) AS u(c, n) ON t.conversation_id = u.c AND t.turn = u.n
                     ORDER BY 1, 2 FOR SHARE OF t";

/// One index range per conversation (`OFFSET 0` keeps the planner from making it a
/// join, which it would run as a scan of the whole log).
fn read_many_sql() -> String {
    format!(
        "SELECT u.n, e.* FROM unnest($1::bigint[], $2::bigint[]) AS u(n, after) \
                     CROSS JOIN LATERAL (SELECT {CATCH_UP_COLUMNS} FROM events \
                       WHERE conv = u.n AND seq > u.after ORDER BY seq OFFSET 0) e \
                     ORDER BY 1, 2"
    )
}

/// Under the locks: every event past the view of the conversations whose every
/// event is needed or that have a marked one past the view ...
fn read_marked_sql() -> String {
    format!(
                    "SELECT u.n, e.* FROM unnest($1::bigint[], $2::bigint[], $3::bool[]) AS u(n, after, whole) \
                     CROSS JOIN LATERAL (SELECT {CATCH_UP_COLUMNS} FROM events \
                       WHERE conv = u.n AND seq > u.after ORDER BY seq OFFSET 0) e \
                     WHERE u.whole OR EXISTS (SELECT 1 FROM events m \
                       WHERE m.conv = u.n AND m.seq > u.after AND ({MARKED})) \
                     ORDER BY 1, 2"
                )
}

/// ... and of the others, the last event's seq and time (one index entry each).
const READ_HEADS: &str =
    "SELECT u.n, l.seq, l.ts_ms FROM unnest($1::bigint[], $2::bigint[]) AS u(n, after) \
                     CROSS JOIN LATERAL (SELECT seq, ts_ms FROM events \
                       WHERE conv = u.n AND seq > u.after ORDER BY seq DESC LIMIT 1) l";

const FIND_CONV: &str = "SELECT num, id, created_by, participants::text, metadata::text FROM conversations WHERE id = $1";

const OPEN_AMONG: &str =
    "SELECT num, id, created_by, participants::text, metadata::text FROM conversations \
                     WHERE num = ANY($1::bigint[]) AND NOT closed ORDER BY num";

/// The open conversations a node takes in after it starts, a slice at a time (the
/// partial index on the open ones).
const OPEN_AFTER: &str =
    "SELECT num, id, created_by, participants::text, metadata::text FROM conversations \
                     WHERE NOT closed AND num > $1 ORDER BY num LIMIT $2";

fn events_of_sql() -> String {
    format!(
                    "SELECT conv, {RECOVER_COLUMNS} FROM events WHERE conv = ANY($1::bigint[]) ORDER BY conv, seq"
                )
}

fn whole_events_of_sql() -> String {
    format!(
                    "SELECT conv, {CATCH_UP_COLUMNS} FROM events WHERE conv = ANY($1::bigint[]) ORDER BY conv, seq"
                )
}

/// Folded in the database: each conversation written lately, once, with its
/// latest head (not every batch's text to the writer thread).
/// A head of 0 says the conversation was deleted
/// ([`crate::engine::store::DELETED_HEAD`]): it wins.
const CHANGED_SINCE: &str =
    "SELECT n, CASE WHEN min(h) = 0 THEN 0 ELSE max(h) END \
                     FROM (SELECT split_part(p, ':', 1)::bigint AS n, split_part(p, ':', 2)::bigint AS h \
                           FROM commits, unnest(string_to_array(heads, ',')) AS p WHERE at_ms > $1) c \
                     GROUP BY 1";

/// Fails the batch's transaction if a conversation it writes was deleted (by another node,
/// after this one last looked): the error names it (`deleted:NUM`, [`deleted_num`]).
const CHECK_CONVS: &str = "SELECT ('deleted:' || n)::bigint FROM unnest($1::bigint[]) n \
                     WHERE NOT EXISTS (SELECT 1 FROM conversations c WHERE c.num = n)";

/// The conversation number the error of [`CHECK_CONVS`] names (`… "deleted:NUM"`).
pub fn deleted_num(error: &str) -> Option<i64> {
    let (_, rest) = error.split_once("\"deleted:")?;
    rest.split('"').next()?.parse().ok()
}

const TAKE_NUMS: &str = "SELECT nextval('conversation_num') FROM generate_series(1, $1::bigint)";

const INSERT_CONVS: &str = "INSERT INTO conversations (num, id, created_by, participants, metadata) \
                     SELECT n, i, b, p::jsonb, m::jsonb \
                     FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(n, i, b, p, m)";

const DECLARE: &str = "INSERT INTO declared_agents (agent_id) \
                     SELECT a FROM unnest($1::text[]) a ORDER BY 1 ON CONFLICT DO NOTHING";

/// The arrays are unnested in the select list (all of one length, so they go in
/// step), not in FROM: there `unnest` first copies the batch into a tuplestore, row
/// by row, before the insert reads it back (~1.5 µs a row; BENCHMARKS.md).
const INSERT_EVENTS: &str = "INSERT INTO events (conv, seq, kind, author, turn, finality, payload, client_request_id, request_hash, ts_ms, doc) \
                     SELECT unnest($1::bigint[]), unnest($2::bigint[]), unnest($3::text[]), unnest($4::text[]), \
                            unnest($5::bigint[]), unnest($6::text[]), unnest($7::text[]), unnest($8::text[]), \
                            unnest($9::bytea[]), unnest($10::bigint[]), unnest($11::boolean[])";

/// Runs after the batch's events are inserted: it reads them ([`super::closed::CLOSED_PLACE`]).
fn close_convs_sql() -> String {
    format!(
        "UPDATE conversations c SET closed = true, {} WHERE num = ANY($1::bigint[])",
        super::closed::CLOSED_PLACE
    )
}

fn notify_sql() -> String {
    format!("SELECT pg_notify('{}', $1)", super::CHANNEL)
}

const RECORD_COMMIT: &str = "INSERT INTO commits (at_ms, heads) VALUES ($1, $2)";
