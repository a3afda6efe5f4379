//! Carries out the soak's schedule on the clusters and nodes, and logs what was done: each
//! fault's start and heal, and the pod or node it hit. Faults on one target nest: a node
//! killed twice comes back when the last of its faults is healed, so a node that lost its
//! data never returns before its restart delay.

use super::schedule::{Fault, Planned, CLOCK_NODE, WIPED_NODE};
use super::store::now_us;
use super::workload::NAMESPACE;
use crate::clusters::{running_holder, NodeProxies, Side, RELEASE_NAMESPACE};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use kube::ResourceExt;
use lockedjob::lab::harness::{ProxyMode, RedisNodes};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// One fault as it was carried out.
#[derive(Debug, Clone, Serialize)]
pub struct Executed {
    pub index: usize,
    pub kind: &'static str,
    pub outside_the_model: bool,
    /// Whether it hit anything (a replica may be restarting, no run in flight to pause).
    pub hit: bool,
    /// The pod, node or cluster it hit, or why it hit nothing.
    pub target: String,
    pub started_us: u64,
    pub healed_us: u64,
}

impl Executed {
    /// From its start to its heal, in seconds since the epoch.
    pub fn window(&self) -> (f64, f64) {
        (self.started_us as f64 / 1e6, self.healed_us as f64 / 1e6)
    }
}

/// What the faults act on.
pub struct Targets {
    pub sides: Arc<Vec<Side>>,
    pub nodes: Arc<Mutex<RedisNodes>>,
    pub proxies: Arc<Vec<NodeProxies>>,
    /// The nodes' password: set at run time, so a restarted node needs it again.
    pub password: String,
}

/// Nesting of faults per target: the fault is applied on the first and healed on the last.
#[derive(Default)]
struct Nesting(Mutex<BTreeMap<String, u32>>);

impl Nesting {
    fn enter(&self, key: &str) -> bool {
        let Ok(mut map) = self.0.lock() else {
            return false;
        };
        let count = map.entry(key.to_string()).or_insert(0);
        *count += 1;
        *count == 1
    }

    fn leave(&self, key: &str) -> bool {
        let Ok(mut map) = self.0.lock() else {
            return false;
        };
        let count = map.entry(key.to_string()).or_insert(1);
        *count = count.saturating_sub(1);
        *count == 0
    }
}

/// Carries out `plan` from `start`, returning when every fault is healed.
pub async fn carry_out(plan: &[Planned], start: Instant, targets: Targets) -> Vec<Executed> {
    let targets = Arc::new(targets);
    let nesting = Arc::new(Nesting::default());
    let clock_offset = Arc::new(Mutex::new(Duration::ZERO));
    let mut running = JoinSet::new();
    for (index, planned) in plan.iter().copied().enumerate() {
        tokio::time::sleep_until((start + Duration::from_millis(planned.at_ms)).into()).await;
        let targets = targets.clone();
        let nesting = nesting.clone();
        let clock_offset = clock_offset.clone();
        running.spawn(async move {
            let applied = apply(&planned.fault, &targets, &nesting, &clock_offset).await;
            // After: finding a holder to pause may take a while.
            let started_us = now_us();
            tracing_line(index, &planned, &applied);
            tokio::time::sleep(Duration::from_millis(planned.heal_after_ms)).await;
            if let Ok(hit) = &applied {
                heal(hit, &targets, &nesting).await;
            }
            Executed {
                index,
                kind: planned.fault.kind(),
                outside_the_model: planned.fault.outside_the_model(),
                hit: applied.is_ok(),
                target: match applied {
                    Ok(hit) => hit.describe(),
                    Err(why) => format!("nothing: {why}"),
                },
                started_us,
                healed_us: now_us(),
            }
        });
    }
    let mut done = running.join_all().await;
    done.sort_by_key(|e| e.index);
    done
}

fn tracing_line(index: usize, planned: &Planned, applied: &Result<Hit, String>) {
    let target = match applied {
        Ok(hit) => hit.describe(),
        Err(why) => format!("nothing ({why})"),
    };
    eprintln!(
        "[soak] fault {index} {} at {} s, healed after {} ms: {target}",
        planned.fault.kind(),
        planned.at_ms / 1000,
        planned.heal_after_ms
    );
}

/// What a fault hit, with what its heal needs.
enum Hit {
    /// A replica's processes, killed or deleted: nothing to heal.
    Replica {
        cluster: String,
        pod: String,
    },
    Paused {
        cluster: String,
        pod: String,
        pids: Vec<i32>,
    },
    Cut {
        cluster: String,
        pod: String,
        pid: i32,
        service: String,
    },
    Apiserver {
        cluster: usize,
    },
    Node {
        node: u32,
        wiped: bool,
    },
    Slow {
        node: u32,
    },
    Clock {
        offset: Duration,
    },
}

