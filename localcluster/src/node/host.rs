//! What real nodes change on the host outside their network namespaces, and how it is put
//! back:
//! - kernel settings the kubelet sets when it starts (saved before the first node on this
//!   machine starts, restored when the last one stops);
//! - a cgroup `/ljN/nodeK` in every hierarchy, the root of node K's pods;
//! - mounts (container root file systems, pod volumes, network namespaces) under the nodes'
//!   directories;
//! - container processes, which outlive their shim's parent by design;
//! - files at paths the kubelet and libcni do not let us move: the kubelet's device-plugin
//!   socket under /var/lib/kubelet, its log links in /var/log/containers, libcni's result
//!   cache in /var/lib/cni. The node's own entries go when it stops; these directories, if
//!   the first node made them, go when the last one stops.
//!
//! `/run/localcluster/<N>/` records who owns cluster N's nodes, so nodes whose owner was
//! killed are cleaned up by the next cluster that starts.

use super::network::{namespaces, remove_network, NodeSlot, Subnets};
use crate::Error;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The kubelet sets these at start (`setupKernelTunables`, protectKernelDefaults off).
const KERNEL_SETTINGS: [&str; 6] = [
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
];

const STATE_ROOT: &str = "/run/localcluster";
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Paths the kubelet, libcni and `ip netns` write to whatever their configuration says.
const FIXED_PATHS: [&str; 4] = [
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/netns",
];

fn saved_settings() -> PathBuf {
    Path::new(STATE_ROOT).join("kernel-settings")
}

fn absent_paths() -> PathBuf {
    Path::new(STATE_ROOT).join("absent-paths")
}

/// Cluster N's nodes' runtime state (`node-K` each: containerd's sockets and state, the pods'
/// network namespaces, the IP allocations) and the owner record.
pub fn state_dir(subnets: &Subnets) -> PathBuf {
    Path::new(STATE_ROOT).join(subnets.index.to_string())
}

/// The cgroup (relative to each hierarchy) under which a node's pods run: `/ljN/nodeK`.
pub fn cgroup_name(slot: &NodeSlot) -> String {
    format!("/lj{}/node{}", slot.index, slot.k)
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::io(what, e)
}

/// Saves the kernel settings, and which fixed paths do not exist yet, unless a running node
/// saved them already. Called, under the [`HostLock`], before the first node on the machine
/// makes its namespace.
pub fn save_host_state(_locked: &HostLock) -> Result<(), Error> {
    std::fs::create_dir_all(STATE_ROOT).map_err(io("create /run/localcluster"))?;
    if saved_settings().exists() {
        return Ok(());
    }
    let absent: Vec<&str> = FIXED_PATHS
        .into_iter()
        .filter(|p| !Path::new(p).exists())
        .collect();
    std::fs::write(absent_paths(), absent.join("\n")).map_err(io("save the host's paths"))?;
    let mut text = String::new();
    for key in KERNEL_SETTINGS {
        let value = std::fs::read_to_string(Path::new("/proc/sys").join(key))
            .map_err(io("read a kernel setting"))?;
        text.push_str(&format!("{key}={}\n", value.trim()));
    }
    std::fs::write(saved_settings(), text).map_err(io("save the kernel settings"))
}

/// Puts the saved kernel settings back and removes the fixed paths the nodes made, once no
/// node owns state here any more.
fn restore_host_if_last() {
    let others = std::fs::read_dir(STATE_ROOT)
        .map(|entries| entries.flatten().filter(|e| e.path().is_dir()).count())
        .unwrap_or(0);
    if others > 0 {
        return;
    }
    let Ok(text) = std::fs::read_to_string(saved_settings()) else {
        return;
    };
    for (key, value) in text.lines().filter_map(|l| l.split_once('=')) {
        if let Err(e) = std::fs::write(Path::new("/proc/sys").join(key), value) {
            eprintln!("localcluster: put back kernel setting {key}={value}: {e}");
        }
    }
    let _ = std::fs::remove_file(saved_settings());
    let absent = std::fs::read_to_string(absent_paths()).unwrap_or_default();
    for path in absent.lines().filter(|l| !l.is_empty()) {
        // /run/netns may hold other tools' namespaces by now: removed only if empty. `ip netns`
        // made it a mount point (bound onto itself, shared), which goes first.
        let removed = if path == "/run/netns" {
            let empty = std::fs::read_dir(path).is_ok_and(|mut d| d.next().is_none());
            if empty {
                let _ = nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH);
            }
            std::fs::remove_dir(path)
        } else {
            std::fs::remove_dir_all(path)
        };
        if let Err(e) = removed {
            if e.kind() != std::io::ErrorKind::NotFound {
                eprintln!("localcluster: remove {path}: {e}");
            }
        }
    }
    let _ = std::fs::remove_file(absent_paths());
    // Empty now, unless another node started meanwhile (then this fails, as it should).
    let _ = std::fs::remove_dir(STATE_ROOT);
}

