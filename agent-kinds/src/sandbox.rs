//! [`Sandbox`]: what the agents a server runs may reach, set by the operator, never by a
//! scenario (docs/security.md).
//!
//! - **Secrets.** A scenario reads environment variables (an `http` header's `{env: NAME}`, an
//!   `llm`'s `apiKeyEnv`) only from an allow-list, empty by default (`serve --agent-env NAME`).
//!   Processes get a minimal environment plus the allowed names, never the server's own.
//! - **Network.** `http`, `llm`, `a2a` and MCP-over-HTTP `tool` participants connect only where
//!   the allow-list lets them ([`NetRule`]: by default every public address; loopback, private
//!   and link-local addresses only when allowed). Names are checked at each connection, on the
//!   addresses they resolve to, so a name that resolves to a refused address is refused; a
//!   redirect is checked like the first request. No proxy from the environment is used.
//! - **Execution.** `function` and `process` runs share a cap on how many run at once; each
//!   process runs in a process group of its own (killed whole when its turn ends), with limits
//!   on CPU time and memory, optionally as another user.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One entry of the network allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetRule {
    /// Every globally routable address (the default).
    Public,
    /// `127.0.0.0/8` and `::1`.
    Loopback,
    /// `10/8`, `172.16/12`, `192.168/16`, `100.64/10` and `fc00::/7`.
    Private,
    /// Addresses in this network (`169.254.0.0/16`, `10.1.2.3/32`, `fd00::/8`).
    Cidr(IpAddr, u8),
    /// This host name, whatever it resolves to.
    Host(String),
}

impl NetRule {
    /// Reads `public`, `loopback`, `private`, a CIDR such as `10.0.0.0/8` or an address, or a
    /// host name.
    pub fn parse(s: &str) -> Result<NetRule, String> {
        let s = s.trim();
        match s {
            "public" => return Ok(NetRule::Public),
            "loopback" => return Ok(NetRule::Loopback),
            "private" => return Ok(NetRule::Private),
            "" => return Err("an empty network rule".into()),
            _ => {}
        }
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        if let Ok(ip) = addr.parse::<IpAddr>() {
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let bits = match bits {
                None => max,
                Some(b) => b
                    .parse::<u8>()
                    .ok()
                    .filter(|b| *b <= max)
                    .ok_or_else(|| format!("{s:?}: the prefix length is 0 to {max}"))?,
            };
            return Ok(NetRule::Cidr(ip, bits));
        }
        let host = s.to_ascii_lowercase();
        let valid = bits.is_none()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
        if !valid {
            return Err(format!(
                "{s:?} is not public, loopback, private, a network such as 10.0.0.0/8 or a host name"
            ));
        }
        Ok(NetRule::Host(host))
    }

    fn allows_ip(&self, ip: IpAddr) -> bool {
        match self {
            NetRule::Public => is_public(ip),
            NetRule::Loopback => ip.is_loopback(),
            NetRule::Private => is_private(ip),
            NetRule::Cidr(net, bits) => in_network(ip, *net, *bits),
            NetRule::Host(_) => false,
        }
    }
}

fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn in_network(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (canonical(ip), canonical(net)) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(bits)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(bits)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

fn is_private(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            v4.is_private()
                || in_network(IpAddr::V4(v4), IpAddr::V4(Ipv4Addr::new(100, 64, 0, 0)), 10)
        }
        IpAddr::V6(v6) => in_network(
            IpAddr::V6(v6),
            IpAddr::V6(Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0, 0)),
            7,
        ),
    }
}

/// Whether `ip` is a globally routable address: not loopback, private, link-local,
/// unspecified, multicast, broadcast, shared (100.64/10) or reserved for documentation.
pub fn is_public(ip: IpAddr) -> bool {
    let ip = canonical(ip);
    if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() || is_private(ip) {
        return false;
    }
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            !(v4.is_link_local()
                || v4.is_broadcast()
                || v4.is_documentation()
                || o[0] == 0
                || o[0] >= 240
                || (o[0] == 192 && o[1] == 0 && o[2] == 0))
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            !((s[0] & 0xffc0) == 0xfe80 || (s[0] == 0x2001 && s[1] == 0x0db8) || s[0] == 0x64)
        }
    }
}

/// The user processes run as (`serve --process-user`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessUser {
    /// Its name, for messages.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

