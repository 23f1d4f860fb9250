//! A PostgreSQL of the test's own, started from the machine's binaries: a temporary data
//! directory, a free port on 127.0.0.1, fsync and `synchronous_commit` on. As root it runs as
//! the `postgres` user (PostgreSQL refuses to run as root). `ORCHESTRATOR_TEST_PG` (a
//! `postgres://` URL) uses a running server instead. A test that cannot have one fails with the
//! reason: nothing is skipped.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running PostgreSQL for one test (stopped when dropped), or the one `ORCHESTRATOR_TEST_PG`
/// names.
#[derive(Debug)]
pub struct TestPostgres {
    url: String,
    child: Option<Child>,
    /// How the server was started, to start it again after [`TestPostgres::crash`].
    launch: Option<Launch>,
    /// The data directory and the server's log; removed when dropped.
    dir: Option<tempfile::TempDir>,
}

/// What starting the server again takes.
#[derive(Debug, Clone)]
struct Launch {
    bin: PathBuf,
    user: Option<(u32, u32)>,
    dir: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
}

impl Launch {
    fn spawn(&self) -> Result<Child, String> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| e.to_string())?;
        if let Some((uid, gid)) = self.user {
            std::os::unix::fs::chown(&self.log, Some(uid), Some(gid)).map_err(|e| e.to_string())?;
        }
        let err = out.try_clone().map_err(|e| e.to_string())?;
        as_server_user(
            Command::new(self.bin.join("postgres")).current_dir(&self.dir),
            self.user,
        )
        .arg("-D")
        .arg(&self.data)
        .args(["-p", &self.port.to_string()])
        .args(["-c", "listen_addresses=127.0.0.1"])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", self.dir.display()))
        .args(["-c", "fsync=on", "-c", "synchronous_commit=on"])
        .args(["-c", "max_connections=200"])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("starting {}: {e}", self.bin.join("postgres").display()))
    }
}

/// The directory holding `initdb` and `postgres`: on the `PATH`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian's `postgresql` package).
pub fn binaries() -> Result<PathBuf, String> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .find(|d| d.join("initdb").is_file() && d.join("postgres").is_file())
    });
    if let Some(dir) = on_path {
        return Ok(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|e| format!("no PostgreSQL on the PATH and none under /usr/lib/postgresql ({e}); install Debian's `postgresql` package"))?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        "no initdb under /usr/lib/postgresql/*/bin; install Debian's `postgresql` package".into()
    })
}

/// Who the server runs as: the `postgres` user when this process is root, else this user.
fn server_user() -> Result<Option<(u32, u32)>, String> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let user = nix::unistd::User::from_name("postgres")
        .map_err(|e| format!("looking up the postgres user: {e}"))?
        .ok_or("running as root, and there is no `postgres` user to run PostgreSQL as")?;
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}

fn as_server_user(cmd: &mut Command, user: Option<(u32, u32)>) -> &mut Command {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// The last lines of the server's log, for a failure message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

impl TestPostgres {
    /// Starts a server (or uses `ORCHESTRATOR_TEST_PG`) and waits until it answers.
    pub async fn start() -> Result<TestPostgres, String> {
        if let Ok(url) = std::env::var("ORCHESTRATOR_TEST_PG") {
            let pg = TestPostgres {
                url,
                child: None,
                launch: None,
                dir: None,
            };
            pg.wait_ready(Duration::from_secs(10)).await?;
            return Ok(pg);
        }
        TestPostgres::start_own().await
    }

    /// A server of this test's own even when `ORCHESTRATOR_TEST_PG` names one (a test that
    /// crashes the server needs one it may crash).
    pub async fn start_own() -> Result<TestPostgres, String> {
        let bin = binaries()?;
        let user = server_user()?;
        let dir = tempfile::Builder::new()
            .prefix("orchestrator-pg-")
            .tempdir()
            .map_err(|e| format!("a temporary directory: {e}"))?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| format!("giving {} to postgres: {e}", dir.path().display()))?;
        }
        let data = dir.path().join("data");
        let log = dir.path().join("server.log");
        let init = as_server_user(
            Command::new(bin.join("initdb")).current_dir(dir.path()),
            user,
        )
        .args([
            "--username=postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--no-instructions",
        ])
        .arg("--pgdata")
        .arg(&data)
        .output()
        .map_err(|e| format!("running {}: {e}", bin.join("initdb").display()))?;
        if !init.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&init.stderr)
            ));
        }
        let launch = Launch {
            bin: bin.clone(),
            user,
            dir: dir.path().to_path_buf(),
            data,
            log: log.clone(),
            port: free_port()?,
        };
        let child = launch.spawn()?;
        let port = launch.port;
        let pg = TestPostgres {
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            child: Some(child),
            launch: Some(launch),
            dir: Some(dir),
        };
        if let Err(e) = pg.wait_ready(Duration::from_secs(30)).await {
            return Err(format!("{e}; the server's log:\n{}", log_tail(&log)));
        }
        Ok(pg)
    }

    /// Crashes the server as a power loss of its process would: SIGQUIT, the immediate
    /// shutdown (no checkpoint; the next start recovers from the WAL), and waits until it is
    /// gone.
    pub fn crash(&mut self) -> Result<(), String> {
        let child = self
            .child
            .as_mut()
            .ok_or("not a server this test started")?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGQUIT,
        )
        .map_err(|e| e.to_string())?;
        child.wait().map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Starts the server again after [`TestPostgres::crash`], on the same data and port, and
    /// waits until it answers.
    pub async fn restart(&mut self) -> Result<(), String> {
        let launch = self
            .launch
            .clone()
            .ok_or("not a server this test started")?;
        self.child = Some(launch.spawn()?);
        self.wait_ready(Duration::from_secs(30))
            .await
            .map_err(|e| format!("{e}; the server's log:\n{}", log_tail(&launch.log)))
    }

    /// A new, empty database on this server; its URL.
    pub async fn fresh_database(&self) -> Result<String, String> {
        fresh_database(&self.url).await
    }

    /// The URL to connect to (`postgres://…`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A connection, with its driver task spawned.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, String> {
        connect(&self.url).await
    }

    async fn wait_ready(&self, within: Duration) -> Result<(), String> {
        let until = tokio::time::Instant::now() + within;
        loop {
            match self.connect().await {
                Ok(c) => match c.simple_query("SELECT 1").await {
                    Ok(_) => return Ok(()),
                    Err(e) if tokio::time::Instant::now() >= until => {
                        return Err(format!("PostgreSQL did not answer: {e}"))
                    }
                    Err(_) => {}
                },
                Err(e) if tokio::time::Instant::now() >= until => {
                    return Err(format!("PostgreSQL did not start within {within:?}: {e}"))
                }
                Err(_) => {}
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A connection to `url`, with its driver task spawned.
pub async fn connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// A new, empty database (a unique name) on the server `url` points at; the URL of it.
pub async fn fresh_database(url: &str) -> Result<String, String> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!(
        "t_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        chrono::Utc::now().timestamp_micros()
    );
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("connecting to {url}: {e}"))?;
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .map_err(|e| format!("creating database {name}: {e}"))?;
    drop(client);
    let _ = driver.await;
    let mut u = url::Url::parse(url).map_err(|e| format!("{url}: {e}"))?;
    u.set_path(&name);
    Ok(u.to_string())
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            // SIGINT: a fast shutdown (open sessions are ended, the data is consistent).
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGINT,
            );
            for _ in 0..200 {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        drop(self.dir.take());
    }
}
