//! The one task that owns a client's connection: it sends calls, matches answers, delivers
//! subscription events, and on a lost connection reconnects with backoff and jitter,
//! re-authenticates, resubscribes from each subscription's cursor and re-sends unanswered calls.

use super::*;

/// Opens a socket and authenticates on it.
pub(super) async fn open(config: &WsConfig) -> ClientResult<(Ws, String)> {
    let tls = if config.url.starts_with("wss://") {
        let tls = crate::tls::client_config(config.ca_file.as_deref())
            .map_err(|e| ClientError::Transport(format!("TLS for {}: {e}", config.url)))?;
        Some(tokio_tungstenite::Connector::Rustls(tls))
    } else {
        None
    };
    // Nagle's algorithm off: calls and answers are small frames that must leave at once.
    let (mut ws, _) =
        tokio_tungstenite::connect_async_tls_with_config(config.url.as_str(), None, true, tls)
            .await
            .map_err(|e| ClientError::Transport(format!("connect {}: {e}", config.url)))?;
    let req = json!({"jsonrpc": "2.0", "id": 0, "method": names::AUTHENTICATE, "params": {"token": config.token}});
    ws.send(Message::text(req.to_string()))
        .await
        .map_err(|e| ClientError::Transport(e.to_string()))?;
    while let Some(msg) = ws.next().await {
        let msg = msg.map_err(|e| ClientError::Transport(e.to_string()))?;
        let Message::Text(text) = msg else { continue };
        let v: Value =
            serde_json::from_str(&text).map_err(|e| ClientError::Transport(e.to_string()))?;
        if v.get("id") != Some(&json!(0)) {
            continue;
        }
        if let Some(err) = v.get("error") {
            return Err(ClientError::Rpc(wire_error(err)));
        }
        let r: AuthenticateResult = serde_json::from_value(v["result"].clone())
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        return Ok((ws, r.agent_id));
    }
    Err(ClientError::Transport(
        "the connection closed during authenticate".into(),
    ))
}

fn wire_error(err: &Value) -> RpcError {
    serde_json::from_value::<ErrorObject>(err.clone())
        .map(ErrorObject::into_rpc_error)
        .unwrap_or_else(|_| RpcError::new(ErrorCode::Internal, err.to_string()))
}

pub(super) struct Task {
    config: WsConfig,
    rx: mpsc::UnboundedReceiver<Cmd>,
    next_id: u64,
    waiting: HashMap<u64, Waiting>,
    subs: HashMap<u64, Sub>,
    by_server: HashMap<String, u64>,
    /// Notifications that arrived before their subscribe call's answer.
    early: HashMap<String, Vec<Value>>,
    next_local: u64,
    stats: Arc<WsStats>,
}

enum Exit {
    Reconnect,
    Closed,
}

impl Task {
    /// The task that will own the connection, fed by `rx`.
    pub(super) fn new(
        config: WsConfig,
        rx: mpsc::UnboundedReceiver<Cmd>,
        stats: Arc<WsStats>,
    ) -> Task {
        Task {
            config,
            rx,
            next_id: 1,
            waiting: HashMap::new(),
            subs: HashMap::new(),
            by_server: HashMap::new(),
            early: HashMap::new(),
            next_local: 1,
            stats,
        }
    }

