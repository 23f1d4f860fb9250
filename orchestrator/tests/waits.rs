//! How long waits last, on tokio's paused clock: `waitForChange` times out after the time it
//! asked for, and no later than the server's cap. No wall clock is read: the clock moves only
//! when every task waits. (That an append ends a wait is tested over the wire, in
//! `tests/tests/rpc.rs`: an append goes through the writer's thread, which the paused clock
//! does not wait for.)

mod common;

use std::time::Duration;

use orchestrator::engine::auth::Identity;
use orchestrator::engine::config::Limits;
use proto_spec::WaitForChangeParams;
use tokio::time::Instant;

fn wait(since_seq: u64, timeout_ms: u64) -> WaitForChangeParams {
    WaitForChangeParams {
        conversation_id: "c".into(),
        since_seq,
        timeout_ms,
    }
}

#[tokio::test(start_paused = true)]
async fn a_wait_with_nothing_new_times_out_after_its_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let orch = common::open(&dir, Limits::default()).await;
    let alice = Identity::new("alice", false);
    let before = Instant::now();
    let r = orch
        .wait_for_change(&alice, wait(1, 200))
        .await
        .expect("wait");
    assert!(r.timed_out);
    assert_eq!(r.latest_seq, 1);
    assert_eq!(Instant::now() - before, Duration::from_millis(200));
}

#[tokio::test(start_paused = true)]
async fn a_longer_wait_is_capped_by_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limits = Limits {
        max_wait: Duration::from_secs(5),
        ..Limits::default()
    };
    let orch = common::open(&dir, limits).await;
    let alice = Identity::new("alice", false);
    let before = Instant::now();
    let r = orch
        .wait_for_change(&alice, wait(1, 3_600_000))
        .await
        .expect("wait");
    assert!(r.timed_out);
    assert_eq!(Instant::now() - before, Duration::from_secs(5));
}
