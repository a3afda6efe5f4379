//! The lock-safety lab: runs lock clients (separate processes) against local `redis-server`
//! nodes under a scripted fault, records every lock operation and critical section, checks the
//! history, and writes `report.json` and `timeline.svg`.
//!
//! Needs `redis-server` (and `cc` for `clock-jump`) on the machine; see docs/lab.md.

pub mod checker;
pub mod client;
mod error;
pub mod harness;
pub mod history;
pub mod porcupine;
mod scenario;
mod scenarios;
mod soak;
pub mod timeline;

pub use error::LabError;
pub use scenario::Scenario;

use checker::{Findings, Verdict};
use clap::Args;
use history::History;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Exit codes of `lockedjob lab`.
pub const EXIT_AS_EXPECTED: i32 = 0;
pub const EXIT_UNEXPECTED: i32 = 1;
pub const EXIT_USAGE: i32 = crate::exit::USAGE;
pub const EXIT_UNAVAILABLE: i32 = crate::exit::UNAVAILABLE;

#[derive(Debug, Clone, Args)]
pub struct LabArgs {
    pub scenario: Scenario,
    /// How long the clients run under the fault.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Where report.json and timeline.svg go (a subdirectory per scenario with `all`).
    #[arg(long, default_value = "lab-out")]
    pub out: PathBuf,
    #[arg(long, default_value_t = 8)]
    pub clients: u32,
    /// Lock nodes (odd, at least 5: the scenarios fault up to two of them).
    #[arg(long, default_value_t = 5)]
    pub nodes: u32,
    /// Lock TTL in milliseconds; faults are timed in multiples of it.
    #[arg(long, default_value_t = 1000)]
    pub ttl_ms: u64,
    /// Run the lock nodes with TLS only, from tls.crt, tls.key and ca.crt in this directory
    /// (the certificate must name IP 127.0.0.1); clients verify them with ca.crt.
    #[arg(long)]
    pub tls_dir: Option<PathBuf>,
    /// Judge each run with this independent checker too (`scripts/porcupine-check.sh` builds
    /// it): porcupine, with models of the fenced store and of one holder at a time. A run is
    /// as expected only when both checkers reach a verdict the scenario expects.
    #[arg(long, env = "LOCKEDJOB_PORCUPINE_CHECK")]
    pub independent_checker: Option<PathBuf>,
    /// Run with a store that takes every write: a broken build, to show that both checkers
    /// object (the scenario's expected verdicts then do not hold).
    #[arg(long)]
    pub unfenced_store: bool,
    /// What the soak's fault schedule is drawn from: the same seed, the same schedule.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Serialize)]
struct Fencing {
    tokens_strictly_increasing: bool,
    writes: u64,
    stale_writes_refused: u64,
    stale_writes_accepted: usize,
    /// Writes an unfenced store would have taken from a superseded holder, each overwriting
    /// data a newer holder had written.
    unfenced_store_would_have_lost: u64,
    fenced_store_safe: bool,
}

#[derive(Debug, Serialize)]
struct Violations {
    overlaps: usize,
    past_deadline: usize,
    token_order: usize,
    no_validity: usize,
    stale_writes_accepted: usize,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    scenario: &'static str,
    description: String,
    parameters: &'a scenarios::Parameters,
    /// Each injected fault, as "{seconds from the start}s {what}".
    faults: Vec<String>,
    counts: checker::Counts,
    violations: Violations,
    fencing: Fencing,
    verdict: Verdict,
    expected: &'static [Verdict],
    as_expected: bool,
    /// The verdict of porcupine with the models of `tools/porcupine-check`, when it ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    independent_checker: Option<&'a porcupine::Independent>,
    findings: &'a Findings,
}

fn description(scenario: Scenario) -> String {
    use clap::ValueEnum as _;
    scenario
        .to_possible_value()
        .and_then(|v| v.get_help().map(|h| h.to_string()))
        .unwrap_or_default()
}

/// Runs the lab; returns the exit code.
pub fn run(args: LabArgs) -> i32 {
    if args.nodes < 5 || args.nodes.is_multiple_of(2) {
        eprintln!(
            "lockedjob lab: --nodes must be odd and at least 5 (got {})",
            args.nodes
        );
        return EXIT_USAGE;
    }
    if args.clients < 2 || args.seconds < 3 || args.ttl_ms < 200 {
        eprintln!("lockedjob lab: needs --clients >= 2, --seconds >= 3, --ttl-ms >= 200");
        return EXIT_USAGE;
    }
    let tls = match args.tls_dir.as_deref().map(node_tls).transpose() {
        Ok(tls) => tls,
        Err(message) => {
            eprintln!("lockedjob lab: {message}");
            return EXIT_USAGE;
        }
    };
    let scenarios: Vec<Scenario> = if args.scenario == Scenario::All {
        Scenario::EACH.to_vec()
    } else {
        vec![args.scenario]
    };
    scenarios::stop_on_signals();
    let mut code = EXIT_AS_EXPECTED;
    for scenario in scenarios {
        if scenarios::interrupted() {
            return EXIT_UNEXPECTED;
        }
        let out = if args.scenario == Scenario::All {
            args.out.join(scenario.name())
        } else {
            args.out.clone()
        };
        match run_one(scenario, &args, tls.as_ref(), &out) {
            Ok(_) if scenarios::interrupted() => return EXIT_UNEXPECTED,
            Ok(true) => {}
            Ok(false) => code = EXIT_UNEXPECTED,
            Err(e) => {
                eprintln!("lockedjob lab {}: {e}", scenario.name());
                return EXIT_UNAVAILABLE;
            }
        }
    }
    code
}

/// The lab's nodes' TLS from a directory laid out like a cert-manager Secret.
fn node_tls(dir: &Path) -> Result<harness::NodeTls, String> {
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        if !dir.join(file).is_file() {
            return Err(format!(
                "--tls-dir {}: {file} is missing (needs tls.crt, tls.key and ca.crt)",
                dir.display()
            ));
        }
    }
    Ok(harness::NodeTls {
        cert_file: dir.join("tls.crt"),
        key_file: dir.join("tls.key"),
        ca_file: dir.join("ca.crt"),
        require_client_cert: false,
        client: None,
        host: "127.0.0.1".into(),
    })
}

