//! Lock engine benchmark, all variants side by side in one run on the same local nodes:
//! (a) this engine, (b) this engine with sequential fan-out, (c) the `rslock` crate,
//! (d) a bare single-node `SET NX PX` + Lua compare-and-delete.
//!
//! `cargo bench --bench redlock` runs it in full; under `cargo test` it runs a small smoke pass
//! so that it cannot rot. `BENCH_OPS` sets the operations per measurement (default 4000).

#[path = "../tests/support/mod.rs"]
mod support;

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
}

/// Runs `ops` acquire+release operations spread over `tasks` tasks, each on its own key.
async fn measure<F, Fut>(tasks: usize, ops: usize, op: F) -> Stats
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let per_task = ops.div_ceil(tasks);
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
    all.sort_unstable();
    let pick = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    Stats {
        p50: pick(0.50),
        p99: pick(0.99),
        ops_per_sec: all.len() as f64 / wall.as_secs_f64(),
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

async fn bench_engine(urls: Vec<String>, sequential: bool, tasks: usize, ops: usize) -> Stats {
    let engine = engine(urls, sequential);
    let warm = engine.try_acquire("warm", TTL).await.expect("warm-up");
    engine.release(&warm).await;
    measure(tasks, ops, move |key| {
        let engine = engine.clone();
        async move {
            let lease = engine.try_acquire(&key, TTL).await.expect("engine acquire");
            engine.release(&lease).await;
        }
    })
    .await
}

async fn bench_rslock(urls: Vec<String>, tasks: usize, ops: usize) -> Stats {
    let manager = Arc::new(rslock::LockManager::new(urls));
    measure(tasks, ops, move |key| {
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

async fn bench_bare(url: String, tasks: usize, ops: usize) -> Stats {
    let client = redis::Client::open(url).expect("bare url");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("bare connection");
    let delete = Arc::new(redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    ));
    measure(tasks, ops, move |key| {
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

/// `BENCH_ONLY=lockedjob|rslock`: that variant alone, 64 tasks on 5 nodes, for a profiler:
/// `BENCH_ONLY=lockedjob BENCH_OPS=40000 perf record -g target/release/deps/redlock-* --bench`.
async fn profile_one(variant: &str, ops: usize) {
    let nodes = RedisNodes::start(5, Persistence::None).expect("start redis-server");
    let stats = match variant {
        "lockedjob" => bench_engine(nodes.urls(), false, CONCURRENCY, ops).await,
        "rslock" => bench_rslock(nodes.urls(), CONCURRENCY, ops).await,
        other => panic!("BENCH_ONLY={other}: use lockedjob or rslock"),
    };
    println!(
        "{variant}: 5 nodes, {CONCURRENCY} tasks, {ops} ops: p50 {} ms, {:.0} ops/s",
        ms(stats.p50),
        stats.ops_per_sec
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
    println!("| nodes | variant | tasks | p50 ms | p99 ms | ops/s |");
    println!("|---|---|---|---|---|---|");
    let mut summary = Vec::new();
    for &count in node_counts {
        let nodes = RedisNodes::start(count, Persistence::None).expect("start redis-server");
        let urls = nodes.urls();
        for tasks in [1, CONCURRENCY] {
            let ops = if tasks == 1 { ops / 4 } else { ops };
            let bare = bench_bare(urls[0].clone(), tasks, ops).await;
            let sequential = bench_engine(urls.clone(), true, tasks, ops).await;
            // The two being compared take turns, ROUNDS times, and each keeps its median
            // round: a shared 2-core VM drifts by tens of percent within a minute.
            let mut parallel_rounds = Vec::new();
            let mut rslock_rounds = Vec::new();
            for _ in 0..rounds {
                parallel_rounds.push(bench_engine(urls.clone(), false, tasks, ops).await);
                rslock_rounds.push(bench_rslock(urls.clone(), tasks, ops).await);
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
                    "| {count} | {name} | {tasks} | {} | {} | {:.0} |",
                    ms(stats.p50),
                    ms(stats.p99),
                    stats.ops_per_sec
                );
            }
            summary.push((count, tasks, parallel, rslock, bare));
        }
    }
    println!();
    for (count, tasks, parallel, rslock, bare) in summary {
        println!(
            "nodes={count} tasks={tasks}: p50 lockedjob/bare = {:.2}x, throughput lockedjob/rslock = {:.2}x",
            parallel.p50.as_secs_f64() / bare.p50.as_secs_f64(),
            parallel.ops_per_sec / rslock.ops_per_sec
        );
    }
}
