//! `orchestrator run` and `demo` as a person meets them, on the real binary: a failing agent's
//! reason is printed as it happens and a run that can make no more progress stops with its own
//! exit status; the time limit, an interruption and a closed pipe each end the run as the
//! README says; an external participant is told how to speak, and the `curl` line it is given
//! works; scenarios opened by name come from `--scenarios`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tests::procs::{binary, free_port};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

/// Longer than any run here should take: a run still going then is a failure, not a hang.
const BOUND: Duration = Duration::from_secs(60);

/// What a finished run printed, and its exit status.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("a scenario file");
    path
}

fn start(args: &[&str]) -> Child {
    Command::new(binary())
        .args(args)
        .env_remove("ORCHESTRATOR_DB")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the orchestrator binary")
}

async fn finish(mut child: Child) -> Ran {
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let status = tokio::time::timeout(BOUND, async {
        let (a, b) = tokio::join!(
            out.read_to_string(&mut stdout),
            err.read_to_string(&mut stderr)
        );
        a.and(b).expect("the run's output");
        child.wait().await.expect("the run's status")
    })
    .await
    .expect("the run ended by itself");
    Ran {
        code: status.code(),
        stdout,
        stderr,
    }
}

async fn run(args: &[&str]) -> Ran {
    finish(start(args)).await
}

/// A scenario where `alice` speaks first and `bob` is the agent given.
fn with_bob(bob: &str, turn: &str) -> String {
    format!(
        r#"
participants:
  - id: alice
    kind: scripted
    replies: ["hello", "again"]
{bob}
policy:
  order: round_robin
  first: alice
stop:
  maxTurns: 4
{turn}
"#
    )
}

/// Runs a scenario whose `bob` fails and checks what a person sees: each failed attempt with
/// its reason, then a stop with status 3 that says why.
async fn fails_with(bob: &str, reason: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "s.yaml", &with_bob(bob, ""));
    let mut args = vec!["run", path.to_str().unwrap(), "--timeout", "50s"];
    args.extend_from_slice(extra);
    let ran = run(&args).await;
    assert_eq!(ran.code, Some(3), "{}\n{}", ran.stdout, ran.stderr);
    let failures: Vec<&str> = ran
        .stdout
        .lines()
        .filter(|l| l.contains("✗ turn 2: bob failed"))
        .collect();
    assert!(
        !failures.is_empty() && failures.iter().all(|l| l.contains(reason)),
        "the reason {reason:?} on every failed attempt:\n{}",
        ran.stdout
    );
    assert!(failures[0].contains("(attempt 1 of 3)"), "{}", ran.stdout);
    let last = ran.stdout.lines().last().unwrap_or("");
    assert!(
        last.contains("stopped: no more progress: bob failed")
            && last.contains("no turn timeout")
            && last.contains(reason),
        "the summary says why: {last}"
    );
    assert!(last.starts_with("— 1 turn in "), "{last}");
}

#[tokio::test]
async fn a_javascript_exception_is_printed_and_the_run_stops_with_status_3() {
    fails_with(
        r#"  - id: bob
    kind: function
    source: |
      function handler(input, ctx) { throw new Error("bob is broken"); }"#,
        "the function threw: Error: bob is broken",
        &[],
    )
    .await;
}

#[tokio::test]
async fn an_unreachable_model_endpoint_is_printed_and_the_run_stops_with_status_3() {
    // Nothing listens on this port: the connection is refused.
    let port = free_port();
    fails_with(
        &format!(
            r#"  - id: bob
    kind: llm
    baseUrl: http://127.0.0.1:{port}/v1
    model: m
    retries: 0"#
        ),
        &format!("http://127.0.0.1:{port}/v1/chat/completions could not be reached"),
        &["--agent-net", "loopback"],
    )
    .await;
}

#[tokio::test]
async fn a_process_that_exits_is_reported_with_its_stderr() {
    fails_with(
        r#"  - id: bob
    kind: process
    command: ["sh", "-c", "echo 'the disk is on fire' >&2; exit 1"]"#,
        "stderr: the disk is on fire",
        &[],
    )
    .await;
}

#[tokio::test]
async fn with_a_turn_timeout_a_failing_agent_is_skipped_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let bob = r#"  - id: bob
    kind: function
    source: |
      function handler(input, ctx) { throw new Error("bob is broken"); }"#;
    let path = write(
        dir.path(),
        "s.yaml",
        &with_bob(bob, "turn:\n  timeout: 300ms\n  onTimeout: skip"),
    );
    let ran = run(&["run", path.to_str().unwrap(), "--timeout", "50s"]).await;
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    for expected in [
        "✗ turn 2: bob failed (attempt 1 of 3): the function threw: Error: bob is broken",
        "… turn 2 waits for its timeout (300ms from the turn's start), then the turn goes to alice",
        "⌛ turn 2 timed out (bob)",
        "[3] alice: again",
        "stopped: max_turns",
    ] {
        assert!(
            ran.stdout.contains(expected),
            "{expected:?} in:\n{}",
            ran.stdout
        );
    }
}