fn run_one(
    scenario: Scenario,
    args: &LabArgs,
    tls: Option<&harness::NodeTls>,
    out: &Path,
) -> Result<bool, LabError> {
    let mut parameters = scenarios::Parameters::for_scenario(
        scenario,
        args.clients,
        args.nodes,
        args.seconds,
        args.ttl_ms,
    );
    parameters.tls = tls.cloned();
    parameters.unfenced_store = args.unfenced_store;
    if scenario == Scenario::Soak {
        parameters.seed = args.seed;
        parameters.schedule = soak::schedule(
            args.seed,
            args.seconds,
            args.ttl_ms,
            args.nodes,
            parameters.restart_delay_ms,
        );
    }
    eprintln!(
        "lockedjob lab {}: {} clients, {} nodes, {} s, TTL {} ms ...",
        scenario.name(),
        args.clients,
        args.nodes,
        args.seconds,
        args.ttl_ms
    );
    let history = scenarios::run(scenario, &parameters)?;
    let findings = checker::check(&history);
    let verdict = findings.verdict();
    std::fs::create_dir_all(out).map_err(|e| LabError::Io("create the output directory", e))?;
    let independent = match &args.independent_checker {
        Some(checker) => Some(porcupine::check(checker, &history, out)?),
        None => None,
    };
    let as_expected = scenario.expected().contains(&verdict)
        && independent
            .as_ref()
            .is_none_or(|i| scenario.expected().contains(&i.verdict));
    if let Some(independent) = &independent {
        eprintln!(
            "lockedjob lab {}: independent checker (porcupine): fenced store {}, one holder at a time {}: verdict {:?}",
            scenario.name(),
            independent.fenced_store,
            independent.one_holder,
            independent.verdict
        );
    }
    write_outputs(
        scenario,
        &parameters,
        &history,
        &findings,
        independent.as_ref(),
        out,
    )?;
    eprintln!(
        "lockedjob lab {}: verdict {:?} ({}) — {} acquisitions, {} failed attempts, {} lease losses, {} overlaps, {} acts past a deadline, {} token-order violations, {} stale writes refused; {}",
        scenario.name(),
        verdict,
        if as_expected { "as expected" } else { "NOT as expected" },
        findings.counts.acquisitions,
        findings.counts.acquire_failures,
        findings.counts.lease_losses,
        findings.overlaps.len(),
        findings.past_deadline.len(),
        findings.token_order.len(),
        findings.stale_writes_rejected(),
        out.display()
    );
    Ok(as_expected)
}

fn write_outputs(
    scenario: Scenario,
    parameters: &scenarios::Parameters,
    history: &History,
    findings: &Findings,
    independent: Option<&porcupine::Independent>,
    out: &Path,
) -> Result<(), LabError> {
    let verdict = findings.verdict();
    let report = Report {
        scenario: scenario.name(),
        description: description(scenario),
        parameters,
        faults: history
            .faults
            .iter()
            .map(|f| format!("{:.3}s {}", f.at_us as f64 / 1e6, f.label))
            .collect(),
        counts: findings.counts,
        violations: Violations {
            overlaps: findings.overlaps.len(),
            past_deadline: findings.past_deadline.len(),
            token_order: findings.token_order.len(),
            no_validity: findings.no_validity.len(),
            stale_writes_accepted: findings.stale_writes_accepted.len(),
        },
        fencing: Fencing {
            tokens_strictly_increasing: findings.token_order.is_empty(),
            writes: findings.counts.writes,
            stale_writes_refused: findings.stale_writes_rejected(),
            stale_writes_accepted: findings.stale_writes_accepted.len(),
            unfenced_store_would_have_lost: findings.stale_writes_rejected(),
            fenced_store_safe: findings.stale_writes_accepted.is_empty()
                && findings.token_order.is_empty(),
        },
        verdict,
        expected: scenario.expected(),
        as_expected: scenario.expected().contains(&verdict)
            && independent.is_none_or(|i| scenario.expected().contains(&i.verdict)),
        independent_checker: independent,
        findings,
    };
    let json = serde_json::to_string_pretty(&report)
        .map_err(|e| LabError::Io("encode the report", std::io::Error::other(e)))?;
    std::fs::write(out.join("report.json"), json + "\n")
        .map_err(|e| LabError::Io("write report.json", e))?;
    let history_json = serde_json::to_string(history)
        .map_err(|e| LabError::Io("encode the history", std::io::Error::other(e)))?;
    std::fs::write(out.join("history.json"), history_json)
        .map_err(|e| LabError::Io("write history.json", e))?;
    let title = format!(
        "lockedjob lab: {} ({} clients, {} nodes, TTL {} ms)",
        scenario.name(),
        parameters.clients,
        parameters.nodes,
        parameters.ttl_ms
    );
    std::fs::write(
        out.join("timeline.svg"),
        timeline::render(&title, history, findings),
    )
    .map_err(|e| LabError::Io("write timeline.svg", e))?;
    Ok(())
}
