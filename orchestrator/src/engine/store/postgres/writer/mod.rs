//! The writer thread's side of the PostgreSQL backend: one connection of its own, one
//! transaction per batch (locks, reads under them, the commit that inserts, records and
//! notifies).
//!
//! The connection is driven on the writer's own thread ([`Driver`]): a statement goes from the
//! writer to the socket and its answer from the socket to the writer with no other thread
//! between. Through the driver's shared runtime each round trip was four wake-ups of threads
//! (the writer's and a runtime worker's, each way), which on a busy machine wait their turn for
//! a core while the batch's locks are held (BENCHMARKS.md, "What PostgreSQL's sessions wait
//! on").

use std::future::Future;
use std::sync::Arc;

use tokio_postgres::Client;

use super::driver::{Driver, Launched};

mod delete;
mod lock;

use super::{connect, rows, statements, Wake, LATELY, NUMS_AHEAD};
use crate::engine::error::{Error, Result};
use crate::engine::store::{
    now_ms, ConversationRecord, Durability, Locked, LogWriter, NewConversation, NewRow,
    RecoveredEvent, ToLock, TurnKey,
};

/// The writer's connection and the statements prepared on it.
struct WriterConn {
    client: Arc<Client>,
    st: Arc<statements::Statements>,
}

impl std::fmt::Debug for WriterConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterConn")
            .field("closed", &self.client.is_closed())
            .finish()
    }
}

/// The writer thread's side: one connection, one transaction per batch.
pub struct PgWriter {
    config: tokio_postgres::Config,
    /// The runtime the connection runs on, made on the thread that first uses it (the writer's;
    /// a runtime of the current thread cannot be waited on from inside another runtime).
    driver: Option<Driver>,
    conn: Option<WriterConn>,
    /// Conversation numbers taken from the sequence and not used yet.
    nums: Vec<i64>,
    /// Whether a batch's transaction is open (begun by [`LogWriter::lock`]).
    in_tx: bool,
    /// The conversations the next commit locks before it writes (a batch that had nothing to
    /// read or check before deciding: one round trip fewer).
    lock_at_commit: Vec<i64>,
    /// The turns the next commit claims ([`LogWriter::claim_with_commit`]).
    claims: Option<rows::Claims>,
    /// What the last commit claimed, with the fences.
    granted: Vec<(TurnKey, i64)>,
    /// Batches sent and not answered yet ([`LogWriter::send`]), oldest first; only the last
    /// may be without its COMMIT.
    in_flight: std::collections::VecDeque<InFlight>,
    /// Called once a batch in flight has its answer ([`LogWriter::on_landed`]).
    wake: Option<Wake>,
}

impl std::fmt::Debug for PgWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgWriter")
            .field("conn", &self.conn)
            .field("in_tx", &self.in_tx)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// A batch sent without waiting for it.
struct InFlight {
    /// The connection it was sent on (its COMMIT or ROLLBACK goes there).
    client: Arc<Client>,
    /// Its statements' answer: the claims it made.
    writes: Launched<Vec<(TurnKey, i64)>>,
    /// That answer once taken: at once when it came before the statements were all sent (one
    /// failed as it was sent, or its answer came back while the rest were being sent: such a
    /// batch is never committed, see `send_commit`), or by [`LogWriter::landed`].
    early: Option<Result<Vec<(TurnKey, i64)>>>,
    /// Its COMMIT's, once sent.
    commit: Option<Launched<()>>,
    /// Whether it was sent with its COMMIT (its writes' answer is then the last to come).
    whole: bool,
    /// Its COMMIT's answer, once taken by [`LogWriter::landed`].
    committed: Option<Result<()>>,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("committing", &self.commit.is_some())
            .finish()
    }
}

