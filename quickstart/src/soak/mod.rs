//! The cluster soak (`soak --minutes M --seed S`): two local clusters with the operator
//! installed by the chart in each (3 replicas), the five shared Redis nodes of the quickstart,
//! a mix of LockedJobs sharing their locks across the clusters, and a seeded schedule of
//! overlapping faults; judged by our checker (`judge`) and by porcupine (`tools/porcupine-check`).
//! docs/testing.md, "The cluster soak", says what it covers and what it does not.

mod config;
pub mod faults;
pub mod judge;
pub mod leader;
mod report;
pub mod schedule;
mod stand;
pub mod store;
pub mod timeline;
pub mod workload;

pub use config::{say, Options, RESTART_DELAY_MS};
pub use report::Report;

use crate::clusters::Side;
use config::{CLUSTERS, REPLICAS};
use faults::{carry_out, Targets};
use judge::Span;
use report::{judge_all, Request, Seen};
use schedule::Shape;
use serde::Serialize;
use serde_json::json;
use stand::{keep_logs, request_runs, suspend, Stand};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use workload::{now_seconds, Collector, TTL_SECONDS};

/// Runs the soak and writes `report.json` (and porcupine's input per lock) into `out`.
pub async fn run(options: &Options) -> Result<Report, String> {
    std::fs::create_dir_all(&options.out)
        .map_err(|e| format!("create {}: {e}", options.out.display()))?;
    let stand = Stand::start(options).await?;
    let seen = soak(options, stand).await?;
    let report = judge_all(options, &seen)?;
    write_json(&options.out.join("report.json"), &report)?;
    let picture = report.timeline(&format!("soak, seed {}", options.seed), &seen);
    let path = options.out.join("timeline.svg");
    std::fs::write(&path, picture).map_err(|e| format!("write {}: {e}", path.display()))?;
    write_json(
        &options.out.join("runs.json"),
        &json!({"runs": seen.runs, "writes": seen.writes}),
    )?;
    Ok(report)
}

fn write_json(path: &std::path::Path, value: &impl Serialize) -> Result<(), String> {
    let json = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    std::fs::write(path, json).map_err(|e| format!("write {}: {e}", path.display()))
}

/// The faults carried out while the runs are read; then the LockedJobs suspended and the
/// last runs read.
async fn soak(options: &Options, stand: Stand) -> Result<Seen, String> {
    say(format!(
        "soaking for {} s, seed {}",
        options.seconds, options.seed
    ));
    let shape = Shape {
        seconds: options.seconds,
        ttl_ms: TTL_SECONDS * 1000,
        clusters: CLUSTERS.len(),
        replicas: REPLICAS,
        restart_delay_ms: RESTART_DELAY_MS,
    };
    let plan = schedule::schedule(options.seed, shape);
    let start = Instant::now();
    let sides = stand.sides.clone();
    let collector = Arc::new(tokio::sync::Mutex::new(Collector::default()));
    let (stop_reading, reading) = read_runs(sides.clone(), collector.clone());
    let requests = tokio::spawn(request_runs(sides.clone(), options.seconds, stand.created));
    // Held to the end, not only while faults are carried out: the nodes stop when dropped,
    // and the pods reach them through the proxies.
    let proxies = Arc::new(stand.proxies);
    let nodes = Arc::new(Mutex::new(stand.nodes));
    let targets = Targets {
        sides: sides.clone(),
        nodes: nodes.clone(),
        proxies: proxies.clone(),
        password: stand.password,
    };
    let executed = carry_out(&plan, start, targets).await;
    tokio::time::sleep_until((start + Duration::from_secs(options.seconds)).into()).await;
    let requests = requests.await.map_err(|e| e.to_string())?;

    say("suspending the LockedJobs and reading the last runs");
    let suspended = now_seconds();
    suspend(&sides).await?;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let _ = stop_reading.send(());
    let _ = reading.await;
    let mut collector = collector.lock().await;
    for side in sides.iter() {
        collector.read(side.id, &side.client).await;
    }
    let runs = collector.runs();
    drop((proxies, nodes));
    for side in sides.iter() {
        keep_logs(side, &options.out.join("logs"));
    }
    Ok(Seen {
        requests: requests
            .into_iter()
            .map(|(asked, at, kind)| Request::answered(asked, at, kind, &runs))
            .collect(),
        plan,
        executed,
        runs,
        writes: stand.store.log(),
        span: Span {
            from: stand.created + TTL_SECONDS as f64,
            to: suspended - TTL_SECONDS as f64,
        },
    })
}

/// Reads the runs every 2 s until told to stop.
fn read_runs(
    sides: Arc<Vec<Side>>,
    collector: Arc<tokio::sync::Mutex<Collector>>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        loop {
            for side in sides.iter() {
                collector.lock().await.read(side.id, &side.client).await;
            }
            tokio::select! {
                _ = &mut stopped => return,
                _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            }
        }
    });
    (stop, task)
}
