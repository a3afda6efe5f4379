//! `lockedjob backfill NAME --from T1 --to T2`: asks the operators to run the scheduled times
//! of a past range once each, by setting the `lockedjob.dev/backfill` annotation; `--cancel`
//! removes it; with neither, shows the backfill's progress from the LockedJob's status.

use crate::api::{BackfillStatus, LockedJob, ANNOTATION_BACKFILL};
use crate::exit;
use crate::schedule::{BackfillRange, Schedule};
use jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

/// Exit code when the cluster cannot be reached or refuses the change.

#[derive(Debug, clap::Args)]
pub struct BackfillArgs {
    /// The LockedJob (kubeconfig as kubectl finds it).
    pub name: String,
    /// First time of the range, RFC 3339 (included), e.g. 2026-12-01T00:00:00Z.
    #[arg(long, requires = "to", conflicts_with = "cancel")]
    pub from: Option<Timestamp>,
    /// Last time of the range, RFC 3339 (included); must be in the past.
    #[arg(long, requires = "from", conflicts_with = "cancel")]
    pub to: Option<Timestamp>,
    /// Stop the backfill: nothing more starts; a run already started finishes.
    #[arg(long)]
    pub cancel: bool,
    /// Namespace of the LockedJob (default: the kubeconfig context's).
    #[arg(long)]
    pub namespace: Option<String>,
}

/// One line for a backfill's status.
pub fn describe(status: &BackfillStatus) -> String {
    let last = status
        .last_time
        .as_ref()
        .map_or("none yet".to_string(), |t| t.0.to_string());
    format!(
        "backfill {}: {:?}, {} of {} started, {} remaining (last started: {last})",
        status.range().annotation(),
        status.phase,
        status.started,
        status.total,
        status.remaining
    )
}

pub async fn run(args: BackfillArgs) -> i32 {
    match execute(args).await {
        Ok(message) => {
            println!("{message}");
            0
        }
        Err((code, message)) => {
            eprintln!("lockedjob backfill: {message}");
            code
        }
    }
}

async fn execute(args: BackfillArgs) -> Result<String, (i32, String)> {
    let unavailable = |message: String| (exit::UNAVAILABLE, message);
    let client = kube::Client::try_default()
        .await
        .map_err(|e| unavailable(format!("no cluster to reach: {e}")))?;
    let api: Api<LockedJob> = match &args.namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::default_namespaced(client),
    };
    let name = &args.name;
    let lj = api
        .get_opt(name)
        .await
        .map_err(|e| unavailable(format!("cannot read LockedJob {name}: {e}")))?
        .ok_or_else(|| {
            (
                exit::USAGE,
                format!("no LockedJob {name:?} in that namespace"),
            )
        })?;
    let status = lj.status.as_ref().and_then(|s| s.backfill.as_ref());
    let value = match (args.from, args.to, args.cancel) {
        (Some(from), Some(to), false) => {
            let schedule = Schedule::parse(&lj.spec.schedule, lj.spec.time_zone.as_deref())
                .map_err(|e| (exit::USAGE, format!("LockedJob {name}: {e}")))?;
            let value = BackfillRange { from, to }.annotation();
            let range = BackfillRange::parse(&value, &schedule, Timestamp::now())
                .map_err(|message| (exit::USAGE, message))?;
            Some((value, range.count(&schedule)))
        }
        (None, None, true) => None,
        (None, None, false) => {
            return Ok(status.map_or(
                format!("LockedJob {name} has no backfill; start one with --from and --to"),
                describe,
            ))
        }
        _ => {
            return Err((
                exit::USAGE,
                "give --from and --to together, or --cancel".into(),
            ))
        }
    };
    let annotation = value.as_ref().map(|(v, _)| v.clone());
    let patch = json!({"metadata": {"annotations": {ANNOTATION_BACKFILL: annotation}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(|e| unavailable(format!("cannot annotate LockedJob {name}: {e}")))?;
    Ok(match value {
        Some((value, count)) => format!(
            "backfill {value} requested: {count} scheduled times, run once each across replicas and clusters sharing the lock; follow it with lockedjob backfill {name}"
        ),
        None => format!("backfill of LockedJob {name} cancelled; a run already started finishes"),
    })
}
