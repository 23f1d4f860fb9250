//! Fanout over every transport, against the release server binary in its own process, each
//! beside the machine's own reference for it (no server: bare loopback TCP with the same
//! readers):
//!
//! 0. the reference for 1 and 2: N loopback connections fed each event as a frame the size of
//!    the server's notification, by as many sender threads as cores;
//! 1. append → delivery latency (p50/p99/p99.9) to N WebSocket subscribers of one conversation
//!    while one writer appends at R events/s (defaults 1,000 and 1,000/s);
//! 2. the same to N SSE streams;
//! 3. long-poll wake latency (append → the waiter's whole answer) with W parked waiters
//!    (default 2,000), over several rounds, after its reference: W parked connections each
//!    written a ready-made answer at once; in both, every connection stays open until the
//!    round's last answer is in, and the CPU each answer cost meanwhile is printed;
//! 4. C idle, authenticated WebSocket connections (default 10,000) and the server's resident
//!    memory per connection (VmRSS after − before, divided by C).
//!
//! Latency is measured in this process, from just before the append is sent (so it includes
//! the durable commit) to the moment the event arrives; each event carries its index in its
//! text. The clients are minimal (raw WebSocket frames, raw HTTP/1.1 with chunked decoding)
//! and scan for the index instead of parsing JSON, so that most of the two cores go to the
//! server; the client load still shares the machine, so the figures are an upper bound.
//!
//! ```sh
//! cargo bench --workspace --bench http_fanout
//! # BENCH_SUBSCRIBERS, BENCH_RATE, BENCH_SECONDS, BENCH_WAITERS, BENCH_POLL_ROUNDS, BENCH_IDLE,
//! # BENCH_PHASES=raw,ws,sse,rawpoll,poll,idle (which phases run; raw and rawpoll are the
//! # machine's own references for ws/sse and poll: bare loopback TCP, no server)
//! ```

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;

#[path = "common/raw_ws.rs"]
mod raw_ws;
#[path = "fanout/server.rs"]
mod server;
use server::{cpu_seconds, CpuMeter, Server};

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<TcpStream>>;
#[path = "fanout/poll.rs"]
mod poll;
use poll::{long_poll, raw_long_poll};
use raw_ws::{Frame, RawWs};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn ws_connect(addr: &str, token: &str) -> Ws {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/rpc"))
        .await
        .expect("connect");
    call(&mut ws, 1, "authenticate", json!({"token": token})).await;
    ws
}

async fn call(ws: &mut Ws, id: u64, method: &str, params: serde_json::Value) -> serde_json::Value {
    let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    ws.send(Message::text(req.to_string())).await.expect("send");
    loop {
        let msg = ws.next().await.expect("open").expect("frame");
        if let Message::Text(t) = msg {
            let v: serde_json::Value = serde_json::from_str(&t).expect("json");
            if v["id"] == json!(id) {
                assert!(v.get("error").is_none(), "{method} failed: {v}");
                return v["result"].clone();
            }
        }
    }
}

/// The index an event carries in its text (`"text":"b<index>"`), found without parsing JSON.
fn index_in(bytes: &[u8]) -> Option<usize> {
    static KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"text\":\"b"));
    let at = KEY.find(bytes)? + KEY.needle().len();
    let digits = bytes[at..].iter().take_while(|b| b.is_ascii_digit());
    let mut n = 0usize;
    let mut any = false;
    for d in digits {
        n = n * 10 + (d - b'0') as usize;
        any = true;
    }
    any.then_some(n)
}

/// Reads `n` events (each event's index in its text) from `ws`, or until the connection ends
/// or the phase's one deadline passes (a per-frame timer would cost the clients more than the
/// frames do); the latency of each, in microseconds.
async fn latencies(ws: &mut RawWs, n: usize, rate: usize, clock: &Clock) -> Vec<u32> {
    let mut lat = Vec::with_capacity(n);
    let deadline = Duration::from_secs(30 + (n / rate.max(1)) as u64);
    let _ = tokio::time::timeout(deadline, async {
        let mut seen = 0;
        while seen < n {
            let r = match ws.next_frame().await {
                Frame::Text(r) => r,
                Frame::Other => continue,
                Frame::Closed => break,
            };
            if let Some(i) = index_in(ws.text(r)) {
                seen += 1;
                if let Some(l) = clock.latency_us(i) {
                    lat.push(l);
                }
            }
        }
    })
    .await;
    lat
}

/// When each event was sent, in nanoseconds since `origin` (0: not yet).
struct Clock {
    origin: Instant,
    sent: Vec<AtomicU64>,
}

