//! The A2A adapter for `a2a_request`: an orchestrator serving WebSocket on 127.0.0.1 with the
//! scenario `expert` (the peer, then the expert, both external), and the adapter's routes in
//! process, connected to it as the peer (an admin). A blocking `SendMessage` waits 5 ms.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agent_sdk::{WsConfig, WsJsonRpcClient};
use orchestrator::engine::config::Limits;
use serde_json::json;

/// The adapter and what it runs on.
pub struct A2aHarness {
    /// Runs every request (the orchestrator serves on one of its workers meanwhile).
    pub rt: tokio::runtime::Runtime,
    /// The adapter's routes.
    pub app: axum::Router,
    server: orchestrator::transport::server::RunningServer,
    _dir: tempfile::TempDir,
}

/// The adapter: the same one for [`crate::RENEW_EVERY`] inputs.
pub fn a2a() -> Arc<A2aHarness> {
    static H: crate::Renewed<A2aHarness> = crate::Renewed::new();
    H.get(A2aHarness::make, |old| {
        let A2aHarness {
            rt,
            app,
            server,
            _dir,
        } = old;
        // The adapter's connection first, so that the server has none to wait for.
        drop(app);
        rt.block_on(server.stop());
    })
}

impl A2aHarness {
    fn make() -> A2aHarness {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let (dir, store) = crate::scratch_store();
        let token = orchestrator::engine::auth::create_token(store.as_ref(), "peer", true)
            .expect("a token");
        let expert = json!({
            "participants": [{"id": "peer", "external": true}, {"id": "expert", "external": true}],
            "policy": {"order": "round_robin", "first": "peer"},
        });
        let (server, app) = rt.block_on(async {
            let options = orchestrator::host::Options {
                limits: Limits {
                    max_wait: Duration::from_millis(5),
                    rate_per_identity: 0,
                    ..Limits::default()
                },
                scenarios: vec![("expert".into(), expert)],
                agents: HashMap::new(),
                ..Default::default()
            };
            let orch = options.start(store).expect("the orchestrator");
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("a port");
            let server = orchestrator::transport::server::start(orch, listener)
                .await
                .expect("serving");
            let url = server.rpc_url();
            let client = WsJsonRpcClient::connect(WsConfig::new(url.clone(), token))
                .await
                .expect("the adapter's connection");
            let app = orchestrator_a2a::App::start(
                client,
                &url,
                vec!["expert".into()],
                "http://127.0.0.1:1".into(),
            )
            .await
            .expect("the adapter")
            .with_blocking_wait(Duration::from_millis(5));
            (server, orchestrator_a2a::router(Arc::new(app)))
        });
        A2aHarness {
            rt,
            app,
            server,
            _dir: dir,
        }
    }
}
