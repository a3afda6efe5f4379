//! How many clusters one process runs at once, and the clusters its tests share.
//!
//! Two cores run about two busy real-node clusters side by side (the Kubernetes tier runs a
//! second process beside the test binary's, its heavy tests kept apart; docs/testing.md).
//! Every [`LocalCluster::start`] takes a slot first and gives it back when the cluster stops;
//! a start that finds none free stops a shared cluster no test holds, or waits for one. So a
//! test binary may hold any number of suites: the runner's threads, not the file layout,
//! decide what overlaps, and this board keeps the overlap within what the machine holds
//! (docs/testing.md, "Scheduling").
//!
//! A cluster of three nodes or more takes every slot: it runs alone.

use crate::{Error, LocalCluster, Options};
use std::collections::HashMap;
use std::ops::Deref;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How many clusters (of up to two nodes) one process runs at once. Default 2.
pub const LIMIT_ENV: &str = "LOCALCLUSTER_MAX_CLUSTERS";
const DEFAULT_LIMIT: usize = 2;
/// A start that waited this long goes ahead over the limit, with a warning: a test that holds
/// a cluster and asks for another one by one (rather than with [`shared_many`] or
/// [`start_many`]) could otherwise wait forever on a test doing the same.
const OVERCOMMIT_AFTER: Duration = Duration::from_secs(600);
const SAY_WAITING_AFTER: Duration = Duration::from_secs(60);

enum Entry {
    /// Being started by one caller; others asking for it wait.
    Starting,
    Ready {
        cluster: Arc<LocalCluster>,
        users: usize,
    },
}

struct Board {
    used: usize,
    shared: HashMap<&'static str, Entry>,
}

struct Slots {
    /// Read once from `LIMIT_ENV`; never changes.
    limit: usize,
    board: Mutex<Board>,
    changed: Condvar,
}

static SLOTS: OnceLock<Slots> = OnceLock::new();

fn slots() -> &'static Slots {
    SLOTS.get_or_init(|| {
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(stop_shared_clusters) };
        let limit = std::env::var(LIMIT_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|l| *l >= 1)
            .unwrap_or(DEFAULT_LIMIT);
        Slots::new(limit)
    })
}

impl Slots {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            board: Mutex::new(Board {
                used: 0,
                shared: HashMap::new(),
            }),
            changed: Condvar::new(),
        }
    }

    /// The slots a cluster started with `options` takes: one, or all for three nodes or more.
    fn weight(&self, options: &Options) -> usize {
        if options.nodes >= 3 {
            self.limit
        } else {
            1
        }
    }

    fn lock(&self) -> MutexGuard<'_, Board> {
        // A test that panicked while holding the board left it consistent: every change
        // below is made in one step.
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Statics are never dropped: the shared clusters are stopped when the process exits.
extern "C" fn stop_shared_clusters() {
    let Some(slots) = SLOTS.get() else {
        return;
    };
    let ready: Vec<Arc<LocalCluster>> = slots
        .lock()
        .shared
        .drain()
        .filter_map(|(_, entry)| match entry {
            Entry::Ready { cluster, .. } => Some(cluster),
            Entry::Starting => None,
        })
        .collect();
    for cluster in ready {
        cluster.shutdown();
    }
}

/// Slots held by one running cluster, given back when it stops.
pub(crate) struct Slot {
    weight: usize,
    slots: &'static Slots,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let slots = self.slots;
        let mut board = slots.lock();
        board.used = board.used.saturating_sub(self.weight);
        drop(board);
        slots.changed.notify_all();
    }
}

