//! The PostgreSQL backend: several nodes share one database.
//!
//! Reads and tokens go through a pool ([`deadpool_postgres`]); the writer thread owns one
//! connection of its own ([`PgWriter`]), on which each batch is one transaction. The
//! (conversation, seq) primary key is each conversation's compare-and-set: a batch inserts the
//! seqs that follow the head it decided on, so it commits only if no other node appended to
//! any of its conversations since ([`Error::Conflict`] otherwise: nothing is written, and the
//! writer catches up and runs the batch again). Every conversation a batch writes is locked
//! (a transaction advisory lock on its number, taken in the order of the numbers, so that two
//! nodes never wait on each other in a circle) before the batch decides, or with its commit when
//! it has nothing to read first, so that its writers take turns; what the log has past the
//! writer's view of those another node wrote lately is read once the locks are held. The commit
//! inserts the events, marks the conversations it closes, records the commit and notifies the
//! other nodes (`pg_notify`, ids and heads only) in the same transaction.
//! `synchronous_commit=on`: the commit is durable when it returns, so [`Durability::sync`] has
//! nothing left to do. Two batches may be in flight on the writer's connection, the second's
//! COMMIT held back until the first's has succeeded ([`LogWriter::send`]).
//! ARCHITECTURE.md ("Several nodes") has the argument for why no interleaving of two nodes
//! breaks an invariant.
//!
//! The storage traits are synchronous (the writer is a thread of its own); this backend runs
//! its async driver on a small runtime of its own and waits for it, so that it can be called
//! from any thread that may block. The writer's connection, and its reader's, run instead on
//! their own thread, which drives them whenever it waits (`writer.rs`, `Driver`).

mod closed;
mod driver;
mod listen;
pub mod migrations;
mod principals;
mod rows;
mod statements;
mod writer;

use std::sync::OnceLock;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use proto_spec::Event;
use tokio_postgres::{Client, NoTls};

use super::{
    Changed, Claimed, ConvListing, ConversationRecord, LogWriter, RecoveredEvent, Store, TurnKey,
};
use crate::engine::error::{Error, Result};
pub use rows::event_from;
pub use statements::CONV_LOCK_KEY;
pub use writer::PgWriter;

/// The channel every node listens on: each commit notifies it with the numbers and new heads
/// of the conversations it wrote (`num:head,…`), or `*` when they do not fit in a notification.
pub const CHANNEL: &str = "orchestrator_events";
/// Past this a notification says `*` ("look at everything you follow") instead of listing
/// conversations: PostgreSQL refuses payloads of 8,000 bytes or more.
const NOTIFY_MAX: usize = 7_000;
/// The longest any one call to the database may take before the caller gets an error (a
/// database that does not answer must not hold the writer, or a caller, for ever).
pub const DB_TIMEOUT: Duration = Duration::from_secs(10);
/// How far back a node looks for conversations written by others when it polls (a
/// notification may be lost while its listening connection is down): longer than any batch's
/// transaction and any difference between the nodes' clocks.
pub const LATELY: Duration = Duration::from_secs(30);
/// Connections the pool keeps for reads and tokens.
const POOL_SIZE: usize = 16;
/// Conversation numbers fetched from the sequence at a time.
const NUMS_AHEAD: i64 = 64;

/// The runtime the driver runs on: two threads of its own, started on first use.
fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("postgres")
            .enable_all()
            .build()
            .ok()
    })
    .as_ref()
    .ok_or_else(|| Error::Setup("could not start the PostgreSQL driver's runtime".into()))
}

/// Runs `fut` on the driver's runtime and waits for it (at most [`DB_TIMEOUT`]).
pub(crate) fn block<T: Send + 'static>(
    fut: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime()?.spawn(async move {
        let _ = tx.send(within_timeout(fut).await);
    });
    rx.recv()
        .map_err(|_| Error::Setup("the PostgreSQL driver's runtime stopped".into()))?
}

/// What the writer calls once a batch in flight has its answer.
pub(crate) type Wake = std::sync::Arc<dyn Fn() + Send + Sync>;

/// `fut`'s answer, or an error once it has taken [`DB_TIMEOUT`].
async fn within_timeout<T>(fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(DB_TIMEOUT, fut).await {
        Ok(out) => out,
        Err(_) => Err(Error::Unavailable(format!(
            "the database did not answer within {} s",
            DB_TIMEOUT.as_secs()
        ))),
    }
}

/// Whether `db` names a PostgreSQL database rather than a SQLite file.
pub fn is_url(db: &str) -> bool {
    db.starts_with("postgres://") || db.starts_with("postgresql://")
}

