//! What a process that hosts agents (or bridges to them) needs from its surroundings: logs on
//! stderr (stdout may be a protocol channel, as MCP over stdio is), and the stop signal.

/// Logs to stderr, filtered by `ORCHESTRATOR_LOG` (for example `info` or
/// `orchestrator=debug`; `warn` when unset), as text (coloured only on a terminal).
pub fn init_logging() {
    init_logging_with("warn", false);
}

/// Logs to stderr, filtered by `ORCHESTRATOR_LOG`, else by `default` (`info`, `warn`, …); as
/// one JSON object per line when `json`, else as text, coloured only when stderr is a
/// terminal.
pub fn init_logging_with(default: &str, json: bool) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("ORCHESTRATOR_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().with_current_span(false).init();
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).init();
    }
}

/// Raises this process's limit of open files to its hard limit: a server holds a socket per
/// connection, and the usual soft limit (1,024) is below what it is configured to serve. A
/// limit that cannot be raised is left as it is (and said at debug level).
pub fn raise_open_files_limit() {
    #[cfg(unix)]
    {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let raised =
            getrlimit(Resource::RLIMIT_NOFILE).and_then(|(soft, hard)| match soft < hard {
                true => setrlimit(Resource::RLIMIT_NOFILE, hard, hard),
                false => Ok(()),
            });
        if let Err(e) = raised {
            tracing::debug!(error = %e, "the open files limit was not raised");
        }
    }
}

/// Resolves on Ctrl-C, or on SIGTERM where there is one.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Serves `router` on `listener` — over TLS when `tls` is given, the certificate reloaded on
/// SIGHUP — until [`shutdown_signal`], then runs `stopping` and lets the requests in flight end.
#[cfg(feature = "axum")]
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<std::sync::Arc<crate::tls::ServerTls>>,
    router: axum::Router,
    stopping: impl FnOnce() + Send + 'static,
) -> std::io::Result<()> {
    let stop = async move {
        shutdown_signal().await;
        stopping();
    };
    match tls {
        Some(tls) => {
            tls.reload_on_sighup()?;
            axum::serve(crate::tls::incoming(listener, tls)?, router)
                .with_graceful_shutdown(stop)
                .await
        }
        None => {
            axum::serve(listener, router)
                .with_graceful_shutdown(stop)
                .await
        }
    }
}
