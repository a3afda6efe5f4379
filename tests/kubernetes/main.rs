//! The Kubernetes tier: the operator, the chart, the sidecar and the image against real control
//! planes with real nodes (`localcluster`; root, and the binaries of `scripts/k8s-bins.sh`).
//! Every test is `#[ignore]`d so that a plain `cargo test` leaves it out and says so;
//! `scripts/test.sh kubernetes` (and CI) run it with `--include-ignored`.
//!
//! The suites share one process: how many clusters run at once is `localcluster`'s slot board,
//! and the tests that must run alone say so with [`alone`] (docs/testing.md, "Scheduling").

mod apiserver_contract;
mod chart_render;
mod e2e;
mod elect_sidecar;
mod helm;
mod image;
mod kubectl;
mod next_in_cluster;
mod operator_e2e;
mod operator_scale;
mod real_node_chart;
mod real_node_leader;

use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

/// Who has the machine: tests running `beside` one another (how many, libtest's threads
/// decide), or one test `alone`.
struct Turns {
    beside: usize,
    alone: bool,
    /// Tests waiting to run alone: no test starts beside meanwhile, or they could wait forever.
    alone_waiting: usize,
}

static TURNS: Mutex<Turns> = Mutex::new(Turns {
    beside: 0,
    alone: false,
    alone_waiting: 0,
});
static TURN_ENDED: Condvar = Condvar::new();

fn turns() -> MutexGuard<'static, Turns> {
    // A test that panicked holding the lock left the counts whole: each is changed in one step.
    TURNS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where each test's minutes go, when set: a line `seconds<TAB>test` per test (what the suite
/// costs is CI's budget, docs/testing.md "Time"; libtest prints no durations on stable).
const TIMES_ENV: &str = "LOCKEDJOB_TEST_TIMES";

/// A file that other processes hold a shared lock on while they run clusters beside this one
/// (`scripts/test.sh` runs the soak and localcluster's tests so): the tests `alone` and
/// `heavy` take it exclusively, so they wait for those to end and none starts meanwhile.
const ALONE_LOCK_ENV: &str = "LOCKEDJOB_ALONE_LOCK";

/// The exclusive lock on [`ALONE_LOCK_ENV`]'s file, when set: one for the whole process,
/// shared by its tests (an exclusive `flock` taken twice by one process would wait for itself),
/// and released when the last of them drops it.
fn machine_to_ourselves() -> Option<Arc<std::fs::File>> {
    static HELD: Mutex<Weak<std::fs::File>> = Mutex::new(Weak::new());
    let path = std::env::var_os(ALONE_LOCK_ENV)?;
    // Held while waiting for the lock: a second caller would wait for it anyway.
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(file) = held.upgrade() {
        return Some(file);
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("{ALONE_LOCK_ENV}: cannot open {path:?}: {e}"));
    file.lock()
        .unwrap_or_else(|e| panic!("{ALONE_LOCK_ENV}: cannot lock {path:?}: {e}"));
    let file = Arc::new(file);
    *held = Arc::downgrade(&file);
    Some(file)
}

/// A test's hold on the machine, for the whole test; given back when dropped.
struct Turn {
    alone: bool,
    started: std::time::Instant,
    /// Held by a test `alone` or `heavy` for as long as it runs.
    _machine: Option<Arc<std::fs::File>>,
}

impl Turn {
    fn new(alone: bool) -> Self {
        Self {
            alone,
            started: std::time::Instant::now(),
            _machine: None,
        }
    }

    /// The turn, holding `machine` (the other processes' clusters have ended), counted from
    /// now.
    fn holding(mut self, machine: Option<Arc<std::fs::File>>) -> Self {
        self._machine = machine;
        self.started = std::time::Instant::now();
        self
    }

    fn record(&self) {
        let Some(path) = std::env::var_os(TIMES_ENV) else {
            return;
        };
        let thread = std::thread::current();
        let line = format!(
            "{:.0}\t{}\n",
            self.started.elapsed().as_secs_f64(),
            thread.name().unwrap_or("?")
        );
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut file| std::io::Write::write_all(&mut file, line.as_bytes()));
        if let Err(e) = appended {
            eprintln!(
                "{TIMES_ENV}: cannot append to {}: {e}",
                path.to_string_lossy()
            );
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.record();
        let mut turns = turns();
        if self.alone {
            turns.alone = false;
        } else {
            turns.beside -= 1;
        }
        TURN_ENDED.notify_all();
    }
}

/// A test that shares the machine with the others; waits while one runs `alone`.
fn beside() -> Turn {
    let mut turns = turns();
    while turns.alone || turns.alone_waiting > 0 {
        turns = TURN_ENDED.wait(turns).unwrap_or_else(|e| e.into_inner());
    }
    turns.beside += 1;
    Turn::new(false)
}

/// A test on a cluster that takes every slot (five nodes): beside this process's tests, as
/// the slot board allows, but with no other process's clusters running ([`ALONE_LOCK_ENV`]).
fn heavy() -> Turn {
    beside().holding(machine_to_ourselves())
}

/// A test that must have the machine to itself (a load test whose timing the others would
/// disturb): other processes' clusters end first ([`ALONE_LOCK_ENV`]; this process's tests go
/// on meanwhile), then it waits for every test `beside` to end, none starts until it has ended,
/// and the shared clusters no test holds are stopped.
fn alone() -> Turn {
    let machine = machine_to_ourselves();
    let mut turns = turns();
    turns.alone_waiting += 1;
    while turns.alone || turns.beside > 0 {
        turns = TURN_ENDED.wait(turns).unwrap_or_else(|e| e.into_inner());
    }
    turns.alone_waiting -= 1;
    turns.alone = true;
    drop(turns);
    // Made before anything that may panic, so that the turn is given back.
    let turn = Turn::new(true);
    // The clusters other tests left up would run beside it: stopped (they start again later).
    localcluster::stop_idle_shared();
    turn.holding(machine)
}
