//! The harness's own PostgreSQL (tests/src/pg.rs): it starts from the machine's binaries, is
//! durable (fsync and synchronous_commit on), and is stopped and removed with the test.

use tests::pg::TestPostgres;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_starts_a_durable_postgres_of_its_own() {
    let pg = TestPostgres::start()
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL could not be started: {e}"));
    let db = pg.connect().await.expect("a connection");
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
