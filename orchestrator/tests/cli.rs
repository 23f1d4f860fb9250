//! The `run` and `demo` commands of the real binary: a transcript, then a summary; plain text
//! when piped; a bad scenario file refused with the field it is about.

use std::process::Command;

fn orchestrator(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_orchestrator"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("run the binary");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn demo_prints_a_transcript_and_a_summary() {
    let (ok, out, err) = orchestrator(&["demo", "--timeout", "60s"]);
    assert!(ok, "{err}");
    assert!(out.contains("[1] moderator: Today's question"), "{out}");
    assert!(out.contains("  → turn 2: optimist"), "{out}");
    assert!(out.contains("7 turns in"), "{out}");
    assert!(out.trim_end().ends_with("stopped: on_text"), "{out}");
    assert!(!out.contains('\x1b'), "no colours when piped");
}

#[test]
fn run_takes_a_scenario_file() {
    let (ok, out, err) =
        orchestrator(&["run", "examples/scenarios/debate.yaml", "--timeout", "60s"]);
    assert!(ok, "{err}");
    assert!(out.contains("[7] moderator: Thank you."), "{out}");
    assert!(out.trim_end().ends_with("stopped: on_text"), "{out}");
    let (ok, out, _) =
        orchestrator(&["run", "examples/scenarios/debate.yaml", "--color", "always"]);
    assert!(ok && out.contains("\x1b["), "colours on request");
}

#[test]
fn run_refuses_a_bad_scenario_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "participants: [a]\npolicy:\n  order: round_robin\n  first: zed\n",
    )
    .unwrap();
    let (ok, _, err) = orchestrator(&["run", path.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("scenario.policy.first"), "{err}");
}