/// The node's entries at the fixed paths: log links into its directory, libcni's results for
/// its network (and the loopback results of the same containers).
fn remove_fixed_path_entries(subnets: &Subnets, cluster_dir: Option<&Path>) {
    if let (Some(dir), Ok(links)) = (cluster_dir, std::fs::read_dir("/var/log/containers")) {
        for link in links.flatten() {
            if std::fs::read_link(link.path()).is_ok_and(|target| target.starts_with(dir)) {
                let _ = std::fs::remove_file(link.path());
            }
        }
    }
    let results = Path::new("/var/lib/cni/results");
    // `localcluster-ljN-<id>-eth0` and `localcluster-ljN-<k>-<id>-eth0`.
    let prefix = format!("localcluster-{}-", subnets.netns());
    let Ok(entries) = std::fs::read_dir(results) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&prefix) else {
            continue;
        };
        let _ = std::fs::remove_file(entry.path());
        // A container id is 64 hex digits.
        let container = rest
            .strip_suffix("-eth0")
            .map(|r| &r[r.len().saturating_sub(64)..]);
        if let Some(container) = container {
            let _ = std::fs::remove_file(results.join(format!("cni-loopback-{container}-lo")));
        }
    }
}

/// The host's shared state (the saved settings, the state directories), locked across
/// processes and threads while a cluster is set up or released: the last node of one test
/// process stopping must not put the host back while another process sets up its first.
/// The lock is on `/run` itself, so that no lock file stays behind. Released when dropped.
pub struct HostLock {
    _run: std::fs::File,
}

/// Waits for [`HostLock`].
pub fn lock_host() -> Result<HostLock, Error> {
    let run = std::fs::File::open("/run").map_err(io("open /run to lock the host's state"))?;
    run.lock().map_err(io("lock /run"))?;
    Ok(HostLock { _run: run })
}

/// Records this process as the node's owner and where its directory is.
pub fn claim(subnets: &Subnets, cluster_dir: &Path) -> Result<(), Error> {
    let dir = state_dir(subnets);
    std::fs::create_dir_all(&dir).map_err(io("create the node's state directory"))?;
    let record = format!("{}\n{}\n", std::process::id(), cluster_dir.display());
    std::fs::write(dir.join("owner"), record).map_err(io("record the node's owner"))
}

/// Cleans up after nodes whose owner process is gone (killed before it could). The caller
/// holds the [`HostLock`].
pub fn reclaim_stale(_locked: &HostLock) {
    let Ok(entries) = std::fs::read_dir(STATE_ROOT) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(index) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u8>().ok())
        else {
            continue;
        };
        let record = std::fs::read_to_string(entry.path().join("owner")).unwrap_or_default();
        let mut lines = record.lines();
        let owner = lines.next().and_then(|p| p.parse::<i32>().ok());
        if owner.is_some_and(|pid| kill(Pid::from_raw(pid), None).is_ok()) {
            continue;
        }
        let cluster_dir = lines.next().map(PathBuf::from);
        eprintln!("localcluster: cleaning up node lj{index}, whose owner is gone");
        release_locked(&Subnets { index }, cluster_dir.as_deref());
    }
}

/// Creates each node's cgroup in every hierarchy (the kubelet requires its cgroup root to
/// exist). cpuset needs its CPUs and memory nodes before anything can join it.
pub fn create_cgroups(subnets: &Subnets, nodes: u8) -> Result<(), Error> {
    for hierarchy in hierarchies() {
        let cluster = hierarchy.join(subnets.netns());
        let node_dirs = (0..nodes)
            .map(|k| hierarchy.join(cgroup_name(&subnets.node(k)).trim_start_matches('/')));
        for dir in std::iter::once(cluster).chain(node_dirs) {
            std::fs::create_dir_all(&dir).map_err(io("create a node's cgroup"))?;
            let parent = dir.parent().unwrap_or(&hierarchy).to_path_buf();
            for file in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(value) = std::fs::read_to_string(parent.join(file)) {
                    std::fs::write(dir.join(file), value.trim())
                        .map_err(io("set up the cpuset cgroup"))?;
                }
            }
        }
    }
    Ok(())
}

fn hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir(CGROUP_ROOT)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir() && !p.is_symlink())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills whatever still runs in the node's cgroups and network namespace, unmounts everything
/// under the node's directories, removes its cgroups, state and network and, if it was the
/// last node, puts the host back. Best effort: each step reports its own failure and the
/// next one runs, unlocked if the lock cannot be had.
pub fn release(subnets: &Subnets, cluster_dir: Option<&Path>) {
    let locked = lock_host();
    if let Err(e) = &locked {
        eprintln!(
            "localcluster: releasing lj{} without the host lock: {e}",
            subnets.index
        );
    }
    release_locked(subnets, cluster_dir);
}

