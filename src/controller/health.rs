//! What readiness and the `RedisDegraded` condition are made of: the watches' first lists and
//! the Redis nodes answering, counted so that one slow probe does not move them.
//! `probes.rs` serves them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What readiness is made of, apart from the run bookkeeping: the watches' first lists and
/// the Redis nodes that answered the last probe.
#[derive(Debug, Default)]
pub struct Health {
    synced: AtomicBool,
    reachable: AtomicUsize,
    /// What the LockedJobs' `RedisDegraded` condition shows: see [`SettledView`].
    reported: AtomicUsize,
}

impl Health {
    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
    }

    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    pub fn set_reachable(&self, nodes: usize) {
        self.reachable.store(nodes, Ordering::Relaxed);
    }

    pub fn reachable(&self) -> usize {
        self.reachable.load(Ordering::Relaxed)
    }

    pub fn set_reported(&self, nodes: usize) {
        self.reported.store(nodes, Ordering::Relaxed);
    }

    /// The answering nodes the `RedisDegraded` condition reports.
    pub fn reported(&self) -> usize {
        self.reported.load(Ordering::Relaxed)
    }
}

/// The count of answering nodes that the LockedJobs' `RedisDegraded` condition shows. It
/// moves only once the (steady) count has stayed on the other side of "all nodes" for `SETTLE`:
/// each move is a status write on every LockedJob whose last run this replica held, and on an
/// overloaded machine the probes flapped every few seconds, making thousands of writes a
/// minute at 1,000 LockedJobs that fed the overload. While degraded, a change of how many nodes
/// answer (4 to 3) writes nothing either. Readiness uses the faster [`SteadyCount`].
#[derive(Debug, Default)]
pub struct SettledView {
    shown: Option<usize>,
    /// The other side ("degraded" or not) and since when the probes have been on it.
    pending: Option<(bool, Instant)>,
}

pub const SETTLE: Duration = Duration::from_secs(10);

impl SettledView {
    /// Takes a count of `nodes` at `now`; returns the count to show.
    pub fn observe(&mut self, count: usize, nodes: usize, now: Instant) -> usize {
        let Some(shown) = self.shown else {
            self.shown = Some(count);
            return count;
        };
        let degraded = count < nodes;
        if degraded == (shown < nodes) {
            self.pending = None;
            return shown;
        }
        match self.pending {
            Some((side, since)) if side == degraded => {
                if now.saturating_duration_since(since) < SETTLE {
                    return shown;
                }
                self.pending = None;
                self.shown = Some(count);
                count
            }
            _ => {
                self.pending = Some((degraded, now));
                shown
            }
        }
    }
}

/// The number of answering Redis nodes as readiness sees it (and the input of
/// [`SettledView`]): it moves once two probes in a row are on the same side of it (to the
/// nearer of the two), so a single probe that times out on a loaded machine changes nothing.
/// The first probe counts at once.
#[derive(Debug, Default)]
pub struct SteadyCount {
    shown: Option<usize>,
    last: Option<usize>,
}

impl SteadyCount {
    /// Takes a probe's count; returns the count to show.
    pub fn observe(&mut self, probed: usize) -> usize {
        let shown = match (self.shown, self.last) {
            (None, _) => probed,
            (Some(shown), Some(last)) if last < shown && probed < shown => last.max(probed),
            (Some(shown), Some(last)) if last > shown && probed > shown => last.min(probed),
            (Some(shown), _) => shown,
        };
        self.shown = Some(shown);
        self.last = Some(probed);
        shown
    }
}

#[cfg(test)]
mod tests {
    use super::{SettledView, SteadyCount, SETTLE};
    use std::time::{Duration, Instant};

    #[test]
    fn the_condition_moves_only_once_the_other_side_held_for_the_settle_time() {
        let step = SETTLE / 4;
        // (what, counts of 5 nodes, one every `step`, counts shown after each)
        let table: [(&str, &[usize], &[usize]); 5] = [
            ("the first count shows at once", &[3], &[3]),
            (
                "down for less than the settle time: not shown",
                &[5, 4, 4, 5, 4, 4, 4],
                &[5; 7],
            ),
            (
                "down for the settle time",
                &[5, 4, 4, 4, 4, 4, 3],
                &[5, 5, 5, 5, 5, 4, 4],
            ),
            (
                "4 and 3 while degraded: no move",
                &[4, 3, 4, 3, 3, 3, 3],
                &[4; 7],
            ),
            (
                "back up for the settle time",
                &[3, 5, 5, 5, 5, 5],
                &[3, 3, 3, 3, 3, 5],
            ),
        ];
        for (what, counts, expected) in table {
            let mut view = SettledView::default();
            let t0 = Instant::now();
            let shown: Vec<usize> = counts
                .iter()
                .enumerate()
                .map(|(i, &c)| view.observe(c, 5, t0 + step * i as u32))
                .collect();
            assert_eq!(shown, expected, "{what}");
        }
        let mut view = SettledView::default();
        let t0 = Instant::now();
        view.observe(5, 5, t0);
        view.observe(4, 5, t0 + Duration::from_secs(1));
        assert_eq!(view.observe(4, 5, t0 + Duration::from_secs(1) + SETTLE), 4);
    }

    #[test]
    fn a_change_counts_once_two_probes_agree() {
        // (what, probes, counts shown after each)
        let table: [(&str, &[usize], &[usize]); 6] = [
            ("the first probe counts at once", &[3], &[3]),
            ("steady", &[5, 5, 5], &[5, 5, 5]),
            ("one probe timed out: ignored", &[5, 4, 5, 5], &[5, 5, 5, 5]),
            ("a node down for two probes", &[5, 4, 4, 4], &[5, 5, 4, 4]),
            (
                "back up after two probes",
                &[3, 5, 3, 5, 5],
                &[3, 3, 3, 3, 5],
            ),
            (
                "flapping below: the better of the two",
                &[5, 4, 3, 4, 3],
                &[5, 5, 4, 4, 4],
            ),
        ];
        for (what, probes, expected) in table {
            let mut count = SteadyCount::default();
            let shown: Vec<usize> = probes.iter().map(|&p| count.observe(p)).collect();
            assert_eq!(shown, expected, "{what}");
        }
    }
}