#[tokio::test]
async fn a_failure_whose_turn_timeout_would_close_the_conversation_stops_the_run_at_once() {
    // The model cannot be reached; the timeout (60 s, longer than the run's limit) would only
    // close the conversation, as no rule names a speaker after it: nothing can make progress.
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let scenario = format!(
        "participants:\n  - id: user\n    kind: scripted\n    replies: [\"question\"]\n  - id: assistant\n    kind: llm\n    baseUrl: http://127.0.0.1:{port}/v1\n    model: m\n    retries: 0\npolicy:\n  order: rules\n  first: user\n  rules:\n    - when: {{ author: user }}\n      next: assistant\n    - when: {{ author: assistant }}\n      next: user\nturn:\n  timeout: 60s\n"
    );
    let path = write(dir.path(), "s.yaml", &scenario);
    let ran = run(&[
        "run",
        path.to_str().unwrap(),
        "--timeout",
        "50s",
        "--agent-net",
        "loopback",
    ])
    .await;
    assert_eq!(ran.code, Some(3), "{}\n{}", ran.stdout, ran.stderr);
    let last = ran.stdout.lines().last().unwrap_or("");
    assert!(
        last.contains("assistant failed all 3 attempts at turn 2, and its turn timeout would close the conversation (no_rule_matched)"),
        "{last}"
    );
}

#[tokio::test]
async fn the_time_limit_ends_the_run_with_status_4_and_says_who_it_waited_for() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "s.yaml", &with_bob("  - carol", ""));
    let ran = run(&["run", path.to_str().unwrap(), "--timeout", "1s"]).await;
    assert_eq!(ran.code, Some(4), "{}\n{}", ran.stdout, ran.stderr);
    let last = ran.stdout.lines().last().unwrap_or("");
    assert!(
        last.contains("the run's time limit (1s) passed")
            && last.contains("waiting for carol at turn 2"),
        "{last}"
    );
}

/// Reads the run's transcript up to the `curl` line it prints for an external participant,
/// runs that line as printed with `answer` in place of the ellipsis, and returns the lines
/// seen and what the server answered.
async fn answer_by_curl(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    answer: &str,
) -> (Vec<String>, String) {
    let mut seen = Vec::new();
    let curl = tokio::time::timeout(BOUND, async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            seen.push(line.clone());
            if let Some(at) = line.find("curl ") {
                return line[at..].to_string();
            }
        }
        panic!("no curl line in:\n{}", seen.join("\n"));
    })
    .await
    .expect("the curl line in time");
    let curl = curl.replace('…', answer);
    let posted = std::process::Command::new("sh")
        .args(["-c", &curl])
        .output()
        .expect("curl");
    assert!(posted.status.success(), "{posted:?}");
    (seen, String::from_utf8_lossy(&posted.stdout).to_string())
}

/// The rest of a run's transcript, and its exit status.
async fn rest_of(
    mut lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    mut child: Child,
) -> (String, Option<i32>) {
    let mut rest = String::new();
    tokio::time::timeout(BOUND, async {
        while let Some(line) = lines.next_line().await.expect("stdout") {
            rest.push_str(&line);
            rest.push('\n');
        }
    })
    .await
    .expect("the run ends by itself");
    let status = child.wait().await.expect("the run's status");
    (rest, status.code())
}

#[tokio::test]
async fn an_external_participant_is_told_how_to_speak_and_its_curl_line_works() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "s.yaml",
        "participants:\n  - id: alice\n    kind: scripted\n    replies: [\"hello\"]\n  - carol\npolicy:\n  order: round_robin\n  first: alice\nstop:\n  maxTurns: 2\n",
    );
    let mut child = start(&["run", path.to_str().unwrap(), "--timeout", "50s"]);
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (seen, body) = answer_by_curl(&mut lines, "hello from carol").await;
    assert!(
        seen.iter().any(|l| l.contains(
            "waiting for carol (not run by this server), up to the run's time limit (50s"
        )) && seen.iter().any(|l| l.contains("authenticate with oct_")),
        "{seen:?}"
    );
    assert!(body.contains("\"seq\""), "the post was accepted: {body}");
    let (rest, code) = rest_of(lines, child).await;
    assert_eq!(code, Some(0), "{rest}");
    assert!(rest.contains("[2] carol: hello from carol"), "{rest}");
    assert!(rest.contains("— 2 turns in "), "{rest}");
}