impl Hit {
    fn describe(&self) -> String {
        match self {
            Hit::Replica { cluster, pod } => format!("{cluster}/{pod}"),
            Hit::Paused { cluster, pod, .. } => format!("{cluster}/{pod} (SIGSTOP)"),
            Hit::Cut { cluster, pod, .. } => format!("{cluster}/{pod} (API server dropped)"),
            Hit::Apiserver { cluster } => format!("kube-apiserver of cluster {cluster}"),
            Hit::Node { node, wiped } if *wiped => format!("redis node {node}, data lost"),
            Hit::Node { node, .. } => format!("redis node {node}"),
            Hit::Slow { node } => format!("paths to redis node {node}"),
            Hit::Clock { offset } => format!(
                "redis node {CLOCK_NODE}'s clock, now {} ms ahead",
                offset.as_millis()
            ),
        }
    }
}

async fn apply(
    fault: &Fault,
    targets: &Targets,
    nesting: &Nesting,
    clock_offset: &Mutex<Duration>,
) -> Result<Hit, String> {
    match *fault {
        Fault::KillReplica { cluster, replica } => {
            let (side, pod) = replica_pod(targets, cluster, replica).await?;
            let pids = pids_of(&pod, "lockedjob");
            if pids.is_empty() {
                return Err(format!("no process of {pod} found (restarting?)"));
            }
            for pid in pids {
                signal(pid, Signal::SIGKILL)?;
            }
            Ok(Hit::Replica { cluster: side, pod })
        }
        Fault::DeleteReplica { cluster, replica } => {
            let (side, pod) = replica_pod(targets, cluster, replica).await?;
            Api::<Pod>::namespaced(targets.sides[cluster].client.clone(), RELEASE_NAMESPACE)
                .delete(&pod, &DeleteParams::default())
                .await
                .map_err(|e| format!("delete {pod}: {e}"))?;
            Ok(Hit::Replica { cluster: side, pod })
        }
        Fault::PauseHolder => {
            let (cluster, pod) = holder(targets).await?;
            if !nesting.enter(&format!("pause/{pod}")) {
                return Err(format!("{pod} is paused already"));
            }
            let pids = pids_of(&pod, "lockedjob");
            for pid in &pids {
                signal(*pid, Signal::SIGSTOP)?;
            }
            Ok(Hit::Paused { cluster, pod, pids })
        }
        Fault::CutReplica { cluster, replica } => cut(targets, nesting, cluster, replica).await,
        Fault::StopApiserver { cluster } => {
            if nesting.enter(&format!("apiserver/{cluster}")) {
                let sides = targets.sides.clone();
                blocking(move || {
                    sides[cluster]
                        .cluster
                        .stop_apiserver()
                        .map_err(|e| e.to_string())
                })
                .await?;
            }
            Ok(Hit::Apiserver { cluster })
        }
        Fault::KillNode { node } => kill_node(targets, nesting, node, false).await,
        Fault::WipeNode => kill_node(targets, nesting, WIPED_NODE, true).await,
        Fault::SlowNode { node, delay_ms } => {
            if !nesting.enter(&format!("slow/{node}")) {
                return Err(format!("node {node} is slow already"));
            }
            for side in targets.proxies.iter() {
                side.proxies[node as usize]
                    .set_mode(ProxyMode::Delay(Duration::from_millis(delay_ms)));
            }
            Ok(Hit::Slow { node })
        }
        Fault::ClockJump { by_ms } => {
            let offset = {
                let mut total = clock_offset.lock().map_err(|e| e.to_string())?;
                *total += Duration::from_millis(by_ms);
                *total
            };
            let nodes = targets.nodes.lock().map_err(|e| e.to_string())?;
            nodes.nodes[CLOCK_NODE as usize]
                .shift_clock(offset)
                .map_err(|e| e.to_string())?;
            Ok(Hit::Clock { offset })
        }
    }
}

async fn heal(hit: &Hit, targets: &Targets, nesting: &Nesting) {
    match hit {
        Hit::Replica { .. } | Hit::Clock { .. } => {}
        Hit::Paused { pod, pids, .. } => {
            if nesting.leave(&format!("pause/{pod}")) {
                for pid in pids {
                    let _ = signal(*pid, Signal::SIGCONT);
                }
            }
        }
        Hit::Cut {
            pod, pid, service, ..
        } => {
            if nesting.leave(&format!("cut/{pod}")) {
                // The container may have been restarted meanwhile (a kill -9): its new process
                // shares the pod's network namespace. The pod may be gone, and the namespace
                // with it.
                let now = pids_of(pod, "lockedjob").first().copied().unwrap_or(*pid);
                let _ = iptables_in(now, "-D", service);
            }
        }
        Hit::Apiserver { cluster } => {
            if nesting.leave(&format!("apiserver/{cluster}")) {
                let sides = targets.sides.clone();
                let cluster = *cluster;
                if let Err(e) = blocking(move || {
                    sides[cluster]
                        .cluster
                        .start_apiserver()
                        .map_err(|e| e.to_string())
                })
                .await
                {
                    eprintln!("[soak] error: start kube-apiserver of cluster {cluster} again: {e}");
                }
            }
        }
        Hit::Node { node, .. } => {
            if nesting.leave(&format!("node/{node}")) {
                let nodes = targets.nodes.clone();
                let node = *node as usize;
                let password = targets.password.clone();
                let restarted = blocking(move || {
                    let mut nodes = nodes.lock().map_err(|e| e.to_string())?;
                    let target = &mut nodes.nodes[node];
                    target.restart().map_err(|e| e.to_string())?;
                    target
                        .command::<()>(&["CONFIG", "SET", "requirepass", &password])
                        .map_err(|e| e.to_string())
                })
                .await;
                if let Err(e) = restarted {
                    eprintln!("[soak] error: restart redis node {node}: {e}");
                }
            }
        }
        Hit::Slow { node } => {
            if nesting.leave(&format!("slow/{node}")) {
                for side in targets.proxies.iter() {
                    side.proxies[*node as usize].set_mode(ProxyMode::Forward);
                }
            }
        }
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| e.to_string())?
}

