//! The appends benchmark's WebSocket reference: a bare WebSocket server on 127.0.0.1 that
//! answers every JSON-RPC request at once with an answer of the size the orchestrator sends
//! for an append (`{"jsonrpc":"2.0","id":N,"result":{"seq":S,"turn":1,"duplicate":false}}`),
//! and does nothing else: no orchestrator, no log, no JSON parse. Built as lean as the load's
//! own clients (frames parsed in place from one read buffer, every answer to one read sent in
//! one write), so that the round trips it serves are what the machine, its loopback and the
//! same clients allow.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;

/// Starts the server on the current runtime; its address. It serves until the runtime ends.
pub async fn start() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(serve(tcp));
        }
    });
    Ok(addr)
}

/// One connection: the upgrade, then answers until the client closes.
async fn serve(mut tcp: TcpStream) {
    tcp.set_nodelay(true).ok();
    let mut buf = vec![0u8; 256 * 1024];
    let mut filled = 0;
    let end = loop {
        let Ok(n) = tcp.read(&mut buf[filled..]).await else {
            return;
        };
        if n == 0 {
            return;
        }
        filled += n;
        if let Some(end) = memchr::memmem::find(&buf[..filled], b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let Some(key) = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("sec-websocket-key")
            .then(|| value.trim().to_string())
    }) else {
        return;
    };
    let upgraded = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
        derive_accept_key(key.as_bytes())
    );
    if tcp.write_all(upgraded.as_bytes()).await.is_err() {
        return;
    }
    let mut at = end;
    let mut seq = 1u64;
    let mut out = Vec::with_capacity(64 * 1024);
    let mut text = Vec::with_capacity(1024);
    loop {
        // Every whole frame read so far.
        loop {
            let avail = &buf[at..filled];
            let Some((op, start, len)) = client_frame(avail) else {
                break;
            };
            let mask = [
                avail[start - 4],
                avail[start - 3],
                avail[start - 2],
                avail[start - 1],
            ];
            match op {
                0x1 => {
                    text.clear();
                    text.extend(
                        avail[start..start + len]
                            .iter()
                            .enumerate()
                            .map(|(i, b)| b ^ mask[i % 4]),
                    );
                    seq += 1;
                    answer(&mut out, request_id(&text), seq);
                }
                0x8 => return,
                _ => {}
            }
            at += start + len;
        }
        if !out.is_empty() {
            if tcp.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        // The unread part to the front, then read more.
        buf.copy_within(at..filled, 0);
        filled -= at;
        at = 0;
        if filled == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match tcp.read(&mut buf[filled..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => filled += n,
        }
    }
}

/// A whole masked client frame at the start of `avail`: its opcode, where its payload starts
/// (after the mask) and its length.
fn client_frame(avail: &[u8]) -> Option<(u8, usize, usize)> {
    let (len, hdr) = crate::raw_ws::frame_length(avail)?;
    let start = hdr + 4;
    (avail.len() >= start + len).then_some((avail[0] & 0x0f, start, len))
}

/// The digits of the request's `"id":` (the clients send numbers).
fn request_id(text: &[u8]) -> &[u8] {
    let Some(at) = memchr::memmem::find(text, b"\"id\":") else {
        return b"null";
    };
    let rest = &text[at + 5..];
    &rest[..rest.iter().take_while(|b| b.is_ascii_digit()).count()]
}

/// Appends an unmasked text frame answering request `id` as an append's answer would.
fn answer(out: &mut Vec<u8>, id: &[u8], seq: u64) {
    let mut body = Vec::with_capacity(96);
    body.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    body.extend_from_slice(id);
    body.extend_from_slice(
        format!(r#","result":{{"seq":{seq},"turn":1,"duplicate":false}}}}"#).as_bytes(),
    );
    out.push(0x81);
    if body.len() < 126 {
        out.push(body.len() as u8);
    } else {
        out.push(126);
        out.extend_from_slice(&(body.len() as u16).to_be_bytes());
    }
    out.extend_from_slice(&body);
}
