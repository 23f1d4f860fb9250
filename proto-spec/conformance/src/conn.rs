//! One WebSocket connection as a vector's step sees it: calls answered by id, notifications
//! kept in arrival order, and answers nobody waited for kept apart.

use std::collections::VecDeque;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A connection of one identity.
#[derive(Debug)]
pub struct Conn {
    ws: Ws,
    next_id: u64,
    /// Notifications not yet taken by a step, in order.
    pub notes: VecDeque<Value>,
    /// Answers to frames a step sent raw, in order.
    stray: VecDeque<Value>,
    /// The connection was closed (by the server, or by a step).
    pub closed: bool,
}

impl Conn {
    /// Connects to `url`.
    pub async fn open(url: &str, timeout: Duration) -> Result<Conn, String> {
        let connecting = tokio_tungstenite::connect_async(url);
        let (ws, _) = tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_| format!("no WebSocket handshake with {url} within {timeout:?}"))?
            .map_err(|e| format!("could not connect to {url}: {e}"))?;
        Ok(Conn {
            ws,
            next_id: 1,
            notes: VecDeque::new(),
            stray: VecDeque::new(),
            closed: false,
        })
    }

    /// Sends one text frame as it is.
    pub async fn send_text(&mut self, text: String) -> Result<(), String> {
        self.ws
            .send(Message::text(text))
            .await
            .map_err(|e| format!("could not send: {e}"))
    }

    /// Sends a request; its id.
    pub async fn request(&mut self, method: &str, params: Option<Value>) -> Result<u64, String> {
        let id = self.next_id;
        self.next_id += 1;
        let mut frame = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let Some(p) = params {
            frame["params"] = p;
        }
        self.send_text(frame.to_string()).await?;
        Ok(id)
    }

    /// The next frame, as JSON; `Ok(None)` at the deadline.
    async fn frame(&mut self, deadline: Instant) -> Result<Option<Value>, String> {
        loop {
            let next = tokio::time::timeout_at(deadline, self.ws.next()).await;
            let msg = match next {
                Err(_) => return Ok(None),
                Ok(None) => {
                    self.closed = true;
                    return Err("the server closed the connection".into());
                }
                Ok(Some(Err(e))) => {
                    self.closed = true;
                    return Err(format!("the connection failed: {e}"));
                }
                Ok(Some(Ok(m))) => m,
            };
            match msg {
                Message::Text(t) => {
                    return serde_json::from_str(t.as_str()).map(Some).map_err(|e| {
                        format!("the server sent a frame that is not JSON ({e}): {t}")
                    })
                }
                Message::Binary(_) => return Err("the server sent a binary frame".into()),
                Message::Close(c) => {
                    self.closed = true;
                    return Err(format!("the server closed the connection ({c:?})"));
                }
                _ => {}
            }
        }
    }

    /// Reads until the answer to request `id`, keeping notifications and other answers.
    pub async fn answer(&mut self, id: u64, deadline: Instant) -> Result<Value, String> {
        // Read already, while another answer was awaited (answers come in any order).
        if let Some(i) = self
            .stray
            .iter()
            .position(|a| a.get("id") == Some(&json!(id)))
        {
            if let Some(a) = self.stray.remove(i) {
                return Ok(a);
            }
        }
        loop {
            let Some(frame) = self.frame(deadline).await? else {
                return Err(format!(
                    "no answer to request {id} in time ({} other answers and {} notifications came; the last other: {})",
                    self.stray.len(),
                    self.notes.len(),
                    self.stray.back().map(Value::to_string).unwrap_or_default()
                ));
            };
            if frame.get("method").is_some() {
                self.notes.push_back(frame);
            } else if frame.get("id") == Some(&json!(id)) {
                return Ok(frame);
            } else {
                self.stray.push_back(frame);
            }
        }
    }

    /// The next answer that no request of ours waited for (to a raw frame).
    pub async fn stray_answer(&mut self, deadline: Instant) -> Result<Value, String> {
        loop {
            if let Some(a) = self.stray.pop_front() {
                return Ok(a);
            }
            let Some(frame) = self.frame(deadline).await? else {
                return Err("no answer in time".into());
            };
            if frame.get("method").is_some() {
                self.notes.push_back(frame);
            } else {
                self.stray.push_back(frame);
            }
        }
    }

    /// The next notification, or `None` at the deadline.
    pub async fn notification(&mut self, deadline: Instant) -> Result<Option<Value>, String> {
        loop {
            if let Some(n) = self.notes.pop_front() {
                return Ok(Some(n));
            }
            match self.frame(deadline).await? {
                None => return Ok(None),
                Some(f) if f.get("method").is_some() => self.notes.push_back(f),
                Some(f) => self.stray.push_back(f),
            }
        }
    }

    /// Closes the connection.
    pub async fn close(&mut self) {
        let _ = self.ws.close(None).await;
        self.closed = true;
    }
}
