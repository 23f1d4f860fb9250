//! The console (`GET /`): one page embedded at build time (`assets/console.html`, no build
//! step), served under a strict Content-Security-Policy that lets only its own inline script
//! and style run, by their SHA-256, with the usual hardening headers (docs/security.md).

use axum::http::header;
use axum::response::{Html, IntoResponse, Response};

/// The console page, embedded at build time.
const CONSOLE: &str = include_str!("../../assets/console.html");

/// `GET /`: the console, with its security headers.
pub async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, policy()),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (
                header::HeaderName::from_static("cross-origin-opener-policy"),
                "same-origin",
            ),
        ],
        Html(CONSOLE),
    )
        .into_response()
}

/// The console's Content-Security-Policy: nothing loads but its own inline script and style
/// (allowed by their SHA-256, so that no injected markup can run or restyle anything), and it
/// talks only to this server; no framing, no forms elsewhere, no base URL.
fn policy() -> &'static str {
    static POLICY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    POLICY.get_or_init(|| {
        let hash = |open: &str, close: &str| {
            use base64::Engine;
            use sha2::Digest;
            let start = CONSOLE.find(open).map_or(0, |i| i + open.len());
            let end = CONSOLE[start..].find(close).map_or(start, |i| start + i);
            let digest = sha2::Sha256::digest(&CONSOLE.as_bytes()[start..end]);
            format!("'sha256-{}'", base64::engine::general_purpose::STANDARD.encode(digest))
        };
        format!(
            "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self' data:; \
             base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            hash("<script>", "</script>"),
            hash("<style>", "</style>")
        )
    })
}

#[cfg(test)]
mod tests {
    use proto_spec::SystemEvent;

    /// The console describes system events by their `type`: each it names is one the protocol
    /// has, and it names every one.
    #[test]
    fn the_viewer_knows_every_system_event_type() {
        let start = super::CONSOLE
            .find("function describeSystem")
            .expect("the console describes system events");
        let body = &super::CONSOLE[start..];
        let body = &body[..body.find("default:").expect("a default case")];
        let named: Vec<&str> = body
            .split("case \"")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect();
        let mut sorted = named.clone();
        sorted.sort_unstable();
        let mut known = SystemEvent::TYPES.to_vec();
        known.sort_unstable();
        assert_eq!(sorted, known, "the console's cases: {named:?}");
    }
}
