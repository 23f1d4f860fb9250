//! Every flag of `serve` that fills a limit reaches the limit it names: the binary is given a
//! distinct value for each and prints the limits it would serve with (`--print-limits`), so
//! two fields swapped where the flags are read would fail here.

use tests::procs::binary;

#[test]
fn each_serve_flag_sets_the_limit_it_names() {
    // (flag, value, the limit's line as printed)
    let cases: &[(&str, &str, &str)] = &[
        ("--max-frame-bytes", "1000001", "max_frame_bytes: 1000001,"),
        (
            "--max-payload-bytes",
            "1000002",
            "max_payload_bytes: 1000002,",
        ),
        ("--max-connections", "1003", "max_connections: 1003,"),
        ("--max-sockets", "1004", "max_sockets: 1004,"),
        ("--header-timeout-ms", "1005", "header_timeout: 1.005s,"),
        (
            "--max-in-flight",
            "1006",
            "max_in_flight_per_connection: 1006,",
        ),
        ("--max-streams", "1007", "max_streams: 1007,"),
        (
            "--max-streams-per-agent",
            "1008",
            "max_streams_per_agent: 1008,",
        ),
        ("--rate-limit", "1009", "rate_per_identity: 1009,"),
        ("--rate-burst", "1010", "rate_burst: 1010,"),
        ("--auth-timeout-ms", "1011", "auth_timeout: 1.011s,"),
        ("--idle-timeout-ms", "1012", "idle_timeout: 1.012s,"),
        ("--max-wait-ms", "1013", "max_wait: 1.013s,"),
        ("--max-scenario-bytes", "1014", "max_scenario_bytes: 1014,"),
        ("--max-depth", "5", "max_depth: 5,"),
        ("--max-children", "1016", "max_children: 1016,"),
        ("--max-tree", "1017", "max_tree: 1017,"),
        ("--max-open-per-agent", "1018", "max_open_per_agent: 1018,"),
        ("--token-recheck-ms", "1019", "token_recheck: 1.019s,"),
        (
            "--max-connections-per-address",
            "1020",
            "max_connections_per_address: 1020,",
        ),
        (
            "--max-connections-per-agent",
            "1021",
            "max_connections_per_agent: 1021,",
        ),
        (
            "--max-append-bytes-per-minute",
            "1022",
            "max_append_bytes_per_minute: 1022,",
        ),
        ("--process-cpu-secs", "1023", "cpu_secs: 1023,"),
        ("--process-memory-mb", "1024", "memory_mb: 1024,"),
        ("--max-running", "25", "max_running: 25,"),
    ];
    let mut args = vec!["serve", "--print-limits"];
    for (flag, value, _) in cases {
        args.extend([*flag, *value]);
    }
    let out = std::process::Command::new(binary())
        .args(&args)
        .env_remove("ORCHESTRATOR_DB")
        .output()
        .expect("serve --print-limits");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = printed.lines().map(str::trim).collect();
    for (flag, _, line) in cases {
        assert!(
            lines.contains(line),
            "{flag} did not make {line:?}:\n{printed}"
        );
    }
}