/// The URL without its password, for messages and logs.
pub fn redacted(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

/// How long PostgreSQL keeps a session of the orchestrator's that is idle inside a transaction
/// before it ends it. A writer's transaction never waits on anything but the database (its lock,
/// insert and commit follow each other within milliseconds), so a session idle that long in one
/// belongs to a node cut off from the database mid-batch: ending it lets go of the rows the
/// batch locked, which other nodes' writes to those conversations would otherwise wait for as
/// long as the dead connection looks open to PostgreSQL (with a stalled network, for hours).
/// The same as a turn claim's lease ([`crate::engine::turns::cluster::LEASE`]).
pub const IDLE_IN_TRANSACTION: &str = "2s";

/// Connects one client, its connection driven on the driver's runtime; every session of the
/// orchestrator commits with `synchronous_commit=on`, whatever the database's default, and is
/// ended by PostgreSQL when idle in a transaction for [`IDLE_IN_TRANSACTION`].
async fn connect(config: &tokio_postgres::Config) -> Result<Client> {
    let (client, conn) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "a PostgreSQL connection ended");
        }
    });
    client
        .batch_execute(&format!(
            "SET synchronous_commit = on; SET application_name = 'orchestrator'; \
             SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION}'"
        ))
        .await?;
    Ok(client)
}

/// The PostgreSQL store: a pool of connections for reads and tokens, and what the writer
/// connects with.
pub struct PgStore {
    url: String,
    config: tokio_postgres::Config,
    pool: Pool,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("url", &redacted(&self.url))
            .finish()
    }
}

impl PgStore {
    /// Connects to the database at `url` and migrates its schema to this build's (once across
    /// nodes that start together).
    pub fn open(url: &str) -> Result<PgStore> {
        let config: tokio_postgres::Config = url.parse().map_err(|e| {
            Error::Setup(format!(
                "{} is not a PostgreSQL URL ({e}); expected postgres://USER[:PASSWORD]@HOST:PORT/DATABASE",
                redacted(url)
            ))
        })?;
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| Error::Setup(format!("the PostgreSQL pool: {e}")))?;
        let c = config.clone();
        block(async move {
            let mut client = connect(&c).await?;
            migrations::migrate(&mut client).await.map(|_| ())
        })
        .map_err(|e| match e {
            Error::Postgres(p) => Error::Unavailable(format!(
                "could not use the database at {}: {p}",
                redacted(url)
            )),
            other => other,
        })?;
        Ok(PgStore {
            url: url.to_string(),
            config,
            pool,
        })
    }

    /// Runs `f` with a pooled client on the driver's runtime.
    fn with_client<T, F, Fut>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(deadpool_postgres::Object) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send,
    {
        let pool = self.pool.clone();
        block(async move {
            let client = pool.get().await.map_err(pool_error)?;
            f(client).await
        })
    }
}

fn pool_error(e: deadpool_postgres::PoolError) -> Error {
    match e {
        deadpool_postgres::PoolError::Backend(e) => Error::Postgres(e),
        other => Error::Unavailable(format!("no connection to the database: {other}")),
    }
}

impl Store for PgStore {
    fn writer(&self) -> Result<Box<dyn LogWriter>> {
        Ok(Box::new(PgWriter::open(self.config.clone())?))
    }

    fn recover(&self, each: &mut dyn FnMut(ConversationRecord, Vec<RecoveredEvent>)) -> Result<()> {
        // Nothing before serving: the writer takes the open conversations in after the start
        // (`LogWriter::open_after`), and any conversation when a client first names it.
        let _ = each;
        Ok(())
    }

    fn closed_ids(&self, agent: Option<&str>) -> Result<Vec<String>> {
        let agent = agent.map(str::to_string);
        self.with_client(move |c| async move {
            // Two statements, each of which the partial index of closed conversations serves
            // (one with an optional agent is planned once for both, as a scan of every one).
            let rows = match &agent {
                None => {
                    c.query("SELECT id FROM conversations WHERE closed ORDER BY num", &[])
                        .await?
                }
                Some(a) => {
                    c.query(
                        "SELECT id FROM conversations WHERE closed AND participants ? $1 ORDER BY num",
                        &[a],
                    )
                    .await?
                }
            };
            Ok(rows.iter().map(|r| r.get::<_, String>(0)).collect())
        })
    }

    fn closed_page(
        &self,
        query: &crate::engine::store::ClosedQuery,
    ) -> Result<Vec<crate::engine::store::ClosedRow>> {
        self.read_closed_page(query)
    }

    fn read_events(&self, conversation: &str, after: u64, limit: usize) -> Result<Vec<Event>> {
        let id = conversation.to_string();
        let rows = self.with_client(move |c| async move {
            let st = c
                .prepare_cached(
                    "SELECT e.seq, e.kind, e.author, e.turn, e.finality, e.payload, e.client_request_id, e.ts_ms
                     FROM events e JOIN conversations c ON c.num = e.conv
                     WHERE c.id = $1 AND e.seq > $2 ORDER BY e.seq LIMIT $3",
                )
                .await?;
            Ok(c.query(&st, &[&id, &(after as i64), &(limit as i64)])
                .await?)
        })?;
        rows.iter().map(|r| event_from(conversation, r)).collect()
    }

