//! Starts a PostgreSQL of its own for a test run (as the harness does: the machine's binaries,
//! a temporary data directory, a free port, fsync on), prints its URL on one line, and keeps it
//! until SIGTERM or SIGINT, or until the process that started this one is gone; then stops it
//! and removes its data. `scripts/test` runs the suites on it with `ORCHESTRATOR_TEST_PG`.

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pg = match tests::pg::TestPostgres::start().await {
        Ok(pg) => pg,
        Err(e) => {
            eprintln!("test-postgres: {e}");
            std::process::exit(1);
        }
    };
    println!("{}", pg.url());
    let parent = nix::unistd::getppid();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    let mut orphaned = tokio::time::interval(std::time::Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
            _ = orphaned.tick() => {
                if nix::unistd::getppid() != parent {
                    break;
                }
            }
        }
    }
    drop(pg);
}
