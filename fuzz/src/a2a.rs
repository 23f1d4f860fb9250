//! The A2A adapter for `a2a_request`: an orchestrator serving WebSocket on 127.0.0.1 with the
//! scenario `expert` (the peer, its caller, then the expert, both external), and the adapter's
//! routes in process; requests carry the token of `acme` (not an admin), who speaks as the
//! peer, or none. A blocking `SendMessage` waits 1 ms: long
//! enough for its wait loop to run once (nobody answers as the expert), short enough that the
//! wait is not what a run spends its time on.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

/// How many inputs one adapter and its server take before they are made again. Fewer than the
/// other targets' [`crate::RENEW_EVERY`]: most inputs make a task (a conversation), and
/// `ListTasks` reads every task of the peer, so an input's cost grows with the inputs before it.
pub const RENEW_A2A: u64 = 200;

/// The adapter and what it runs on.
pub struct A2aHarness {
    /// The adapter's routes.
    pub app: axum::Router,
    /// The orchestrator it speaks to, and the runtime both run on.
    pub served: crate::Served,
}

/// The adapter: the same one for [`RENEW_A2A`] inputs.
pub fn a2a() -> Arc<A2aHarness> {
    static H: crate::Renewed<A2aHarness> = crate::Renewed::every(RENEW_A2A);
    H.get(A2aHarness::make, |old| {
        drop(old.app);
        old.served.stop();
    })
}

impl A2aHarness {
    fn make() -> A2aHarness {
        let expert = json!({
            "participants": [{"id": "peer", "external": true, "caller": true}, {"id": "expert", "external": true}],
            "policy": {"order": "round_robin", "first": "peer"},
        });
        let served =
            crate::Served::start("acme", false, vec![("expert".into(), expert)], async |_| {});
        let app = served.rt.block_on(async {
            let url = served.url();
            let app = orchestrator_a2a::App::start(
                &url,
                None,
                vec!["expert".into()],
                "http://127.0.0.1:1".into(),
                orchestrator_a2a::PeerLimits::default(),
            )
            .await
            .expect("the adapter")
            .with_blocking_wait(Duration::from_millis(1));
            orchestrator_a2a::router(Arc::new(app))
        });
        A2aHarness { app, served }
    }
}
