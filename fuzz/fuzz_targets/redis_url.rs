//! Redis node URLs (comma-separated, as in LOCKEDJOB_REDIS_URLS): accepted or refused, and a
//! password is never repeated in the refusal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use lockedjob::redlock::{split_node_list, Redlock, RedlockConfig};

fuzz_target!(|data: &str| {
    let urls = split_node_list(data);
    if let Err(err) = Redlock::new(RedlockConfig::new(urls.clone())) {
        // The hint "redis://[user:password@]host:port" is the message's own text.
        let message = err.to_string().replace("[user:password@]", "");
        for url in &urls {
            // user:password@ in a URL: the password must not reach logs.
            // (The same text after the '@' is the host's, shown on purpose.)
            if let Some((userinfo, host)) = url.rsplit_once('@') {
                if let Some((_, password)) = userinfo.rsplit_once(':') {
                    if password.len() >= 8 && !password.contains("//") && !host.contains(password) {
                        assert!(!message.contains(password), "{message}");
                    }
                }
            }
        }
    }
});
