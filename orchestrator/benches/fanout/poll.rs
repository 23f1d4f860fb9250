//! The long-poll phases: 2,000 parked waiters on the server, and the bare-TCP reference.

use super::*;

/// Reads one HTTP/1.1 response with a Content-Length; answers its body.
pub(super) async fn read_response(tcp: &mut TcpStream) -> Option<Vec<u8>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = tcp.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = std::str::from_utf8(&buf[..end]).ok()?.to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))?
            .trim()
            .parse()
            .ok()?;
        if buf.len() >= end + 4 + len {
            return Some(buf[end + 4..end + 4 + len].to_vec());
        }
    }
}

/// The machine's own ceiling for phase 3, with no server in it: `waiters` loopback TCP
/// connections whose clients wait for an answer, then as many threads as there are cores each
/// write one ready-made HTTP answer (the size of the server's) to its share of them at once;
/// the clients read it as in phase 3. Latency runs from the moment the answers start.
pub(super) async fn raw_long_poll(waiters: usize, rounds: usize) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let body = r#"{"latestSeq":2,"timedOut":false,"events":[{"seq":2,"kind":"message","author":"alice","turn":1,"finality":"none","ts":"2026-11-23T01:00:00.000Z","payload":{"text":"b0"}}]}"#;
    let answer = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\ndate: Mon, 23 Nov 2026 01:00:00 GMT\r\n\r\n{body}",
        body.len()
    );
    let answer = Arc::new(answer.into_bytes());
    let mut all = Vec::with_capacity(waiters * rounds);
    // The CPU this process (the writers and the clients) uses while the answers go out.
    let mut cpu = 0.0;
    for _ in 0..rounds {
        let clock = Clock::new(1);
        let mut clients = Vec::with_capacity(waiters);
        let mut groups: Vec<Vec<std::net::TcpStream>> = (0..cores).map(|_| Vec::new()).collect();
        for k in 0..waiters {
            let (a, c) = tokio::join!(listener.accept(), TcpStream::connect(addr));
            let (a, mut c) = (a.expect("accept").0, c.expect("connect"));
            a.set_nodelay(true).ok();
            c.set_nodelay(true).ok();
            let std = a.into_std().expect("std socket");
            std.set_nonblocking(false).ok();
            groups[k % cores].push(std);
            let clock = clock.clone();
            clients.push(tokio::spawn(async move {
                let read =
                    tokio::time::timeout(Duration::from_secs(30), read_response(&mut c)).await;
                let Ok(Some(body)) = read else {
                    return (None, c);
                };
                (index_in(&body).and_then(|i| clock.latency_us(i)), c)
            }));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let cpu_before = cpu_seconds("self");
        clock.sent[0].store(clock.now(), Ordering::Release);
        let senders: Vec<_> = groups
            .into_iter()
            .map(|mut conns| {
                let answer = answer.clone();
                std::thread::spawn(move || {
                    use std::io::Write;
                    for c in &mut conns {
                        let _ = c.write_all(&answer);
                    }
                    conns
                })
            })
            .collect();
        let mut keep = Vec::new();
        for s in senders {
            keep.extend(s.join().unwrap_or_default());
        }
        let mut open = Vec::with_capacity(waiters);
        for c in clients {
            if let Ok((latency, conn)) = c.await {
                all.extend(latency);
                open.push(conn);
            }
        }
        cpu += cpu_seconds("self") - cpu_before;
        // Both ends closed once every answer is in, as in the server's phase.
        drop(open);
        drop(keep);
    }
    report(
        &format!("raw TCP answers x{waiters}, {rounds} rounds"),
        all,
        waiters * rounds,
    );
    per_answer(None, cpu, waiters * rounds);
}