impl PgWriter {
    /// A writer on a connection of its own to the database `config` names, made when the
    /// writer's thread first uses it (the store has connected already: a database that cannot
    /// be reached fails its opening).
    pub(super) fn open(config: tokio_postgres::Config) -> Result<PgWriter> {
        Ok(PgWriter {
            config,
            driver: None,
            conn: None,
            nums: Vec::new(),
            in_tx: false,
            lock_at_commit: Vec::new(),
            claims: None,
            granted: Vec::new(),
            in_flight: Default::default(),
            wake: None,
        })
    }

    fn driver(&mut self) -> Result<&Driver> {
        if self.driver.is_none() {
            self.driver = Some(Driver::new()?);
        }
        self.driver
            .as_ref()
            .ok_or_else(|| Error::Setup("the writer's PostgreSQL runtime".into()))
    }

    /// The connection, made again if it was lost (a batch's transaction never spans two).
    fn conn(&mut self) -> Result<(Arc<Client>, Arc<statements::Statements>)> {
        if let (Some(c), Some(d)) = (&self.conn, &self.driver) {
            if !c.client.is_closed() && !self.in_tx && self.in_flight.is_empty() {
                // The connection runs only while this thread waits on it: one that ended while
                // the writer was idle (the database restarted, the network failed) is seen
                // ending here, and made again, rather than failing the batch's first statement.
                d.settle();
            }
        }
        if let Some(c) = &self.conn {
            if !c.client.is_closed() {
                return Ok((c.client.clone(), c.st.clone()));
            }
            self.in_tx = false;
        }
        let config = self.config.clone();
        let (client, st) = self.driver()?.block(async move {
            let client = connect(&config).await?;
            let st = statements::Statements::prepare(&client).await?;
            Ok((Arc::new(client), Arc::new(st)))
        })?;
        self.conn = Some(WriterConn {
            client: client.clone(),
            st: st.clone(),
        });
        Ok((client, st))
    }

    /// Runs `f` on the writer's connection; a failure ends the open transaction (the server
    /// rolls it back) and drops a connection that is no longer usable.
    fn run<T, F, Fut>(&mut self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Client>, Arc<statements::Statements>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<T>> + Send,
    {
        let (client, st) = self.conn()?;
        let out = self.driver()?.block(f(client, st));
        if out.is_err() {
            self.abort();
        }
        out
    }

    /// After a failed call: ends whatever transaction it left open (a batch's lock is sent
    /// with its BEGIN, so the server may hold an aborted transaction the writer never saw
    /// begin: every later statement would fail until it is ended), or drops the connection when
    /// even that fails (the server then rolls it back itself).
    fn abort(&mut self) {
        self.in_tx = false;
        self.lock_at_commit.clear();
        self.claims = None;
        self.end_tx();
    }

    /// Rolls back whatever transaction the connection holds, or drops the connection when even
    /// that fails (the server then rolls it back itself).
    fn end_tx(&mut self) {
        let Some(c) = &self.conn else { return };
        if c.client.is_closed() {
            self.conn = None;
            return;
        }
        let client = c.client.clone();
        let rolled_back = match &self.driver {
            Some(d) => d.block(async move { Ok(client.batch_execute("ROLLBACK").await?) }),
            None => Err(Error::Setup("no runtime".into())),
        };
        if rolled_back.is_err() {
            self.conn = None;
        }
    }
}

/// Which conversations [`PgWriter::with_their_events`] reads.
enum Which {
    /// The one of this id, open or closed.
    Id(String),
    /// The open ones numbered after the first, at most the second.
    OpenAfter(i64, i64),
    /// Those of these numbers that are open.
    Open(Vec<i64>),
}

impl PgWriter {
    /// Conversations and their events, in one snapshot (outside a batch): for the sweep after
    /// the start, the payloads of messages left out (nothing is published of them); for a
    /// conversation named here or written by other nodes, every payload (what is taken in is
    /// published).
    fn with_their_events(
        &mut self,
        which: Which,
    ) -> Result<Vec<(ConversationRecord, Vec<RecoveredEvent>)>> {
        let in_tx = self.in_tx;
        let (convs, events) = self.run(move |c, st| async move {
            if !in_tx {
                c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await?;
            }
            let (convs, events_of) = match &which {
                Which::Id(id) => (c.query(&st.find_conv, &[id]).await?, &st.whole_events_of),
                Which::OpenAfter(after, limit) => (
                    c.query(&st.open_after, &[after, limit]).await?,
                    &st.events_of,
                ),
                Which::Open(nums) => (c.query(&st.open_among, &[nums]).await?, &st.whole_events_of),
            };
            let nums: Vec<i64> = convs.iter().map(|r| r.get(0)).collect();
            let events = match nums.is_empty() {
                true => Vec::new(),
                false => c.query(events_of, &[&nums]).await?,
            };
            if !in_tx {
                c.batch_execute("COMMIT").await?;
            }
            Ok((convs, events))
        })?;
        rows::with_events(&convs, events)
    }
}

impl LogWriter for PgWriter {
    fn lock(&mut self, asked: &ToLock<'_>) -> Result<Locked> {
        self.lock_and_read(asked)
    }

