//! client-go's `tools/leaderelection` beside `lockedjob elect` (issue 31's side-by-side): the
//! same two-candidate trials, run with `tools/leaderelection-peer` (client-go at the pinned
//! Kubernetes version, a Lease object) on a local control plane (etcd, kube-apiserver; no node
//! needed). Two settings: client-go's defaults (15/10/2 s), and the lease length `lockedjob
//! elect` uses, the other two durations scaled alike. Both release on SIGTERM
//! (`ReleaseOnCancel`).

use localcluster::{LocalCluster, Options};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// client-go's three durations.
pub struct Timing {
    pub lease: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Timing {
    /// client-go's defaults, as `kube-controller-manager` uses them.
    pub fn defaults() -> Self {
        Self::with_lease(Duration::from_secs(15))
    }

    /// `lease`, with RenewDeadline and RetryPeriod in the defaults' ratios (10/15, 2/15).
    pub fn with_lease(lease: Duration) -> Self {
        Self {
            lease,
            renew_deadline: lease * 2 / 3,
            retry_period: lease * 2 / 15,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{:.2?}/{:.2?}/{:.2?}",
            self.lease, self.renew_deadline, self.retry_period
        )
    }
}

/// The peer binary: `LOCKEDJOB_LEADERELECTION_PEER`, or built by `scripts/go-tool.sh`.
fn peer_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("LOCKEDJOB_LEADERELECTION_PEER") {
        return path.into();
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/go-tool.sh");
    let out = Command::new(script)
        .arg("leaderelection-peer")
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/go-tool.sh");
    assert!(
        out.status.success(),
        "scripts/go-tool.sh leaderelection-peer failed"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.lines().last().expect("the peer's path").into()
}

/// `dir/IDENTITY.log`, appended to, for a candidate's stderr (the bench shows it on failure).
pub fn log(dir: &Path, identity: &str) -> Stdio {
    std::fs::File::options()
        .create(true)
        .append(true)
        .open(dir.join(format!("{identity}.log")))
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}

/// A control plane and the peer binary, for candidates that take a Lease in it.
pub struct Peers {
    cluster: LocalCluster,
    binary: PathBuf,
}

impl Peers {
    pub fn start() -> Self {
        let binary = peer_binary();
        let cluster = LocalCluster::start(Options::named("client-go"))
            .expect("start a local control plane for client-go");
        Self { cluster, binary }
    }

    /// A candidate for Lease `lease` that appends "IDENTITY NANOS" to `dir/starts` when it
    /// starts leading and "IDENTITY 0 NANOS" to `dir/writes` every 100 ms while it leads;
    /// its stderr goes to `dir/IDENTITY.log`.
    pub fn candidate(&self, lease: &str, timing: &Timing, dir: &Path, identity: &str) -> Child {
        Command::new(&self.binary)
            .arg("--kubeconfig")
            .arg(self.cluster.kubeconfig())
            .args(["--lease", lease, "--identity", identity])
            .arg(format!("--lease-duration={:?}", timing.lease))
            .arg(format!("--renew-deadline={:?}", timing.renew_deadline))
            .arg(format!("--retry-period={:?}", timing.retry_period))
            .arg("--starts")
            .arg(dir.join("starts"))
            .arg("--writes")
            .arg(dir.join("writes"))
            .stdout(Stdio::null())
            .stderr(log(dir, identity))
            .process_group(0)
            .spawn()
            .expect("start leaderelection-peer")
    }
}