impl Clock {
    fn new(n: usize) -> Arc<Clock> {
        Arc::new(Clock {
            origin: Instant::now(),
            sent: (0..n).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn latency_us(&self, idx: usize) -> Option<u32> {
        let sent = self.sent.get(idx)?.load(Ordering::Acquire);
        (sent != 0).then(|| ((self.now().saturating_sub(sent)) / 1000) as u32)
    }
}

/// Appends `n` events at `rate`/s from one WebSocket connection, pipelined; returns the
/// median acknowledgement latency in microseconds.
async fn write_events(
    addr: &str,
    token: &str,
    conv: &str,
    n: usize,
    rate: usize,
    clock: Arc<Clock>,
) -> u32 {
    let ws = ws_connect(addr, token).await;
    let (mut tx, mut rx) = ws.split();
    let acks = tokio::spawn({
        let clock = clock.clone();
        async move {
            let mut lat = Vec::with_capacity(n);
            let mut answered = 0;
            while answered < n {
                let t = match rx.next().await {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(_)) => continue,
                    other => {
                        eprintln!("writer connection ended after {answered} answers: {other:?}");
                        break;
                    }
                };
                let v: serde_json::Value = serde_json::from_str(&t).unwrap_or_default();
                let Some(id) = v["id"].as_u64() else { continue };
                answered += 1;
                if v.get("error").is_some() {
                    eprintln!("append {id} refused: {v}");
                } else if let Some(l) = clock.latency_us(id as usize) {
                    lat.push(l);
                }
            }
            lat.sort_unstable();
            lat.get(lat.len() / 2).copied().unwrap_or(0)
        }
    });
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for i in 0..n {
        tick.tick().await;
        let req = json!({"jsonrpc": "2.0", "id": i, "method": "sendMessage", "params": {
            "conversationId": conv, "payload": {"text": format!("b{i}")}, "finality": "none"}});
        clock.sent[i].store(clock.now(), Ordering::Release);
        tx.send(Message::text(req.to_string())).await.expect("send");
    }
    let median = acks.await.unwrap_or(0);
    let _ = tx.close().await;
    median
}

fn report(name: &str, mut lat: Vec<u32>, expected: usize) {
    lat.sort_unstable();
    let pct = |p: f64| {
        if lat.is_empty() {
            return 0.0;
        }
        lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0
    };
    println!(
        "{name:<34} deliveries {:>9} of {:>9}   p50 {:>8.2} ms   p99 {:>8.2} ms   p99.9 {:>8.2} ms   max {:>8.2} ms",
        lat.len(),
        expected,
        pct(0.5),
        pct(0.99),
        pct(0.999),
        pct(1.0),
    );
}

async fn create(addr: &str, admin: &str, conv: &str) {
    let mut ws = ws_connect(addr, admin).await;
    call(
        &mut ws,
        2,
        "createConversation",
        json!({"conversationId": conv, "participants": ["alice", "bob"]}),
    )
    .await;
    let _ = ws.close(None).await;
}

/// Phase 0: this machine's own ceiling for the same fanout, with no server in it: `subs`
/// loopback TCP connections fed by as many sender threads as there are cores, each event a
/// WebSocket text frame the size of the server's `event` notification, every event due on a
/// connection written in one call (as much coalescing as there can be without waiting), read
/// by the same minimal readers as the WebSocket phase. Latency runs from the moment an event
/// is due to its arrival.
async fn raw_fanout(subs: usize, rate: usize, n: usize) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let clock = Clock::new(n);
    let mut readers = Vec::with_capacity(subs);
    let mut accepted = Vec::with_capacity(subs);
    for _ in 0..subs {
        let connect = TcpStream::connect(addr);
        let (a, c) = tokio::join!(listener.accept(), connect);
        let (a, c) = (a.expect("accept").0, c.expect("connect"));
        a.set_nodelay(true).ok();
        c.set_nodelay(true).ok();
        let std = a.into_std().expect("std socket");
        std.set_nonblocking(false).ok();
        accepted.push(std);
        let clock = clock.clone();
        readers.push(tokio::spawn(async move {
            let mut ws = RawWs::over(c, Vec::new(), 0);
            latencies(&mut ws, n, rate, &clock).await
        }));
    }
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let started = cpu_seconds("self");
    let wall = Instant::now();
    let mut groups: Vec<Vec<std::net::TcpStream>> = (0..cores).map(|_| Vec::new()).collect();
    for (k, c) in accepted.into_iter().enumerate() {
        groups[k % cores].push(c);
    }
    let origin = Instant::now();
    let senders: Vec<_> = groups
        .into_iter()
        .map(|mut conns| {
            let clock = clock.clone();
            std::thread::spawn(move || {
                use std::io::Write;
                let mut sent = vec![0usize; conns.len()];
                let mut buf = Vec::new();
                let mut frames: Vec<Vec<u8>> = Vec::new();
                loop {
                    let due = n.min((origin.elapsed().as_secs_f64() * rate as f64) as usize + 1);
                    while frames.len() < due {
                        let i = frames.len();
                        let _ = clock.sent[i].compare_exchange(
                            0,
                            clock.now(),
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        );
                        frames.push(raw_event_frame(i));
                    }
                    for (k, c) in conns.iter_mut().enumerate() {
                        if sent[k] < due {
                            buf.clear();
                            for f in &frames[sent[k]..due] {
                                buf.extend_from_slice(f);
                            }
                            if c.write_all(&buf).is_err() {
                                return;
                            }
                            sent[k] = due;
                        }
                    }
                    if due == n {
                        return;
                    }
                    let next = Duration::from_secs_f64(due as f64 / rate as f64);
                    if let Some(wait) = next.checked_sub(origin.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
            })
        })
        .collect();
    for s in senders {
        let _ = s.join();
    }
    let mut all = Vec::with_capacity(subs * n);
    for r in readers {
        all.extend(r.await.unwrap_or_default());
    }
    report(&format!("raw TCP fanout x{subs} @ {rate}/s"), all, subs * n);
    let secs = wall.elapsed().as_secs_f64();
    println!(
        "{:<34} CPU over {:.1} s: senders and readers together {:.0}% (of one core); no server",
        "",
        secs,
        100.0 * (cpu_seconds("self") - started) / secs
    );
}

/// A WebSocket text frame the size and shape of the server's `event` notification for event `i`.
fn raw_event_frame(i: usize) -> Vec<u8> {
    let payload = format!(
        r#"{{"jsonrpc":"2.0","method":"event","params":{{"subscription":4503599627370495,"result":{{"conversationId":"ws-fanout","event":{{"seq":{seq},"kind":"message","author":"alice","turn":1,"finality":"none","ts":"2026-11-23T01:00:00.000Z","payload":{{"text":"b{i}"}}}}}}}}}}"#,
        seq = i + 2
    );
    let mut f = vec![0x81u8];
    if payload.len() < 126 {
        f.push(payload.len() as u8);
    } else {
        f.push(126);
        f.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    f.extend_from_slice(payload.as_bytes());
    f
}

/// Phase 1: WebSocket subscribers.
async fn ws_fanout(s: &Server, subs: usize, rate: usize, n: usize) {
    let conv = "ws-fanout";
    create(&s.addr, &s.admin, conv).await;
    let clock = Clock::new(n);
    let ready = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(subs);
    for _ in 0..subs {
        let addr = s.addr.clone();
        let token = s.bob.clone();
        let clock = clock.clone();
        let ready = ready.clone();
        tasks.push(tokio::spawn(async move {
            let mut ws = RawWs::connect(&addr, &token).await;
            ws.call(
                2,
                "subscribe",
                json!({"conversationId": conv, "sinceSeq": 1}),
            )
            .await;
            ready.fetch_add(1, Ordering::Relaxed);
            latencies(&mut ws, n, rate, &clock).await
        }));
    }
    while ready.load(Ordering::Relaxed) < subs {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let cpu = CpuMeter::start(s);
    let ack = write_events(&s.addr, &s.alice, conv, n, rate, clock).await;
    let mut all = Vec::with_capacity(subs * n);
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    report(&format!("WebSocket x{subs} @ {rate}/s"), all, subs * n);
    cpu.report();
    println!(
        "{:<34} append acknowledged (durable) p50 {:.2} ms",
        "",
        ack as f64 / 1000.0
    );
}

/// A minimal SSE reader over raw HTTP/1.1 (chunked transfer decoding), yielding each event's
/// data line.
async fn sse_open(addr: &str, token: &str, conv: &str, since: u64) -> TokioBufReader<TcpStream> {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).ok();
    let req = format!(
        "GET /conversations/{conv}/events?sinceSeq={since} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
    );
    tcp.write_all(req.as_bytes()).await.expect("request");
    let mut r = TokioBufReader::new(tcp);
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line).await.expect("header");
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    r
}

/// Phase 2: SSE streams.
async fn sse_fanout(s: &Server, subs: usize, rate: usize, n: usize) {
    let conv = "sse-fanout";
    create(&s.addr, &s.admin, conv).await;
    let clock = Clock::new(n);
    let ready = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(subs);
    for _ in 0..subs {
        let addr = s.addr.clone();
        let token = s.bob.clone();
        let clock = clock.clone();
        let ready = ready.clone();
        tasks.push(tokio::spawn(async move {
            let mut r = sse_open(&addr, &token, conv, 1).await;
            ready.fetch_add(1, Ordering::Relaxed);
            let mut lat = Vec::with_capacity(n);
            let mut seen = 0;
            let mut size_line = String::new();
            let mut chunk = Vec::new();
            while seen < n {
                size_line.clear();
                let read =
                    tokio::time::timeout(Duration::from_secs(10), r.read_line(&mut size_line))
                        .await;
                let Ok(Ok(got)) = read else { break };
                if got == 0 {
                    break;
                }
                let Ok(size) = usize::from_str_radix(size_line.trim(), 16) else {
                    continue;
                };
                if size == 0 {
                    break;
                }
                chunk.resize(size + 2, 0);
                if r.read_exact(&mut chunk).await.is_err() {
                    break;
                }
                // One chunk holds one or more whole events; each carries one index.
                for event in chunk
                    .split(|b| *b == b'\n')
                    .filter(|l| l.starts_with(b"data:"))
                {
                    if let Some(i) = index_in(event) {
                        seen += 1;
                        if let Some(l) = clock.latency_us(i) {
                            lat.push(l);
                        }
                    }
                }
            }
            lat
        }));
    }
    while ready.load(Ordering::Relaxed) < subs {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The stream is open once its headers arrive; give the server a moment to park each feed.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cpu = CpuMeter::start(s);
    write_events(&s.addr, &s.alice, conv, n, rate, clock).await;
    let mut all = Vec::with_capacity(subs * n);
    for t in tasks {
        all.extend(t.await.unwrap_or_default());
    }
    report(&format!("SSE x{subs} @ {rate}/s"), all, subs * n);
    cpu.report();
}

/// Phase 4: idle connections and memory.
async fn idle(s: &Server, n: usize) {
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = s.rss_kib();
    let mut conns = Vec::with_capacity(n);
    let started = Instant::now();
    for chunk in 0..n.div_ceil(500) {
        let mut batch = Vec::new();
        for _ in 0..500.min(n - chunk * 500) {
            let addr = s.addr.clone();
            let token = s.bob.clone();
            batch.push(tokio::spawn(async move { ws_connect(&addr, &token).await }));
        }
        for b in batch {
            if let Ok(ws) = b.await {
                conns.push(ws);
            }
        }
    }
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = s.rss_kib();
    let per = (after.saturating_sub(before)) as f64 * 1024.0 / conns.len().max(1) as f64;
    println!(
        "idle WebSocket connections {:>6} (authenticated, in {:.1} s)   server RSS {} → {} KiB   {:.1} KiB per connection",
        conns.len(),
        took.as_secs_f64(),
        before,
        after,
        per / 1024.0
    );
    drop(conns);
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("http_fanout: bench");
        return;
    }
    if !std::env::args().any(|a| a == "--bench") {
        // `cargo test` runs bench targets in test mode: nothing to check here.
        return;
    }
    let subs = env_or("BENCH_SUBSCRIBERS", 1000);
    let rate = env_or("BENCH_RATE", 1000);
    let seconds = env_or("BENCH_SECONDS", 5);
    let waiters = env_or("BENCH_WAITERS", 2000);
    let poll_rounds = env_or("BENCH_POLL_ROUNDS", 5);
    let idle_n = env_or("BENCH_IDLE", 10_000);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let server = Server::start();
    println!(
        "http_fanout: server pid {} on {}, {} cores; {subs} subscribers, {rate} events/s for {seconds} s",
        server.pid,
        server.addr,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let phases =
        std::env::var("BENCH_PHASES").unwrap_or_else(|_| "raw,ws,sse,rawpoll,poll,idle".into());
    let on = |p: &str| phases.split(',').any(|x| x.trim() == p);
    rt.block_on(async {
        if on("raw") {
            raw_fanout(subs, rate, rate * seconds).await;
        }
        if on("ws") {
            ws_fanout(&server, subs, rate, rate * seconds).await;
        }
        if on("sse") {
            sse_fanout(&server, subs, rate, rate * seconds).await;
        }
        if on("rawpoll") {
            raw_long_poll(waiters, poll_rounds).await;
        }
        if on("poll") {
            long_poll(&server, waiters, poll_rounds).await;
        }
        if on("idle") {
            idle(&server, idle_n).await;
        }
    });
}
