//! Operator benchmark: many LockedJobs, 3 replicas of the real `lockedjob operator` binary, the
//! local control plane (real kube-apiserver, etcd, controller manager, scheduler; the node
//! agent runs the Jobs' pods as processes) and 5 real Redis nodes, all on this machine. Reports schedule lag (due
//! time to Job created, from the replicas' own histogram), Redis commands per run (from every
//! node's `INFO commandstats`), and each replica's peak RSS and its RSS at the end.
//!
//! `cargo bench --bench operator` runs 1,000 LockedJobs on a 10-second schedule for 60 s.
//! `BENCH_LOCKEDJOBS` and `BENCH_SECONDS` change that, `BENCH_IDLE=1` measures the LockedJobs
//! without runs; under `cargo test` it runs a small smoke pass so that it cannot rot.

#[path = "../tests/support/mod.rs"]
mod support;

use kube::api::{Api, PostParams};
use lockedjob::api::LockedJob;
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::{NodeChecks, Persistence, RedisNodes};

const REPLICAS: usize = 3;
const NODES: usize = 5;
const PERIOD_S: u64 = 10;
const TTL_S: u64 = 30;

struct Replica {
    child: Child,
    metrics: String,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Calls per command, summed over the nodes.
fn calls_by_command(nodes: &RedisNodes) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for i in 0..nodes.len() {
        let stats: String = nodes[i].query(&["INFO", "commandstats"]);
        for line in stats.lines().filter_map(|l| l.strip_prefix("cmdstat_")) {
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            let calls = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|c| c.parse::<u64>().ok())
                .unwrap_or(0);
            *out.entry(name.to_string()).or_insert(0) += calls;
        }
    }
    out
}

fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = write!(stream, "GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n");
    let mut body = String::new();
    let _ = stream.read_to_string(&mut body);
    body
}

