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
                let Ok(Some(body)) = read else { return None };
                let i = index_in(&body)?;
                clock.latency_us(i)
            }));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
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
        for c in clients {
            if let Ok(Some(l)) = c.await {
                all.push(l);
            }
        }
        drop(keep);
    }
    report(
        &format!("raw TCP answers x{waiters}, {rounds} rounds"),
        all,
        waiters * rounds,
    );
}

/// Phase 3: long-poll waiters.
pub(super) async fn long_poll(s: &Server, waiters: usize, rounds: usize) {
    let conv = "long-poll";
    create(&s.addr, &s.admin, conv).await;
    let mut all = Vec::with_capacity(waiters * rounds);
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
                    return None;
                };
                let i = index_in(&body)?;
                clock.latency_us(i)
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
        clock.sent[0].store(clock.now(), Ordering::Release);
        call(
            &mut ws,
            2,
            "sendMessage",
            json!({"conversationId": conv, "payload": {"text": "b0"}, "finality": "none"}),
        )
        .await;
        for t in tasks {
            if let Ok(Some(l)) = t.await {
                all.push(l);
            }
        }
        let _ = ws.close(None).await;
    }
    report(
        &format!("long-poll x{waiters} parked, {rounds} rounds"),
        all,
        waiters * rounds,
    );
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
