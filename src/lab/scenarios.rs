//! The scripted faults. Each scenario starts its nodes, clients and proxies, breaks things on
//! a schedule while the clients run, and collects the history.

use super::client::{HOLDER_PREFIX, STORE_LOG_KEY};
use super::error::LabError;
use super::harness::{
    FaultProxy, HarnessError, NodeTls, Persistence, ProxyMode, RedisNode, RedisNodes,
};
use super::history::{monotonic_us, ClientEvent, Fault, History, NodeEvent, NodeState, StoreWrite};
use super::scenario::Scenario;
use super::soak;
use crate::redlock::DEFAULT_KEY_PREFIX;
use std::collections::HashMap;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Knobs of one run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Parameters {
    pub clients: u32,
    pub nodes: u32,
    pub seconds: u64,
    pub ttl_ms: u64,
    pub hold_ms: u64,
    pub work_ms: u64,
    pub request_timeout_ms: u64,
    pub persistence: &'static str,
    /// How long a killed node stays down before it restarts (node-crash).
    pub restart_delay_ms: u64,
    /// Lock nodes serve TLS only (`--tls-dir`).
    #[serde(serialize_with = "serialize_is_some")]
    pub tls: Option<NodeTls>,
    /// The store takes every write (`--unfenced-store`): a broken build, on purpose.
    pub unfenced_store: bool,
    /// What the soak's fault schedule is drawn from (`--seed`).
    pub seed: u64,
    /// The soak's schedule, as drawn (empty for the other scenarios).
    pub schedule: Vec<soak::Planned>,
}

fn serialize_is_some<S: serde::Serializer>(
    tls: &Option<NodeTls>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_bool(tls.is_some())
}

impl Parameters {
    pub fn for_scenario(
        scenario: Scenario,
        clients: u32,
        nodes: u32,
        seconds: u64,
        ttl_ms: u64,
    ) -> Self {
        let (hold_ms, request_timeout_ms) = match scenario {
            // Long stays, so a holder is inside when the fault hits it.
            Scenario::RestartNoPersistence | Scenario::ClockJump | Scenario::Partition => {
                (ttl_ms * 3, 100)
            }
            Scenario::ClientPause | Scenario::Soak => (ttl_ms, 100),
            // Requests must be allowed to take as long as the latency the scenario adds, or
            // they time out before the validity check is ever reached.
            Scenario::SlowNetwork => (ttl_ms / 2, ttl_ms * 2),
            _ => (ttl_ms / 4, 100),
        };
        Self {
            clients,
            nodes,
            seconds,
            ttl_ms,
            hold_ms,
            work_ms: (ttl_ms / 50).max(5),
            request_timeout_ms,
            persistence: match scenario.persistence() {
                Persistence::None => "none",
                Persistence::AppendFsyncAlways => "appendonly yes, appendfsync always",
            },
            restart_delay_ms: ttl_ms + ttl_ms / 2,
            tls: None,
            unfenced_store: false,
            seed: 0,
            schedule: Vec::new(),
        }
    }
}

const LOCK: &str = "lab";

