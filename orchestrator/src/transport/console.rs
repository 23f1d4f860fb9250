//! The console (`GET /`): a page, its style and its scripts, embedded at build time
//! (`assets/console.html` and `assets/console/`, no build step), served under a strict
//! Content-Security-Policy that runs only scripts and styles from this server, with the usual
//! hardening headers (docs/security.md).

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// The console page, embedded at build time.
const CONSOLE: &str = include_str!("../../assets/console.html");

/// The page's style and scripts (`GET /console/{name}`), each with its content type. The
/// scripts load in the order the page names them and share its global scope; `panels.js`,
/// last, starts the console.
const FILES: &[(&str, &str, &str)] = &[
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("../../assets/console/console.css"),
    ),
    (
        "core.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/console/core.js"),
    ),
    (
        "stream.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/console/stream.js"),
    ),
    (
        "events.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/console/events.js"),
    ),
    (
        "tokens.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/console/tokens.js"),
    ),
    (
        "panels.js",
        "text/javascript; charset=utf-8",
        include_str!("../../assets/console/panels.js"),
    ),
];

/// The console's Content-Security-Policy: nothing runs or styles the page but the files this
/// server serves (no inline script or style, so that no injected markup can run or restyle
/// anything), and it talks only to this server; no framing, no forms elsewhere, no base URL.
const POLICY: &str =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
     img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// `GET /`: the console, with its security headers.
pub async fn page() -> Response {
    with_headers("text/html; charset=utf-8", CONSOLE)
}

/// `GET /console/{name}`: one of the page's files; 404 for any other name.
pub async fn file(Path(name): Path<String>) -> Response {
    match FILES.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => with_headers(content_type, body),
        None => (StatusCode::NOT_FOUND, "no such console file").into_response(),
    }
}

fn with_headers(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (
                header::HeaderName::from_static("cross-origin-opener-policy"),
                "same-origin",
            ),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use proto_spec::SystemEvent;

    /// The console describes system events by their `type`: each it names is one the protocol
    /// has, and it names every one.
    #[test]
    fn the_viewer_knows_every_system_event_type() {
        let events = super::FILES
            .iter()
            .find(|f| f.0 == "events.js")
            .expect("the console's events.js")
            .2;
        let start = events
            .find("function describeSystem")
            .expect("the console describes system events");
        let body = &events[start..];
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
