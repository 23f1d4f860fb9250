//! A JSON-RPC frame, as any identity, through the frame reader, params parsing and the method
//! core. Oracle: no panic, no hang, every frame with an id answered with a result or an error
//! object whose code is in the table and whose `data.error` names it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&who, frame)) = data.split_first() else {
        return;
    };
    let h = orchestrator_fuzz::harness();
    let session = h.session(who as usize % (orchestrator_fuzz::AGENTS.len() + 1));
    h.frame(&session, frame.to_vec());
});