    fn list_conversations(&self) -> Result<Vec<ConvListing>> {
        let rows = self.with_client(move |c| async move {
            Ok(c.query(
                "SELECT c.id, c.participants::text, c.created_by, e.seq, e.ts_ms, c.closed \
                 FROM conversations c LEFT JOIN LATERAL \
                   (SELECT seq, ts_ms FROM events WHERE conv = c.num ORDER BY seq DESC LIMIT 1) e ON true \
                 ORDER BY c.num",
                &[],
            )
            .await?)
        })?;
        rows.iter()
            .map(|r| {
                let participants: String = r.get(1);
                Ok(ConvListing {
                    conversation_id: r.get(0),
                    participants: serde_json::from_str(&participants)
                        .map_err(|e| Error::Corrupt(e.to_string()))?,
                    created_by: r.get(2),
                    latest_seq: r.get::<_, Option<i64>>(3).unwrap_or(0) as u64,
                    last_ms: r.get(4),
                    closed: r.get(5),
                })
            })
            .collect()
    }

    fn follow(&self, changed: Changed) -> Result<()> {
        runtime()?.spawn(listen::listen(self.config.clone(), changed));
        Ok(())
    }

    fn shared(&self) -> bool {
        true
    }

    fn claim_turn(&self, turn: &TurnKey, holder: &str, lease: Duration) -> Result<Claimed> {
        let (key, holder, lease_ms) = (turn.clone(), holder.to_string(), lease.as_millis() as i64);
        self.with_client(move |c| async move {
            let turn = key.turn as i64;
            let granted = c
                .query_opt(
                    "WITH now AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS ms)
                     INSERT INTO turn_claims (conversation_id, turn, holder, fence, lease_until_ms)
                     SELECT $1, $2, $3, nextval('turn_fence'), ms + $4 FROM now
                     ON CONFLICT (conversation_id, turn) DO UPDATE
                       SET fence = CASE WHEN turn_claims.holder = EXCLUDED.holder
                                        THEN turn_claims.fence ELSE EXCLUDED.fence END,
                           holder = EXCLUDED.holder,
                           lease_until_ms = EXCLUDED.lease_until_ms
                       WHERE turn_claims.holder = EXCLUDED.holder
                          OR turn_claims.lease_until_ms < EXCLUDED.lease_until_ms - $4
                     RETURNING fence",
                    &[&key.conversation_id, &turn, &holder, &lease_ms],
                )
                .await?;
            if let Some(row) = granted {
                return Ok(Claimed::Granted { fence: row.get(0) });
            }
            let left: Option<i64> = c
                .query_opt(
                    "SELECT lease_until_ms - (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                     FROM turn_claims WHERE conversation_id = $1 AND turn = $2",
                    &[&key.conversation_id, &turn],
                )
                .await?
                .map(|r| r.get(0));
            Ok(Claimed::Held {
                left_ms: left.unwrap_or(0).max(0),
            })
        })
    }

    fn renew_turns(
        &self,
        holder: &str,
        held: &[(TurnKey, i64)],
        lease: Duration,
    ) -> Result<Vec<bool>> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let convs: Vec<String> = held
            .iter()
            .map(|(k, _)| k.conversation_id.clone())
            .collect();
        let turns: Vec<i64> = held.iter().map(|(k, _)| k.turn as i64).collect();
        let fences: Vec<i64> = held.iter().map(|(_, f)| *f).collect();
        let (holder, lease_ms) = (holder.to_string(), lease.as_millis() as i64);
        let kept = self.with_client(move |c| async move {
            let rows = c
                .query(
                    // Rows locked in the order a batch's fence check locks them (conversation,
                    // turn), so that the two never wait on each other in a circle.
                    "WITH mine AS (
                       SELECT t.conversation_id, t.turn FROM turn_claims t
                       JOIN unnest($2::text[], $3::bigint[], $4::bigint[]) AS u(c, n, f)
                         ON t.conversation_id = u.c AND t.turn = u.n AND t.fence = u.f
                       WHERE t.holder = $1 OR t.holder LIKE $1 || '/%'
                       ORDER BY 1, 2 FOR UPDATE OF t)
                     UPDATE turn_claims t
                     SET lease_until_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $5
                     FROM mine m
                     WHERE t.conversation_id = m.conversation_id AND t.turn = m.turn
                     RETURNING t.fence",
                    &[&holder, &convs, &turns, &fences, &lease_ms],
                )
                .await?;
            Ok(rows.iter().map(|r| r.get::<_, i64>(0)).collect::<std::collections::HashSet<i64>>())
        })?;
        Ok(held.iter().map(|(_, f)| kept.contains(f)).collect())
    }

    fn release_turns(&self, holder: &str) -> Result<()> {
        let holder = holder.to_string();
        self.with_client(move |c| async move {
            // The node's own claims, and its push replicas' (`node/claim`).
            c.execute(
                "WITH mine AS (
                   SELECT conversation_id, turn FROM turn_claims
                   WHERE holder = $1 OR holder LIKE $1 || '/%'
                   ORDER BY 1, 2 FOR UPDATE)
                 UPDATE turn_claims t SET lease_until_ms = 0 FROM mine m
                 WHERE t.conversation_id = m.conversation_id AND t.turn = m.turn",
                &[&holder],
            )
            .await?;
            Ok(())
        })
    }
}
