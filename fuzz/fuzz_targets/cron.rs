//! A cron expression and a time zone (first line, second line): a schedule that parses fires,
//! and its next times grow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockedjob::schedule::Schedule;

fuzz_target!(|data: &str| {
    let (expression, zone) = match data.split_once('\n') {
        Some((expression, zone)) => (expression, Some(zone)),
        None => (data, None),
    };
    if let Ok(schedule) = Schedule::parse(expression, zone) {
        let mut at = jiff::Timestamp::UNIX_EPOCH;
        for _ in 0..3 {
            let next = schedule
                .next_after(at)
                .expect("a schedule that parsed keeps firing");
            assert!(next > at);
            assert_eq!(schedule.latest_at_or_before(next), Some(next));
            at = next;
        }
    }
});
