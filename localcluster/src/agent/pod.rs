//! One pod's life on the node agent: init containers in order, then every container as a
//! process group; restarts by the pod's restart policy; readiness probes; status reports
//! through `pods/status`; graceful deletion.

use super::shared::Shared;
use super::{env, volumes};
use crate::process;
use futures::stream::{FuturesUnordered, StreamExt};
use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use kube::api::{Api, Patch, PatchParams};
use kube::ResourceExt;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(crate) fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    Waiting {
        reason: String,
        message: String,
    },
    Running {
        pid: u32,
        started: String,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        message: String,
        started: String,
        finished: String,
    },
}

impl State {
    fn to_json(&self) -> Value {
        match self {
            State::Waiting { reason, message } => {
                json!({"waiting": {"reason": reason, "message": message}})
            }
            State::Running { started, .. } => json!({"running": {"startedAt": started}}),
            State::Terminated {
                exit_code,
                reason,
                message,
                started,
                finished,
            } => json!({"terminated": {"exitCode": exit_code, "reason": reason,
                "message": message, "startedAt": started, "finishedAt": finished}}),
        }
    }
}

struct ContainerRun {
    spec: Container,
    log: PathBuf,
    state: State,
    last_terminated: Option<State>,
    restart_count: i32,
    ready: bool,
    /// Readiness: consecutive results and when the next probe is due.
    probe_successes: i32,
    probe_failures: i32,
    next_probe: Option<Instant>,
    restart_at: Option<Instant>,
}

impl ContainerRun {
    fn new(spec: Container, log: PathBuf) -> Self {
        Self {
            spec,
            log,
            state: State::Waiting {
                reason: "ContainerCreating".into(),
                message: String::new(),
            },
            last_terminated: None,
            restart_count: 0,
            ready: false,
            probe_successes: 0,
            probe_failures: 0,
            next_probe: None,
            restart_at: None,
        }
    }

    fn pid(&self) -> Option<u32> {
        match self.state {
            State::Running { pid, .. } => Some(pid),
            _ => None,
        }
    }

    fn exit_code(&self) -> Option<i32> {
        match self.state {
            State::Terminated { exit_code, .. } => Some(exit_code),
            _ => None,
        }
    }

    fn to_json(&self) -> Value {
        let image = self.spec.image.clone().unwrap_or_default();
        let mut status = json!({
            "name": self.spec.name, "image": image, "imageID": image,
            "ready": self.ready, "restartCount": self.restart_count,
            "started": matches!(self.state, State::Running { .. }),
            "state": self.state.to_json(),
        });
        if let Some(pid) = self.pid() {
            status["containerID"] = json!(format!("localcluster://{pid}"));
        }
        if let Some(last) = &self.last_terminated {
            status["lastState"] = last.to_json();
        }
        status
    }
}

type Exit = Pin<Box<dyn Future<Output = (usize, i32)> + Send>>;

/// The pod being run, and what was last reported of it.
struct PodRun<'a> {
    shared: &'a Shared,
    api: Api<Pod>,
    pod: Pod,
    dir: PathBuf,
    init: Vec<ContainerRun>,
    main: Vec<ContainerRun>,
    exits: FuturesUnordered<Exit>,
    phase: &'static str,
    start_time: String,
    /// Condition type -> (status, lastTransitionTime).
    conditions: BTreeMap<&'static str, (bool, String)>,
    reported: Option<Value>,
    /// Volume name -> its directory, once laid out.
    volumes: BTreeMap<String, PathBuf>,
    ip: String,
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

/// Runs the pod until it ends, its object is deleted (returns true: the caller sends the
/// final delete) or disappears, or the agent stops (returns false).
pub(crate) async fn run(
    shared: &Shared,
    pod: Pod,
    mut updates: watch::Receiver<Pod>,
    cancel: CancellationToken,
) -> bool {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let uid = pod.uid().unwrap_or_default();
    let dir = shared.config.dir.join(format!("{namespace}_{name}_{uid}"));
    let _ = std::fs::create_dir_all(dir.join("logs"));
    let spec = pod.spec.clone().unwrap_or_default();
    let container = |c: Container| {
        let log = dir.join("logs").join(format!("{}.log", c.name));
        ContainerRun::new(c, log)
    };
    let init: Vec<ContainerRun> = spec
        .init_containers
        .into_iter()
        .flatten()
        .map(container)
        .collect();
    let main: Vec<ContainerRun> = spec.containers.into_iter().map(container).collect();
    shared.logs.add(
        &uid,
        &namespace,
        &name,
        init.iter()
            .chain(&main)
            .map(|c| (c.spec.name.clone(), c.log.clone())),
    );
    let ip = super::config::pod_ip(&pod);
    let mut run = PodRun {
        shared,
        api: Api::namespaced(shared.client.clone(), &namespace),
        pod,
        dir,
        init,
        main,
        exits: FuturesUnordered::new(),
        phase: "Pending",
        start_time: now(),
        conditions: BTreeMap::new(),
        reported: None,
        volumes: BTreeMap::new(),
        ip,
    };
    let outcome = run.drive(&mut updates, &cancel).await;
    shared.logs.finished(&uid);
    outcome
}

