//! What `lockedjob elect` is given.

use super::lease_runner::LeaseOptions;
use crate::options::{parse_duration, RedisOptions};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct ElectArgs {
    #[command(flatten)]
    pub redis: RedisOptions,
    /// The election's lock name: every replica of one workload, in every cluster, uses the same.
    pub lock: String,
    /// Lease TTL: how long a leader that vanished without a trace (a lost node, a partition)
    /// keeps the others waiting.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub ttl: Duration,
    #[command(flatten)]
    pub lease: LeaseOptions,
    /// How often a candidate tries to become leader (each wait drawn ±20% around it): after a
    /// graceful step-down the next leader starts within about this long.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub retry_interval: Duration,
    /// This candidate's preference: after a failover, a candidate of higher priority takes
    /// leadership back through a clean handover once it has seen a Redis quorum for
    /// --reclaim-after; equal priorities never take over from each other
    /// (docs/leader-election.md, "Preference and stickiness").
    #[arg(long, env = "LOCKEDJOB_ELECT_PRIORITY", default_value_t = 0)]
    pub priority: u32,
    /// How long a candidate of higher priority must see a Redis quorum before it asks the
    /// leader to hand over: a cluster that just healed is not trusted at once.
    #[arg(long, env = "LOCKEDJOB_RECLAIM_AFTER", default_value = "30s", value_parser = parse_duration)]
    pub reclaim_after: Duration,
    /// While leading, keep this JSON file up to date (lock, holder, token, validUntil), written
    /// atomically; it is removed as soon as leadership is lost, before the command is stopped.
    #[arg(long, env = "LOCKEDJOB_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// How far ahead of its writing each leader record (the token file, `/leader`) of a sidecar
    /// is valid; the sidecar rewrites it four times as often while it leads. A workload that
    /// checks `validUntil` stops acting at most this long after its sidecar died, and a
    /// candidate that learns of that death from the kubelet waits this long before it takes
    /// over. Longer rides out a starved sidecar without gaps in the work; shorter fails over
    /// sooner. [default: 500ms]
    #[arg(long, env = "LOCKEDJOB_RECORD_VALIDITY", value_parser = parse_duration)]
    pub record_validity: Option<Duration>,
    /// Run no command: hold leadership for this pod and show it (the token file; with
    /// --pod-namespace, the pod's `lockedjob.dev/leader` condition and label and a mirror
    /// Lease). Run as a native sidecar (an init container with `restartPolicy: Always`).
    #[arg(long, conflicts_with = "command")]
    pub sidecar: bool,
    /// The sidecar's pod namespace (downward API); with the pod name (--runner-name, POD_NAME)
    /// it turns on the pod's condition, label and the mirror Lease.
    #[arg(long, env = "POD_NAMESPACE", requires = "sidecar")]
    pub pod_namespace: Option<String>,
    /// Where the sidecar answers `GET /leader` (200 with the token file's JSON while this pod
    /// leads, 503 otherwise), `/healthz` and `/metrics`. Loopback by default: only the pod's
    /// own containers should ask.
    #[arg(long, env = "LOCKEDJOB_LEADER_ADDR", default_value = "127.0.0.1:8087")]
    pub leader_addr: SocketAddr,
    /// The sidecar container's termination message file (its `terminationMessagePath`): while
    /// leading, the sidecar writes its lock value there, so that when the container dies the
    /// kubelet's report lets a candidate take over at once (docs/design.md, "Failover when
    /// Kubernetes confirms the leader's end"). Written only if the kubelet made it.
    #[arg(
        long,
        env = "LOCKEDJOB_TERMINATION_MESSAGE_PATH",
        default_value = "/dev/termination-log"
    )]
    pub termination_message_path: PathBuf,
    /// Print a line each time the leader changes, instead of campaigning.
    #[arg(long, conflicts_with_all = ["command", "token_file", "sidecar"])]
    pub observe: bool,
    /// Output of --observe: text, or one JSON object a line.
    #[arg(short, long, value_enum, default_value_t = ObserveOutput::Text, requires = "observe")]
    pub output: ObserveOutput,
    /// How often --observe reads the nodes.
    #[arg(long, default_value = "500ms", value_parser = parse_duration, requires = "observe")]
    pub poll_interval: Duration,
    /// The command and its arguments, run while this replica leads.
    #[arg(last = true, required_unless_present_any = ["observe", "sidecar"], num_args = 1..)]
    pub command: Vec<String>,
}

impl ElectArgs {
    /// `--record-validity`, or its default.
    pub fn record_validity(&self) -> Duration {
        self.record_validity.unwrap_or(DEFAULT_RECORD_VALIDITY)
    }
}

/// How far ahead a sidecar's leader record reaches unless told otherwise.
pub const DEFAULT_RECORD_VALIDITY: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ObserveOutput {
    Text,
    Json,
}
