//! Redis node URLs (comma-separated, as in LOCKEDJOB_REDIS_URLS): accepted or refused, and a
//! password is never repeated in the refusal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockedjob::redlock::{split_node_list, Redlock, RedlockConfig};

fuzz_target!(|data: &str| {
    let urls = split_node_list(data);
    if let Err(err) = Redlock::new(RedlockConfig::new(urls.clone())) {
        let message = err.to_string();
        for url in &urls {
            // user:password@ in a URL: the password must not reach logs.
            if let Some((_, password)) = url
                .rsplit_once('@')
                .and_then(|(userinfo, _)| userinfo.rsplit_once(':'))
            {
                if password.len() >= 8 && !password.contains("//") {
                    assert!(!message.contains(password), "{message}");
                }
            }
        }
    }
});