    pub(super) async fn run(mut self, mut ws: Ws) {
        let mut failures = 0u32;
        loop {
            match self.serve(&mut ws).await {
                Exit::Closed => {
                    let _ = ws.close(None).await;
                    return;
                }
                Exit::Reconnect => {}
            }
            let _ = ws.close(None).await;
            // Reconnect with backoff and jitter; commands keep queueing meanwhile.
            loop {
                let base = self.config.backoff_min.as_millis() as u64 * (1u64 << failures.min(10));
                let cap = base.min(self.config.backoff_max.as_millis() as u64).max(1);
                let delay = rand::rng().random_range(cap / 2..=cap);
                tokio::time::sleep(Duration::from_millis(delay)).await;
                if self.rx.is_closed() && self.subs.is_empty() && self.waiting.is_empty() {
                    return;
                }
                match open(&self.config).await {
                    Ok((new, _)) => {
                        ws = new;
                        failures = 0;
                        self.stats.reconnects.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    Err(ClientError::Rpc(e)) => {
                        tracing::error!(error = %e, "re-authentication refused; the client stops");
                        self.fail_all(ClientError::Rpc(e));
                        return;
                    }
                    Err(e) => {
                        failures += 1;
                        tracing::debug!(error = %e, "reconnect failed; retrying");
                    }
                }
            }
            if self.resume(&mut ws).await.is_err() {
                continue;
            }
        }
    }

    fn fail_all(&mut self, e: ClientError) {
        for (_, w) in self.waiting.drain() {
            if let Waiting::Call { reply, .. } = w {
                let _ = reply.send(Err(e.clone()));
            }
        }
        for (_, s) in self.subs.drain() {
            if let Some(tx) = s.started {
                let _ = tx.send(Err(e.clone()));
            }
        }
    }

    /// After a reconnect: subscribe again from each cursor, then send every unanswered call.
    ///
    /// Every unanswered call is parked under its new id before anything is sent, so a connection
    /// that fails part-way through leaves them all waiting for the next one: none is dropped.
    async fn resume(&mut self, ws: &mut Ws) -> Result<(), ()> {
        self.by_server.clear();
        self.early.clear();
        let mut old: Vec<(u64, Waiting)> = self.waiting.drain().collect();
        // In the order they were first sent.
        old.sort_unstable_by_key(|(id, _)| *id);
        let mut frames = Vec::new();
        for (_, w) in old {
            if let Waiting::Call {
                method,
                params,
                reply,
                sent,
            } = w
            {
                self.stats.resent.fetch_add(1, Ordering::Relaxed);
                frames.push(self.park_call(method, params, reply, sent));
            }
        }
        let locals: Vec<u64> = self.subs.keys().copied().collect();
        for local in locals {
            if let Some(s) = self.subs.get_mut(&local) {
                s.server_id = None;
            }
            self.send_subscribe(ws, local).await?;
        }
        for frame in frames {
            Self::send_frame(ws, frame).await?;
        }
        Ok(())
    }

    async fn send_frame(ws: &mut Ws, v: Value) -> Result<(), ()> {
        ws.send(Message::text(v.to_string())).await.map_err(|_| ())
    }

    /// Gives a call its id and keeps it waiting for its answer; returns the frame to send.
    fn park_call(&mut self, method: &'static str, params: Value, reply: Reply, sent: u32) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.waiting.insert(
            id,
            Waiting::Call {
                method,
                params,
                reply,
                sent: sent + 1,
            },
        );
        frame
    }

