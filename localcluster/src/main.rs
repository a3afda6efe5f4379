//! `localcluster up DIR` starts a local control plane and its nodes in the foreground (until
//! Ctrl-C or `localcluster down DIR`); `DIR/kubeconfig` reaches it.

use clap::{Parser, Subcommand};
use localcluster::node::ImageSource;
use localcluster::{Binaries, LocalCluster, Options};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    about = "A real local Kubernetes cluster: control plane and nodes (kubelet, containerd, runc, kube-proxy, CoreDNS; needs root)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start a fresh cluster in DIR and stay in the foreground until Ctrl-C or `down DIR`.
    Up {
        dir: PathBuf,
        /// The cluster's name (its node is NAME-node).
        #[arg(long, default_value = "local")]
        name: String,
        /// Directory of the binaries (default: $LOCKEDJOB_K8S_BIN, else scripts/k8s-bins.sh).
        #[arg(long)]
        bin: Option<PathBuf>,
        /// How many nodes (each a kubelet, containerd and kube-proxy of its own).
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=i64::from(localcluster::node::MAX_NODES)))]
        nodes: u8,
        /// IMAGE=PROGRAM, e.g. ghcr.io/lockedjob/lockedjob-operator:0.1.0=target/debug/lockedjob.
        /// The cluster's registry gets an image of that name holding PROGRAM and its shared
        /// libraries, which the nodes pull.
        #[arg(long = "image", value_parser = parse_program_image)]
        images: Vec<(String, ImageSource)>,
        /// IMAGE=ARCHIVE, e.g. ghcr.io/lockedjob/lockedjob-operator:0.1.0=$(scripts/image.sh | tail -n1):
        /// a docker archive holding IMAGE (scripts/image.sh builds the Dockerfile into one),
        /// pushed to the cluster's registry.
        #[arg(long = "image-archive", value_parser = parse_archive_image)]
        archives: Vec<(String, ImageSource)>,
    },
    /// Stop the cluster started with `up DIR`.
    Down { dir: PathBuf },
}

const PID_FILE: &str = "localcluster.pid";

/// `REPOSITORY=PATH`, the path made absolute (it must exist).
fn parse_image_arg(text: &str, what: &str) -> Result<(String, PathBuf), String> {
    let (repository, path) = text
        .split_once('=')
        .filter(|(r, p)| !r.is_empty() && !p.is_empty())
        .ok_or_else(|| format!("{text:?}: expected REPOSITORY={what}"))?;
    let path =
        std::fs::canonicalize(path).map_err(|e| format!("{path}: {e} (the {what} must exist)"))?;
    Ok((repository.to_string(), path))
}

fn parse_program_image(text: &str) -> Result<(String, ImageSource), String> {
    parse_image_arg(text, "PROGRAM").map(|(r, p)| (r, ImageSource::Program(p)))
}

fn parse_archive_image(text: &str) -> Result<(String, ImageSource), String> {
    parse_image_arg(text, "ARCHIVE").map(|(r, p)| (r, ImageSource::Archive(p)))
}

fn up(
    dir: &Path,
    name: String,
    bin: Option<PathBuf>,
    nodes: u8,
    images: Vec<(String, ImageSource)>,
) -> Result<(), String> {
    if let Some(pid) = running_pid(dir) {
        return Err(format!(
            "a cluster already runs in {} (pid {pid}): `localcluster down {}` first",
            dir.display(),
            dir.display()
        ));
    }
    // A fresh cluster each time: the CA and keys are new, so old data would not verify.
    let stale = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name == "etcd" || name.starts_with("node-")
        });
    for entry in stale {
        let _ = std::fs::remove_dir_all(entry.path());
    }
    let binaries = bin
        .map(Binaries::in_dir)
        .transpose()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    eprintln!(
        "starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a registry and {nodes} node(s) (containerd, kubelet, kube-proxy; CoreDNS) in {}",
        dir.display()
    );
    let cluster = LocalCluster::start(Options {
        binaries,
        dir: Some(dir.to_path_buf()),
        images: images.into_iter().collect(),
        nodes,
        ..Options::named(&name)
    })
    .map_err(|e| e.to_string())?;
    std::fs::write(dir.join(PID_FILE), std::process::id().to_string())
        .map_err(|e| format!("write {PID_FILE}: {e}"))?;
    eprintln!(
        "ready in {:.1} s: Kubernetes {} at {}, nodes {name}-node...; logs in {}",
        started.elapsed().as_secs_f64(),
        cluster.version(),
        cluster.server(),
        dir.display()
    );
    eprintln!(
        "  kubectl --kubeconfig {} get nodes",
        cluster.kubeconfig().display()
    );
    eprintln!("Ctrl-C or `localcluster down {}` stops it", dir.display());
    println!("{}", cluster.kubeconfig().display());

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| e.to_string())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        Ok::<(), String>(())
    })?;
    eprintln!("stopping");
    drop(cluster);
    let _ = std::fs::remove_file(dir.join(PID_FILE));
    Ok(())
}

fn running_pid(dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(dir.join(PID_FILE))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    kill(Pid::from_raw(pid), None).ok().map(|_| pid)
}

fn down(dir: &Path) -> Result<(), String> {
    let Some(pid) = running_pid(dir) else {
        return Err(format!("no cluster runs in {}", dir.display()));
    };
    kill(Pid::from_raw(pid), Signal::SIGTERM).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while kill(Pid::from_raw(pid), None).is_ok() {
        if Instant::now() > deadline {
            return Err(format!("pid {pid} still running after 30 s"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("stopped the cluster in {}", dir.display());
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // kube's client logs every refused /readyz poll while the API server starts.
                .unwrap_or_else(|_| "warn,kube_client=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Up {
            dir,
            name,
            bin,
            nodes,
            mut images,
            archives,
        } => {
            images.extend(archives);
            up(&dir, name, bin, nodes, images)
        }
        Command::Down { dir } => down(&dir),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("localcluster: {e}");
            ExitCode::FAILURE
        }
    }
}
