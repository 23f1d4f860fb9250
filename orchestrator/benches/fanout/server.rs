//! The release server in its own process for the fanout bench, and the CPU each side uses.

use super::*;

pub(super) struct Server {
    pub(super) child: Child,
    pub(super) addr: String,
    pub(super) pid: u32,
    pub(super) _dir: tempfile::TempDir,
    pub(super) admin: String,
    pub(super) alice: String,
    pub(super) bob: String,
}

impl Server {
    pub(super) fn start() -> Server {
        let bin = env!("CARGO_BIN_EXE_orchestrator");
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("bench.db");
        let token = |agent: &str, admin: bool| {
            let mut cmd = Command::new(bin);
            cmd.args(["token", "create", "--agent", agent, "--db"])
                .arg(&db);
            if admin {
                cmd.arg("--admin");
            }
            let out = cmd.output().expect("token create");
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        };
        let admin = token("admin", true);
        let alice = token("alice", false);
        let bob = token("bob", false);
        let mut child = Command::new(bin)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--max-connections",
                "30000",
                "--max-connections-per-address",
                "30000",
                "--max-connections-per-agent",
                "30000",
                "--max-append-bytes-per-minute",
                "0",
                "--max-streams",
                "30000",
                // The long-poll phase parks every waiter as one agent (2,000 by default, each
                // round), over the per-agent caps and request rate a server has by default.
                "--max-streams-per-agent",
                "30000",
                "--rate-limit",
                "1000000",
                "--rate-burst",
                "1000000",
                "--max-in-flight",
                "4096",
                "--db",
            ])
            .arg(&db)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("serve");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("address line");
        let addr = line
            .split("ws://")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .expect("address")
            .to_string();
        let pid = child.id();
        Server {
            child,
            addr,
            pid,
            _dir: dir,
            admin,
            alice,
            bob,
        }
    }

    pub(super) fn rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }
}

/// CPU seconds (user + system) a process has used, from `/proc/<pid>/stat`.
pub(super) fn cpu_seconds(pid: &str) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Fields after the command: state is 0, utime 11, stime 12 (clock ticks of 1/100 s).
    (ticks(11) + ticks(12)) / 100.0
}

/// CPU used by the server and by this (client) process over a phase.
pub(super) struct CpuMeter {
    pub(super) server: String,
    pub(super) at: Instant,
    pub(super) server_cpu: f64,
    pub(super) client_cpu: f64,
}

impl CpuMeter {
    pub(super) fn start(s: &Server) -> CpuMeter {
        let server = s.pid.to_string();
        CpuMeter {
            server_cpu: cpu_seconds(&server),
            client_cpu: cpu_seconds("self"),
            server,
            at: Instant::now(),
        }
    }

    pub(super) fn report(&self) {
        let wall = self.at.elapsed().as_secs_f64();
        println!(
            "{:<34} CPU over {:.1} s: server {:.0}%, clients {:.0}% (of one core)",
            "",
            wall,
            100.0 * (cpu_seconds(&self.server) - self.server_cpu) / wall,
            100.0 * (cpu_seconds("self") - self.client_cpu) / wall,
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