#[tokio::test]
async fn the_plan_build_example_runs_with_a_person_approving_by_curl() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/scenarios/plan-build.yaml"
    );
    let mut child = start(&["run", example, "--timeout", "50s"]);
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let (seen, _) = answer_by_curl(&mut lines, "approve").await;
    let seen = seen.join("\n");
    // The plan shows as a document, its turn with its mode.
    assert!(seen.contains("→ turn 1: planner (plan mode)"), "{seen}");
    assert!(
        seen.contains("[1] planner: plan launch-plan v1 (markdown, plan mode)\n    # Goal"),
        "{seen}"
    );
    assert!(
        seen.contains("⏸ approval of api-builder (build mode) requested from alice")
            && seen.contains("waiting for alice to approve or reject api-builder's turn"),
        "{seen}"
    );
    let (rest, code) = rest_of(lines, child).await;
    assert_eq!(code, Some(0), "{rest}");
    for line in [
        "→ turn 3: api-builder (build mode)",
        "[3] api-builder: deliverable api-spec v1 (json, build mode)",
        "[4] docs-builder: deliverable launch-note v1 (markdown, build mode)",
        "[5] reviewer: Reviewed api-spec v1 by api-builder and launch-note v1 by docs-builder: ready to ship.",
        "The conversation ended: sequence done.",
    ] {
        assert!(rest.contains(line), "{line:?} in:\n{rest}");
    }
}

#[tokio::test]
async fn sigterm_and_ctrl_c_say_interrupted_and_exit_143_and_130() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "s.yaml", &with_bob("  - carol", ""));
    for (signal, code) in [
        (nix::sys::signal::Signal::SIGTERM, 143),
        (nix::sys::signal::Signal::SIGINT, 130),
    ] {
        let mut child = start(&["run", path.to_str().unwrap(), "--timeout", "50s"]);
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        // Once the run waits for carol, it is in the middle of its work.
        tokio::time::timeout(BOUND, async {
            while let Some(line) = lines.next_line().await.expect("stdout") {
                if line.contains("waiting for carol") {
                    return;
                }
            }
            panic!("the run ended before waiting for carol");
        })
        .await
        .expect("the run waits for carol");
        let pid = nix::unistd::Pid::from_raw(child.id().expect("a pid") as i32);
        nix::sys::signal::kill(pid, signal).expect("signalled");
        let (status, err) = finish_rest(child).await;
        assert_eq!(status, Some(code), "{signal}: {err}");
        assert_eq!(
            err.lines().last(),
            Some("orchestrator: interrupted"),
            "{signal}: {err}"
        );
        assert!(!err.contains("Error"), "{signal}: {err}");
    }
}

#[tokio::test]
async fn a_closed_pipe_ends_the_run_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "s.yaml", &with_bob("  - carol", ""));
    // It waits for carol, who never comes; its summary then meets the closed pipe.
    let mut child = start(&["run", path.to_str().unwrap(), "--timeout", "2s"]);
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    tokio::time::timeout(BOUND, lines.next_line())
        .await
        .expect("a first line")
        .expect("stdout");
    // The reader goes away (as `| head -1` does); the run's next line finds the pipe closed.
    drop(lines);
    let ran = finish_rest(child).await;
    assert_eq!(ran.0, Some(0), "{}", ran.1);
    assert!(
        !ran.1.contains("Error") && !ran.1.contains("Broken pipe"),
        "{}",
        ran.1
    );
}

/// The status and stderr of a child whose stdout was taken.
async fn finish_rest(mut child: Child) -> (Option<i32>, String) {
    let mut err = String::new();
    let mut stderr = child.stderr.take().expect("stderr");
    let status = tokio::time::timeout(BOUND, async {
        stderr.read_to_string(&mut err).await.expect("stderr");
        child.wait().await.expect("the status")
    })
    .await
    .expect("the run ended by itself");
    (status.code(), err)
}

#[tokio::test]
async fn scenarios_opened_by_name_run_with_the_scenarios_folder() {
    let dir = tempfile::tempdir().unwrap();
    let library = dir.path().join("library");
    std::fs::create_dir(&library).unwrap();
    write(
        &library,
        "echo.yaml",
        "name: echo\nparticipants:\n  - id: echoer\n    kind: function\n    source: |\n      function handler(input, ctx) { return { text: \"echo: \" + input.tail[input.tail.length - 1].text }; }\npolicy:\n  order: round_robin\n  first: echoer\nstop:\n  maxTurns: 1\n",
    );
    let parent = write(
        dir.path(),
        "parent.yaml",
        "participants:\n  - id: boss\n    kind: orchestrate\n    steps:\n      - { call: echo, as: e, input: \"ping\" }\n    reply: \"{{$.steps.e.text}}\"\npolicy:\n  order: round_robin\n  first: boss\nstop:\n  maxTurns: 1\n",
    );
    let ran = run(&[
        "run",
        parent.to_str().unwrap(),
        "--timeout",
        "50s",
        "--scenarios",
        library.to_str().unwrap(),
    ])
    .await;
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("boss: echo: ping"), "{}", ran.stdout);
    // Without the folder the name is unknown: the step says so in the boss's reply.
    let ran = run(&["run", parent.to_str().unwrap(), "--timeout", "50s"]).await;
    assert!(
        ran.stdout.contains("no scenario named \"echo\""),
        "{}",
        ran.stdout
    );
}
