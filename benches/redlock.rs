//! Lock engine benchmark, all variants side by side in one run on the same local nodes:
//! (a) this engine, (b) this engine with sequential fan-out, (c) the `rslock` crate,
//! (d) a bare single-node `SET NX PX` + Lua compare-and-delete.
//!
//! `cargo bench --bench redlock` runs it in full; under `cargo test` it runs a small smoke pass
//! so that it cannot rot. `BENCH_OPS` sets the operations per measurement (default 4000).

use testsupport as support;

use lockedjob::redlock::{Redlock, RedlockConfig};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{Persistence, RedisNodes};

const CONCURRENCY: usize = 64;
const TTL: Duration = Duration::from_secs(30);

#[derive(Clone, Copy)]
struct Stats {
    p50: Duration,
    p99: Duration,
    ops_per_sec: f64,
    /// CPU microseconds per operation in the nodes (`INFO cpu`, all nodes summed)...
    server_us: f64,
    /// ...and in this process: the client, its connections' tasks and the benchmark loop.
    client_us: f64,
}

/// CPU seconds used so far by the nodes and by this process.
fn cpu_seconds(nodes: &RedisNodes) -> (f64, f64) {
    let server = nodes
        .nodes
        .iter()
        .filter_map(|node| node.command::<String>(&["INFO", "cpu"]).ok())
        .flat_map(|info| {
            info.lines()
                .filter_map(|line| {
                    let (key, value) = line.split_once(':')?;
                    matches!(key, "used_cpu_sys" | "used_cpu_user")
                        .then(|| value.trim().parse::<f64>().ok())?
                })
                .collect::<Vec<_>>()
        })
        .sum();
    // SAFETY: getrusage writes into the zeroed struct it is given and reads nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (server, seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

/// Runs `ops` acquire+release operations spread over `tasks` tasks, each on its own key.
async fn measure<F, Fut>(nodes: &RedisNodes, tasks: usize, ops: usize, op: F) -> Stats
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let per_task = ops.div_ceil(tasks);
    let (server_before, client_before) = cpu_seconds(nodes);
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(per_task);
                // One lock name a task, reused as real lock names are: a fencing engine keeps
                // each name's fence for good, so a fresh name per operation would measure a
                // growing keyspace rather than locking.
                let key = format!("bench-{t}");
                for _ in 0..per_task {
                    let key = key.clone();
                    let begun = Instant::now();
                    op(key).await;
                    latencies.push(begun.elapsed());
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::with_capacity(per_task * tasks);
    for handle in handles {
        all.extend(handle.await.expect("bench task"));
    }
    let wall = started.elapsed();
    let (server_after, client_after) = cpu_seconds(nodes);
    all.sort_unstable();
    let pick = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    let per_op = |seconds: f64| seconds * 1e6 / all.len() as f64;
    Stats {
        p50: pick(0.50),
        p99: pick(0.99),
        ops_per_sec: all.len() as f64 / wall.as_secs_f64(),
        server_us: per_op(server_after - server_before),
        client_us: per_op(client_after - client_before),
    }
}

fn engine(urls: Vec<String>, sequential: bool) -> Redlock {
    let mut config = RedlockConfig::new(urls);
    // Generous per-node timeout: the benchmark measures speed, not fault handling.
    config.request_timeout = Duration::from_secs(2);
    config.holder = "bench/engine".into();
    let engine = if sequential {
        Redlock::new_sequential(config)
    } else {
        Redlock::new(config)
    };
    engine.expect("bench engine config")
}

async fn bench_engine(nodes: &RedisNodes, sequential: bool, tasks: usize, ops: usize) -> Stats {
    let engine = engine(nodes.urls(), sequential);
    let warm = engine.try_acquire("warm", TTL).await.expect("warm-up");
    engine.release(&warm).await;
    measure(nodes, tasks, ops, move |key| {
        let engine = engine.clone();
        async move {
            let lease = engine.try_acquire(&key, TTL).await.expect("engine acquire");
            engine.release(&lease).await;
        }
    })
    .await
}

async fn bench_rslock(nodes: &RedisNodes, tasks: usize, ops: usize) -> Stats {
    let manager = Arc::new(rslock::LockManager::new(nodes.urls()));
    measure(nodes, tasks, ops, move |key| {
        let manager = Arc::clone(&manager);
        async move {
            let lock = manager
                .lock(key.as_bytes(), TTL)
                .await
                .expect("rslock acquire");
            manager.unlock(&lock).await;
        }
    })
    .await
}

async fn bench_bare(nodes: &RedisNodes, tasks: usize, ops: usize) -> Stats {
    let client = redis::Client::open(nodes.urls()[0].clone()).expect("bare url");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("bare connection");
    let delete = Arc::new(redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    ));
    measure(nodes, tasks, ops, move |key| {
        let mut conn = conn.clone();
        let delete = Arc::clone(&delete);
        async move {
            let value = format!("{:032x}", rand::random::<u128>());
            let set: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&value)
                .arg("NX")
                .arg("PX")
                .arg(TTL.as_millis() as u64)
                .query_async(&mut conn)
                .await
                .expect("bare SET");
            assert!(set.is_some(), "bare SET NX on a released key");
            let _: i64 = delete
                .key(&key)
                .arg(&value)
                .invoke_async(&mut conn)
                .await
                .expect("bare delete");
        }
    })
    .await
}