/// Phase 3: long-poll waiters.
pub(super) async fn long_poll(s: &Server, waiters: usize, rounds: usize) {
    let conv = "long-poll";
    create(&s.addr, &s.admin, conv).await;
    let mut all = Vec::with_capacity(waiters * rounds);
    let server = s.pid.to_string();
    let (mut server_cpu, mut clients_cpu) = (0.0, 0.0);
    for round in 0..rounds {
        let since = 1 + round as u64;
        let clock = Clock::new(1);
        let parked = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::with_capacity(waiters);
        for w in 0..waiters {
            if w % 250 == 249 {
                // Park them in bursts the listen backlog takes.
                while parked.load(Ordering::Relaxed) < w {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            let addr = s.addr.clone();
            let token = s.bob.clone();
            let clock = clock.clone();
            let parked = parked.clone();
            tasks.push(tokio::spawn(async move {
                let mut tcp = TcpStream::connect(&addr).await.expect("connect");
                tcp.set_nodelay(true).ok();
                // A kept-alive connection, as browsers and HTTP libraries use: the answer is
                // complete when its Content-Length is in.
                let req = format!(
                    "GET /conversations/{conv}/wait?sinceSeq={since}&timeoutMs=30000 HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n"
                );
                tcp.write_all(req.as_bytes()).await.expect("request");
                parked.fetch_add(1, Ordering::Relaxed);
                let read = tokio::time::timeout(Duration::from_secs(30), read_response(&mut tcp)).await;
                let Ok(Some(body)) = read else {
                    return (None, tcp);
                };
                (index_in(&body).and_then(|i| clock.latency_us(i)), tcp)
            }));
        }
        while parked.load(Ordering::Relaxed) < waiters {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The requests are sent; wait until the server has parked them (the gauge says so).
        let deadline = Instant::now() + Duration::from_secs(10);
        while parked_waiters(&s.addr).await < waiters && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut ws = ws_connect(&s.addr, &s.alice).await;
        let (server_before, clients_before) = (cpu_seconds(&server), cpu_seconds("self"));
        clock.sent[0].store(clock.now(), Ordering::Release);
        call(
            &mut ws,
            2,
            "sendMessage",
            json!({"conversationId": conv, "payload": {"text": "b0"}, "finality": "none"}),
        )
        .await;
        // Each connection is held (kept alive, as a client that asks again would) until every
        // answer is in: closing them is no part of a wake-up, and the reference closes neither
        // end before then either.
        let mut open = Vec::with_capacity(waiters);
        for t in tasks {
            if let Ok((latency, conn)) = t.await {
                all.extend(latency);
                open.push(conn);
            }
        }
        server_cpu += cpu_seconds(&server) - server_before;
        clients_cpu += cpu_seconds("self") - clients_before;
        drop(open);
        let _ = ws.close(None).await;
    }
    report(
        &format!("long-poll x{waiters} parked, {rounds} rounds"),
        all,
        waiters * rounds,
    );
    per_answer(Some(server_cpu), clients_cpu, waiters * rounds);
}

/// The CPU each answer cost while the answers went out (from the append, or the first write,
/// to the last answer read): the server's, when there is one, and this process's (the clients,
/// and in the reference the writers too). Clock ticks of 10 ms, summed over the rounds.
fn per_answer(server: Option<f64>, here: f64, answers: usize) {
    let us = |secs: f64| secs * 1e6 / answers.max(1) as f64;
    match server {
        Some(server) => println!(
            "{:<34} CPU per answer while they went out: server {:.1} µs, clients {:.1} µs",
            "",
            us(server),
            us(here)
        ),
        None => println!(
            "{:<34} CPU per answer while they went out: writers and clients {:.1} µs",
            "",
            us(here)
        ),
    }
}

/// The server's `orchestrator_subscribers{transport="longpoll"}` gauge.
pub(super) async fn parked_waiters(addr: &str) -> usize {
    let Ok(mut tcp) = TcpStream::connect(addr).await else {
        return 0;
    };
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if tcp.write_all(req.as_bytes()).await.is_err() {
        return 0;
    }
    let mut body = String::new();
    let _ = tcp.read_to_string(&mut body).await;
    body.lines()
        .find(|l| l.starts_with("orchestrator_subscribers{transport=\"longpoll\"}"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as usize)
}
