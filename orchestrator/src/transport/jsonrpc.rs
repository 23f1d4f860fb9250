//! JSON-RPC 2.0 frames: reading one request object, writing one answer.
//!
//! The server reads frames itself rather than through a library's request type, so that every
//! id the specification allows is answered with exactly the id it came with (a string, any
//! number: `-1`, `1.5`, `1e30`, `2^64`, or null), and every refusal carries the error object of
//! PROTOCOL.md §11 (`data.error` names the code). A frame that is not a request object gets
//! `-32600` with id null; an id that is `true`, an object or an array, or an `id` member given
//! twice, is such a frame.

use std::ops::Range;

use proto_spec::{ErrorCode, RpcError};
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// One request read from a frame: where its id, method and params lie in the frame.
#[derive(Debug, Clone)]
pub struct Call {
    frame: Vec<u8>,
    id: Range<usize>,
    method: Range<usize>,
    params: Option<Range<usize>>,
    /// The rate limiter admitted it already (the connection's reader does, before it reads on).
    admitted: bool,
}

impl Call {
    /// Whether the rate limiter admitted the call already.
    pub fn admitted(&self) -> bool {
        self.admitted
    }

    /// Notes that the rate limiter admitted the call.
    pub fn set_admitted(&mut self) {
        self.admitted = true;
    }

    /// The id, as it was sent (raw JSON).
    pub fn id(&self) -> &str {
        self.slice(&self.id)
    }

    /// The method's name.
    pub fn method(&self) -> &str {
        self.slice(&self.method)
    }

    /// The params, raw JSON (`{}` when absent).
    pub fn params(&self) -> &str {
        match &self.params {
            Some(r) => self.slice(r),
            None => "{}",
        }
    }

    fn slice(&self, r: &Range<usize>) -> &str {
        // The frame was read as UTF-8 JSON, and every range is one of its tokens.
        std::str::from_utf8(&self.frame[r.clone()]).unwrap_or("null")
    }
}

/// What a frame holds.
#[derive(Debug)]
pub enum Frame {
    /// A call, to be answered.
    Call(Call),
    /// A notification (no `id`): not answered, not run (the server takes none).
    Notification,
    /// Not a request the server runs: answer this error with this id (raw JSON).
    Refused(String, RpcError),
}

/// The members of a request object, as slices of the frame.
#[derive(Default)]
struct Members<'a> {
    jsonrpc: Option<&'a RawValue>,
    id: Option<&'a RawValue>,
    method: Option<&'a RawValue>,
    params: Option<&'a RawValue>,
    /// A member given twice (its name).
    twice: Option<&'static str>,
}

struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON-RPC request object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut m = Members::default();
        while let Some(key) = map.next_key::<Key>()? {
            let value: &'de RawValue = map.next_value()?;
            let slot = match key {
                Key::Jsonrpc => &mut m.jsonrpc,
                Key::Id => &mut m.id,
                Key::Method => &mut m.method,
                Key::Params => &mut m.params,
                // Other members are ignored, as JSON-RPC allows.
                Key::Other => continue,
            };
            if slot.replace(value).is_some() && m.twice.is_none() {
                m.twice = Some(key.name());
            }
        }
        Ok(m)
    }
}

/// A member's name, read without allocating.
#[derive(Clone, Copy)]
enum Key {
    Jsonrpc,
    Id,
    Method,
    Params,
    Other,
}

impl Key {
    fn name(self) -> &'static str {
        match self {
            Key::Jsonrpc => "jsonrpc",
            Key::Id => "id",
            Key::Method => "method",
            Key::Params => "params",
            Key::Other => "",
        }
    }
}

impl<'de> serde::Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "jsonrpc" => Key::Jsonrpc,
                    "id" => Key::Id,
                    "method" => Key::Method,
                    "params" => Key::Params,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(MembersVisitor)
    }
}

const NULL: &str = "null";

fn invalid(message: impl Into<String>) -> RpcError {
    RpcError::new(ErrorCode::InvalidRequest, message)
}

/// Whether `raw` is an id JSON-RPC allows: a string, null, or a number that JSON parsers can
/// read back (one beyond a double's range, such as `934e969`, would come back as infinity, or
/// as an error, and match nothing).
fn valid_id(raw: &RawValue) -> bool {
    match raw.get().as_bytes().first() {
        Some(b'"' | b'n') => true,
        Some(b'-' | b'0'..=b'9') => raw.get().parse::<f64>().is_ok_and(f64::is_finite),
        _ => false,
    }
}

