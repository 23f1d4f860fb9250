//! The harness's own PostgreSQL (tests/src/pg.rs): it starts from the machine's binaries, is
//! durable (fsync and synchronous_commit on), and is stopped and removed with the test.

use tests::pg::{connect, TestPostgres};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_starts_a_durable_postgres_of_its_own() {
    let pg = TestPostgres::start()
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL could not be started: {e}"));
    let url = pg.fresh_database().await.expect("a database");
    let db = connect(&url).await.expect("a connection");
    let show = |name: &'static str| {
        let db = &db;
        async move {
            let row = db
                .query_one(&format!("SHOW {name}"), &[])
                .await
                .unwrap_or_else(|e| panic!("SHOW {name}: {e}"));
            row.get::<_, String>(0)
        }
    };
    assert_eq!(show("fsync").await, "on");
    assert_eq!(show("synchronous_commit").await, "on");
    let version: String = db
        .query_one("SELECT version()", &[])
        .await
        .expect("version")
        .get(0);
    assert!(version.starts_with("PostgreSQL"), "{version}");
    // A write is committed and read back.
    db.batch_execute("CREATE TABLE t (n int PRIMARY KEY); INSERT INTO t VALUES (1), (2);")
        .await
        .expect("write");
    let n: i64 = db
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .expect("read")
        .get(0);
    assert_eq!(n, 2);
}

/// Nodes starting together migrate the schema once between them, under the advisory lock; the
/// (conversation, seq) key refuses a second row of the same seq.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_starting_together_migrate_the_schema_once() {
    use orchestrator::engine::store::postgres::migrations::{latest, migrate};
    let pg = TestPostgres::start()
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL could not be started: {e}"));
    let url = pg.fresh_database().await.expect("a database");
    let mut nodes = Vec::new();
    for _ in 0..8 {
        let mut db = connect(&url).await.expect("a connection");
        nodes.push(tokio::spawn(async move { migrate(&mut db).await }));
    }
    let mut found = Vec::new();
    for n in nodes {
        found.push(n.await.expect("task").expect("migrate"));
    }
    // Exactly one node found an empty database; every other found it migrated.
    found.sort();
    let mut expected = vec![latest(); 8];
    expected[0] = 0;
    assert_eq!(found, expected);
    let db = connect(&url).await.expect("a connection");
    let versions: Vec<i64> = db
        .query(
            "SELECT version FROM orchestrator_schema ORDER BY version",
            &[],
        )
        .await
        .expect("versions")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, (1..=latest()).collect::<Vec<_>>());
    db.batch_execute(
        "INSERT INTO conversations (num, id, created_by, participants) VALUES (1, 'c', 'admin', '[\"a\"]');
         INSERT INTO events (conv, seq, kind, author, turn, payload, ts_ms) VALUES (1, 1, 'system', 'orchestrator', 1, '{}', 0);",
    )
    .await
    .expect("a first row");
    let second = db
        .batch_execute("INSERT INTO events (conv, seq, kind, author, turn, payload, ts_ms) VALUES (1, 1, 'message', 'a', 1, '{}', 0)")
        .await
        .expect_err("a second row of seq 1");
    assert_eq!(
        second.code(),
        Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION),
        "{second}"
    );
    // A node of an older build refuses a newer schema.
    db.execute(
        "INSERT INTO orchestrator_schema (version) VALUES ($1)",
        &[&(latest() + 1)],
    )
    .await
    .expect("a version from the future");
    let mut old = connect(&url).await.expect("a connection");
    let e = migrate(&mut old)
        .await
        .expect_err("a newer schema is refused");
    assert!(e.to_string().contains("newer than this build"), "{e}");
}