impl ProcessUser {
    /// Looks up a user by name or number.
    pub fn lookup(name: &str) -> Result<ProcessUser, String> {
        use nix::unistd::{Uid, User};
        let found = match name.parse::<u32>() {
            Ok(uid) => User::from_uid(Uid::from_raw(uid)),
            Err(_) => User::from_name(name),
        };
        match found {
            Ok(Some(u)) => Ok(ProcessUser {
                name: u.name,
                uid: u.uid.as_raw(),
                gid: u.gid.as_raw(),
            }),
            Ok(None) => Err(format!("no user {name:?} on this machine")),
            Err(e) => Err(format!("looking up user {name:?} failed: {e}")),
        }
    }
}

/// Environment variables every process gets (when the server has them), besides the allowed.
const BASE_ENV: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// What the agents a server runs may reach; cheap to clone (the run cap is shared).
#[derive(Debug, Clone)]
pub struct Sandbox {
    env: Vec<String>,
    net: Vec<NetRule>,
    process_user: Option<ProcessUser>,
    cpu_secs: u64,
    memory_mb: u64,
    max_running: usize,
    slots: Arc<Semaphore>,
}

impl Default for Sandbox {
    /// No environment variable, public addresses only, at most 8 functions and processes at
    /// once, each process with 60 s of CPU time and 1 GiB of memory, as the server's user.
    fn default() -> Self {
        Sandbox {
            env: Vec::new(),
            net: vec![NetRule::Public],
            process_user: None,
            cpu_secs: 60,
            memory_mb: 1024,
            max_running: 8,
            slots: Arc::new(Semaphore::new(8)),
        }
    }
}

impl Sandbox {
    /// These environment variables may be read by scenarios and passed to processes.
    pub fn with_env(mut self, names: impl IntoIterator<Item = String>) -> Self {
        self.env = names.into_iter().collect();
        self
    }

    /// The network allow-list (replacing the default `public`).
    pub fn with_net(mut self, rules: Vec<NetRule>) -> Self {
        self.net = rules;
        self
    }

    /// Adds one rule to the network allow-list.
    pub fn allowing(mut self, rule: NetRule) -> Self {
        self.net.push(rule);
        self
    }

    /// Processes run as this user (the server must be able to switch to it).
    pub fn with_process_user(mut self, user: Option<ProcessUser>) -> Self {
        self.process_user = user;
        self
    }

    /// At most `max_running` functions and processes at once; each process gets `cpu_secs`
    /// of CPU time and `memory_mb` of memory (a function's heap is capped by it too).
    pub fn with_exec_limits(mut self, max_running: usize, cpu_secs: u64, memory_mb: u64) -> Self {
        let max_running = max_running.max(1);
        self.max_running = max_running;
        self.slots = Arc::new(Semaphore::new(max_running));
        self.cpu_secs = cpu_secs.max(1);
        self.memory_mb = memory_mb.max(16);
        self
    }

    /// The most memory one process or function may use, in MiB.
    pub fn memory_mb(&self) -> u64 {
        self.memory_mb
    }

    /// How many functions and processes may run at once.
    pub fn max_running(&self) -> usize {
        self.max_running
    }

    /// The user processes run as, if not the server's.
    pub fn process_user(&self) -> Option<&ProcessUser> {
        self.process_user.as_ref()
    }

    /// Whether a scenario may read the environment variable `name`.
    pub fn env_allowed(&self, name: &str) -> bool {
        self.env.iter().any(|n| n == name)
    }

    /// Refuses an environment variable that is not allowed (the message goes after a path).
    pub fn check_env(&self, name: &str) -> Result<(), String> {
        if self.env_allowed(name) {
            Ok(())
        } else {
            Err(format!(
                "{name:?} is not an environment variable this server lets scenarios read (the operator allows names with --agent-env)"
            ))
        }
    }

    /// Reads an allowed environment variable.
    pub fn read_env(&self, name: &str) -> Result<String, String> {
        self.check_env(name)?;
        std::env::var(name).map_err(|_| format!("the environment variable {name} is not set"))
    }

    /// Whether agents may connect to `ip`.
    pub fn ip_allowed(&self, ip: IpAddr) -> bool {
        self.net.iter().any(|r| r.allows_ip(ip))
    }

    fn host_named(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        self.net
            .iter()
            .any(|r| matches!(r, NetRule::Host(h) if *h == host))
    }

