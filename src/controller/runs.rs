//! This replica's bookkeeping of runs, with one owner: which scheduled times are being
//! started, which Jobs are supervised here, which times not to try again yet, and when an
//! unsupervised Job was last checked for a dead holder. Claims release themselves on drop, so
//! a run that ends early (an error, a panic) never leaves its key taken.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A scheduled time of a LockedJob: (namespace, LockedJob name or `name#run-now`, seconds).
pub type RunKey = (String, String, i64);
/// A Job: (namespace, name).
pub type JobKey = (String, String);

#[derive(Default)]
pub struct Runs {
    starting: Mutex<HashSet<RunKey>>,
    supervised: Mutex<HashSet<JobKey>>,
    /// Scheduled times not to try again before an instant: ones that ran (here or elsewhere),
    /// and ones another runner holds the lock for.
    pub settled: Cooldowns<RunKey>,
    /// Unsupervised Jobs not to check for a dead holder again before an instant.
    orphan_checks: Cooldowns<JobKey>,
    /// Finished Jobs this replica asked the API server to delete, not to ask again before an
    /// instant.
    deletes: Cooldowns<JobKey>,
}

/// How long a replica waits before it deletes the same history Job again: until then its
/// cache may still show a Job the API server already removed (the watch lags under load, and
/// every Job event reconciles the LockedJob again; at 1,000 LockedJobs that made 2.2 DELETEs
/// a run), and a delete that failed is tried again after this.
pub const DELETE_PAUSE: Duration = Duration::from_secs(30);

/// A key taken in one of the registry's sets until this is dropped.
pub struct Claim<'a, K: Eq + Hash> {
    set: &'a Mutex<HashSet<K>>,
    key: K,
}

impl<K: Eq + Hash> Drop for Claim<'_, K> {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.lock() {
            set.remove(&self.key);
        }
    }
}

/// Takes `key`; `None` when it is taken already (a poisoned set counts as taken, so nothing
/// starts twice).
fn claim<'a, K: Eq + Hash + Clone>(set: &'a Mutex<HashSet<K>>, key: &K) -> Option<Claim<'a, K>> {
    let inserted = set
        .lock()
        .map(|mut s| s.insert(key.clone()))
        .unwrap_or(false);
    inserted.then(|| Claim {
        set,
        key: key.clone(),
    })
}

impl Runs {
    /// This replica starts `key`; `None` when it already is.
    pub fn claim_start(&self, key: &RunKey) -> Option<Claim<'_, RunKey>> {
        claim(&self.starting, key)
    }

    /// This replica supervises (or tries to adopt) the Job; `None` when it already does.
    pub fn claim_job(&self, key: &JobKey) -> Option<Claim<'_, JobKey>> {
        claim(&self.supervised, key)
    }

    pub fn is_supervised(&self, key: &JobKey) -> bool {
        self.supervised
            .lock()
            .map(|s| s.contains(key))
            .unwrap_or(true)
    }

    /// Whether an orphan candidate (an active Job at least a TTL old that this replica does
    /// not supervise) is due for a check, and if so records the check. Every Job status
    /// change reconciles its LockedJob on every replica; asking Redis each time cost ~100
    /// GETs per run with 3 replicas. The first check is at once (the Job is already old
    /// enough for its holder's lock to have expired), then at most once per `interval` (the
    /// renew interval), or later when [`Runs::defer_orphan_check`] says so.
    pub fn orphan_check_due(&self, key: &JobKey, now: Instant, interval: Duration) -> bool {
        self.orphan_checks.take(key, now, now + interval)
    }

    /// Whether this replica should delete the finished Job now, and if so records it: not
    /// again within [`DELETE_PAUSE`].
    pub fn delete_due(&self, key: &JobKey, now: Instant) -> bool {
        self.deletes.take(key, now, now + DELETE_PAUSE)
    }

    /// No check of the Job before `until`: its holder's value outlives it on a node, so the
    /// holder cannot be gone before then.
    pub fn defer_orphan_check(&self, key: &JobKey, until: Instant) {
        self.orphan_checks.set(key.clone(), until);
    }
}

