//! A real node leaves the host as it found it: after a cluster stops, and after a cluster
//! whose owner was killed (kill -9) is cleaned up by the next one that starts. A test binary
//! of its own, so no other cluster changes the host while it compares. Needs root.

use localcluster::{LocalCluster, Options};
use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The tests compare the whole host: one at a time.
static HOST: Mutex<()> = Mutex::new(());

/// Everything a node changes on the host, as text that compares equal when nothing changed.
#[derive(Debug, PartialEq)]
struct HostState {
    network_namespaces: String,
    forward_rules: String,
    links: Vec<String>,
    routes: String,
    kernel_settings: Vec<String>,
    fixed_paths: Vec<(String, bool)>,
    /// What /run, /var/lib, /var/log, /etc and /opt hold: components write to fixed host paths
    /// beyond those above (containerd's NRI socket in /run/nri was found this way).
    host_dirs: Vec<String>,
    node_mounts: Vec<String>,
    node_cgroups: Vec<String>,
    shims: usize,
}

fn command_text(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn shims() -> usize {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                c.starts_with(b"containerd-shim-runc-v2")
                    || c.windows(23).any(|w| w == b"containerd-shim-runc-v2")
            })
        })
        .count()
}

fn host_state() -> HostState {
    let links = command_text("ip", &["-o", "link", "show"])
        .lines()
        .filter_map(|l| {
            l.split(": ")
                .nth(1)
                .map(|n| n.split('@').next().unwrap_or(n).to_string())
        })
        .collect();
    let kernel_settings = [
        "kernel/panic",
        "kernel/panic_on_oops",
        "kernel/keys/root_maxkeys",
        "kernel/keys/root_maxbytes",
        "vm/overcommit_memory",
        "vm/panic_on_oom",
    ]
    .iter()
    .map(|k| {
        format!(
            "{k}={}",
            std::fs::read_to_string(format!("/proc/sys/{k}"))
                .unwrap_or_default()
                .trim()
        )
    })
    .collect();
    let fixed_paths = [
        "/var/lib/kubelet",
        "/var/log/containers",
        "/var/lib/cni",
        "/run/netns",
        "/run/localcluster",
        "/run/containerd",
        "/etc/cni",
        "/var/lib/containerd",
    ]
    .iter()
    .map(|p| (p.to_string(), std::path::Path::new(p).exists()))
    .collect();
    let host_dirs = ["/run", "/var/lib", "/var/log", "/etc", "/opt"]
        .iter()
        .flat_map(|dir| {
            let mut names: Vec<String> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| format!("{dir}/{}", e.file_name().to_string_lossy()))
                .collect();
            names.sort();
            names
        })
        .collect();
    let node_mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.contains("localcluster") || p.starts_with("/run/netns/"))
        .map(str::to_string)
        .collect();
    let node_cgroups = std::fs::read_dir("/sys/fs/cgroup")
        .expect("cgroups")
        .flatten()
        .flat_map(|h| std::fs::read_dir(h.path()).into_iter().flatten().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with("lj"))
        .map(|e| e.path().display().to_string())
        .collect();
    HostState {
        network_namespaces: command_text("ip", &["netns", "list"]),
        forward_rules: command_text("iptables", &["-w", "-S", "FORWARD"]),
        links,
        routes: command_text("ip", &["route"]),
        kernel_settings,
        fixed_paths,
        host_dirs,
        node_mounts,
        node_cgroups,
        shims: shims(),
    }
}

fn real(name: &str) -> Options {
    Options {
        ..Options::named(name)
    }
}

/// A pod that keeps running (so the node has containers, mounts and a pod network to undo),
/// made with the built kubectl on the cluster of `kubeconfig`.
fn run_sleeper(kubeconfig: &Path) {
    let kubectl = |args: &[&str]| {
        let bin = localcluster::Binaries::locate().expect("binaries");
        let out = Command::new(bin.path("kubectl"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .expect("kubectl");
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    kubectl(&[
        "run",
        "sleeper",
        "--image=busybox:1.36",
        "--restart=Never",
        "--",
        "sleep",
        "3600",
    ]);
    kubectl(&[
        "wait",
        "--for=condition=Ready",
        "pod/sleeper",
        "--timeout=90s",
    ]);
}

#[test]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
fn a_stopped_cluster_leaves_the_host_as_it_found_it() {
    let _one = HOST.lock().unwrap_or_else(|e| e.into_inner());
    let before = host_state();
    let cluster = LocalCluster::start(Options {
        nodes: 2,
        ..real("tidy")
    })
    .expect("start two real nodes");
    run_sleeper(&cluster.kubeconfig());
    let running = host_state();
    // The check sees what a node changes: otherwise it would pass on any clean-up.
    assert_ne!(running.network_namespaces, before.network_namespaces);
    assert_ne!(running.forward_rules, before.forward_rules);
    assert!(running.shims > before.shims && !running.node_mounts.is_empty());
    drop(cluster);
    assert_eq!(host_state(), before);
}

#[test]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
fn a_node_whose_owner_was_killed_is_cleaned_up_by_the_next_one() {
    let _one = HOST.lock().unwrap_or_else(|e| e.into_inner());
    let before = host_state();
    let dir = tempfile::tempdir().expect("temp dir");
    let bin = localcluster::Binaries::locate().expect("binaries");
    let mut owner = Command::new(env!("CARGO_BIN_EXE_localcluster"))
        .arg("up")
        .arg(dir.path())
        .arg("--bin")
        .arg(bin.dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start localcluster up");
    // The kubeconfig's path is printed once the cluster is ready.
    let mut line = String::new();
    std::io::BufReader::new(owner.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read localcluster's output");
    let kubeconfig = line.trim().to_string();
    assert!(
        kubeconfig.ends_with("kubeconfig"),
        "localcluster up printed {line:?}"
    );
    run_sleeper(Path::new(&kubeconfig));
    owner.kill().expect("kill -9 the owner");
    let _ = owner.wait();
    // Its control plane and kubelet died with it (PDEATHSIG); its containers did not.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && shims() == before.shims {
        std::thread::sleep(Duration::from_millis(100));
    }
    let orphaned = host_state();
    assert!(
        orphaned.shims > before.shims,
        "the killed node left no container behind: {orphaned:?}"
    );
    assert_ne!(orphaned.network_namespaces, before.network_namespaces);

    let next = LocalCluster::start(real("next")).expect("start the next real node");
    drop(next);
    assert_eq!(host_state(), before);
}