    async fn send_subscribe(&mut self, ws: &mut Ws, local: u64) -> Result<(), ()> {
        let Some(sub) = self.subs.get(&local) else {
            return Ok(());
        };
        let (method, params) = match &sub.kind {
            SubKind::Events {
                conversation_id: Some(c),
                since,
                cursors,
                ..
            } => {
                let since = cursors.get(c).copied().or(*since);
                (
                    names::SUBSCRIBE,
                    serde_json::to_value(SubscribeParams {
                        conversation_id: Some(c.clone()),
                        since_seq: since,
                        cursors: None,
                    }),
                )
            }
            SubKind::Events {
                conversation_id: None,
                since,
                cursors,
                ..
            } => {
                // A resumed subscription replays conversations it never saw from their start.
                let since = if sub.server_id.is_none() && sub.started.is_none() {
                    Some(0)
                } else {
                    *since
                };
                (
                    names::SUBSCRIBE,
                    serde_json::to_value(SubscribeParams {
                        conversation_id: None,
                        since_seq: since,
                        cursors: Some(cursors.clone()),
                    }),
                )
            }
            SubKind::Turns { .. } => (
                names::REGISTER_EXECUTOR,
                serde_json::to_value(RegisterExecutorParams {
                    mode: ExecutorMode::Push,
                }),
            ),
        };
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.insert(id, Waiting::SubStart(local));
        let params = params.unwrap_or(Value::Null);
        Self::send_frame(
            ws,
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}),
        )
        .await
    }

    async fn serve(&mut self, ws: &mut Ws) -> Exit {
        loop {
            tokio::select! {
                cmd = self.rx.recv() => {
                    let Some(cmd) = cmd else { return Exit::Closed };
                    if self.command(ws, cmd).await.is_err() {
                        return Exit::Reconnect;
                    }
                }
                msg = ws.next() => {
                    match msg {
                        Some(Ok(Message::Text(text))) => self.frame(&text),
                        Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return Exit::Reconnect,
                        Some(Ok(_)) => {}
                    }
                }
            }
        }
    }

    async fn command(&mut self, ws: &mut Ws, cmd: Cmd) -> Result<(), ()> {
        match cmd {
            Cmd::Call {
                method,
                params,
                reply,
            } => {
                let frame = self.park_call(method, params, reply, 0);
                Self::send_frame(ws, frame).await
            }
            Cmd::Subscribe {
                conversation_id,
                since,
                cursors,
                sink,
                reply,
            } => {
                let local = self.next_local;
                self.next_local += 1;
                self.subs.insert(
                    local,
                    Sub {
                        kind: SubKind::Events {
                            conversation_id,
                            since,
                            cursors,
                            sink,
                        },
                        server_id: None,
                        started: Some(reply),
                    },
                );
                self.send_subscribe(ws, local).await
            }
            Cmd::Register { sink, reply } => {
                let local = self.next_local;
                self.next_local += 1;
                self.subs.insert(
                    local,
                    Sub {
                        kind: SubKind::Turns { sink },
                        server_id: None,
                        started: Some(reply),
                    },
                );
                self.send_subscribe(ws, local).await
            }
            Cmd::Drop(local) => {
                if let Some(sub) = self.subs.remove(&local) {
                    if let Some(server_id) = sub.server_id {
                        self.by_server.remove(&server_id);
                        let method = match sub.kind {
                            SubKind::Events { .. } => names::UNSUBSCRIBE,
                            SubKind::Turns { .. } => names::UNREGISTER_EXECUTOR,
                        };
                        let id = self.next_id;
                        self.next_id += 1;
                        self.waiting.insert(id, Waiting::Ignore);
                        return Self::send_frame(ws, json!({"jsonrpc": "2.0", "id": id, "method": method, "params": [server_id]})).await;
                    }
                }
                Ok(())
            }
            Cmd::Cut => Err(()),
        }
    }

    fn frame(&mut self, text: &str) {
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            tracing::warn!("unreadable frame from the server");
            return;
        };
        if let Some(id) = v.get("id").and_then(Value::as_u64) {
            let Some(w) = self.waiting.remove(&id) else {
                return;
            };
            let result = match v.get("error") {
                Some(err) => Err(wire_error(err)),
                None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
            };
            match w {
                Waiting::Call {
                    method,
                    params,
                    reply,
                    sent,
                } => {
                    let result = match result {
                        // A creation sent again after its answer was lost finds its own result.
                        Err(e)
                            if sent > 1
                                && method == names::CREATE_CONVERSATION
                                && e.code == ErrorCode::ConversationExists =>
                        {
                            Ok(json!({"conversationId": params["conversationId"]}))
                        }
                        other => other.map_err(ClientError::Rpc),
                    };
                    let _ = reply.send(result);
                }
                Waiting::SubStart(local) => self.started(local, result),
                Waiting::Ignore => {}
            }
            return;
        }
        let (Some(method), Some(params)) =
            (v.get("method").and_then(Value::as_str), v.get("params"))
        else {
            return;
        };
        let Some(sid) = params.get("subscription").map(sub_key) else {
            return;
        };
        let Some(local) = self.by_server.get(&sid).copied() else {
            let early = self.early.entry(sid).or_default();
            if early.len() < 100_000 {
                early.push(v.clone());
            }
            return;
        };
        self.notification(
            local,
            method,
            params.get("result").cloned().unwrap_or(Value::Null),
        );
    }

    fn started(&mut self, local: u64, result: Result<Value, RpcError>) {
        let Some(sub) = self.subs.get_mut(&local) else {
            return;
        };
        match result {
            Ok(id) => {
                let sid = sub_key(&id);
                sub.server_id = Some(sid.clone());
                if let Some(tx) = sub.started.take() {
                    let _ = tx.send(Ok(local));
                }
                self.by_server.insert(sid.clone(), local);
                for v in self.early.remove(&sid).unwrap_or_default() {
                    let method = v["method"].as_str().unwrap_or_default().to_string();
                    self.notification(local, &method, v["params"]["result"].clone());
                }
            }
            Err(e) => {
                if let Some(sub) = self.subs.remove(&local) {
                    if let Some(tx) = sub.started {
                        let _ = tx.send(Err(ClientError::Rpc(e)));
                    } else {
                        tracing::error!(error = %e, "a subscription could not be resumed; it ends");
                    }
                }
            }
        }
    }

    fn notification(&mut self, local: u64, method: &str, result: Value) {
        let Some(sub) = self.subs.get_mut(&local) else {
            return;
        };
        match (&mut sub.kind, method) {
            (SubKind::Events { cursors, sink, .. }, names::EVENT) => {
                let Ok(n) = serde_json::from_value::<EventNotification>(result) else {
                    return;
                };
                let cursor = cursors.entry(n.conversation_id.clone()).or_insert(0);
                if n.event.seq <= *cursor {
                    self.stats
                        .duplicates_dropped
                        .fetch_add(1, Ordering::Relaxed);
                    return;
                }
                *cursor = n.event.seq;
                let _ = sink.send(n);
            }
            (SubKind::Turns { sink }, names::REQUEST_TURN) => {
                if let Ok(n) = serde_json::from_value::<RequestTurnNotification>(result) {
                    let _ = sink.send(n);
                }
            }
            _ => {}
        }
    }
}
