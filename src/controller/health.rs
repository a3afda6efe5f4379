//! `/healthz`, `/readyz` and `/metrics` over a minimal HTTP/1.1 responder.

use super::Context;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

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

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Answers each request in a task of its own until the returned future is dropped.
pub async fn serve(listener: TcpListener, ctx: Arc<Context>) {
    let mut connections = tokio::task::JoinSet::new();
    while let Ok((mut stream, _)) = listener.accept().await {
        // Reap the finished ones so the set stays small.
        while connections.try_join_next().is_some() {}
        let ctx = Arc::clone(&ctx);
        connections.spawn(async move {
                let mut buf = [0u8; 2048];
                let Ok(n) = stream.read(&mut buf).await else {
                    return;
                };
                let request = String::from_utf8_lossy(&buf[..n]);
                let path = request.split_whitespace().nth(1).unwrap_or("/");
                let (code, body) = match path {
                    "/healthz" => (200, "ok\n".to_string()),
                    "/readyz" if ctx.is_ready() => (200, "ready\n".to_string()),
                    "/readyz" => (503, format!(
                        "not ready: watch synced={}, redis nodes answering={} of {} (quorum {}), shutting down={}\n",
                        ctx.health.synced(),
                        ctx.health.reachable(),
                        ctx.nodes(), ctx.engine.quorum(), ctx.shutdown.is_cancelled())),
                    "/metrics" => (200, ctx.metrics.render()),
                    _ => (404, "not found\n".to_string()),
                };
                let reason = match code {
                    200 => "OK",
                    503 => "Service Unavailable",
                    _ => "Not Found",
                };
                let content_type = if path == "/metrics" {
                    "application/openmetrics-text; version=1.0.0; charset=utf-8"
                } else {
                    "text/plain"
                };
                let response = format!("HTTP/1.1 {code} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                let _ = stream.write_all(response.as_bytes()).await;
            });
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