/// Takes `weight` slots, stopping shared clusters no test holds (other than `keep`) to make
/// room, or waiting for a cluster to stop.
fn take(slots: &'static Slots, weight: usize, keep: &[&str], what: &str) -> Slot {
    let mut board = slots.lock();
    let since = Instant::now();
    let mut said = false;
    loop {
        let over = since.elapsed() > OVERCOMMIT_AFTER;
        // More than the limit at once (clusters asked for together) goes ahead alone.
        let room = board.used + weight <= slots.limit || board.used == 0;
        if room || over {
            if over {
                eprintln!("localcluster: {what} starts over the limit of {} clusters after waiting {} s (does a test hold one cluster while asking for another?)", slots.limit, since.elapsed().as_secs());
            }
            board.used += weight;
            return Slot { weight, slots };
        }
        if let Some(idle) = take_idle(&mut board, keep) {
            // Its shutdown gives its slot back; the board is not held meanwhile.
            drop(board);
            drop(idle);
            board = slots.lock();
            continue;
        }
        if !said && since.elapsed() > SAY_WAITING_AFTER {
            eprintln!(
                "localcluster: {what} waits for one of {} cluster slots ({LIMIT_ENV})",
                slots.limit
            );
            said = true;
        }
        board = slots
            .changed
            .wait_timeout(board, Duration::from_secs(5))
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// Removes a shared cluster no test holds, to be stopped by the caller.
fn take_idle(board: &mut Board, keep: &[&str]) -> Option<Arc<LocalCluster>> {
    let name = board.shared.iter().find_map(|(name, entry)| match entry {
        Entry::Ready { users: 0, .. } if !keep.contains(name) => Some(*name),
        _ => None,
    })?;
    match board.shared.remove(name) {
        Some(Entry::Ready { cluster, .. }) => Some(cluster),
        _ => None,
    }
}

/// The slot a private start takes (blocking).
pub(crate) fn take_for(options: &Options) -> Slot {
    let slots = slots();
    take(slots, slots.weight(options), &[], &options.name)
}

/// Starts several clusters of the test's own once there is room for all of them, so a test
/// needing two never holds one while waiting for the other. Each stops when dropped.
pub fn start_many(options: Vec<Options>) -> Result<Vec<LocalCluster>, Error> {
    let named: Vec<(&str, Options)> = options.into_iter().map(|o| ("", o)).collect();
    let what: Vec<String> = named.iter().map(|(_, o)| o.name.clone()).collect();
    let started = start_reserved(slots(), &[], &what.join(" and "), named)?;
    Ok(started.into_iter().map(|(_, cluster)| cluster).collect())
}

/// A cluster shared by the tests of this process under one name; it stays up while any test
/// holds it, and after that until its slot is needed or the process exits.
pub struct Shared {
    name: &'static str,
    cluster: Arc<LocalCluster>,
}

impl Deref for Shared {
    type Target = LocalCluster;

    fn deref(&self) -> &LocalCluster {
        &self.cluster
    }
}

impl Shared {
    /// Changes how many handles hold this very cluster (not a later one of the same name).
    fn count(&self, change: impl FnOnce(&mut usize)) {
        let slots = slots();
        if let Some(Entry::Ready { cluster, users }) = slots.lock().shared.get_mut(self.name) {
            if Arc::ptr_eq(cluster, &self.cluster) {
                change(users);
            }
        }
        slots.changed.notify_all();
    }
}

impl Clone for Shared {
    fn clone(&self) -> Self {
        self.count(|users| *users += 1);
        Self {
            name: self.name,
            cluster: self.cluster.clone(),
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.count(|users| *users = users.saturating_sub(1));
    }
}

/// The cluster shared under `name`, started with [`Options::named`] on first use.
pub fn shared(name: &'static str) -> Result<Shared, Error> {
    shared_with(name, || Options::named(name))
}

/// `shared`, started with the options `options` gives (called only if it must start).
pub fn shared_with(name: &'static str, options: impl FnOnce() -> Options) -> Result<Shared, Error> {
    let mut clusters = shared_many(vec![(name, Box::new(options) as LazyOptions)])?;
    Ok(clusters.remove(0))
}

/// Options made only when a shared cluster must start.
pub type LazyOptions<'a> = Box<dyn FnOnce() -> Options + 'a>;

/// Several shared clusters at once (a test of two clusters): those missing start only once
/// there is room for all of them, so the test never holds one while waiting for another.
pub fn shared_many(wanted: Vec<(&'static str, LazyOptions<'_>)>) -> Result<Vec<Shared>, Error> {
    let slots = slots();
    let names: Vec<&'static str> = wanted.iter().map(|(name, _)| *name).collect();
    let mut board = slots.lock();
    // Wait while another caller starts one of them (its marks are cleared even if it panics).
    while names
        .iter()
        .any(|n| matches!(board.shared.get(n), Some(Entry::Starting)))
    {
        board = slots.changed.wait(board).unwrap_or_else(|e| e.into_inner());
    }
    // In one step: hold what is up (so no start evicts it meanwhile), mark what is missing.
    let mut held = HashMap::new();
    let mut missing = Vec::new();
    for (name, options) in wanted {
        match board.shared.get_mut(name) {
            Some(Entry::Ready { cluster, users }) => {
                *users += 1;
                let cluster = cluster.clone();
                held.insert(name, Shared { name, cluster });
            }
            _ => {
                board.shared.insert(name, Entry::Starting);
                missing.push((name, options));
            }
        }
    }
    drop(board);
    let marks = StartingMarks {
        slots,
        names: missing.iter().map(|(name, _)| *name).collect(),
    };
    // On an error (or a panic) `held` gives its users back and `marks` clears this caller's
    // marks, with the board not locked.
    let started = start_missing(slots, &names, missing)?;
    let mut board = slots.lock();
    for (name, cluster) in started {
        let cluster = Arc::new(cluster);
        board.shared.insert(
            name,
            Entry::Ready {
                cluster: cluster.clone(),
                users: 1,
            },
        );
        held.insert(name, Shared { name, cluster });
    }
    drop(board);
    drop(marks);
    slots.changed.notify_all();
    Ok(names.iter().filter_map(|name| held.remove(name)).collect())
}

/// The names one caller marked `Starting`: whatever happens to its start, they are cleared
/// when this is dropped (a start that succeeded has replaced them with `Ready` already).
struct StartingMarks {
    slots: &'static Slots,
    names: Vec<&'static str>,
}

impl Drop for StartingMarks {
    fn drop(&mut self) {
        let mut board = self.slots.lock();
        for name in &self.names {
            if matches!(board.shared.get(name), Some(Entry::Starting)) {
                board.shared.remove(name);
            }
        }
        drop(board);
        self.slots.changed.notify_all();
    }
}

/// Stops every shared cluster no test holds, so a test that must have the machine to itself
/// gets it (they start again on their next use).
pub fn stop_idle_shared() {
    let slots = slots();
    loop {
        let idle = take_idle(&mut slots.lock(), &[]);
        match idle {
            // Stopped with the board unlocked: its slot is given back as it stops.
            Some(cluster) => drop(cluster),
            None => return,
        }
    }
}

/// Starts the clusters marked `Starting` by this caller, with the slots for all taken at once.
fn start_missing(
    slots: &'static Slots,
    names: &[&'static str],
    missing: Vec<(&'static str, LazyOptions<'_>)>,
) -> Result<Vec<(&'static str, LocalCluster)>, Error> {
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    let options = missing
        .into_iter()
        .map(|(name, options)| (name, options()))
        .collect();
    start_reserved(slots, names, &names.join(" and "), options)
}

/// Takes the slots of every cluster in `options` at once, then starts them one by one, each
/// with its own share (given back when it stops, or at once if it fails to start).
fn start_reserved<N>(
    slots: &'static Slots,
    keep: &[&str],
    what: &str,
    options: Vec<(N, Options)>,
) -> Result<Vec<(N, LocalCluster)>, Error> {
    let total = options.iter().map(|(_, o)| slots.weight(o)).sum();
    let mut reserved = take(slots, total, keep, what);
    let mut started = Vec::new();
    for (name, option) in options {
        let share = slots.weight(&option).min(reserved.weight);
        // Moved from the reservation to the cluster's own slot, never counted twice.
        reserved.weight = reserved.weight.saturating_sub(share);
        started.push((
            name,
            LocalCluster::start_with(
                option,
                Slot {
                    weight: share,
                    slots,
                },
            )?,
        ));
    }
    Ok(started)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board(limit: usize) -> &'static Slots {
        Box::leak(Box::new(Slots::new(limit)))
    }

    fn take_now(slots: &'static Slots, weight: usize) -> Slot {
        take(slots, weight, &[], "test")
    }

    #[test]
    fn a_start_waits_for_a_slot_and_gets_the_one_given_back() {
        let slots = board(2);
        let first = take_now(slots, 1);
        let _second = take_now(slots, 1);
        assert_eq!(slots.lock().used, 2);
        let (sent, got) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let third = take_now(slots, 1);
            sent.send(()).expect("the test waits");
            third
        });
        assert!(
            got.recv_timeout(Duration::from_millis(300)).is_err(),
            "a third cluster started while two ran"
        );
        drop(first);
        got.recv_timeout(Duration::from_secs(10))
            .expect("the third start once the first stopped");
        drop(waiter.join().expect("the waiter"));
        assert_eq!(slots.lock().used, 1, "each slot given back once");
    }

    #[test]
    fn a_start_that_panics_leaves_no_mark_behind() {
        let caught = std::panic::catch_unwind(|| {
            shared_with("panics", || -> Options { panic!("no options") })
        });
        assert!(caught.is_err());
        assert!(
            !slots().lock().shared.contains_key("panics"),
            "a later request would wait for it forever"
        );
    }

    #[test]
    fn a_cluster_of_three_nodes_takes_every_slot() {
        let limit = 2;
        let three = Options {
            nodes: 3,
            ..Options::named("big")
        };
        let slots = board(limit);
        assert_eq!(slots.weight(&three), limit);
        assert_eq!(slots.weight(&Options::named("small")), 1);
        let big = take_now(slots, slots.weight(&three));
        assert_eq!(slots.lock().used, limit);
        drop(big);
        assert_eq!(slots.lock().used, 0);
    }
}