fn release_locked(subnets: &Subnets, cluster_dir: Option<&Path>) {
    kill_cgroup_processes(subnets);
    kill_namespace_processes(subnets);
    let state = state_dir(subnets);
    let mut roots = vec![state.clone()];
    roots.extend(cluster_dir.map(Path::to_path_buf));
    unmount_under(&roots);
    remove_cgroups(subnets);
    remove_fixed_path_entries(subnets, cluster_dir);
    if let Err(e) = std::fs::remove_dir_all(&state) {
        if e.kind() != std::io::ErrorKind::NotFound {
            eprintln!("localcluster: remove {}: {e}", state.display());
        }
    }
    remove_network(subnets);
    restore_host_if_last();
}

fn cgroup_dirs(subnets: &Subnets) -> Vec<PathBuf> {
    // Deepest first, so each directory is empty of children when it is removed.
    let mut dirs = Vec::new();
    for hierarchy in hierarchies() {
        collect_dirs(&hierarchy.join(subnets.netns()), &mut dirs);
    }
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    dirs
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    out.push(dir.to_path_buf());
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            collect_dirs(&entry.path(), out);
        }
    }
}

fn kill_cgroup_processes(subnets: &Subnets) {
    kill_until_gone(|| {
        cgroup_dirs(subnets)
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|text| {
                text.lines()
                    .filter_map(|l| l.parse().ok())
                    .collect::<Vec<_>>()
            })
            .collect()
    });
}

/// Whatever runs in the nodes' network namespaces: containerd's shims above all, which leave
/// their parent by design (so containers survive a containerd restart) and would keep the
/// namespace, and with it the host's end of its link, alive.
fn kill_namespace_processes(subnets: &Subnets) {
    use std::os::unix::fs::MetadataExt;
    let inodes: Vec<(u64, u64)> = namespaces(subnets)
        .iter()
        .filter_map(|ns| std::fs::metadata(Path::new("/run/netns").join(ns)).ok())
        .map(|m| (m.dev(), m.ino()))
        .collect();
    if inodes.is_empty() {
        return;
    }
    let inside = || -> Vec<i32> {
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
            .filter(|pid| {
                std::fs::metadata(format!("/proc/{pid}/ns/net"))
                    .is_ok_and(|ns| inodes.contains(&(ns.dev(), ns.ino())))
            })
            .collect()
    };
    kill_until_gone(inside);
}

/// SIGKILLs what `find` lists until it lists nothing (a killed process takes a moment to
/// leave its namespaces and cgroups), for at most ten seconds.
fn kill_until_gone(mut find: impl FnMut() -> Vec<i32>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let pids = find();
        if pids.is_empty() || Instant::now() > deadline {
            return;
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn remove_cgroups(subnets: &Subnets) {
    for dir in cgroup_dirs(subnets) {
        // A cgroup's files cannot be removed, only the directory itself, once empty.
        if let Err(e) = std::fs::remove_dir(&dir) {
            eprintln!("localcluster: remove cgroup {}: {e}", dir.display());
        }
    }
}

/// Unmounts every mount point under `roots`, deepest first (lazily, so a busy one goes once
/// its last user does).
fn unmount_under(roots: &[PathBuf]) {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mount_point)
        .filter(|p| roots.iter().any(|r| p.starts_with(r)))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for point in points {
        if let Err(e) = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH) {
            if e != nix::errno::Errno::EINVAL && e != nix::errno::Errno::ENOENT {
                eprintln!("localcluster: unmount {}: {e}", point.display());
            }
        }
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount_point(field: &str) -> PathBuf {
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            match u8::from_str_radix(&code, 8) {
                Ok(byte) => out.push(byte as char),
                Err(_) => out.push_str(&code),
            }
        } else {
            out.push(c);
        }
    }
    PathBuf::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two test processes set clusters up and release them at once (scripts/test.sh): while
    /// one holds the host, another waits (a thread here; flock keeps them apart the same way).
    #[test]
    fn a_second_holder_of_the_host_waits_for_the_first() {
        let first = lock_host().expect("lock the host");
        let (tx, rx) = std::sync::mpsc::channel();
        let second = std::thread::spawn(move || {
            let locked = lock_host().expect("lock the host");
            tx.send(()).expect("send");
            drop(locked);
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "the second got the host while the first held it"
        );
        drop(first);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the second gets the host once the first lets go");
        second.join().expect("join");
    }

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape_mount_point(r"/a\040b/c"), PathBuf::from("/a b/c"));
        assert_eq!(unescape_mount_point("/plain"), PathBuf::from("/plain"));
    }
}