    /// Checks a URL's scheme and host before any connection: an address or a `localhost` name
    /// must be allowed; other names are checked on the addresses they resolve to, at each
    /// connection.
    pub fn check_url(&self, url: &reqwest::Url) -> Result<(), String> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("{url}: an http or https URL"));
        }
        let refused = |what: &str| {
            Err(format!(
                "{what} is not an address this server's agents may reach (the operator allows networks with --agent-net)"
            ))
        };
        match url.host() {
            None => Err(format!("{url}: no host")),
            Some(url::Host::Ipv4(v4)) if !self.ip_allowed(IpAddr::V4(v4)) => {
                refused(&v4.to_string())
            }
            Some(url::Host::Ipv6(v6)) if !self.ip_allowed(IpAddr::V6(v6)) => {
                refused(&v6.to_string())
            }
            Some(url::Host::Domain(d)) => {
                let d = d.trim_end_matches('.').to_ascii_lowercase();
                let local = d == "localhost" || d.ends_with(".localhost");
                if local
                    && !self.host_named(&d)
                    && !self.ip_allowed(IpAddr::V4(Ipv4Addr::LOCALHOST))
                {
                    return refused(&d);
                }
                Ok(())
            }
            Some(_) => Ok(()),
        }
    }

    /// Resolves `host` to the addresses agents may connect to; an error when there is none.
    pub async fn resolve(&self, host: &str) -> Result<Vec<SocketAddr>, String> {
        let found: Vec<SocketAddr> = tokio::net::lookup_host((host, 0))
            .await
            .map_err(|e| format!("{host}: {e}"))?
            .collect();
        if self.host_named(host) {
            return Ok(found);
        }
        let allowed: Vec<SocketAddr> = found
            .into_iter()
            .filter(|a| self.ip_allowed(a.ip()))
            .collect();
        if allowed.is_empty() {
            return Err(format!(
                "{host} resolves to no address this server's agents may reach (the operator allows networks with --agent-net)"
            ));
        }
        Ok(allowed)
    }

    /// An HTTP client that connects only where this sandbox allows, redirects included. It
    /// uses no proxy from the environment (`HTTP_PROXY`…): a proxy would resolve names itself,
    /// past the allow-list.
    pub fn http_client(&self, builder: reqwest::ClientBuilder) -> reqwest::Result<reqwest::Client> {
        let me = self.clone();
        let redirect = reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= 5 {
                attempt.error("too many redirects")
            } else if let Err(e) = me.check_url(attempt.url()) {
                attempt.error(e)
            } else {
                attempt.follow()
            }
        });
        builder
            .no_proxy()
            .dns_resolver(Arc::new(Guard(self.clone())))
            .redirect(redirect)
            .build()
    }

    /// The HTTP client of MCP servers (rmcp's own reqwest), held to the same rules.
    pub fn mcp_http_client(&self) -> Result<reqwest_mcp::Client, String> {
        let me = self.clone();
        let redirect = reqwest_mcp::redirect::Policy::custom(move |attempt| {
            let url = attempt.url().as_str().parse::<reqwest::Url>();
            match url
                .map_err(|e| e.to_string())
                .and_then(|u| me.check_url(&u))
            {
                Err(e) => attempt.error(e),
                Ok(()) if attempt.previous().len() >= 5 => attempt.error("too many redirects"),
                Ok(()) => attempt.follow(),
            }
        });
        reqwest_mcp::Client::builder()
            .no_proxy()
            .dns_resolver(GuardMcp(self.clone()))
            .redirect(redirect)
            .build()
            .map_err(|e| e.to_string())
    }

    /// Waits for a free run slot (functions and processes share them).
    pub async fn run_slot(&self) -> OwnedSemaphorePermit {
        // The semaphore is never closed.
        self.slots
            .clone()
            .acquire_owned()
            .await
            .unwrap_or_else(|_| unreachable!("the run slots are never closed"))
    }

    /// A command for `program args…` as this sandbox runs processes: in a process group of its
    /// own, with a minimal environment plus the allowed variables, limited CPU time and memory
    /// (through `/bin/sh`'s `ulimit`), as the configured user.
    pub fn command(&self, program: &str, args: &[String]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.arg("-c")
            .arg("ulimit -t \"$1\" && ulimit -v \"$2\" && shift 2 && exec \"$@\"")
            .arg("sh")
            .arg(self.cpu_secs.to_string())
            .arg((self.memory_mb * 1024).to_string())
            .arg(program)
            .args(args);
        cmd.env_clear();
        for name in BASE_ENV
            .iter()
            .copied()
            .chain(self.env.iter().map(String::as_str))
        {
            if let Ok(v) = std::env::var(name) {
                cmd.env(name, v);
            }
        }
        cmd.process_group(0);
        if let Some(u) = &self.process_user {
            cmd.uid(u.uid).gid(u.gid);
        }
        cmd
    }
}

