//! The run-now annotation: an accepted time prints back as itself.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockedjob::schedule::parse_run_now;

fuzz_target!(|data: &str| {
    if let Ok(time) = parse_run_now(data) {
        assert_eq!(parse_run_now(&time.to_string()), Ok(time));
    }
});
