//! Metrics: the names, one place that records each, and the Prometheus recorder behind
//! `GET /metrics`.
//!
//! Recording goes through the `metrics` facade, which costs nothing until a recorder is
//! installed; [`install`] installs the Prometheus one once per process (a second server in the
//! same process shares it, so its figures are the process's).

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, gauge, histogram, Counter, Histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use proto_spec::ErrorCode;

/// Events committed (messages, traces, system events).
pub const APPENDS: &str = "orchestrator_appends_total";
/// Time of one group commit (the SQLite transaction, fsync included), in seconds.
pub const COMMIT_SECONDS: &str = "orchestrator_commit_seconds";
/// Jobs (appends, creations) in one group commit.
pub const COMMIT_BATCH: &str = "orchestrator_commit_batch_size";
/// Open subscribers, by `transport`: `ws` (subscriptions), `sse` (streams), `longpoll`
/// (parked waits).
pub const SUBSCRIBERS: &str = "orchestrator_subscribers";
/// Feeds that fell behind the live broadcast and were resumed from the log.
pub const RESUMED: &str = "orchestrator_subscribers_resumed_total";
/// Open connections, by `transport` (`ws`: WebSocket sessions at `/rpc`).
pub const CONNECTIONS: &str = "orchestrator_connections";
/// TCP connections accepted on the port.
pub const ACCEPTED: &str = "orchestrator_connections_accepted_total";
/// WebSocket connections the server ended, by `reason`: `auth_timeout` (no `authenticate` in
/// time), `idle_timeout` (nothing called or open for the idle timeout).
pub const DROPPED: &str = "orchestrator_connections_dropped_total";
/// Turns handed to an agent, by `mode`: `internal` or `push`.
pub const TURNS: &str = "orchestrator_turns_total";
/// Errors returned to callers, by `code` (the table's name) and `transport` (`rpc`, `http`).
pub const ERRORS: &str = "orchestrator_errors_total";
/// This node: `backend` (`sqlite`, `postgres`) and, on a cluster, `node` (its name in the turn
/// claims, new at every start); always 1.
pub const NODE_INFO: &str = "orchestrator_node_info";
/// On a cluster: claims this node asked for an internal agent's turn, by `result`: `granted`,
/// `held` (another node holds it; tried again when its lease runs out), `error`, or
/// `with_commit` (claimed by this node's commit that opened the turn: nothing to ask).
pub const CLUSTER_CLAIMS: &str = "orchestrator_cluster_claims_total";
/// On a cluster: runs stopped because their claim was lost, by `why`: `taken` (a renewal found
/// another node holding it) or `expired` (no renewal in time by this node's clock).
pub const CLUSTER_CLAIMS_LOST: &str = "orchestrator_cluster_claims_lost_total";
/// On a cluster: events other nodes committed, read back and published on this one.
pub const CLUSTER_CAUGHT_UP: &str = "orchestrator_cluster_caught_up_events_total";
/// On a cluster: events other nodes committed that this node's writer moved past reading only
/// their conversation's head (they move nothing else; a reader here reads them from the log).
pub const CLUSTER_PASSED: &str = "orchestrator_cluster_passed_events_total";
/// On a cluster: looks at other nodes' commits, by `source`: `notification` (a commit's
/// notification named the conversations) or `scan` (the poll, or a notification too long to
/// name them).
pub const CLUSTER_REFRESHES: &str = "orchestrator_cluster_refreshes_total";
/// On a cluster: batches refused by the database because another node had appended to one of
/// their conversations first (nothing of them was written; each was caught up and run again).
pub const CLUSTER_CONFLICTS: &str = "orchestrator_cluster_conflicts_total";
/// On a cluster: writes put off to this node's next batch because another node's batch held
/// their conversation when this one began.
pub const CLUSTER_PUT_OFF: &str = "orchestrator_cluster_put_off_total";
/// One executor run of an agent on a turn, in seconds (the executor crate records it).
pub const EXECUTOR_RUN_SECONDS: &str = executors::core::RUN_SECONDS;

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How often the recorder's histograms are drained into their buckets. The recorder keeps
/// every recorded sample until it is drained (a scrape of `/metrics` also drains), so without
/// this a server nobody scrapes would hold two samples per commit forever.
pub const UPKEEP: std::time::Duration = std::time::Duration::from_secs(1);