fn range_of(frame: &[u8], part: &str) -> Range<usize> {
    let start = part.as_ptr() as usize - frame.as_ptr() as usize;
    start..start + part.len()
}

/// Reads one frame.
pub fn read(frame: Vec<u8>) -> Frame {
    let first = frame.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        return Frame::Refused(
            NULL.into(),
            RpcError::new(
                ErrorCode::BatchNotSupported,
                "batches are not supported: send one call per frame (calls on one connection run concurrently)",
            ),
        );
    }
    let m = match serde_json::from_slice::<Members<'_>>(&frame) {
        Ok(m) => m,
        Err(e) if e.is_data() => {
            return Frame::Refused(
                NULL.into(),
                invalid("a frame must be one JSON-RPC request object"),
            )
        }
        Err(e) => {
            return Frame::Refused(
                NULL.into(),
                RpcError::new(ErrorCode::ParseError, format!("the frame is not JSON: {e}")),
            )
        }
    };
    if let Some(name) = &m.twice {
        return Frame::Refused(
            NULL.into(),
            invalid(format!("the member `{name}` is given twice")),
        );
    }
    let Some(id) = m.id else {
        // A notification is still a request: without `jsonrpc: "2.0"` and a method name it
        // is an invalid request (`{}`, a frame of unknown members), answered with id null.
        let method_named = m
            .method
            .is_some_and(|r| serde_json::from_str::<&str>(r.get()).is_ok());
        if m.jsonrpc.map(RawValue::get) != Some("\"2.0\"") || !method_named {
            return Frame::Refused(
                NULL.into(),
                invalid(
                    "not a JSON-RPC 2.0 request: `jsonrpc: \"2.0\"` and a `method` are required",
                ),
            );
        }
        return Frame::Notification;
    };
    if !valid_id(id) {
        return Frame::Refused(NULL.into(), invalid("an id is a string, a number or null"));
    }
    if m.jsonrpc.map(RawValue::get) != Some("\"2.0\"") {
        return Frame::Refused(id.get().to_owned(), invalid("`jsonrpc` must be \"2.0\""));
    }
    let method = match m.method.map(|r| serde_json::from_str::<&str>(r.get())) {
        Some(Ok(name)) => name,
        _ => {
            return Frame::Refused(
                id.get().to_owned(),
                invalid("`method` must be a string (with no escapes)"),
            )
        }
    };
    if let Some(p) = m.params {
        if !matches!(p.get().as_bytes().first(), Some(b'{' | b'[')) {
            return Frame::Refused(
                id.get().to_owned(),
                invalid("`params` must be an object (or absent)"),
            );
        }
    }
    let id = range_of(&frame, id.get());
    let method = range_of(&frame, method);
    let params = m.params.map(|p| range_of(&frame, p.get()));
    Frame::Call(Call {
        frame,
        id,
        method,
        params,
        admitted: false,
    })
}