async fn kill_node(
    targets: &Targets,
    nesting: &Nesting,
    node: u32,
    wipe: bool,
) -> Result<Hit, String> {
    nesting.enter(&format!("node/{node}"));
    let nodes = targets.nodes.clone();
    blocking(move || {
        let mut nodes = nodes.lock().map_err(|e| e.to_string())?;
        let target = &mut nodes.nodes[node as usize];
        target.kill9();
        if wipe {
            target.wipe().map_err(|e| e.to_string())?;
        }
        Ok(())
    })
    .await?;
    Ok(Hit::Node { node, wiped: wipe })
}

async fn cut(
    targets: &Targets,
    nesting: &Nesting,
    cluster: usize,
    replica: usize,
) -> Result<Hit, String> {
    let (side, pod) = replica_pod(targets, cluster, replica).await?;
    let pid = *pids_of(&pod, "lockedjob")
        .first()
        .ok_or_else(|| format!("no process of {pod} found"))?;
    let service = environment(pid)
        .into_iter()
        .find_map(|v| {
            v.strip_prefix("KUBERNETES_SERVICE_HOST=")
                .map(str::to_string)
        })
        .ok_or_else(|| format!("{pod} has no KUBERNETES_SERVICE_HOST"))?;
    if !nesting.enter(&format!("cut/{pod}")) {
        return Err(format!("{pod} is cut off already"));
    }
    iptables_in(pid, "-I", &service)?;
    Ok(Hit::Cut {
        cluster: side,
        pod,
        pid,
        service,
    })
}

/// Adds (`-I`) or deletes (`-D`) the rule that drops the pod's packets to its API server, in
/// the pod's own network namespace: nothing of the node's or the host's rules changes.
fn iptables_in(pid: i32, action: &str, service: &str) -> Result<(), String> {
    let net = format!("--net=/proc/{pid}/ns/net");
    let out = std::process::Command::new("nsenter")
        .args([
            net.as_str(),
            "iptables",
            "-w",
            action,
            "OUTPUT",
            "-d",
            service,
            "-p",
            "tcp",
            "-j",
            "DROP",
        ])
        .output()
        .map_err(|e| format!("run nsenter iptables: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "iptables {action} in the network namespace of {pid}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// The operator replica `replica` (modulo how many run) of cluster `cluster`, by name.
async fn replica_pod(
    targets: &Targets,
    cluster: usize,
    replica: usize,
) -> Result<(String, String), String> {
    let side = &targets.sides[cluster];
    let list = Api::<Pod>::namespaced(side.client.clone(), RELEASE_NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/name=lockedjob-operator"))
        .await
        .map_err(|e| format!("list the replicas of {}: {e}", side.id))?;
    let mut names: Vec<String> = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.name_any())
        .collect();
    names.sort();
    if names.is_empty() {
        return Err(format!("no replica of {} runs", side.id));
    }
    let pod = names[replica % names.len()].clone();
    Ok((side.id.to_string(), pod))
}

/// The replica holding a run, waiting up to a TTL for one.
async fn holder(targets: &Targets) -> Result<(String, String), String> {
    let wait = Duration::from_secs(super::workload::TTL_SECONDS);
    let (side, pod) = running_holder(&targets.sides, NAMESPACE, wait)
        .await
        .ok_or("no run is in flight")?;
    Ok((targets.sides[side].id.to_string(), pod))
}

/// The processes of pod `pod` whose command line names `program`: found by the `HOSTNAME` the
/// container runtime gave them, as the host sees every container's processes.
fn pids_of(pod: &str, program: &str) -> Vec<i32> {
    let wanted = format!("HOSTNAME={pod}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(program)
                && environment(*pid).contains(&wanted)
        })
        .collect()
}

fn environment(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|bytes| {
            bytes
                .split(|b| *b == 0)
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn signal(pid: i32, signal: Signal) -> Result<(), String> {
    kill(Pid::from_raw(pid), signal).map_err(|e| format!("{signal} to {pid}: {e}"))
}