/// Installs the Prometheus recorder (once per process), with a thread that drains its
/// histograms every [`UPKEEP`], and returns its handle.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let latency = [
            0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1,
            0.25, 0.5, 1.0,
        ];
        let runs = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0];
        let batches = [
            1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
        ];
        let builder = PrometheusBuilder::new();
        let recorder = builder
            .set_buckets_for_metric(Matcher::Full(COMMIT_SECONDS.into()), &latency)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(COMMIT_BATCH.into()), &batches))
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(EXECUTOR_RUN_SECONDS.into()), &runs)
            })
            .map(|b| b.build_recorder())
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "metric buckets refused; using summaries");
                PrometheusBuilder::new().build_recorder()
            });
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("another metrics recorder is installed; /metrics shows only ours");
        }
        describe();
        let upkeep = std::thread::Builder::new()
            .name("metrics-upkeep".into())
            .spawn(|| loop {
                std::thread::sleep(UPKEEP);
                if let Some(h) = HANDLE.get() {
                    h.run_upkeep();
                }
            });
        if let Err(e) = upkeep {
            tracing::warn!(error = %e, "no thread to drain the metrics' histograms; they are drained when /metrics is read");
        }
        handle
    })
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(APPENDS, "Events committed to the log.");
    describe_histogram!(
        COMMIT_SECONDS,
        Unit::Seconds,
        "Time of one group commit, fsync included."
    );
    describe_histogram!(
        COMMIT_BATCH,
        "Jobs (appends, creations) in one group commit."
    );
    describe_gauge!(SUBSCRIBERS, "Open subscribers by transport.");
    describe_counter!(
        RESUMED,
        "Feeds that fell behind and were resumed from the log."
    );
    describe_gauge!(CONNECTIONS, "Open WebSocket sessions.");
    describe_counter!(ACCEPTED, "TCP connections accepted.");
    describe_counter!(
        DROPPED,
        "WebSocket connections the server ended, by reason (auth_timeout, idle_timeout)."
    );
    describe_counter!(TURNS, "Turns handed to an agent, by mode.");
    describe_counter!(ERRORS, "Errors returned to callers, by code and transport.");
    describe_gauge!(
        NODE_INFO,
        "This node: its backend and, on a cluster, its name."
    );
    describe_counter!(
        CLUSTER_CLAIMS,
        "Turn claims this node asked for, by result."
    );
    describe_counter!(
        CLUSTER_CLAIMS_LOST,
        "Runs stopped because their claim was lost, by why."
    );
    describe_counter!(
        CLUSTER_CAUGHT_UP,
        "Events other nodes committed, published on this one."
    );
    describe_counter!(
        CLUSTER_PASSED,
        "Events other nodes committed that this node moved past reading only the head."
    );
    describe_counter!(
        CLUSTER_REFRESHES,
        "Looks at other nodes' commits, by source."
    );
    describe_counter!(
        CLUSTER_CONFLICTS,
        "Batches another node got ahead of, caught up and run again."
    );
    describe_counter!(
        CLUSTER_PUT_OFF,
        "Writes put off to the next batch because another node's batch held their conversation."
    );
    describe_histogram!(
        EXECUTOR_RUN_SECONDS,
        Unit::Seconds,
        "One executor run of an agent on a turn."
    );
}

/// The Prometheus text of every metric; empty when no recorder is installed.
pub fn render() -> String {
    HANDLE.get().map(|h| h.render()).unwrap_or_default()
}

/// The writer's handles, looked up once.
#[derive(Debug, Clone)]
pub struct CommitMetrics {
    appends: Counter,
    seconds: Histogram,
    batch: Histogram,
}

impl CommitMetrics {
    /// Handles bound to the current recorder.
    pub fn new() -> Self {
        CommitMetrics {
            appends: counter!(APPENDS),
            seconds: histogram!(COMMIT_SECONDS),
            batch: histogram!(COMMIT_BATCH),
        }
    }

    /// One group commit of `jobs` jobs and `events` events that took `took` (logged at `warn`
    /// past [`SLOW_COMMIT`]).
    pub fn committed(&self, jobs: usize, events: u64, took: Duration) {
        self.appends.increment(events);
        self.seconds.record(took.as_secs_f64());
        self.batch.record(jobs as f64);
        slow("commit", events, took);
    }
}

