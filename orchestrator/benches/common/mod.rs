//! Helpers the bench binaries share.

/// A knob from the environment, or its default.
pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Removes the previous phases' files and flushes the page cache's dirty data, so that each phase
/// starts from the same disk state rather than paying for the writeback of the phase before it.
#[allow(dead_code)] // Not every benchmark writes files.
pub fn settle(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let _ = std::process::Command::new("sync").status();
}

/// The middle value (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Creates conversations `conv-0` … `conv-{n-1}` with participants `agent-0` …
/// `agent-{clients-1}`, as admin, spread over `orchs` (one node or several).
#[allow(dead_code)] // Not every benchmark creates conversations this way.
pub async fn create_conversations(
    orchs: &[std::sync::Arc<orchestrator::engine::service::Orchestrator>],
    n: usize,
    clients: usize,
) -> anyhow::Result<()> {
    use futures::stream::{FuturesUnordered, StreamExt};
    let admin = orchestrator::engine::auth::Identity::new("admin", true);
    let participants: Vec<String> = (0..clients).map(|c| format!("agent-{c}")).collect();
    let mut creates = FuturesUnordered::new();
    for i in 0..n {
        let p = proto_spec::CreateConversationParams {
            conversation_id: Some(format!("conv-{i}")),
            participants: Some(participants.clone()),
            ..Default::default()
        };
        let (orch, admin) = (orchs[i % orchs.len()].clone(), admin.clone());
        creates.push(async move { orch.create_conversation(&admin, p).await });
    }
    while let Some(r) = creates.next().await {
        r?;
    }
    Ok(())
}

/// A message of `text` to `conversation` (finality `none`, no key).
#[allow(dead_code)]
pub fn message(
    conversation: &str,
    payload: proto_spec::MessagePayload,
) -> proto_spec::SendMessageParams {
    proto_spec::SendMessageParams {
        conversation_id: conversation.to_string(),
        payload,
        finality: proto_spec::Finality::None,
        turn_hint: None,
        client_request_id: None,
        after_key: None,
    }
}

/// A new database on the server `base` names; its URL.
#[allow(dead_code)] // Only the benchmarks that run on PostgreSQL.
pub async fn fresh_database(base: &str, name: &str) -> anyhow::Result<String> {
    let (client, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls).await?;
    let driver = tokio::spawn(conn);
    // A new name each time: the pools of a phase's stores may still hold connections.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let db = format!(
        "bench_{name}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    // Two statements: CREATE DATABASE cannot run in the implicit transaction of a batch.
    client
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
        .await?;
    client
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await?;
    drop(client);
    let _ = driver.await;
    let mut url = url::Url::parse(base)?;
    url.set_path(&db);
    Ok(url.to_string())
}

/// Drops every database [`fresh_database`] made for this process: a run leaves gigabytes of
/// rows on the server otherwise, and runs after runs fill its disk.
#[allow(dead_code)] // Only the benchmarks that run on PostgreSQL.
pub async fn drop_databases(base: &str) -> anyhow::Result<()> {
    let (client, conn) = tokio_postgres::connect(base, tokio_postgres::NoTls).await?;
    let driver = tokio::spawn(conn);
    // `_` matches any character in LIKE: escaped, the names `fresh_database` gives.
    let pattern = format!("bench\\_%\\_{}\\_%", std::process::id());
    let names: Vec<String> = client
        .query(
            "SELECT datname FROM pg_database WHERE datname LIKE $1",
            &[&pattern],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for db in names {
        // FORCE: a pool of a phase's store may still hold a connection.
        client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
            .await?;
    }
    drop(client);
    let _ = driver.await;
    Ok(())
}