/// `lockedjob_redis_requests_total` by op, summed over the replicas' /metrics bodies.
fn requests_by_op(bodies: &[String]) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    for line in bodies.iter().flat_map(|b| b.lines()) {
        let Some(rest) = line.strip_prefix("lockedjob_redis_requests_total{op=\"") else {
            continue;
        };
        if let Some((op, n)) = rest.split_once("\"} ") {
            *out.entry(op.to_string()).or_insert(0.0) += n.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    out
}

/// Merged histogram buckets (upper bound in seconds, cumulative count) over all replicas.
fn lag_buckets(bodies: &[String]) -> Vec<(f64, u64)> {
    let mut buckets: Vec<(f64, u64)> = Vec::new();
    for body in bodies {
        for line in body.lines() {
            let Some(rest) = line.strip_prefix("lockedjob_schedule_lag_seconds_bucket{le=\"")
            else {
                continue;
            };
            let Some((le, count)) = rest.split_once("\"} ") else {
                continue;
            };
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            let count: u64 = count.trim().parse().unwrap_or(0);
            match buckets.iter_mut().find(|(b, _)| *b == le) {
                Some(slot) => slot.1 += count,
                None => buckets.push((le, count)),
            }
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

fn quantile(buckets: &[(f64, u64)], q: f64) -> f64 {
    let total = buckets.last().map(|b| b.1).unwrap_or(0);
    let rank = (total as f64 * q).ceil() as u64;
    buckets
        .iter()
        .find(|(_, count)| *count >= rank.max(1))
        .map(|(le, _)| *le)
        .unwrap_or(f64::NAN)
}

/// A `/proc/{pid}/status` memory figure in MiB: `VmHWM` (peak RSS) or `VmRSS` (now).
fn status_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// `BENCH_IDLE=1`: a yearly schedule, so nothing runs and the figures are a replica's cost of
/// watching and caching N LockedJobs alone.
fn idle() -> bool {
    std::env::var("BENCH_IDLE").is_ok_and(|v| v == "1")
}

fn locked_job(name: &str) -> LockedJob {
    let schedule = if idle() {
        "0 0 1 1 *".to_string()
    } else {
        format!("*/{PERIOD_S} * * * * *")
    };
    serde_json::from_value(json!({
        "apiVersion": "lockedjob.dev/v1alpha1", "kind": "LockedJob",
        "metadata": {"name": name},
        "spec": {"schedule": schedule, "successfulJobsHistoryLimit": 1,
            "lock": {"ttlSeconds": TTL_S},
            "jobTemplate": {"spec": {"backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]}}}}}
    }))
    .expect("locked job")
}

async fn bench(lockedjobs: u64, seconds: u64) {
    let nodes =
        RedisNodes::start(NODES, Persistence::AppendFsyncAlways).expect("start redis-server");
    let cluster = support::kubernetes::local_cluster("bench").await;
    let client = support::kubernetes::client_for(&cluster.kubeconfig()).await;
    support::kubernetes::install_lockedjob_crd(&client, "bench")
        .await
        .expect("LockedJob CRD");
    let namespace = support::kubernetes::create_namespace(&client, "bench").await;
    let replicas: Vec<Replica> = (0..REPLICAS)
        .map(|i| {
            let metrics = format!("127.0.0.1:{}", support::free_port());
            let child = Command::new(env!("CARGO_BIN_EXE_lockedjob"))
                .arg("operator")
                .args(["--redis", &nodes.urls().join(",")])
                .args(["--cluster-id", "bench", "--runner-name", &format!("r{i}")])
                .args(["--metrics-addr", &metrics])
                .args(["--namespaces", &namespace])
                .env("KUBECONFIG", cluster.kubeconfig())
                .env("RUST_LOG", "warn")
                .env_remove("LOCKEDJOB_REDIS_URLS")
                .stdout(Stdio::null())
                // BENCH_LOG_DIR keeps each replica's warnings, for finding out why.
                .stderr(match std::env::var_os("BENCH_LOG_DIR") {
                    Some(dir) => Stdio::from(
                        std::fs::File::create(std::path::Path::new(&dir).join(format!("r{i}.log")))
                            .expect("replica log file"),
                    ),
                    None => Stdio::null(),
                })
                .spawn()
                .expect("start operator");
            Replica { child, metrics }
        })
        .collect();
    let api: Api<LockedJob> = Api::namespaced(client.clone(), &namespace);
    for i in 0..lockedjobs {
        api.create(
            &PostParams::default(),
            &locked_job(&format!("bench-{i:04}")),
        )
        .await
        .expect("create LockedJob");
    }
    eprintln!("operator bench: {lockedjobs} LockedJobs created");
    // Let every replica sync and the first due time pass before counting.
    tokio::time::sleep(Duration::from_secs(PERIOD_S + 2)).await;
    let bodies_before: Vec<String> = replicas.iter().map(|r| scrape(&r.metrics)).collect();
    let lag_before = lag_buckets(&bodies_before);
    let requests_before = requests_by_op(&bodies_before);
    let by_command_before = calls_by_command(&nodes);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let by_command_after = calls_by_command(&nodes);
    let bodies: Vec<String> = replicas.iter().map(|r| scrape(&r.metrics)).collect();
    let lag_after = lag_buckets(&bodies);
    let requests: Vec<(String, f64)> = requests_by_op(&bodies)
        .into_iter()
        .map(|(op, n)| {
            let before = requests_before.get(&op).copied().unwrap_or(0.0);
            (op, n - before)
        })
        .collect();
    // Only the runs created in the measured window.
    let lag: Vec<(f64, u64)> = lag_after
        .iter()
        .map(|(le, n)| {
            let before = lag_before
                .iter()
                .find(|(b, _)| b == le)
                .map(|b| b.1)
                .unwrap_or(0);
            (*le, n.saturating_sub(before))
        })
        .collect();
    let runs = lag.last().map(|b| b.1).unwrap_or(0);
    // Every command but INFO (the benchmark's own reads).
    let total = |by: &std::collections::BTreeMap<String, u64>| -> u64 {
        by.iter()
            .filter(|(name, _)| *name != "info")
            .map(|(_, n)| n)
            .sum()
    };
    let calls = total(&by_command_after).saturating_sub(total(&by_command_before));
    let rss: Vec<(f64, f64)> = replicas
        .iter()
        .map(|r| {
            (
                status_mib(r.child.id(), "VmHWM"),
                status_mib(r.child.id(), "VmRSS"),
            )
        })
        .collect();
    let run_length_s = 0.0_f64; // `true` exits at once: the bound's renewal term is ~0
    let bound = 3.0 * NODES as f64 + NODES as f64 * (run_length_s / (TTL_S as f64 / 3.0));
    println!(
        "operator bench: {lockedjobs} LockedJobs {}, {REPLICAS} replicas, {NODES} Redis nodes, {seconds}s measured",
        if idle() { "idle (yearly schedule)".to_string() } else { format!("every {PERIOD_S}s") }
    );
    println!("| measure | value | target |");
    println!("|---|---|---|");
    println!(
        "| runs in the window | {runs} | {} due |",
        lockedjobs * seconds / PERIOD_S
    );
    println!(
        "| schedule lag p50 (histogram bucket bound) | <= {:.3} s | |",
        quantile(&lag, 0.50)
    );
    println!(
        "| schedule lag p99 (histogram bucket bound) | <= {:.3} s | <= 0.5 s |",
        quantile(&lag, 0.99)
    );
    let per_run = |ops: &[&str]| {
        requests
            .iter()
            .filter(|(op, _)| ops.is_empty() || ops.contains(&op.as_str()))
            .map(|(_, n)| n)
            .sum::<f64>()
            / runs.max(1) as f64
    };
    println!(
        "| Redis requests per run, lock traffic of all replicas (no probes) | {:.1} | <= {bound:.0} |",
        per_run(&["acquire", "fence", "extend", "progress", "release", "holder"])
    );
    println!(
        "| Redis requests per run, with the readiness probes | {:.1} | |",
        per_run(&[])
    );
    println!(
        "| Redis commands per run as the nodes count them (script internals included) | {:.1} | |",
        calls as f64 / runs.max(1) as f64
    );
    for (i, (peak, now)) in rss.iter().enumerate() {
        println!("| replica r{i} RSS, peak / at the end | {peak:.1} / {now:.1} MiB | <= 64 MiB |");
    }
    let breakdown: Vec<String> = by_command_after
        .iter()
        .map(|(name, n)| {
            let delta = n.saturating_sub(by_command_before.get(name).copied().unwrap_or(0));
            format!("{name} {:.1}", delta as f64 / runs.max(1) as f64)
        })
        .collect();
    println!(
        "Redis calls per run by command (nodes' view): {}",
        breakdown.join(", ")
    );
    let by_op: Vec<String> = requests
        .iter()
        .map(|(op, n)| format!("{op} {:.1}", n / runs.max(1) as f64))
        .collect();
    println!(
        "Redis requests per run by op (client's view): {}",
        by_op.join(", ")
    );
    let mut outcomes: std::collections::BTreeMap<String, f64> = Default::default();
    for body in &bodies {
        for line in body.lines() {
            if let Some(rest) = line.strip_prefix("lockedjob_lock_acquisitions_total{") {
                if let Some((labels, n)) = rest.split_once("} ") {
                    *outcomes.entry(labels.to_string()).or_default() +=
                        n.trim().parse::<f64>().unwrap_or(0.0);
                }
            }
        }
    }
    println!("lock acquisition attempts since start (all replicas): {outcomes:?}");
    assert!(runs > 0, "no run was created in the window");
}

fn main() {
    let smoke = !std::env::args().any(|a| a == "--bench");
    let (lockedjobs, seconds) = if smoke {
        (env_or("BENCH_LOCKEDJOBS", 20), env_or("BENCH_SECONDS", 11))
    } else {
        (
            env_or("BENCH_LOCKEDJOBS", 1000),
            env_or("BENCH_SECONDS", 60),
        )
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(bench(lockedjobs, seconds));
}
