//! Rotation without a restart (docs/design.md, "Rotating certificates and passwords"): the
//! files the engine was given (CA, client certificate and key, password file) are read every
//! reload interval, and when their bytes differ from the last look the owner's `apply` runs
//! once. Polling rather than inotify: a Secret volume changes by swapping a symlink, which a
//! watch on the file itself misses, and a few small reads every ten seconds cost nothing.

use std::path::PathBuf;
use std::sync::Weak;
use std::time::Duration;

/// What the files held at the last look; an unreadable file is its error's text, so that a
/// file that disappears and comes back counts as two changes.
#[derive(Debug, PartialEq, Eq)]
struct Contents(Vec<Result<Vec<u8>, String>>);

impl Contents {
    fn read(files: &[PathBuf]) -> Self {
        Self(
            files
                .iter()
                .map(|path| std::fs::read(path).map_err(|e| e.to_string()))
                .collect(),
        )
    }
}

/// The files and what they held when last read.
pub(crate) struct Watch {
    files: Vec<PathBuf>,
    last: Contents,
}

impl Watch {
    /// Starts from the files as they are now: what the owner was built from.
    pub(crate) fn new(files: Vec<PathBuf>) -> Self {
        let last = Contents::read(&files);
        Self { files, last }
    }

    /// Whether any file changed since the last call (or since `new`).
    pub(crate) fn changed(&mut self) -> bool {
        let now = Contents::read(&self.files);
        if now == self.last {
            return false;
        }
        self.last = now;
        true
    }
}

/// Polls `watch` every `interval` and calls `apply` on the owner after each change, until the
/// owner is dropped: the task holds it weakly, like the batching tasks (`batch.rs`). Needs a
/// Tokio runtime; without one (or with nothing to watch, or a zero interval) nothing runs.
pub(crate) fn spawn<Owner: Send + Sync + 'static>(
    weak_owner: Weak<Owner>,
    mut watch: Watch,
    interval: Duration,
    apply: fn(&Owner),
) {
    if watch.files.is_empty() || interval.is_zero() {
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!("no Tokio runtime: TLS and password files are not watched for changes");
        return;
    };
    runtime.spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let Some(owner) = weak_owner.upgrade() else {
                return;
            };
            // The reads are a few small files; blocking the worker for them is cheaper than a
            // blocking-pool round trip every interval.
            if watch.changed() {
                apply(&owner);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_is_reported_once_and_a_vanished_file_is_a_change() {
        let dir = tempfile_dir();
        let file = dir.join("ca.crt");
        std::fs::write(&file, "one").expect("write");
        let mut watch = Watch::new(vec![file.clone()]);
        assert!(!watch.changed(), "nothing written yet");
        std::fs::write(&file, "two").expect("write");
        assert!(watch.changed());
        assert!(!watch.changed(), "reported once");
        std::fs::remove_file(&file).expect("remove");
        assert!(watch.changed(), "gone");
        std::fs::write(&file, "two").expect("write");
        assert!(
            watch.changed(),
            "back, even with the same bytes as before it went"
        );
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "lockedjob-reload-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }
}