/// The client id in a lock value `{HOLDER_PREFIX}{id}/{random}`.
fn client_of(value: &str) -> Option<u32> {
    value
        .strip_prefix(HOLDER_PREFIX)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// What is running, and the history being recorded.
struct Run {
    /// The lock's key on the nodes, as the clients' engines name it.
    lock_key: String,
    nodes: RedisNodes,
    store: RedisNode,
    /// `proxies[client][node]`, when the scenario cuts or slows single paths.
    proxies: Vec<Vec<FaultProxy>>,
    clients: Vec<Child>,
    readers: Vec<std::thread::JoinHandle<()>>,
    events: Arc<Mutex<Vec<ClientEvent>>>,
    node_events: Vec<NodeEvent>,
    faults: Vec<Fault>,
}

impl Run {
    fn fault(&mut self, label: impl Into<String>) {
        let label = label.into();
        tracing::info!(fault = %label, "lab");
        self.faults.push(Fault {
            at_us: monotonic_us(),
            label,
        });
    }

    fn node_state(&mut self, node: usize, state: NodeState) {
        self.node_events.push(NodeEvent {
            at_us: monotonic_us(),
            node: node as u32,
            state,
        });
    }

    /// Waits up to `limit` for the holder: the client whose lock value a quorum of nodes
    /// holds. A losing attempt holds its key on a few nodes for a moment; a fault aimed at
    /// that loser instead of the holder tests nothing (seen on a loaded machine: the partition
    /// scenario cut a loser, and no lease was lost).
    fn wait_holder(&self, limit: Duration) -> Option<u32> {
        let quorum = self.nodes.len() / 2 + 1;
        let until = Instant::now() + limit;
        while !interrupted() && Instant::now() < until {
            let mut seen: HashMap<String, usize> = HashMap::new();
            for node in &self.nodes.nodes {
                if let Ok(Some(value)) = node.command::<Option<String>>(&["GET", &self.lock_key]) {
                    *seen.entry(value).or_default() += 1;
                }
            }
            let holder = seen
                .into_iter()
                .find(|(_, count)| *count >= quorum)
                .and_then(|(value, _)| client_of(&value));
            if holder.is_some() {
                return holder;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// Waits up to `limit` for one lease, other than `previous` (a lock value), on every node
    /// of `nodes`; returns its client. Requiring several nodes to agree skips the keys that
    /// losing attempts hold for a moment on single nodes.
    fn wait_lease(&self, nodes: &[usize], previous: Option<&str>, limit: Duration) -> Option<u32> {
        let until = Instant::now() + limit;
        while !interrupted() && Instant::now() < until {
            let values: Vec<Option<String>> = nodes
                .iter()
                .map(|&n| {
                    self.nodes[n]
                        .command(&["GET", &self.lock_key])
                        .ok()
                        .flatten()
                })
                .collect();
            if let Some(Some(value)) = values.first() {
                if values.iter().all(|v| v.as_ref() == Some(value))
                    && Some(value.as_str()) != previous
                {
                    if let Some(client) = client_of(value) {
                        return Some(client);
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    /// Sets the paths from `clients` (all when `None`) to `nodes` to `mode`.
    fn set_paths(
        &mut self,
        clients: Option<u32>,
        nodes: std::ops::Range<usize>,
        mode: ProxyMode,
        state: NodeState,
    ) {
        for node in nodes {
            for (client, paths) in self.proxies.iter().enumerate() {
                if clients.is_none_or(|c| c as usize == client) {
                    paths[node].set_mode(mode);
                }
            }
            self.node_state(node, state);
        }
    }

    /// Blackholes `client`'s paths to a majority of nodes (the partition scenario, the soak).
    fn cut_from_majority(&mut self, client: u32) {
        let majority = self.nodes.len() / 2 + 1;
        self.fault(format!("cut client {client} from redis 0-{}", majority - 1));
        self.set_paths(
            Some(client),
            0..majority,
            ProxyMode::Blackhole,
            NodeState::Partitioned,
        );
    }

    /// Undoes [`Run::cut_from_majority`].
    fn reconnect(&mut self, client: u32) {
        let majority = self.nodes.len() / 2 + 1;
        self.set_paths(Some(client), 0..majority, ProxyMode::Forward, NodeState::Up);
        self.fault(format!("heal client {client}"));
    }

    fn signal_client(&self, client: u32, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.clients[client as usize].id() as i32);
        let _ = nix::sys::signal::kill(pid, signal);
    }
}

fn start(scenario: Scenario, p: &Parameters) -> Result<Run, LabError> {
    let nodes = RedisNodes::start_with(
        p.nodes as usize,
        scenario.persistence(),
        |i| matches!(scenario, Scenario::ClockJump | Scenario::Soak) && i == 2,
        p.tls.as_ref(),
    )?;
    let store = RedisNode::start(Persistence::None)?;
    let proxies = if matches!(
        scenario,
        Scenario::Partition | Scenario::SlowNetwork | Scenario::ClockJump | Scenario::Soak
    ) {
        (0..p.clients)
            .map(|_| {
                nodes
                    .nodes
                    .iter()
                    .map(|n| FaultProxy::start(&n.addr()))
                    .collect::<Result<Vec<_>, HarnessError>>()
            })
            .collect::<Result<Vec<_>, _>>()?
    } else {
        Vec::new()
    };
    let exe = std::env::current_exe().map_err(|e| LabError::Io("find this program", e))?;
    let events = Arc::new(Mutex::new(Vec::new()));
    let mut run = Run {
        lock_key: format!("{DEFAULT_KEY_PREFIX}:lock:{LOCK}"),
        nodes,
        store,
        proxies,
        clients: Vec::new(),
        readers: Vec::new(),
        events,
        node_events: Vec::new(),
        faults: Vec::new(),
    };
    for id in 0..p.clients {
        let urls: Vec<String> = match run.proxies.get(id as usize) {
            // A proxy passes TLS through; the client still verifies the node's certificate.
            Some(paths) if p.tls.is_some() => paths
                .iter()
                .map(|proxy| format!("rediss://{}", proxy.addr()))
                .collect(),
            Some(paths) => paths.iter().map(FaultProxy::url).collect(),
            None => run.nodes.urls(),
        };
        let mut client = Command::new(&exe);
        client
            .arg("lab-client")
            .args(["--id", &id.to_string()])
            .args(["--nodes", &urls.join(",")])
            .args(["--store", &run.store.url()])
            .args(["--lock", LOCK])
            .args(["--ttl-ms", &p.ttl_ms.to_string()])
            .args(["--hold-ms", &p.hold_ms.to_string()])
            .args(["--work-ms", &p.work_ms.to_string()])
            .args(["--request-timeout-ms", &p.request_timeout_ms.to_string()]);
        if let Some(tls) = &p.tls {
            client.arg("--redis-ca-file").arg(&tls.ca_file);
        }
        if p.unfenced_store {
            client.arg("--unfenced-store");
        }
        let mut child = client
            // Everything a client does is in its history; its logs would only repeat it.
            .env("RUST_LOG", "off")
            // The client stops when this pipe closes: also when the lab dies without cleaning up.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| LabError::Io("start a lab client", e))?;
        let Some(stdout) = child.stdout.take() else {
            return Err(LabError::Io(
                "read a lab client's output",
                std::io::Error::other("no stdout"),
            ));
        };
        run.clients.push(child);
        let events = Arc::clone(&run.events);
        run.readers.push(std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(event) = serde_json::from_str::<ClientEvent>(&line) {
                    if let Ok(mut all) = events.lock() {
                        all.push(event);
                    }
                }
            }
        }));
    }
    Ok(run)
}

/// Runs `scenario` and returns its history, times relative to the clients' start.
pub fn run(scenario: Scenario, p: &Parameters) -> Result<History, LabError> {
    let mut run = start(scenario, p)?;
    let origin = monotonic_us();
    let end = Instant::now() + Duration::from_secs(p.seconds);
    let ttl = Duration::from_millis(p.ttl_ms);
    let outcome = script(scenario, p, &mut run, end, ttl);
    // Stop the clients: SIGCONT first in case one is paused, then SIGTERM; they leave their
    // section, release, and exit.
    for id in 0..p.clients {
        run.signal_client(id, nix::sys::signal::Signal::SIGCONT);
        run.signal_client(id, nix::sys::signal::Signal::SIGTERM);
    }
    for proxy in run.proxies.iter().flatten() {
        proxy.set_mode(ProxyMode::Forward);
    }
    let stop_by = Instant::now() + ttl * 3 + Duration::from_secs(2);
    for child in &mut run.clients {
        while Instant::now() < stop_by && matches!(child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    let end_us = monotonic_us();
    for reader in run.readers.drain(..) {
        let _ = reader.join();
    }
    outcome?;
    let store_log: Vec<String> = run
        .store
        .command(&["LRANGE", STORE_LOG_KEY, "0", "-1"])
        .map_err(LabError::Store)?;
    let store_log = store_log
        .iter()
        .filter_map(|entry| {
            let mut parts = entry.split(':');
            Some(StoreWrite {
                client: parts.next()?.parse().ok()?,
                token: parts.next()?.parse().ok()?,
                accepted: parts.next()? == "1",
            })
        })
        .collect();
    let events = std::mem::take(&mut *run.events.lock().map_err(|_| LabError::Poisoned)?);
    let mut history = History {
        clients: p.clients,
        nodes: p.nodes,
        end_us,
        events,
        node_events: std::mem::take(&mut run.node_events),
        faults: std::mem::take(&mut run.faults),
        store_log,
    };
    history.rebase(origin, end_us);
    Ok(history)
}

/// Set by SIGINT/SIGTERM: the scenario ends early, and the clients and servers are still
/// stopped and the history still written.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Watches for SIGINT/SIGTERM on a thread of its own (the lab itself is synchronous).
pub fn stop_on_signals() {
    std::thread::spawn(|| {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async {
            crate::shutdown::sigterm_or_sigint().await;
            eprintln!("lockedjob lab: interrupted; stopping clients and nodes");
            INTERRUPTED.store(true, Ordering::Relaxed);
        });
    });
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

/// Sleeps until `at`, or less when interrupted.
fn sleep_until(at: Instant) {
    while !interrupted() {
        let now = Instant::now();
        if at <= now {
            return;
        }
        std::thread::sleep((at - now).min(Duration::from_millis(50)));
    }
}

fn nap(length: Duration) {
    sleep_until(Instant::now() + length);
}

/// The fault schedule of each scenario, run until `end`.
fn script(
    scenario: Scenario,
    p: &Parameters,
    run: &mut Run,
    end: Instant,
    ttl: Duration,
) -> Result<(), LabError> {
    let n = p.nodes as usize;
    let majority = n / 2 + 1;
    match scenario {
        Scenario::Baseline => sleep_until(end),
        Scenario::NodeCrash => {
            // One node at a time: kill -9, stay down for the restart delay, come back with its
            // append-only file, then a pause before the next.
            let delay = Duration::from_millis(p.restart_delay_ms);
            let mut node = 0;
            nap(ttl / 2);
            while !interrupted() && Instant::now() + delay < end {
                run.fault(format!("kill -9 redis {node}"));
                run.nodes[node].kill9();
                run.node_state(node, NodeState::Down);
                nap(delay);
                run.nodes[node].restart()?;
                run.node_state(node, NodeState::Up);
                nap(ttl / 4);
                node = (node + 1) % n;
            }
            sleep_until(end);
        }
        Scenario::RestartNoPersistence => {
            // While someone holds the lock, restart a majority of nodes empty, at once, with no
            // delay: the lock (and the fence) are forgotten there.
            while !interrupted() && Instant::now() + ttl * 2 < end {
                let Some(holder) = run.wait_holder(ttl * 2) else {
                    continue;
                };
                run.fault(format!(
                    "client {holder} holds; restart redis 0-{} empty",
                    majority - 1
                ));
                for node in 0..majority {
                    run.nodes[node].restart()?;
                    run.node_state(node, NodeState::Emptied);
                }
                nap(ttl * 2);
            }
            sleep_until(end);
        }
        Scenario::ClockJump => {
            // Kleppmann's sequence: nodes 3.. become unreachable (connections refused, so no
            // request lands later), so the next holder gets exactly a majority {0, 1, 2};
            // they come back; node 2's clock jumps past the TTL and its copy of the lock
            // expires; another client then wins {2, 3, ..} while the first still holds.
            let mut jumped = Duration::ZERO;
            while !interrupted() && Instant::now() + ttl * 3 < end {
                nap(ttl);
                let before: Option<String> =
                    run.nodes[2].command(&["GET", &run.lock_key]).ok().flatten();
                run.set_paths(None, majority..n, ProxyMode::Reject, NodeState::Partitioned);
                run.fault(format!("redis {majority}-{} unreachable", n - 1));
                // A lease taken from now on lives on {0, 1, 2} only.
                let exactly_a_majority: Vec<usize> = (0..majority).collect();
                let holder = run.wait_lease(&exactly_a_majority, before.as_deref(), ttl * 5);
                run.set_paths(None, majority..n, ProxyMode::Forward, NodeState::Up);
                let Some(holder) = holder else { continue };
                jumped += ttl * 3;
                run.nodes[2].shift_clock(jumped)?;
                run.node_state(
                    2,
                    NodeState::Skewed {
                        offset_ms: jumped.as_millis() as u64,
                    },
                );
                run.fault(format!(
                    "client {holder} holds 0-2; redis 2 clock +{}s",
                    (ttl * 3).as_secs_f64()
                ));
                nap(ttl * 3);
            }
            sleep_until(end);
        }
        Scenario::ClientPause => {
            // The holder stops (SIGSTOP, like a long GC pause) for three TTLs, mid-section.
            while !interrupted() && Instant::now() + ttl * 4 < end {
                let Some(holder) = run.wait_holder(ttl * 2) else {
                    continue;
                };
                nap(ttl / 5);
                run.fault(format!("SIGSTOP client {holder}"));
                run.signal_client(holder, nix::sys::signal::Signal::SIGSTOP);
                nap(ttl * 3);
                run.signal_client(holder, nix::sys::signal::Signal::SIGCONT);
                run.fault(format!("SIGCONT client {holder}"));
                nap(ttl);
            }
            sleep_until(end);
        }
        Scenario::Partition => {
            // The holder loses its paths to a majority of nodes for three TTLs; everyone else
            // still reaches all nodes.
            while !interrupted() && Instant::now() + ttl * 4 < end {
                let Some(holder) = run.wait_holder(ttl * 2) else {
                    continue;
                };
                nap(ttl / 5);
                run.cut_from_majority(holder);
                nap(ttl * 3);
                run.reconnect(holder);
                nap(ttl);
            }
            sleep_until(end);
        }
        Scenario::SlowNetwork => {
            // Latency on every path, in steps up to past half the TTL each way (a lock round
            // then costs more than the TTL), and back down.
            let steps = [0u64, 10, 25, 40, 55, 40, 10];
            let step_time = Duration::from_secs(p.seconds) / steps.len() as u32;
            for (i, percent) in steps.into_iter().enumerate() {
                let delay = Duration::from_millis(p.ttl_ms * percent / 100);
                if i > 0 {
                    run.fault(format!("latency {} ms each way", delay.as_millis()));
                }
                let (mode, state) = if delay.is_zero() {
                    (ProxyMode::Forward, NodeState::Up)
                } else {
                    let delay_ms = delay.as_millis() as u64;
                    (ProxyMode::Delay(delay), NodeState::Slow { delay_ms })
                };
                run.set_paths(None, 0..n, mode, state);
                sleep_until((Instant::now() + step_time).min(end));
            }
            sleep_until(end);
        }
        Scenario::Soak => soak_script(p, run, end)?,
        Scenario::All => {}
    }
    Ok(())
}

/// What heals a soak fault.
enum Heal {
    Restart { node: usize, emptied: bool },
    Resume { client: u32 },
    Reconnect { client: u32 },
    Unslow { node: usize },
}

/// Runs the soak's schedule (`soak.rs`): each fault at its time, each heal at its own, faults
/// overlapping; a fault whose target is gone (no holder, a node already down) is skipped and
/// said so.
fn soak_script(p: &Parameters, run: &mut Run, end: Instant) -> Result<(), LabError> {
    let ttl = Duration::from_millis(p.ttl_ms);
    let started = Instant::now();
    let mut heals: Vec<(Instant, Heal)> = Vec::new();
    let mut clock = Duration::ZERO;
    for planned in &p.schedule {
        let at = (started + Duration::from_millis(planned.at_ms)).min(end);
        heal_until(run, &mut heals, at)?;
        sleep_until(at);
        if interrupted() || Instant::now() >= end {
            break;
        }
        let heal_at = Instant::now() + Duration::from_millis(planned.heal_after_ms);
        if let Some(heal) = apply(run, planned.fault, ttl, &mut clock)? {
            heals.push((heal_at, heal));
        }
    }
    heal_until(run, &mut heals, end)?;
    // Whatever is still faulted heals now, so the run ends with every node up.
    for (_, heal) in std::mem::take(&mut heals) {
        undo(run, heal)?;
    }
    sleep_until(end);
    Ok(())
}

/// Heals, in time order, everything due by `until`.
fn heal_until(
    run: &mut Run,
    heals: &mut Vec<(Instant, Heal)>,
    until: Instant,
) -> Result<(), LabError> {
    heals.sort_by_key(|(at, _)| *at);
    while heals.first().is_some_and(|(at, _)| *at <= until) && !interrupted() {
        let (at, heal) = heals.remove(0);
        sleep_until(at);
        undo(run, heal)?;
    }
    Ok(())
}

fn apply(
    run: &mut Run,
    fault: soak::SoakFault,
    ttl: Duration,
    clock: &mut Duration,
) -> Result<Option<Heal>, LabError> {
    use soak::SoakFault;
    Ok(match fault {
        SoakFault::KillNode { .. } | SoakFault::WipeNode
            if !run.nodes[node_of(fault)].is_running() =>
        {
            run.fault(format!("skipped {fault:?}: the node is down"));
            None
        }
        SoakFault::KillNode { node } => {
            let node = node as usize;
            run.fault(format!("kill -9 redis {node}"));
            run.nodes[node].kill9();
            run.node_state(node, NodeState::Down);
            Some(Heal::Restart {
                node,
                emptied: false,
            })
        }
        SoakFault::WipeNode => {
            run.fault("kill -9 redis 0, its data lost");
            run.nodes[0].kill9();
            run.nodes[0].wipe()?;
            run.node_state(0, NodeState::Down);
            Some(Heal::Restart {
                node: 0,
                emptied: true,
            })
        }
        SoakFault::PauseHolder | SoakFault::CutHolder => {
            let Some(holder) = run.wait_holder(ttl) else {
                run.fault(format!("skipped {fault:?}: no holder"));
                return Ok(None);
            };
            if fault == SoakFault::PauseHolder {
                run.fault(format!("SIGSTOP client {holder}"));
                run.signal_client(holder, nix::sys::signal::Signal::SIGSTOP);
                Some(Heal::Resume { client: holder })
            } else {
                run.cut_from_majority(holder);
                Some(Heal::Reconnect { client: holder })
            }
        }
        SoakFault::SlowNode { node, delay_ms } => {
            let node = node as usize;
            let delay = Duration::from_millis(delay_ms);
            run.fault(format!("latency {delay_ms} ms each way to redis {node}"));
            run.set_paths(
                None,
                node..node + 1,
                ProxyMode::Delay(delay),
                NodeState::Slow { delay_ms },
            );
            Some(Heal::Unslow { node })
        }
        SoakFault::ClockJump { by_ms } => {
            *clock += Duration::from_millis(by_ms);
            run.nodes[2].shift_clock(*clock)?;
            run.node_state(
                2,
                NodeState::Skewed {
                    offset_ms: clock.as_millis() as u64,
                },
            );
            run.fault(format!("redis 2 clock +{}s", by_ms as f64 / 1000.0));
            None
        }
    })
}

/// The node a node fault aims at.
fn node_of(fault: soak::SoakFault) -> usize {
    match fault {
        soak::SoakFault::KillNode { node } => node as usize,
        _ => 0,
    }
}

fn undo(run: &mut Run, heal: Heal) -> Result<(), LabError> {
    match heal {
        Heal::Restart { node, emptied } => {
            run.nodes[node].restart()?;
            run.node_state(
                node,
                if emptied {
                    NodeState::Emptied
                } else {
                    NodeState::Up
                },
            );
            run.fault(format!(
                "redis {node} back{}",
                if emptied { ", empty" } else { "" }
            ));
        }
        Heal::Resume { client } => {
            run.signal_client(client, nix::sys::signal::Signal::SIGCONT);
            run.fault(format!("SIGCONT client {client}"));
        }
        Heal::Reconnect { client } => run.reconnect(client),
        Heal::Unslow { node } => {
            run.set_paths(None, node..node + 1, ProxyMode::Forward, NodeState::Up);
            run.fault(format!("redis {node} fast again"));
        }
    }
    Ok(())
}