    fn read_many(&mut self, from: &[(i64, u64)]) -> Result<Vec<(i64, Vec<RecoveredEvent>)>> {
        let nums: Vec<i64> = from.iter().map(|f| f.0).collect();
        let after: Vec<i64> = from.iter().map(|f| f.1 as i64).collect();
        let rows = self
            .run(move |c, st| async move { Ok(c.query(&st.read_many, &[&nums, &after]).await?) })?;
        rows::by_conversation(&rows)
    }

    fn load(&mut self, id: &str) -> Result<Option<(ConversationRecord, Vec<RecoveredEvent>)>> {
        Ok(self
            .with_their_events(Which::Id(id.to_string()))?
            .into_iter()
            .next())
    }

    fn load_open(
        &mut self,
        nums: &[i64],
    ) -> Result<Vec<(ConversationRecord, Vec<RecoveredEvent>)>> {
        self.with_their_events(Which::Open(nums.to_vec()))
    }

    fn open_after(
        &mut self,
        after: i64,
        limit: i64,
    ) -> Result<Vec<(ConversationRecord, Vec<RecoveredEvent>)>> {
        self.with_their_events(Which::OpenAfter(after, limit))
    }

    fn changed_lately(&mut self) -> Result<Vec<(i64, u64)>> {
        let since = now_ms() - LATELY.as_millis() as i64;
        self.run(move |c, st| async move {
            Ok(c.query(&st.changed_since, &[&since])
                .await?
                .iter()
                .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1) as u64))
                .collect())
        })
    }

    fn release(&mut self) -> Result<()> {
        self.lock_at_commit.clear();
        self.claims = None;
        if !std::mem::replace(&mut self.in_tx, false) {
            return Ok(());
        }
        self.run(|c, _| async move { Ok(c.batch_execute("COMMIT").await?) })
    }

    fn commit(&mut self, convs: &[NewConversation], rows: &[NewRow<'_>]) -> Result<()> {
        debug_assert!(
            self.in_flight.is_empty(),
            "a commit behind batches in flight"
        );
        let batch = rows::Batch::new(convs, rows);
        let began = std::mem::replace(&mut self.in_tx, false);
        let lock = std::mem::take(&mut self.lock_at_commit);
        let claims = self.claims.take();
        self.granted.clear();
        let granted = self
            .run(move |c, st| async move {
                batch
                    .write(&c, &st, !began, &lock, claims.as_ref(), true)
                    .await
            })
            .map_err(refused)?;
        self.granted = granted;
        Ok(())
    }

    fn overlaps(&self) -> bool {
        true
    }

    fn on_landed(&mut self, wake: Box<dyn Fn() + Send + Sync>) {
        self.wake = Some(wake.into());
    }

    fn send(&mut self, convs: &[NewConversation], rows: &[NewRow<'_>], commit: bool) -> Result<()> {
        debug_assert!(
            self.in_flight.back().is_none_or(|b| b.commit.is_some()),
            "a batch sent behind one without its COMMIT"
        );
        let batch = rows::Batch::new(convs, rows);
        let began = std::mem::replace(&mut self.in_tx, false);
        let lock = std::mem::take(&mut self.lock_at_commit);
        let claims = self.claims.take();
        let (client, st) = match self.conn() {
            Ok(c) => c,
            Err(e) => {
                self.abort();
                return Err(e);
            }
        };
        let c = client.clone();
        // Woken by the answer that ends it: with its COMMIT, that of its writes.
        let wake = self.wake.clone().filter(|_| commit);
        // Made with the connection (`conn`).
        let Some(driver) = self.driver.as_ref() else {
            self.abort();
            return Err(Error::Setup("the writer's PostgreSQL runtime".into()));
        };
        let mut writes = driver.launch(
            async move {
                batch
                    .write(&c, &st, !began, &lock, claims.as_ref(), commit)
                    .await
            },
            wake,
        );
        let early = writes.try_recv().ok();
        self.in_flight.push_back(InFlight {
            client,
            writes,
            early,
            commit: None,
            whole: commit,
            committed: None,
        });
        if commit {
            // Answered with the writes (the COMMIT was among them).
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _ = tx.send(Ok(()));
            if let Some(b) = self.in_flight.back_mut() {
                b.commit = Some(rx);
            }
        }
        Ok(())
    }

    fn send_commit(&mut self) -> Result<()> {
        // A batch in flight was sent on the driver's connection: the driver is made.
        let (Some(driver), Some(b)) = (
            self.driver.as_ref(),
            self.in_flight.back_mut().filter(|b| b.commit.is_none()),
        ) else {
            return Err(Error::Setup("no batch waits for its COMMIT".into()));
        };
        let c = b.client.clone();
        let wake = self.wake.clone();
        // A batch whose writes failed before they were all sent may hold a transaction some of
        // them began well: it is rolled back, never committed (its outcome is their error).
        let end = match &b.early {
            Some(Err(_)) => "ROLLBACK",
            _ => "COMMIT",
        };
        b.commit = Some(driver.launch(async move { Ok(c.batch_execute(end).await?) }, wake));
        Ok(())
    }

    fn abandon(&mut self) {
        let Some(mut b) = self.in_flight.pop_back() else {
            return;
        };
        debug_assert!(
            b.commit.is_none(),
            "abandoning a batch whose COMMIT was sent"
        );
        let Some(driver) = self.driver.as_ref() else {
            self.conn = None;
            return;
        };
        let c = b.client.clone();
        if driver
            .block(async move { Ok(c.batch_execute("ROLLBACK").await?) })
            .is_err()
        {
            self.conn = None;
        }
        if b.early.is_none() {
            let _ = driver.answer(&mut b.writes);
        }
    }

    fn landed(&mut self) -> bool {
        let Some(b) = self.in_flight.front_mut() else {
            return false;
        };
        if b.whole {
            if b.early.is_none() {
                b.early = b.writes.try_recv().ok();
            }
            return b.early.is_some();
        }
        // Its COMMIT was answered after its writes were (the answer of the writes may still be
        // on its way: `outcome` waits for it).
        if b.committed.is_none() {
            b.committed = b.commit.as_mut().and_then(|rx| rx.try_recv().ok());
        }
        b.committed.is_some()
    }

    fn outcome(&mut self) -> Result<()> {
        let Some(mut b) = self.in_flight.pop_front() else {
            return Err(Error::Setup("no batch in flight".into()));
        };
        self.granted.clear();
        let driver = self.driver()?;
        let writes = match b.early {
            Some(early) => early,
            None => driver.answer(&mut b.writes),
        };
        let committed = match (b.committed, &mut b.commit) {
            (Some(committed), _) => committed,
            (None, Some(rx)) => driver.answer(rx),
            (None, None) => Err(Error::Setup(
                "a batch's outcome asked before its COMMIT".into(),
            )),
        };
        match (writes, committed) {
            (Ok(granted), Ok(())) => {
                self.granted = granted;
                Ok(())
            }
            (Err(e), _) | (Ok(_), Err(e)) => {
                // A statement refused by the server aborted the transaction; an answer that
                // came while the batch was still being sent may have left its COMMIT unsent, so
                // the transaction is ended here (unless a batch is sent behind it, which is
                // rolled back: see `LogWriter::abandon`). Anything else (a lost connection, no
                // answer in time) leaves the connection in a state nothing here knows: it is
                // not used again.
                let answered = matches!(&e, Error::Postgres(p) if p.as_db_error().is_some());
                if !answered {
                    self.conn = None;
                } else if self.in_flight.is_empty() {
                    self.end_tx();
                }
                Err(refused(e))
            }
        }
    }

    fn claim_with_commit(&mut self, holder: &str, turns: Vec<TurnKey>, lease: std::time::Duration) {
        self.claims = (!turns.is_empty()).then(|| rows::Claims::new(holder, turns, lease));
    }

    fn granted(&mut self) -> Vec<(TurnKey, i64)> {
        std::mem::take(&mut self.granted)
    }

    fn conversation_num(&mut self) -> Result<i64> {
        if self.nums.is_empty() {
            let mut nums: Vec<i64> = self.run(|c, st| async move {
                Ok(c.query(&st.take_nums, &[&NUMS_AHEAD])
                    .await?
                    .iter()
                    .map(|r| r.get(0))
                    .collect())
            })?;
            nums.reverse();
            self.nums = nums;
        }
        self.nums.pop().ok_or_else(|| {
            Error::Corrupt("the conversation number sequence answered nothing".into())
        })
    }

    fn durability(&mut self) -> Result<Box<dyn Durability>> {
        Ok(Box::new(Committed))
    }

    fn delete(&mut self, keys: &[String]) -> Result<Vec<String>> {
        self.delete_conversations(keys)
    }

    fn wait_for(&mut self, next: std::pin::Pin<&mut dyn Future<Output = ()>>) {
        match &self.driver {
            Some(d) if tokio::runtime::Handle::try_current().is_err() => d.rt.block_on(next),
            _ => futures::executor::block_on(next),
        }
    }

    fn drives(&self) -> bool {
        true
    }
}

impl Drop for PgWriter {
    fn drop(&mut self) {
        // Whatever thread drops it, without waiting for what still runs there (a runtime
        // dropped inside another's context would panic).
        if let Some(d) = self.driver.take() {
            d.rt.shutdown_background();
        }
    }
}

/// A batch's failure, as the writer is told of it: a seq (or an id) another node wrote first is
/// a conflict (the batch was decided on a view behind the log; nothing of it was written), as
/// is being the one of two batches waiting on each other that the database chose to end.
fn refused(e: Error) -> Error {
    match e {
        Error::Postgres(p)
            if [
                tokio_postgres::error::SqlState::UNIQUE_VIOLATION,
                tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED,
            ]
            .iter()
            .any(|c| p.code() == Some(c)) =>
        {
            Error::Conflict(p.as_db_error().map_or_else(
                || p.to_string(),
                |d| d.detail().unwrap_or(d.message()).to_string(),
            ))
        }
        Error::Postgres(p)
            if p.code() == Some(&tokio_postgres::error::SqlState::INVALID_TEXT_REPRESENTATION) =>
        {
            // `check_convs`: a conversation the batch writes was deleted by another node.
            match p
                .as_db_error()
                .and_then(|d| statements::deleted_num(d.message()))
            {
                Some(num) => Error::Deleted(num),
                None => Error::Postgres(p),
            }
        }
        other => other,
    }
}

/// A PostgreSQL commit is durable when it returns (`synchronous_commit=on`).
struct Committed;

impl Durability for Committed {
    fn sync(&mut self) -> Result<()> {
        Ok(())
    }
}
