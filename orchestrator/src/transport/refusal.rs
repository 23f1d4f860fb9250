//! hyper's own refusals in the protocol's error shape. A request hyper cannot read (a broken
//! request line: 400; a request target or head over its buffer: 414, 431) is refused by hyper
//! itself, before any route sees it, with an empty body and `connection: close`. Every other
//! refusal of this server is `{"error": {code, message, data}}` (PROTOCOL.md §13), so the
//! connection's writer ([`crate::transport::net::Coalesced`]) gives these the same shape: a
//! head that hyper wrote for a 4xx with `content-length: 0` is written with a JSON body.

use proto_spec::{ErrorCode, RpcError};

/// The answer to write instead of `head`, when `head` is one of hyper's empty 4xx refusals.
pub fn as_json(head: &[u8]) -> Option<Vec<u8>> {
    if !head.starts_with(b"HTTP/1.1 4") || !head.ends_with(b"\r\n\r\n") {
        return None;
    }
    let text = std::str::from_utf8(head).ok()?;
    let lower = text.to_ascii_lowercase();
    if !lower.contains("\r\ncontent-length: 0\r\n") || !lower.contains("\r\nconnection: close\r\n")
    {
        return None;
    }
    let status: u16 = text.get(9..12)?.parse().ok()?;
    let message = match status {
        400 => "the request could not be read as HTTP/1.1",
        414 => "the request target is over the limit",
        431 => "the request's head (its headers) is over the limit of 64 KiB",
        _ => "the request could not be read",
    };
    let error = RpcError::new(ErrorCode::InvalidRequest, message)
        .with_data(serde_json::json!({"status": status}));
    let body = serde_json::json!({"error": error.to_wire()}).to_string();
    let (status_line, rest) = text.split_once("\r\n")?;
    let headers: String = rest
        .trim_end_matches("\r\n")
        .split("\r\n")
        .filter(|h| !h.to_ascii_lowercase().starts_with("content-length:"))
        .map(|h| format!("{h}\r\n"))
        .collect();
    Some(
        format!(
            "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{headers}\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_empty_refusals_get_the_error_shape_and_nothing_else_changes() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\ndate: Sat, 28 Nov 2026 09:52:45 GMT\r\n\r\n";
        let out = String::from_utf8(as_json(head).unwrap()).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{out}");
        assert!(head.contains("content-type: application/json"), "{out}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{out}"
        );
        assert!(
            head.contains("connection: close") && head.contains("date: "),
            "{out}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], -32600);
        assert_eq!(v["error"]["data"]["status"], 431);
        // Our own answers, frames and bodies pass as they are.
        for other in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n",
            b"\x81\x05hello",
        ] {
            assert_eq!(as_json(other), None);
        }
    }
}
