//! Every flag of `serve` that fills a limit reaches the limit it names: the binary is given a
//! distinct value for each and prints the limits it would serve with (`--print-limits`), so
//! two fields swapped where the flags are read would fail here.

use tests::procs::binary;

/// Each limit flag and the field it fills; `ms` marks a duration given in milliseconds.
const FLAGS: &str = "
    --max-frame-bytes max_frame_bytes
    --max-payload-bytes max_payload_bytes
    --max-connections max_connections
    --max-sockets max_sockets
    --header-timeout-ms header_timeout ms
    --max-in-flight max_in_flight_per_connection
    --max-streams max_streams
    --max-streams-per-agent max_streams_per_agent
    --rate-limit rate_per_identity
    --rate-burst rate_burst
    --auth-timeout-ms auth_timeout ms
    --idle-timeout-ms idle_timeout ms
    --max-wait-ms max_wait ms
    --max-scenario-bytes max_scenario_bytes
    --max-children max_children
    --max-tree max_tree
    --max-open-per-agent max_open_per_agent
    --token-recheck-ms token_recheck ms
    --max-connections-per-address max_connections_per_address
    --max-connections-per-agent max_connections_per_agent
    --max-append-bytes-per-minute max_append_bytes_per_minute
    --process-cpu-secs cpu_secs
    --process-memory-mb memory_mb
    --max-depth max_depth
    --max-running max_running";

#[test]
fn each_serve_flag_sets_the_limit_it_names() {
    // The n-th flag gets 1001 + n (a depth and a count of running agents stay small).
    let cases: Vec<(String, String, String)> = FLAGS
        .lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            (!words.is_empty()).then_some(words)
        })
        .enumerate()
        .map(|(n, words)| {
            let value = match words[1] {
                "max_depth" => 5,
                "max_running" => 25,
                _ => 1001 + n as u64,
            };
            let shown = match words.get(2) {
                Some(&"ms") => format!("{}.{:03}s", value / 1000, value % 1000),
                _ => value.to_string(),
            };
            (
                words[0].to_string(),
                value.to_string(),
                format!("{}: {shown},", words[1]),
            )
        })
        .collect();
    let mut args = vec!["serve".to_string(), "--print-limits".into()];
    for (flag, value, _) in &cases {
        args.extend([flag.clone(), value.clone()]);
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
    assert_eq!(cases.len(), 25, "every limit flag is in the table");
    for (flag, _, line) in &cases {
        assert!(
            lines.contains(&line.as_str()),
            "{flag} did not make {line:?}:\n{printed}"
        );
    }
}

/// Each `--tenant-…` flag fills the quota of the same name that every tenant without its own is
/// held to.
#[test]
fn each_tenant_quota_flag_sets_the_default_quota_it_names() {
    let fields = [
        "open_conversations",
        "stored_bytes",
        "appends_per_second",
        "connections",
        "llm_tokens_per_day",
        "tokens",
    ];
    let mut args = vec!["serve".to_string(), "--print-limits".into()];
    for (n, field) in fields.iter().enumerate() {
        args.extend([
            format!("--tenant-{}", field.replace('_', "-")),
            (11 + n).to_string(),
        ]);
    }
    let out = std::process::Command::new(binary())
        .args(&args)
        .env_remove("ORCHESTRATOR_DB")
        .output()
        .expect("serve --print-limits");
    let printed: String = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect();
    assert!(out.status.success(), "{printed}");
    for (n, field) in fields.iter().enumerate() {
        let shown = format!("{field}:Some({},)", 11 + n);
        assert!(printed.contains(&shown), "{shown} not in {printed}");
    }
}
