//! A minimal WebSocket client over raw TCP for the bench binaries' load: the upgrade, masked
//! frames for its own calls, and the server's (unmasked) frames parsed in place from one read
//! buffer. It keeps the clients' share of the two cores small, so that most of it goes to the
//! server they measure.

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The mask of every frame this client sends (a client must mask; the value is immaterial).
const MASK: [u8; 4] = [0x5a, 0x13, 0xc7, 0x2e];

pub struct RawWs {
    tcp: TcpStream,
    /// Bytes read; `buf[at..filled]` is not yet parsed.
    buf: Vec<u8>,
    at: usize,
    filled: usize,
    /// Pongs owed for pings found by [`RawWs::buffered_frame`], sent with the next write.
    pongs: Vec<u8>,
}

/// What [`RawWs::next_frame`] found.
pub enum Frame {
    /// A text frame: its payload is `ws.text(range)`.
    Text(std::ops::Range<usize>),
    Other,
    Closed,
}

/// Appends `text` as one masked text frame to `out`.
pub fn text_frame(out: &mut Vec<u8>, text: &[u8]) {
    out.push(0x81);
    if text.len() < 126 {
        out.push(0x80 | text.len() as u8);
    } else if text.len() <= u16::MAX as usize {
        out.push(0x80 | 126);
        out.extend_from_slice(&(text.len() as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(text.len() as u64).to_be_bytes());
    }
    out.extend_from_slice(&MASK);
    out.extend(text.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
}

/// The payload length of the frame at the start of `avail` and the length of its header up to
/// its mask (if any): `None` until that much has been read.
pub fn frame_length(avail: &[u8]) -> Option<(usize, usize)> {
    if avail.len() < 2 {
        return None;
    }
    match avail[1] & 0x7f {
        126 if avail.len() >= 4 => Some((u16::from_be_bytes([avail[2], avail[3]]) as usize, 4)),
        127 if avail.len() >= 10 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&avail[2..10]);
            Some((u64::from_be_bytes(b) as usize, 10))
        }
        126 | 127 => None,
        n => Some((n as usize, 2)),
    }
}

impl RawWs {
    /// Connects to `/rpc` at `addr` and authenticates with `token`.
    pub async fn connect(addr: &str, token: &str) -> RawWs {
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.set_nodelay(true).ok();
        let req = format!(
            "GET /rpc HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        tcp.write_all(req.as_bytes())
            .await
            .expect("upgrade request");
        let mut buf = Vec::with_capacity(64 * 1024);
        let end = loop {
            let mut chunk = [0u8; 4096];
            let n = tcp.read(&mut chunk).await.expect("upgrade answer");
            assert!(n > 0, "closed during the upgrade");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(end) = memchr::memmem::find(&buf, b"\r\n\r\n") {
                break end + 4;
            }
        };
        assert!(buf.starts_with(b"HTTP/1.1 101"), "upgrade refused");
        let mut ws = RawWs::over(tcp, buf, end);
        ws.call(1, "authenticate", json!({"token": token})).await;
        ws
    }

    /// A client over `tcp` whose first bytes, `read`, are parsed from `at`.
    pub fn over(tcp: TcpStream, mut read: Vec<u8>, at: usize) -> RawWs {
        let filled = read.len();
        read.resize(filled.max(256 * 1024), 0);
        RawWs {
            tcp,
            buf: read,
            at,
            filled,
            pongs: Vec::new(),
        }
    }

    /// The payload of a text frame found by [`RawWs::next_frame`] or
    /// [`RawWs::buffered_frame`], until the next call of either.
    pub fn text(&self, r: std::ops::Range<usize>) -> &[u8] {
        &self.buf[r]
    }

    /// Writes `bytes` (whole frames) to the server, after any pongs owed.
    pub async fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if !self.pongs.is_empty() {
            let pongs = std::mem::take(&mut self.pongs);
            self.tcp.write_all(&pongs).await?;
        }
        self.tcp.write_all(bytes).await
    }

    /// Sends `text` as one text frame.
    pub async fn send_text(&mut self, text: &str) {
        let mut f = Vec::with_capacity(text.len() + 14);
        text_frame(&mut f, text.as_bytes());
        self.write(&f).await.expect("send");
    }

    /// Calls `method` and waits for its answer (skipping anything else).
    pub async fn call(&mut self, id: u64, method: &str, params: serde_json::Value) {
        let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_text(&req.to_string()).await;
        let want = format!("\"id\":{id}");
        loop {
            match self.next_frame().await {
                Frame::Text(r) => {
                    let t = self.text(r);
                    if memchr::memmem::find(t, want.as_bytes()).is_some() {
                        assert!(
                            memchr::memmem::find(t, b"\"error\"").is_none(),
                            "{method} failed: {}",
                            String::from_utf8_lossy(t)
                        );
                        return;
                    }
                }
                Frame::Other => {}
                Frame::Closed => panic!("closed while waiting for {method}"),
            }
        }
    }

    /// The next whole frame already read, without reading more; a ping is owed its pong.
    pub fn buffered_frame(&mut self) -> Option<Frame> {
        let avail = &self.buf[self.at..self.filled];
        let (len, hdr) = frame_length(avail)?;
        let op = avail[0] & 0x0f;
        if avail.len() < hdr + len {
            return None;
        }
        let start = self.at + hdr;
        self.at = start + len;
        Some(match op {
            0x1 => Frame::Text(start..start + len),
            0x8 => Frame::Closed,
            0x9 => {
                // A pong carries the ping's payload, masked (with the zero mask).
                self.pongs
                    .extend_from_slice(&[0x8a, 0x80 | len as u8, 0, 0, 0, 0]);
                let payload = self.buf[start..start + len].to_vec();
                self.pongs.extend_from_slice(&payload);
                Frame::Other
            }
            _ => Frame::Other,
        })
    }

    /// The next whole frame, reading as needed; a ping is answered.
    pub async fn next_frame(&mut self) -> Frame {
        loop {
            if let Some(f) = self.buffered_frame() {
                if !self.pongs.is_empty() && self.write(&[]).await.is_err() {
                    return Frame::Closed;
                }
                return f;
            }
            // Need more bytes: move the unread part to the front when room runs short, then read.
            if self.buf.len() - self.filled < 16 * 1024 {
                self.buf.copy_within(self.at..self.filled, 0);
                self.filled -= self.at;
                self.at = 0;
                if self.buf.len() - self.filled < 16 * 1024 {
                    self.buf.resize(self.buf.len() * 2, 0);
                }
            }
            let n = self
                .tcp
                .read(&mut self.buf[self.filled..])
                .await
                .unwrap_or(0);
            if n == 0 {
                return Frame::Closed;
            }
            self.filled += n;
        }
    }
}
