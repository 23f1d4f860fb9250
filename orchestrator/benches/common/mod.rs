//! Helpers the bench binaries share.

/// A knob from the environment, or its default.
pub fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Removes the previous phases' files and flushes the page cache's dirty data, so that each phase
/// starts from the same disk state rather than paying for the writeback of the phase before it.
pub fn settle(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }
    let _ = std::process::Command::new("sync").status();
}

/// The middle value (the upper one of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