impl Default for CommitMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// A commit or a sync slower than this is logged: callers waited that long for their answers.
pub const SLOW_COMMIT: Duration = Duration::from_millis(250);

/// Logs a `what` (commit, sync) of `events` events that took `took`, when past [`SLOW_COMMIT`].
pub fn slow(what: &'static str, events: u64, took: Duration) {
    if took >= SLOW_COMMIT {
        tracing::warn!(
            what,
            events,
            ms = took.as_millis() as u64,
            "slow {what}: appends waited for the disk or the database"
        );
    }
}

/// An error returned to a caller.
pub fn error(code: ErrorCode, transport: &'static str) {
    counter!(ERRORS, "code" => code.name(), "transport" => transport).increment(1);
}

/// A request refused: counted ([`error`]) and logged with its code, at `info`; at `debug` when
/// it is how the protocol settles a race every client meets in normal work (`TurnClosed`: a
/// write that names a turn already over, such as an executor's trace sent after its reply).
pub fn refused(e: &proto_spec::RpcError, transport: &'static str) {
    error(e.code, transport);
    if e.code == ErrorCode::TurnClosed {
        tracing::debug!(code = e.code.name(), number = e.code.code(), transport, reason = %e.message, "request refused");
    } else {
        tracing::info!(code = e.code.name(), number = e.code.code(), transport, reason = %e.message, "request refused");
    }
}

/// A turn handed out.
pub fn turn(mode: &'static str) {
    counter!(TURNS, "mode" => mode).increment(1);
}

/// This node's backend and (on a cluster) name, as [`NODE_INFO`].
pub fn node(backend: &'static str, name: Option<&str>) {
    match name {
        Some(n) => gauge!(NODE_INFO, "backend" => backend, "node" => n.to_string()).set(1.0),
        None => gauge!(NODE_INFO, "backend" => backend).set(1.0),
    }
}

/// A turn claim asked for (`result`: `granted`, `held`, `error`, `with_commit`).
pub fn claim(result: &'static str) {
    counter!(CLUSTER_CLAIMS, "result" => result).increment(1);
}

/// A run stopped because its claim was lost (`why`: `taken`, `expired`).
pub fn claim_lost(why: &'static str) {
    counter!(CLUSTER_CLAIMS_LOST, "why" => why).increment(1);
}

/// `events` committed by other nodes, published here.
pub fn caught_up(events: usize) {
    counter!(CLUSTER_CAUGHT_UP).increment(events as u64);
}

/// `events` committed by other nodes that the writer moved past reading only the head.
pub fn passed(events: u64) {
    counter!(CLUSTER_PASSED).increment(events);
}

/// A look at other nodes' commits (`source`: `notification`, `scan`).
pub fn refreshed(source: &'static str) {
    counter!(CLUSTER_REFRESHES, "source" => source).increment(1);
}

/// A batch another node got ahead of (run again).
pub fn conflict() {
    counter!(CLUSTER_CONFLICTS).increment(1);
}

/// `jobs` writes put off to the next batch (their conversation was held by another node).
pub fn put_off(jobs: usize) {
    counter!(CLUSTER_PUT_OFF).increment(jobs as u64);
}

/// A feed resumed from the log after falling behind.
pub fn resumed() {
    counter!(RESUMED).increment(1);
}

/// A connection the server ended, and why.
pub fn dropped_connection(reason: &'static str) {
    counter!(DROPPED, "reason" => reason).increment(1);
    tracing::info!(reason, "closing a connection");
}

/// A TCP connection accepted.
pub fn accepted() {
    counter!(ACCEPTED).increment(1);
}

/// Counts one open subscriber or connection of a kind while it lives.
#[derive(Debug)]
pub struct Open {
    name: &'static str,
    transport: &'static str,
}

impl Open {
    /// An open subscriber (`transport`: `ws`, `sse`, `longpoll`).
    pub fn subscriber(transport: &'static str) -> Open {
        Open::new(SUBSCRIBERS, transport)
    }

    /// An open connection.
    pub fn connection(transport: &'static str) -> Open {
        Open::new(CONNECTIONS, transport)
    }

    fn new(name: &'static str, transport: &'static str) -> Open {
        gauge!(name, "transport" => transport).increment(1.0);
        Open { name, transport }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        gauge!(self.name, "transport" => self.transport).decrement(1.0);
    }
}
