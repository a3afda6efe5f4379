//! A LockedJob spec as JSON: valid with lease timing that validates, or refused field by field.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockedjob::api::{validate, LockedJobSpec};

fuzz_target!(|data: &[u8]| {
    let Ok(spec) = serde_json::from_slice::<LockedJobSpec>(data) else {
        return;
    };
    match validate("team-a", "fuzzed", &spec) {
        Ok(valid) => assert!(valid
            .timing
            .validate(lockedjob::redlock::DEFAULT_DRIFT_FACTOR)
            .is_ok()),
        Err(errors) => assert!(errors
            .iter()
            .all(|e| e.field.starts_with("spec.") || e.field == "metadata.name")),
    }
});
