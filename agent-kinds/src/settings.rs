//! A kind's settings as a scenario writes them: read into the kind's own type, with errors that
//! name the setting, and the durations they hold (`250ms`, `10s`, `2m`).

use std::time::Duration;

use proto_spec::scenario::show_ms;
use serde_json::Value;

/// Reads a kind's settings (the participant without `kind`, `id` and `context`); the error
/// starts with the setting it is about (`fallback` when serde does not name one).
pub fn settings<T: serde::de::DeserializeOwned>(spec: &Value, fallback: &str) -> Result<T, String> {
    let mut v = spec.clone();
    if let Some(o) = v.as_object_mut() {
        for shared in ["kind", "id", "context", "modes", "plan", "deliverable"] {
            o.remove(shared);
        }
    }
    serde_json::from_value(v).map_err(|e| {
        let msg = e.to_string();
        match msg.split('`').nth(1) {
            Some(field) if msg.contains("unknown field") || msg.contains("missing field") => {
                format!("{field}: {msg}")
            }
            _ => format!("{fallback}: {msg}"),
        }
    })
}

/// Parses `250ms`, `10s`, `2m` (`None` when it is not such a duration or does not fit).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = num.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

/// Reads the duration setting `field` (`250ms`, `10s`, `2m`), which must lie in `min..=max`.
pub fn duration_in(field: &str, s: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d =
        parse_duration(s).ok_or_else(|| format!("{field}: a duration such as 250ms, 10s or 2m"))?;
    if d < min || d > max {
        return Err(format!(
            "{field}: {s:?} is out of range ({} to {})",
            show_ms(min.as_millis() as u64),
            show_ms(max.as_millis() as u64)
        ));
    }
    Ok(d)
}
