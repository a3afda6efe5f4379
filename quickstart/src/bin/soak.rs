//! `soak`: the operator on two local clusters under a seeded schedule of random faults for a
//! while, judged by our checker and by porcupine (quickstart/src/soak/). Needs root (real
//! nodes), the control plane's binaries (`scripts/k8s-bins.sh`) and `target/debug/lockedjob`.

use clap::Parser;
use quickstart::clusters::block_on;
use quickstart::soak::{self, say, Options};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Soak the operator on two local clusters under seeded random faults")]
struct Cli {
    /// How long the faults go on (the clusters' start and the last runs come on top).
    #[arg(long, default_value_t = 3.0)]
    minutes: f64,
    /// The fault schedule's seed: the same seed gives the same schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where `report.json`, `runs.json`, `timeline.svg`, porcupine's input and the logs go.
    #[arg(long, default_value = "target/soak")]
    out: PathBuf,
    /// The broken deployment both checkers must catch: each cluster its own lock nodes.
    #[arg(long)]
    split_nodes: bool,
    /// The broken build both checkers must catch in the writes: the store takes every write,
    /// whatever its token (fencing off).
    #[arg(long)]
    unfenced_store: bool,
    /// `tools/porcupine-check` (scripts/porcupine-check.sh builds it).
    #[arg(long, env = "LOCKEDJOB_PORCUPINE_CHECK")]
    porcupine_check: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !(cli.minutes > 0.0 && cli.minutes <= 24.0 * 60.0) {
        say("error: --minutes must be more than 0 and at most a day");
        return ExitCode::from(2);
    }
    let options = Options {
        seconds: (cli.minutes * 60.0).round() as u64,
        seed: cli.seed,
        out: cli.out,
        split_nodes: cli.split_nodes,
        unfenced_store: cli.unfenced_store,
        porcupine_check: cli.porcupine_check,
    };
    match block_on(soak::run(&options)).and_then(|outcome| outcome) {
        Ok(report) => {
            for objection in report.ours() {
                say(format!("ours: {objection}"));
            }
            for objection in report.porcupine() {
                say(format!("porcupine: {objection}"));
            }
            say(format!(
                "{}: {}",
                if report.ok() { "OK" } else { "FAILED" },
                options.out.join("report.json").display()
            ));
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            say(format!("error: {e}"));
            ExitCode::FAILURE
        }
    }
}
