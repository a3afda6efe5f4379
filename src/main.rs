//! The `lockedjob` command line. Only argument parsing and dispatch live here.

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use lockedjob::cli::exec::{self, ExecArgs};
use lockedjob::exit;

#[derive(Parser)]
#[command(
    name = "lockedjob",
    version,
    about = "Run each scheduled job exactly once across replicas and clusters, under Redlock with fencing tokens"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, env = "LOCKEDJOB_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a command only while holding a lock (like `etcdctl lock` / `consul lock`).
    ///
    /// Exit codes: the command's own (128+N when signal N ended it); 75 lock not acquired
    /// within --wait; 76 lease lost, command stopped; 64 bad usage or configuration;
    /// 127 command could not be started.
    Exec(Box<ExecArgs>),
    /// Leader election for a long-running command: campaign for LOCK, run the command only
    /// while leading, step down before the lease can expire, campaign again.
    ///
    /// Unlike `exec`, which makes one attempt (or waits up to --wait) and exits 76 when the
    /// lease is lost, `elect` campaigns without end: after a lost lease it stops the command
    /// (SIGTERM, then SIGKILL before the deadline) and campaigns again. The command gets
    /// LOCKEDJOB_FENCING_TOKEN, LOCKEDJOB_HOLDER and LOCKEDJOB_LOCK_NAME; --token-file keeps
    /// the same in a file while leading. `--observe` prints the leader each time it changes.
    ///
    /// `--sidecar` runs no command: it holds leadership for its pod and shows it (token file,
    /// `GET /leader`, the pod's `lockedjob.dev/leader` condition and label, a mirror Lease).
    ///
    /// Exit codes: the command's own when it exits (leadership is released); 128+N when
    /// signal N arrived while campaigning; 0 after SIGTERM/SIGINT with --sidecar or
    /// --observe; 64 bad usage or configuration; 127 command could not be started.
    Elect(Box<lockedjob::elect::ElectArgs>),
    /// Run the Kubernetes operator: reconcile LockedJobs, run each due Job once under the lock.
    ///
    /// Exit codes: 0 after a graceful shutdown (SIGTERM/SIGINT); 64 bad configuration.
    Operator(Box<lockedjob::controller::OperatorArgs>),
    /// Show who holds a lock and what each Redis node stores for it (value, TTL, fence and
    /// progress registers).
    ///
    /// Exit codes: 0 a quorum of nodes answered; 69 fewer did; 64 bad usage.
    Status(Box<lockedjob::cli::status::StatusArgs>),
    /// Print the next scheduled times of a cron expression or of a LockedJob.
    ///
    /// Exit codes: 0; 1 the schedule has no future time; 64 bad expression or no such LockedJob.
    Next(lockedjob::cli::next::NextArgs),
    /// Run the scheduled times of a past range once each (`--from`, `--to`), cancel that
    /// (`--cancel`), or show how far it got (neither).
    ///
    /// Exit codes: 0; 64 bad range or no such LockedJob; 69 the cluster cannot be reached.
    Backfill(lockedjob::cli::backfill::BackfillArgs),
    /// Print a shell completion script, e.g. `lockedjob completions bash > /etc/bash_completion.d/lockedjob`.
    Completions { shell: clap_complete::Shell },
    /// Print the LockedJob CustomResourceDefinition (YAML), as committed in crds/.
    Crd,
    /// Lock-safety lab: run lock clients against local redis-server nodes under a scripted
    /// fault, check the history, write report.json and timeline.svg.
    ///
    /// Needs redis-server (and cc for clock-jump). Exit codes: 0 the verdict is the one the
    /// scenario should reach; 1 it is not; 64 bad usage; 69 a part could not be started.
    Lab(lockedjob::lab::LabArgs),
    /// One client of the lab (started by `lockedjob lab`).
    #[command(hide = true)]
    LabClient(lockedjob::lab::client::ClientArgs),
    /// Kills a command's process group when its supervisor dies (started by `exec`, `elect`).
    #[command(hide = true, name = lockedjob::child::GROUP_GUARD_SUBCOMMAND)]
    GroupGuard,
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::USAGE } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    match cli.command {
        Command::Crd => {
            print!("{}", lockedjob::api::crd_yaml());
            return;
        }
        Command::GroupGuard => {
            std::process::exit(lockedjob::child::run_group_guard());
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "lockedjob",
                &mut std::io::stdout(),
            );
            return;
        }
        _ => {}
    }
    init_logging(cli.log_format);
    lockedjob::child::enable_group_guard();
    if let Command::Lab(args) = cli.command {
        std::process::exit(lockedjob::lab::run(args));
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    if matches!(cli.command, Command::Operator(_)) {
        lockedjob::controller::return_large_allocations_to_the_system();
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("lockedjob: cannot start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async move {
        match cli.command {
            Command::Exec(args) => exec::run(*args).await,
            Command::Elect(args) => lockedjob::elect::run(*args).await,
            Command::Operator(args) => lockedjob::controller::run(*args).await,
            Command::LabClient(args) => lockedjob::lab::client::run(args).await,
            Command::Status(args) => lockedjob::cli::status::run(*args).await,
            Command::Next(args) => lockedjob::cli::next::run(args).await,
            Command::Backfill(args) => lockedjob::cli::backfill::run(args).await,
            Command::Crd | Command::Lab(_) | Command::Completions { .. } | Command::GroupGuard => 0,
        }
    });
    // Pending background work (a connection attempt to a dead node) must not delay the exit.
    runtime.shutdown_background();
    std::process::exit(code);
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal: `kubectl logs` and log collectors get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