/// `{"jsonrpc":"2.0","id":ID,"result":RESULT}`.
pub fn result(id: &str, result: &str) -> Vec<u8> {
    envelope(id, br#","result":"#, result)
}

/// `{"jsonrpc":"2.0","id":ID,"error":{code,message,data}}`, counted as a refusal on `transport`.
pub fn error(id: &str, e: &RpcError, transport: &'static str) -> Vec<u8> {
    crate::engine::telemetry::refused(e, transport);
    let object = serde_json::to_string(&e.to_wire()).unwrap_or_else(|_| {
        r#"{"code":-32603,"message":"internal error","data":{"error":"Internal"}}"#.into()
    });
    envelope(id, br#","error":"#, &object)
}

/// `{"jsonrpc":"2.0","id":ID` `member` `body}`.
fn envelope(id: &str, member: &[u8], body: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + id.len() + 36);
    out.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(member);
    out.extend_from_slice(body.as_bytes());
    out.push(b'}');
    out
}

/// The answer to a call whose result is `outcome`, refused with `ResponseTooLarge` when the
/// result is over `max` bytes.
pub fn answer(
    id: &str,
    outcome: Result<String, RpcError>,
    max: usize,
    transport: &'static str,
) -> Vec<u8> {
    match outcome {
        Ok(r) if r.len() > max => error(
            id,
            &RpcError::new(
                ErrorCode::ResponseTooLarge,
                format!(
                    "the answer is {} bytes, over the limit of {max}: ask for fewer events",
                    r.len()
                ),
            )
            .with_data(serde_json::json!({"limit": max})),
            transport,
        ),
        Ok(r) => result(id, &r),
        Err(e) => error(id, &e, transport),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn refused(frame: &str) -> (Value, i32) {
        match read(frame.as_bytes().to_vec()) {
            Frame::Refused(id, e) => (serde_json::from_str(&id).unwrap(), e.code.code()),
            other => panic!("{frame}: {other:?}"),
        }
    }

    fn call(frame: &str) -> Call {
        match read(frame.as_bytes().to_vec()) {
            Frame::Call(c) => c,
            other => panic!("{frame}: {other:?}"),
        }
    }

    #[test]
    fn every_id_the_specification_allows_is_kept_as_sent() {
        for id in [
            "-1",
            "1.5",
            "1.0",
            "18446744073709551616",
            "1e30",
            "\"a\\\"b\"",
            "null",
            "0",
        ] {
            let c = call(&format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tail","params":{{"x":1}}}}"#
            ));
            assert_eq!(c.id(), id);
            assert_eq!(c.method(), "tail");
            assert_eq!(c.params(), r#"{"x":1}"#);
            let answer: Value = serde_json::from_slice(&result(c.id(), "true")).unwrap();
            assert_eq!(answer["id"], serde_json::from_str::<Value>(id).unwrap());
        }
    }

    #[test]
    fn ids_of_other_types_and_ids_given_twice_are_invalid_requests_with_id_null() {
        for frame in [
            r#"{"jsonrpc":"2.0","id":true,"method":"tail"}"#,
            r#"{"jsonrpc":"2.0","id":{},"method":"tail"}"#,
            r#"{"jsonrpc":"2.0","id":[],"method":"tail"}"#,
            r#"{"jsonrpc":"2.0","id":-1,"id":2,"method":"tail"}"#,
            // Found by the rpc_frame fuzzer: numbers no JSON parser reads back.
            r#"{"jsonrpc":"2.0","id":934e969,"method":"tail"}"#,
            r#"{"jsonrpc":"2.0","id":-1e400,"method":"tail"}"#,
        ] {
            assert_eq!(refused(frame), (Value::Null, -32600), "{frame}");
        }
    }

    #[test]
    fn not_a_request_object() {
        assert_eq!(
            refused("{\"jsonrpc\": \"2.0\", \"method\": "),
            (Value::Null, -32700)
        );
        assert_eq!(refused("\u{feff}x"), (Value::Null, -32700));
        assert_eq!(refused("[]"), (Value::Null, -32005));
        assert_eq!(refused("  [1"), (Value::Null, -32005));
        assert_eq!(refused("5"), (Value::Null, -32600));
        assert_eq!(refused(r#"{"jsonrpc":"2.0","id":4}"#), (json!(4), -32600));
        assert_eq!(
            refused(r#"{"jsonrpc":"1.0","id":4,"method":"x"}"#),
            (json!(4), -32600)
        );
        assert_eq!(
            refused(r#"{"jsonrpc":"2.0","id":"a","method":7}"#),
            (json!("a"), -32600)
        );
        assert_eq!(
            refused(r#"{"jsonrpc":"2.0","id":4,"method":"x","params":3}"#),
            (json!(4), -32600)
        );
        assert!(matches!(
            read(br#"{"jsonrpc":"2.0","method":"tail"}"#.to_vec()),
            Frame::Notification
        ));
        // Without an id, still a request: `{}`, unknown members, a frame nested deep.
        assert_eq!(refused("{}"), (Value::Null, -32600));
        assert_eq!(refused(r#"{"jsonrpc":"2.0"}"#), (Value::Null, -32600));
        assert_eq!(refused(r#"{"method":"tail"}"#), (Value::Null, -32600));
        let deep = format!("{}1{}", r#"{"a":"#.repeat(100_000), "}".repeat(100_000));
        assert_eq!(refused(&deep), (Value::Null, -32600));
    }

    #[test]
    fn every_error_object_names_its_code() {
        let e = RpcError::new(ErrorCode::ParseError, "x");
        let v: Value = serde_json::from_slice(&error("null", &e, "test")).unwrap();
        assert_eq!(v["error"]["data"]["error"], "ParseError");
        let v: Value =
            serde_json::from_slice(&answer("7", Ok("\"0123456789\"".into()), 5, "test")).unwrap();
        assert_eq!(v["id"], 7);
        assert_eq!(v["error"]["code"], -32008);
        assert_eq!(
            v["error"]["data"],
            json!({"limit": 5, "error": "ResponseTooLarge"})
        );
    }
}