/// Kills a whole process group with SIGKILL when dropped (a process started by
/// [`Sandbox::command`] leads its own group, whose id is its pid).
#[derive(Debug)]
pub struct GroupKill(Option<u32>);

impl GroupKill {
    /// Guards the group led by `pid`.
    pub fn new(pid: Option<u32>) -> Self {
        GroupKill(pid)
    }

    /// Kills the group now.
    pub fn kill(&mut self) {
        if let Some(pid) = self.0.take() {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The resolver of the sandbox's HTTP clients: only allowed addresses come back.
struct Guard(Sandbox);
/// The same for rmcp's HTTP client.
struct GuardMcp(Sandbox);

macro_rules! resolver {
    ($guard:ident, $krate:ident) => {
        impl $krate::dns::Resolve for $guard {
            fn resolve(&self, name: $krate::dns::Name) -> $krate::dns::Resolving {
                let sandbox = self.0.clone();
                let host = name.as_str().to_string();
                Box::pin(async move {
                    let addrs = sandbox.resolve(&host).await?;
                    Ok(Box::new(addrs.into_iter()) as $krate::dns::Addrs)
                })
            }
        }
    };
}
resolver!(Guard, reqwest);
resolver!(GuardMcp, reqwest_mcp);

/// The default sandbox that also reaches loopback, where unit tests' stand-ins listen.
#[cfg(test)]
pub(crate) fn loopback() -> Sandbox {
    Sandbox::default().allowing(NetRule::Loopback)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_default_reaches_public_addresses_only() {
        let s = Sandbox::default();
        for ok in ["8.8.8.8", "1.1.1.1", "2606:4700::1111"] {
            assert!(s.ip_allowed(ip(ok)), "{ok}");
        }
        for no in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "224.0.0.1",
        ] {
            assert!(!s.ip_allowed(ip(no)), "{no}");
        }
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(s.check_url(&url("http://127.0.0.1:9/")).is_err());
        assert!(s.check_url(&url("http://localhost:9/")).is_err());
        assert!(s.check_url(&url("http://[::1]:9/")).is_err());
        assert!(s.check_url(&url("file:///etc/passwd")).is_err());
        assert!(s.check_url(&url("https://example.com/")).is_ok());
    }

    #[test]
    fn rules_allow_what_they_name() {
        let s = Sandbox::default().with_net(vec![
            NetRule::parse("loopback").unwrap(),
            NetRule::parse("10.0.0.0/8").unwrap(),
            NetRule::parse("llm.internal").unwrap(),
        ]);
        assert!(s.ip_allowed(ip("127.0.0.1")) && s.ip_allowed(ip("10.9.9.9")));
        assert!(!s.ip_allowed(ip("8.8.8.8")) && !s.ip_allowed(ip("192.168.0.1")));
        assert!(s.host_named("LLM.internal."));
        assert!(NetRule::parse("10.0.0.0/33").is_err());
        assert!(NetRule::parse("a b").is_err());
        assert_eq!(
            NetRule::parse("169.254.169.254").unwrap(),
            NetRule::Cidr(ip("169.254.169.254"), 32)
        );
    }

    #[tokio::test]
    async fn names_are_judged_by_what_they_resolve_to() {
        let s = Sandbox::default();
        let e = s.resolve("localhost").await.unwrap_err();
        assert!(e.contains("--agent-net"), "{e}");
        let s = s.allowing(NetRule::Loopback);
        assert!(!s.resolve("localhost").await.unwrap().is_empty());
    }

    #[test]
    fn only_allowed_variables_are_read() {
        let s = Sandbox::default().with_env(["SANDBOX_TEST_OK".to_string()]);
        assert!(s.read_env("PATH").unwrap_err().contains("--agent-env"));
        std::env::set_var("SANDBOX_TEST_OK", "v");
        assert_eq!(s.read_env("SANDBOX_TEST_OK").unwrap(), "v");
    }
}
