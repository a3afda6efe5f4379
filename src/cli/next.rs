//! `lockedjob next SCHEDULE-OR-NAME`: the next scheduled times of a cron expression, or of a
//! LockedJob in the cluster, for checking an expression before applying it.

use crate::api::LockedJob;
use crate::exit;
use crate::schedule::Schedule;
use jiff::Timestamp;
use kube::api::Api;

#[derive(Debug, clap::Args)]
pub struct NextArgs {
    /// A cron expression ("*/15 * * * *", "@daily"; quote it) or the name of a LockedJob to
    /// read from the cluster (kubeconfig as kubectl finds it).
    pub schedule_or_name: String,
    /// IANA time zone of a cron expression, e.g. Europe/Berlin (a LockedJob uses its own).
    #[arg(long, default_value = "UTC")]
    pub time_zone: String,
    /// How many times to print.
    #[arg(short = 'n', long, default_value_t = 5)]
    pub count: usize,
    /// Count from this RFC 3339 time instead of now.
    #[arg(long)]
    pub after: Option<Timestamp>,
    /// Namespace of the LockedJob (default: the kubeconfig context's).
    #[arg(long)]
    pub namespace: Option<String>,
}

/// A cron expression has fields separated by spaces or is a macro; a Kubernetes name has
/// neither.
pub fn is_expression(text: &str) -> bool {
    let text = text.trim();
    text.starts_with('@') || text.contains(char::is_whitespace)
}

/// The first `count` scheduled times strictly after `after`.
pub fn upcoming(schedule: &Schedule, after: Timestamp, count: usize) -> Vec<Timestamp> {
    schedule.times_after(after).take(count).collect()
}

/// One line a time: in the schedule's zone, and in UTC when that differs.
pub fn render(schedule: &Schedule, times: &[Timestamp]) -> String {
    let zone = schedule.time_zone();
    times
        .iter()
        .map(|t| match jiff::tz::db().get(zone) {
            Ok(tz) if zone != "UTC" => format!(
                "{}  ({t})\n",
                t.to_zoned(tz).strftime("%Y-%m-%dT%H:%M:%S%:z %Z")
            ),
            _ => format!("{t}\n"),
        })
        .collect()
}

pub async fn run(args: NextArgs) -> i32 {
    let parsed = if is_expression(&args.schedule_or_name) {
        Schedule::parse(&args.schedule_or_name, Some(&args.time_zone)).map_err(|e| e.to_string())
    } else {
        from_cluster(&args.schedule_or_name, args.namespace.as_deref()).await
    };
    let schedule = match parsed {
        Ok(schedule) => schedule,
        Err(message) => {
            eprintln!("lockedjob next: {message}");
            return exit::USAGE;
        }
    };
    let times = upcoming(
        &schedule,
        args.after.unwrap_or_else(Timestamp::now),
        args.count,
    );
    if times.is_empty() {
        eprintln!("lockedjob next: the schedule has no future time");
        return 1;
    }
    print!("{}", render(&schedule, &times));
    0
}

/// The schedule of LockedJob `name`, with its own time zone.
async fn from_cluster(name: &str, namespace: Option<&str>) -> Result<Schedule, String> {
    let client = kube::Client::try_default().await.map_err(|e| {
        format!("{name:?} is no cron expression (those have spaces or start with @), and no cluster to look it up as a LockedJob: {e}")
    })?;
    let api: Api<LockedJob> = match namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::default_namespaced(client),
    };
    let lj = api
        .get_opt(name)
        .await
        .map_err(|e| format!("cannot read LockedJob {name}: {e}"))?
        .ok_or_else(|| format!("no LockedJob {name:?} in that namespace; for a cron expression, quote all its fields (\"*/5 * * * *\")"))?;
    Schedule::parse(&lj.spec.schedule, lj.spec.time_zone.as_deref())
        .map_err(|e| format!("LockedJob {name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn expressions_and_names_are_told_apart() {
        for (text, expression) in [
            ("*/5 * * * *", true),
            ("@daily", true),
            ("0 0 * * * *", true),
            ("nightly-report", false),
            ("report", false),
        ] {
            assert_eq!(is_expression(text), expression, "{text}");
        }
    }

    #[test]
    fn upcoming_times_follow_the_zone_and_its_clock_changes() {
        let table = [
            (
                "every 15 minutes, UTC",
                "*/15 * * * *",
                "UTC",
                "2026-03-01T10:07:00Z",
                vec!["2026-03-01T10:15:00Z", "2026-03-01T10:30:00Z"],
            ),
            (
                "02:30 Berlin: on the spring-forward day it does not exist, the run is right after the gap",
                "30 2 * * *",
                "Europe/Berlin",
                "2026-03-28T00:00:00Z",
                vec!["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"],
            ),
            (
                "a yearly macro",
                "@yearly",
                "UTC",
                "2026-06-01T00:00:00Z",
                vec!["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"],
            ),
        ];
        for (what, expression, zone, after, expected) in table {
            let schedule = Schedule::parse(expression, Some(zone)).expect("valid");
            let got: Vec<String> = upcoming(&schedule, ts(after), expected.len())
                .iter()
                .map(Timestamp::to_string)
                .collect();
            assert_eq!(got, expected, "{what}");
        }
    }

    #[test]
    fn times_are_shown_in_the_zone_and_in_utc() {
        let schedule = Schedule::parse("0 9 * * *", Some("Europe/Berlin")).expect("valid");
        let times = upcoming(&schedule, ts("2026-12-03T12:00:00Z"), 1);
        assert_eq!(
            render(&schedule, &times),
            "2026-12-04T09:00:00+01:00 CET  (2026-12-04T08:00:00Z)\n"
        );
        let utc = Schedule::parse("0 9 * * *", None).expect("valid");
        let times = upcoming(&utc, ts("2026-12-03T12:00:00Z"), 1);
        assert_eq!(render(&utc, &times), "2026-12-04T09:00:00Z\n");
    }
}