enum Step {
    Continue,
    Deleted,
    Gone,
}

impl PodRun<'_> {
    fn restart_policy(&self) -> &str {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            .unwrap_or("Always")
    }

    async fn drive(
        &mut self,
        updates: &mut watch::Receiver<Pod>,
        cancel: &CancellationToken,
    ) -> bool {
        self.report().await;
        match self.prepare_volumes(updates, cancel).await {
            Step::Continue => {}
            Step::Deleted => return self.stop_gracefully().await,
            Step::Gone => return false,
        }
        // Init containers, one at a time, each to success.
        for index in 0..self.init.len() {
            loop {
                self.start(true, index).await;
                self.report().await;
                let code = loop {
                    match self.next_event(updates, cancel).await {
                        Some((_, code)) => break Some(code),
                        None if cancel.is_cancelled() => {
                            self.kill_all();
                            return false;
                        }
                        None => match self.on_update(updates) {
                            Step::Continue => {}
                            Step::Deleted => return self.stop_gracefully().await,
                            Step::Gone => {
                                self.kill_all();
                                return false;
                            }
                        },
                    }
                };
                match code {
                    Some(0) => break,
                    _ if self.restart_policy() == "Never" => {
                        self.phase = "Failed";
                        self.report().await;
                        return false;
                    }
                    _ => {
                        self.init[index].restart_count += 1;
                        tokio::time::sleep(backoff(self.init[index].restart_count)).await;
                    }
                }
            }
        }
        self.set_condition("Initialized", true);
        for index in 0..self.main.len() {
            self.start(false, index).await;
        }
        self.phase = "Running";
        self.update_readiness();
        self.report().await;

        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                _ = cancel.cancelled() => {
                    self.kill_all();
                    return false;
                }
                changed = updates.changed() => {
                    if changed.is_err() {
                        self.kill_all();
                        return false;
                    }
                    match self.on_update(updates) {
                        Step::Continue => {}
                        Step::Deleted => return self.stop_gracefully().await,
                        Step::Gone => { self.kill_all(); return false; }
                    }
                }
                Some((index, code)) = self.exits.next() => {
                    self.exited(index, code);
                    if let Some(phase) = self.terminal_phase() {
                        self.phase = phase;
                        self.update_readiness();
                        self.report().await;
                        return false;
                    }
                    self.update_readiness();
                    self.report().await;
                }
                _ = tick.tick() => {
                    let now = Instant::now();
                    for index in 0..self.main.len() {
                        if self.main[index].restart_at.is_some_and(|at| at <= now) {
                            self.main[index].restart_at = None;
                            self.main[index].restart_count += 1;
                            self.start(false, index).await;
                        }
                    }
                    self.probe().await;
                    self.update_readiness();
                    self.report().await;
                }
            }
        }
    }

    /// Lays out the pod's volumes, retrying each second while something they need is missing
    /// (a kubelet keeps the pod in ContainerCreating the same way), until the pod goes away.
    async fn prepare_volumes(
        &mut self,
        updates: &mut watch::Receiver<Pod>,
        cancel: &CancellationToken,
    ) -> Step {
        loop {
            match volumes::prepare(self.shared, &self.pod, &self.dir).await {
                Ok(prepared) => {
                    self.volumes = prepared;
                    return Step::Continue;
                }
                Err(message) => {
                    for c in self.init.iter_mut().chain(self.main.iter_mut()) {
                        c.state = State::Waiting {
                            reason: "ContainerCreating".into(),
                            message: message.clone(),
                        };
                    }
                    self.report().await;
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return Step::Gone,
                changed = updates.changed() => {
                    if changed.is_err() {
                        return Step::Gone;
                    }
                    if let step @ (Step::Deleted | Step::Gone) = self.on_update(updates) {
                        return step;
                    }
                }
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    /// The next container exit, or `None` when the pod object changed or the agent stops.
    async fn next_event(
        &mut self,
        updates: &mut watch::Receiver<Pod>,
        cancel: &CancellationToken,
    ) -> Option<(usize, i32)> {
        tokio::select! {
            _ = cancel.cancelled() => None,
            changed = updates.changed() => {
                if changed.is_err() {
                    // Our entry was dropped: the pod is gone from the API.
                    self.pod.metadata.uid = None;
                }
                None
            }
            Some(exit) = self.exits.next() => {
                let (index, code) = exit;
                self.init[index].state = terminated(&self.init[index].state, code);
                Some(exit)
            }
        }
    }

    fn on_update(&mut self, updates: &mut watch::Receiver<Pod>) -> Step {
        if self.pod.metadata.uid.is_none() {
            return Step::Gone;
        }
        self.pod = updates.borrow_and_update().clone();
        if self.pod.metadata.deletion_timestamp.is_some() {
            Step::Deleted
        } else {
            Step::Continue
        }
    }

    fn containers(&mut self, init: bool) -> &mut Vec<ContainerRun> {
        if init {
            &mut self.init
        } else {
            &mut self.main
        }
    }

    /// Resolves the container's environment and starts its process; a failure is reported
    /// in its state (and, for a missing Secret or ConfigMap key, retried by the restart logic).
    async fn start(&mut self, init: bool, index: usize) {
        let spec = self.containers(init)[index].spec.clone();
        let resolved = match env::resolve(self.shared, &self.pod, &spec).await {
            Ok(vars) => {
                env::command_line(&spec, &vars, &self.shared.config.images).map(|argv| (vars, argv))
            }
            Err(e) => Err(e),
        };
        let resolved = resolved.and_then(|(vars, argv)| {
            volumes::mounts(&spec, &self.volumes).map(|mounts| (vars, argv, mounts))
        });
        let (vars, argv, mounts) = match resolved {
            Ok(ok) => ok,
            Err(message) => {
                let c = &mut self.containers(init)[index];
                c.state = State::Terminated {
                    exit_code: 128,
                    reason: "StartError".into(),
                    message,
                    started: now(),
                    finished: now(),
                };
                self.exited_without_process(init, index);
                return;
            }
        };
        let log_path = self.containers(init)[index].log.clone();
        let workdir = spec
            .working_dir
            .as_deref()
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .unwrap_or_else(|| self.dir.clone());
        let child = spawn(
            &argv, &vars, &mounts, &workdir, &log_path, &self.dir, &self.pod,
        );
        let c = &mut self.containers(init)[index];
        match child {
            Ok(mut child) => {
                let pid = child.id().unwrap_or_default();
                c.state = State::Running {
                    pid,
                    started: now(),
                };
                c.probe_successes = 0;
                c.probe_failures = 0;
                c.next_probe = Some(
                    Instant::now()
                        + Duration::from_secs(
                            c.spec
                                .readiness_probe
                                .as_ref()
                                .and_then(|p| p.initial_delay_seconds)
                                .unwrap_or(0)
                                .max(0) as u64,
                        ),
                );
                self.exits.push(Box::pin(async move {
                    let code = child.wait().await.map(exit_code).unwrap_or(-1);
                    (index, code)
                }));
            }
            Err(e) => {
                c.state = State::Terminated {
                    exit_code: 128,
                    reason: "StartError".into(),
                    message: format!("start {:?}: {e}", argv.first()),
                    started: now(),
                    finished: now(),
                };
                self.exited_without_process(init, index);
            }
        }
    }

    /// A container that could not start counts as exited with its code (its terminated
    /// state, with the message, is already set and is kept by `terminated`).
    fn exited_without_process(&mut self, init: bool, index: usize) {
        let code = self.containers(init)[index].exit_code().unwrap_or(128);
        self.exits
            .push(Box::pin(async move { (index, code) }) as Exit);
    }

    fn exited(&mut self, index: usize, code: i32) {
        let policy = self.restart_policy().to_string();
        let c = &mut self.main[index];
        c.state = terminated(&c.state, code);
        c.ready = false;
        let restart = match policy.as_str() {
            "Always" => true,
            "OnFailure" => code != 0,
            _ => false,
        };
        if restart {
            c.last_terminated = Some(c.state.clone());
            c.restart_at = Some(Instant::now() + backoff(c.restart_count + 1));
        }
    }

    /// Succeeded or Failed once every container ended for good.
    fn terminal_phase(&self) -> Option<&'static str> {
        if self
            .main
            .iter()
            .any(|c| c.restart_at.is_some() || c.exit_code().is_none())
        {
            return None;
        }
        if self.main.iter().all(|c| c.exit_code() == Some(0)) {
            Some("Succeeded")
        } else {
            Some("Failed")
        }
    }

    fn kill_all(&mut self) {
        for c in self.init.iter().chain(&self.main) {
            if let Some(pid) = c.pid() {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
    }

    /// SIGTERM, the grace period, SIGKILL; the final state reported. Returns true (deleted).
    async fn stop_gracefully(&mut self) -> bool {
        let grace = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30)
            .max(0) as u64;
        for c in self.init.iter().chain(&self.main) {
            if let Some(pid) = c.pid() {
                let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
        }
        for c in &mut self.main {
            c.restart_at = None;
        }
        let deadline = Instant::now() + Duration::from_secs(grace);
        // Exits carry an index into the containers of the current stage.
        let stage_is_init = self.phase == "Pending";
        let mut killed = false;
        loop {
            let exit = if killed {
                self.exits.next().await
            } else {
                match tokio::time::timeout_at(deadline, self.exits.next()).await {
                    Ok(exit) => exit,
                    Err(_) => {
                        self.kill_all();
                        killed = true;
                        continue;
                    }
                }
            };
            let Some((index, code)) = exit else { break };
            if let Some(c) = self.containers(stage_is_init).get_mut(index) {
                c.state = terminated(&c.state, code);
                c.ready = false;
            }
        }
        for c in self.main.iter_mut().filter(|c| c.exit_code().is_none()) {
            c.state = terminated(&c.state, 137);
        }
        self.phase = if self.main.iter().all(|c| c.exit_code() == Some(0)) {
            "Succeeded"
        } else {
            "Failed"
        };
        self.update_readiness();
        self.report().await;
        true
    }

    async fn probe(&mut self) {
        let now = Instant::now();
        let ip = self.ip.clone();
        for c in &mut self.main {
            let Some(probe) = c.spec.readiness_probe.clone() else {
                continue;
            };
            if c.pid().is_none() || c.next_probe.is_none_or(|at| at > now) {
                continue;
            }
            c.next_probe =
                Some(now + Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64));
            let ok = run_probe(&probe, &c.spec, &ip).await;
            if ok {
                c.probe_failures = 0;
                c.probe_successes += 1;
                if c.probe_successes >= probe.success_threshold.unwrap_or(1) {
                    c.ready = true;
                }
            } else {
                c.probe_successes = 0;
                c.probe_failures += 1;
                if c.probe_failures >= probe.failure_threshold.unwrap_or(3) || !c.ready {
                    c.ready = false;
                }
            }
        }
    }

    fn update_readiness(&mut self) {
        for c in &mut self.main {
            if c.spec.readiness_probe.is_none() {
                c.ready = c.pid().is_some();
            } else if c.pid().is_none() {
                c.ready = false;
            }
        }
        let all = !self.main.is_empty() && self.main.iter().all(|c| c.ready);
        self.set_condition("ContainersReady", all);
        self.set_condition("Ready", all);
    }

    fn set_condition(&mut self, kind: &'static str, status: bool) {
        match self.conditions.get(kind) {
            Some((current, _)) if *current == status => {}
            _ => {
                self.conditions.insert(kind, (status, now()));
            }
        }
    }

    /// Sends the pod's status when it changed since the last report that went through.
    async fn report(&mut self) {
        let mut conditions = vec![json!({"type": "PodReadyToStartContainers", "status": "True"})];
        if !self.conditions.contains_key("Initialized") {
            let done = self.init.is_empty();
            self.set_condition("Initialized", done);
        }
        for (kind, (status, since)) in &self.conditions {
            conditions.push(json!({"type": kind,
                "status": if *status { "True" } else { "False" },
                "lastTransitionTime": since}));
        }
        let mut status = json!({
            "phase": self.phase,
            "hostIP": super::config::HOST_IP, "hostIPs": [{"ip": super::config::HOST_IP}],
            "podIP": self.ip, "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "conditions": conditions,
            "containerStatuses": self.main.iter().map(ContainerRun::to_json).collect::<Vec<_>>(),
        });
        if !self.init.is_empty() {
            status["initContainerStatuses"] = json!(self
                .init
                .iter()
                .map(ContainerRun::to_json)
                .collect::<Vec<_>>());
        }
        if self.reported.as_ref() == Some(&status) {
            return;
        }
        let patch = Patch::Strategic(json!({"status": status}));
        // A report that fails (API server restarting, a conflict) is sent again by the next
        // change or tick: `reported` only moves when one went through.
        match self
            .api
            .patch_status(&self.pod.name_any(), &PatchParams::default(), &patch)
            .await
        {
            Ok(_) => self.reported = Some(status),
            Err(e) => {
                tracing::debug!(pod = %self.pod.name_any(), error = %e, "status not reported")
            }
        }
    }
}

fn terminated(previous: &State, code: i32) -> State {
    let started = match previous {
        State::Running { started, .. } => started.clone(),
        State::Terminated { started, .. } => started.clone(),
        State::Waiting { .. } => now(),
    };
    if let State::Terminated { .. } = previous {
        return previous.clone();
    }
    State::Terminated {
        exit_code: code,
        reason: if code == 0 { "Completed" } else { "Error" }.into(),
        message: String::new(),
        started,
        finished: now(),
    }
}

/// A kubelet's crash-loop backoff, shortened for tests: 1, 2, 4, then 8 seconds.
fn backoff(restarts: i32) -> Duration {
    Duration::from_secs((1u64 << restarts.clamp(1, 4) as u32 >> 1).min(10))
}

fn spawn(
    argv: &[String],
    vars: &[(String, String)],
    mounts: &[volumes::Mount],
    workdir: &Path,
    log: &Path,
    pod_dir: &Path,
    pod: &Pod,
) -> std::io::Result<tokio::process::Child> {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let err = out.try_clone()?;
    let mut command = std::process::Command::new(&argv[0]);
    command
        .args(&argv[1..])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", pod_dir)
        .env("HOSTNAME", pod.name_any())
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .current_dir(workdir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    process::contain(&mut command);
    volumes::bind_in_private_namespace(&mut command, mounts)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let mut command = tokio::process::Command::from(command);
    command.kill_on_drop(true);
    command.spawn()
}

/// One readiness probe: HTTP GET (2xx/3xx), TCP connect, or a command exiting 0.
async fn run_probe(probe: &Probe, container: &Container, ip: &str) -> bool {
    let timeout = Duration::from_secs(probe.timeout_seconds.unwrap_or(1).max(1) as u64);
    let port_of = |port: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString| match port {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => Some(*p as u16),
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.container_port as u16),
    };
    let attempt = async {
        if let Some(http) = &probe.http_get {
            let port = port_of(&http.port)?;
            let path = http.path.clone().unwrap_or_else(|| "/".into());
            let mut stream = tokio::net::TcpStream::connect((ip, port)).await.ok()?;
            let request =
                format!("GET {path} HTTP/1.1\r\nHost: {ip}:{port}\r\nUser-Agent: kube-probe/localcluster\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.ok()?;
            let mut head = [0u8; 16];
            let n = stream.read(&mut head).await.ok()?;
            let line = String::from_utf8_lossy(&head[..n]).to_string();
            let code: u16 = line.split_whitespace().nth(1)?.parse().ok()?;
            return Some((200..400).contains(&code));
        }
        if let Some(tcp) = &probe.tcp_socket {
            let port = port_of(&tcp.port)?;
            return Some(tokio::net::TcpStream::connect((ip, port)).await.is_ok());
        }
        if let Some(exec) = &probe.exec {
            let argv = exec.command.clone().unwrap_or_default();
            let (program, args) = argv.split_first()?;
            let status = tokio::process::Command::new(program)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .status()
                .await
                .ok()?;
            return Some(status.success());
        }
        None
    };
    matches!(tokio::time::timeout(timeout, attempt).await, Ok(Some(true)))
}

#[cfg(test)]
mod tests {
    use super::backoff;
    use std::time::Duration;

    #[test]
    fn backoff_grows_and_caps() {
        let seconds: Vec<u64> = (0..7).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(seconds, [1, 1, 2, 4, 8, 8, 8]);
        assert!(backoff(100) <= Duration::from_secs(10));
    }
}