/// Keys with an instant before which they are not acted on again, optionally only as long as
/// a watched state (a tag) stays the same. Every Job event reconciles its LockedJob on every
/// replica; without this, the replicas that lost the race for a time tried again at each
/// event, costing Redis rounds for nothing.
pub struct Cooldowns<K> {
    entries: Mutex<CooldownEntries<K>>,
}

struct CooldownEntries<K> {
    /// Key -> the instant its cooldown ends, and the tag it was set at, if it watches one.
    until: HashMap<K, (Instant, Option<u64>)>,
    /// Keys left after the last sweep of expired ones.
    swept_len: usize,
}

impl<K> Default for Cooldowns<K> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(CooldownEntries {
                until: HashMap::new(),
                swept_len: 0,
            }),
        }
    }
}

impl<K: Eq + std::hash::Hash> Cooldowns<K> {
    pub fn set(&self, key: K, until: Instant) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.until.insert(key, (until, None));
        }
    }

    /// Whether `key` is free at `now`; if so, it cools down until `until` from here on.
    pub fn take(&self, key: &K, now: Instant, until: Instant) -> bool
    where
        K: Clone,
    {
        if self.holds(key, now, 0) {
            return false;
        }
        self.set(key.clone(), until);
        true
    }

    /// Like [`Cooldowns::set`], but ends early once the tag passed to `holds` differs from
    /// `tag`.
    pub fn set_until_changed(&self, key: K, until: Instant, tag: u64) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.until.insert(key, (until, Some(tag)));
        }
    }

    /// Whether `key` is still cooling down at `now` with the watched state at `tag`. Keys
    /// whose time has passed are forgotten once the map has doubled since the last sweep, so
    /// a check costs O(1) amortized, not a scan of every key (thousands at scale).
    pub fn holds(&self, key: &K, now: Instant, tag: u64) -> bool {
        let Ok(mut entries) = self.entries.lock() else {
            return false;
        };
        if entries.until.len() >= 2 * entries.swept_len.max(64) {
            entries.until.retain(|_, (until, _)| *until > now);
            entries.swept_len = entries.until.len();
        }
        entries
            .until
            .get(key)
            .is_some_and(|(until, set_at)| *until > now && set_at.is_none_or(|t| t == tag))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_exclusive_and_released_when_dropped() {
        let runs = Runs::default();
        let key: RunKey = ("ns".into(), "report".into(), 60);
        let first = runs.claim_start(&key).expect("free");
        assert!(runs.claim_start(&key).is_none(), "taken while held");
        drop(first);
        assert!(runs.claim_start(&key).is_some(), "free again once dropped");
        let job: JobKey = ("ns".into(), "report-1".into());
        {
            let _held = runs.claim_job(&job).expect("free");
            assert!(runs.is_supervised(&job));
        }
        assert!(
            !runs.is_supervised(&job),
            "released at the end of its scope"
        );
    }

    #[test]
    fn cooldowns_hold_until_their_instant() {
        let cooldowns = Cooldowns::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        cooldowns.set("a", at(10));
        cooldowns.set("b", at(5));
        let table = [
            ("a", 0, true, "a before its instant"),
            ("b", 4, true, "b before its instant"),
            ("c", 4, false, "never set"),
            ("b", 5, false, "b at its instant"),
            ("a", 9, true, "a still"),
            ("a", 10, false, "a at its instant"),
        ];
        for (key, s, holds, what) in table {
            assert_eq!(cooldowns.holds(&key, at(s), 0), holds, "{what}");
        }
        cooldowns.set("a", at(20));
        assert!(
            cooldowns.holds(&"a", at(15), 7),
            "set again; no tag watched"
        );
    }

    #[test]
    fn expired_keys_are_swept_once_the_map_has_doubled() {
        let cooldowns = Cooldowns::default();
        let t0 = Instant::now();
        let len = |c: &Cooldowns<u32>| c.entries.lock().map(|e| e.until.len()).unwrap_or(0);
        for key in 0..100 {
            cooldowns.set(key, t0 + Duration::from_secs(1));
        }
        let later = t0 + Duration::from_secs(2);
        assert!(!cooldowns.holds(&0, later, 0), "expired keys never hold");
        assert_eq!(
            len(&cooldowns),
            100,
            "below the mark (2 x 64): no sweep yet"
        );
        for key in 100..130 {
            cooldowns.set(key, later + Duration::from_secs(10));
        }
        assert!(cooldowns.holds(&120, later, 0));
        assert_eq!(len(&cooldowns), 30, "swept: only the live keys stay");
        assert!(!cooldowns.holds(&5, later, 0));
    }

    #[test]
    fn a_tagged_cooldown_ends_when_the_tag_changes() {
        let cooldowns = Cooldowns::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        cooldowns.set_until_changed("a", at(10), 1);
        let table = [
            (1, 1, true, "same state, before the instant"),
            (2, 2, false, "state changed: retry now"),
            (
                3,
                1,
                true,
                "back to the state it was set at (nothing forgotten)",
            ),
            (10, 1, false, "instant passed"),
        ];
        for (s, tag, holds, what) in table {
            assert_eq!(cooldowns.holds(&"a", at(s), tag), holds, "{what}");
        }
    }

    #[test]
    fn a_history_job_is_deleted_again_only_after_the_pause() {
        let runs = Runs::default();
        let a = ("ns".to_string(), "job-a".to_string());
        let b = ("ns".to_string(), "job-b".to_string());
        let t0 = Instant::now();
        let pause = DELETE_PAUSE.as_secs();
        let table = [
            (&a, 0, true, "a first: deleted"),
            (&a, 1, false, "a still in a lagging cache: not again"),
            (&b, 1, true, "b independently of a"),
            (&a, pause - 1, false, "a within the pause"),
            (
                &a,
                pause,
                true,
                "a after the pause (the last delete may have failed)",
            ),
            (
                &a,
                pause + 1,
                false,
                "the pause counts from the last delete",
            ),
        ];
        for (key, at, due, what) in table {
            let now = t0 + Duration::from_secs(at);
            assert_eq!(runs.delete_due(key, now), due, "{what}");
        }
    }

    #[test]
    fn orphan_checks_are_spaced_by_the_interval_or_the_deferral_per_job() {
        let runs = Runs::default();
        let a = ("ns".to_string(), "job-a".to_string());
        let b = ("ns".to_string(), "job-b".to_string());
        let t0 = Instant::now();
        let interval = Duration::from_secs(10);
        // (Job, at second, defer its next check to this second, due, what)
        let table = [
            (&a, 0, None, true, "a first seen: checked at once"),
            (&a, 1, None, false, "a again within the interval"),
            (&b, 1, None, true, "b first seen, independently of a"),
            (&a, 9, None, false, "a still within the interval"),
            (&a, 10, None, true, "a once an interval has passed"),
            (
                &a,
                15,
                None,
                false,
                "the interval counts from the last check",
            ),
            (&a, 20, Some(45), true, "a again after another interval"),
            (
                &a,
                30,
                None,
                false,
                "a deferred past the interval (its holder's value lives on)",
            ),
            (&a, 44, None, false, "a deferred until 45"),
            (&a, 45, None, true, "a once the deferral ends"),
            (&b, 11, None, true, "b an interval after its first check"),
            (&b, 700, None, true, "b after a long pause"),
            (&b, 710, None, true, "b an interval after that"),
        ];
        for (key, at, defer, due, what) in table {
            let now = t0 + Duration::from_secs(at);
            assert_eq!(runs.orphan_check_due(key, now, interval), due, "{what}");
            if let Some(until) = defer {
                runs.defer_orphan_check(key, t0 + Duration::from_secs(until));
            }
        }
    }
}
