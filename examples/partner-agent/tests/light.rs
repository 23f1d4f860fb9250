//! The partner agent builds on the SDK core alone: none of the built-in kinds' heavy
//! dependencies (a JavaScript engine, a tokenizer, an MCP client, an HTTP client stack) is in
//! its dependency tree.

#[test]
fn the_partner_agent_compiles_no_javascript_engine_tokenizer_mcp_or_http_client() {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "tree",
            "--frozen",
            "--edges",
            "normal",
            "--prefix",
            "none",
            "--package",
            "partner-agent",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        tree.contains("agent-sdk"),
        "the tree is the partner's:\n{tree}"
    );
    let crates: Vec<&str> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for heavy in ["rquickjs", "tiktoken-rs", "rmcp", "reqwest", "agent-kinds"] {
        assert!(
            !crates.contains(&heavy),
            "{heavy} is in the partner agent's build"
        );
    }
}
