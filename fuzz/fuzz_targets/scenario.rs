//! A scenario document, as YAML (first byte even) or as inline JSON, through the scenario
//! check. Oracle: no panic, no hang; a refusal is `InvalidParams` and names a path that starts
//! at `scenario`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orchestrator::engine::scenario::Scenario;

fuzz_target!(|data: &[u8]| {
    let Some((&how, text)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let sandbox = agent_kinds::Sandbox::default();
    let checked = if how % 2 == 0 {
        Scenario::from_yaml(text, &sandbox)
    } else {
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) => Scenario::parse(&v, &sandbox),
            Err(_) => return,
        }
    };
    if let Err(e) = checked {
        assert_eq!(e.code, proto_spec::ErrorCode::InvalidParams, "{e}");
        let path = e
            .data
            .as_ref()
            .and_then(|d| d["path"].as_str())
            .unwrap_or("");
        assert!(path.starts_with("scenario"), "{e}: path {path:?}");
    }
});
