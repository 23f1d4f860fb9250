//! JSON round-trip fixtures for every wire type, and the drift check of the generated documents.

use std::collections::BTreeMap;
use std::path::PathBuf;

use proto_spec::spec::{json_schemas, openapi, openrpc, to_pretty};
use proto_spec::system::StopData;
use proto_spec::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

fn fixtures() -> BTreeMap<String, Vec<Value>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/wire.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn round_trip<T: Serialize + DeserializeOwned>(name: &str, values: &[Value]) {
    assert!(!values.is_empty(), "{name} has no fixture");
    for v in values {
        let typed: T = serde_json::from_value(v.clone())
            .unwrap_or_else(|e| panic!("{name} fixture {v} does not parse: {e}"));
        let back = serde_json::to_value(&typed).unwrap();
        assert_eq!(&back, v, "{name} does not round-trip");
    }
}

#[test]
fn every_wire_type_round_trips_its_fixtures() {
    let f = fixtures();
    let get = |n: &str| f.get(n).cloned().unwrap_or_default();
    macro_rules! check {
        ($($t:ident),* $(,)?) => {{
            let mut seen = Vec::new();
            $( round_trip::<$t>(stringify!($t), &get(stringify!($t))); seen.push(stringify!($t)); )*
            seen
        }};
    }
    let seen = check!(
        Event,
        EventKind,
        Finality,
        MessagePayload,
        Attachment,
        Guidance,
        GuidanceStatus,
        ConversationStatus,
        Snapshot,
        ErrorObject,
        AuthenticateParams,
        AuthenticateResult,
        CreateConversationParams,
        CreateConversationResult,
        ConversationParams,
        ListConversationsParams,
        ListConversationsResult,
        ListScenariosParams,
        ListScenariosResult,
        CreateTokenParams,
        CreateTokenResult,
        TokenSummary,
        ListTokensParams,
        ListTokensResult,
        RevokeTokenParams,
        RevokeTokenResult,
        CreateTenantParams,
        TenantSummary,
        ListTenantsParams,
        ListTenantsResult,
        TenantQuotas,
        SetTenantQuotasParams,
        TailParams,
        TailResult,
        WaitForChangeParams,
        WaitForChangeResult,
        GetUpdatesParams,
        GetUpdatesResult,
        SendMessageParams,
        SendTraceParams,
        TurnHint,
        AppendResult,
        SubscribeParams,
        EventNotification,
        RegisterExecutorParams,
        RequestTurnNotification,
        ClaimTurnParams,
        ClaimTurnResult,
        SeqResult,
        DeleteConversationResult,
        ForkConversationParams,
        PostMessageBody,
        EventsQuery,
        ListStatus,
        WaitQuery,
        WaitResult,
        WhoAmI,
        HttpError,
        SystemEvent,
        StopData,
        ExecutorTrace,
        DocumentData,
        OutputSpec,
    );
    // Every type that has a generated schema has fixtures, and the other way round.
    let schema_names: Vec<&str> = json_schemas().keys().copied().collect();
    let mut seen_sorted = seen.clone();
    seen_sorted.sort();
    assert_eq!(seen_sorted, schema_names);
    let fixture_names: Vec<&str> = f.keys().map(String::as_str).collect();
    assert_eq!(fixture_names, schema_names);
}

#[test]
fn params_refuse_unknown_fields_such_as_a_forged_author() {
    let err = serde_json::from_value::<SendMessageParams>(serde_json::json!({
        "conversationId": "c1", "payload": {"text": "x"}, "finality": "turn", "author": "mallory"
    }))
    .unwrap_err();
    assert!(err.to_string().contains("unknown field `author`"), "{err}");
}

#[test]
fn error_codes_are_unique_and_map_back() {
    let mut seen = std::collections::HashSet::new();
    for c in ErrorCode::ALL {
        assert!(seen.insert(c.code()), "duplicate code {}", c.code());
        assert_eq!(ErrorCode::from_code(c.code()), Some(c));
        let wire = RpcError::new(c, "m").to_wire();
        assert_eq!(wire.code, c.code());
        assert_eq!(wire.clone().into_rpc_error().code, c);
    }
    assert_eq!(ErrorCode::NotYourTurn.code(), codes::NOT_YOUR_TURN);
    assert_eq!(ErrorCode::PayloadTooLarge.http_status(), 413);
}

/// Fails when the committed OpenRPC and OpenAPI documents or JSON Schemas drift from the types.
/// `UPDATE_SPEC=1 cargo test --workspace --test wire` rewrites them.
#[test]
fn spec_drift() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let update = std::env::var_os("UPDATE_SPEC").is_some();
    let mut expected: BTreeMap<PathBuf, String> = BTreeMap::new();
    expected.insert(dir.join("openrpc.json"), to_pretty(&openrpc()));
    expected.insert(dir.join("openapi.json"), to_pretty(&openapi()));
    for (name, schema) in json_schemas() {
        expected.insert(
            dir.join("schemas").join(format!("{name}.json")),
            to_pretty(&schema),
        );
    }
    if update {
        let _ = std::fs::remove_dir_all(dir.join("schemas"));
        std::fs::create_dir_all(dir.join("schemas")).unwrap();
        for (path, text) in &expected {
            std::fs::write(path, text).unwrap();
        }
    }
    let mut stale = Vec::new();
    for (path, text) in &expected {
        if std::fs::read_to_string(path).ok().as_deref() != Some(text.as_str()) {
            stale.push(path.display().to_string());
        }
    }
    for entry in std::fs::read_dir(dir.join("schemas")).unwrap() {
        let path = entry.unwrap().path();
        if !expected.contains_key(&path) {
            stale.push(format!("{} (no such type)", path.display()));
        }
    }
    assert!(
        stale.is_empty(),
        "generated protocol documents drifted from the types: {stale:?}\n\
         rewrite them with: UPDATE_SPEC=1 cargo test --workspace --test wire"
    );
}

#[test]
fn an_events_cached_json_is_its_wire_form() {
    for value in &fixtures()["Event"] {
        let event: Event = serde_json::from_value(value.clone()).expect("an Event fixture");
        let made = event.to_json().get().to_string();
        assert_eq!(made, serde_json::to_string(&event).expect("serializes"));
        // Made once: the second call answers the same text.
        assert!(std::ptr::eq(event.to_json(), event.to_json()));
        // A clone makes its own, so a changed copy is sent as it is.
        let copy = event.clone();
        assert_eq!(copy.to_json().get(), made);
        let mut changed = event.clone();
        changed.seq += 1;
        assert_ne!(changed.to_json().get(), made);
        assert!(!std::ptr::eq(copy.to_json(), event.to_json()));
        // The cache is not part of the wire form, nor of equality.
        let back: Event = serde_json::from_str(&made).expect("parses back");
        assert_eq!(back, event);
        assert_eq!(serde_json::to_value(&back).expect("serializes"), *value);
    }
}

#[test]
fn every_system_event_type_has_a_fixture_and_is_listed() {
    let mut seen: Vec<&str> = fixtures()["SystemEvent"]
        .iter()
        .map(|v| {
            let e: SystemEvent = serde_json::from_value(v.clone()).expect("a system event");
            e.type_name()
        })
        .collect();
    seen.dedup();
    assert_eq!(seen, SystemEvent::TYPES);
}