/// Rounds of the compared pair per cell in a full run.
const ROUNDS: usize = 3;

/// The round with the median throughput.
fn median(mut rounds: Vec<Stats>) -> Stats {
    rounds.sort_by(|a, b| a.ops_per_sec.total_cmp(&b.ops_per_sec));
    rounds[rounds.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

/// `BENCH_ONLY=lockedjob|rslock`: that variant alone, 64 tasks (`BENCH_TASKS`) on 5 nodes
/// (`BENCH_NODES`), for a profiler, built with symbols (the release profile strips them):
/// `CARGO_PROFILE_BENCH_STRIP=false CARGO_PROFILE_BENCH_DEBUG=line-tables-only cargo bench
/// --bench redlock --no-run`, then
/// `BENCH_ONLY=lockedjob BENCH_OPS=40000 perf record -g target/release/deps/redlock-* --bench`.
async fn profile_one(variant: &str, ops: usize) {
    let setting = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (count, tasks) = (
        setting("BENCH_NODES", 5),
        setting("BENCH_TASKS", CONCURRENCY),
    );
    let nodes = RedisNodes::start(count, Persistence::None).expect("start redis-server");
    let stats = match variant {
        "lockedjob" => bench_engine(&nodes, false, tasks, ops).await,
        "rslock" => bench_rslock(&nodes, tasks, ops).await,
        other => panic!("BENCH_ONLY={other}: use lockedjob or rslock"),
    };
    println!(
        "{variant}: {count} nodes, {tasks} tasks, {ops} ops: p50 {} ms, {:.0} ops/s, CPU per op {:.1} µs in the nodes + {:.1} µs here",
        ms(stats.p50),
        stats.ops_per_sec,
        stats.server_us,
        stats.client_us
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    if let Ok(variant) = std::env::var("BENCH_ONLY") {
        let ops = std::env::var("BENCH_OPS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40_000);
        return profile_one(&variant, ops).await;
    }
    let ops: usize = std::env::var("BENCH_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 4000 } else { 128 });
    let node_counts: &[usize] = if full { &[1, 3, 5] } else { &[3] };
    let rounds = if full { ROUNDS } else { 1 };
    println!(
        "lock benchmark: acquire+release, {ops} ops per cell, on local redis-server nodes; (a) and (c) median of {rounds} alternating rounds"
    );
    println!();
    println!("| nodes | variant | tasks | p50 ms | p99 ms | ops/s | CPU µs/op: nodes + client |");
    println!("|---|---|---|---|---|---|---|");
    let mut summary = Vec::new();
    for &count in node_counts {
        let nodes = RedisNodes::start(count, Persistence::None).expect("start redis-server");
        for tasks in [1, CONCURRENCY] {
            let ops = if tasks == 1 { ops / 4 } else { ops };
            let bare = bench_bare(&nodes, tasks, ops).await;
            let sequential = bench_engine(&nodes, true, tasks, ops).await;
            // The two being compared take turns, ROUNDS times, and each keeps its median
            // round: a shared 2-core VM drifts by tens of percent within a minute.
            let mut parallel_rounds = Vec::new();
            let mut rslock_rounds = Vec::new();
            for _ in 0..rounds {
                parallel_rounds.push(bench_engine(&nodes, false, tasks, ops).await);
                rslock_rounds.push(bench_rslock(&nodes, tasks, ops).await);
            }
            let parallel = median(parallel_rounds);
            let rslock = median(rslock_rounds);
            for (name, stats) in [
                ("(a) lockedjob", parallel),
                ("(b) lockedjob, sequential fan-out", sequential),
                ("(c) rslock", rslock),
                ("(d) bare SET NX PX + Lua DEL, 1 node", bare),
            ] {
                println!(
                    "| {count} | {name} | {tasks} | {} | {} | {:.0} | {:.1} + {:.1} |",
                    ms(stats.p50),
                    ms(stats.p99),
                    stats.ops_per_sec,
                    stats.server_us,
                    stats.client_us
                );
            }
            summary.push((count, tasks, parallel, rslock, bare));
        }
    }
    println!();
    for (count, tasks, parallel, rslock, bare) in summary {
        println!(
            "nodes={count} tasks={tasks}: p50 lockedjob/bare = {:.2}x, p50 lockedjob/rslock = {:.2}x, throughput lockedjob/rslock = {:.2}x, CPU per op lockedjob/rslock = {:.2}x (nodes {:.2}x, client {:.2}x)",
            parallel.p50.as_secs_f64() / bare.p50.as_secs_f64(),
            parallel.p50.as_secs_f64() / rslock.p50.as_secs_f64(),
            parallel.ops_per_sec / rslock.ops_per_sec,
            (parallel.server_us + parallel.client_us) / (rslock.server_us + rslock.client_us),
            parallel.server_us / rslock.server_us,
            parallel.client_us / rslock.client_us
        );
    }
}
