//! `lockedjob status LOCK`: who holds a lock and what every node stores for it, like
//! `etcdctl lock` users read with `etcdctl get --prefix`. Reads only.

use crate::exit;
use crate::options::RedisOptions;
use crate::redlock::{LockView, Redlock};
use jiff::Timestamp;
use std::fmt::Write as _;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub redis: RedisOptions,
    /// The lock name: a LockedJob's spec.lock.name (default NAMESPACE/NAME) or exec's --lock.
    pub lock: String,
    /// Output format; json is one object, for scripts.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Prints the lock and returns the exit code: 0 when a quorum answered, 69 when not.
pub async fn run(args: StatusArgs) -> i32 {
    if args.lock.trim().is_empty() {
        eprintln!("lockedjob status: LOCK must name the lock");
        return exit::USAGE;
    }
    let engine = match Redlock::new(args.redis.engine_config()) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("lockedjob status: {e}");
            return exit::USAGE;
        }
    };
    let view = engine.inspect(&args.lock).await;
    match args.output {
        Output::Table => print!("{}", table(&view)),
        Output::Json => match serde_json::to_string_pretty(&view) {
            Ok(json) => println!("{json}"),
            Err(e) => {
                eprintln!("lockedjob status: cannot write JSON: {e}");
                return 1;
            }
        },
    }
    if view.answered < view.quorum {
        exit::UNAVAILABLE
    } else {
        0
    }
}

/// A summary line, then one row per node.
pub fn table(view: &LockView) -> String {
    let mut out = String::new();
    let nodes = view.nodes.len();
    let _ = match (&view.holder, view.answered >= view.quorum) {
        (_, false) => writeln!(
            out,
            "lock {}: unknown, only {} of {nodes} nodes answer (quorum {})",
            view.lock, view.answered, view.quorum
        ),
        (Some(holder), true) => writeln!(
            out,
            "lock {}: held by {holder} on {} of {nodes} nodes (quorum {}), token {}",
            view.lock,
            view.held_on,
            view.quorum,
            register(view.token)
        ),
        (None, true) if view.held_on > 0 => writeln!(
            out,
            "lock {}: not held (the most common value is on {} of {nodes} nodes, quorum {}), last token {}",
            view.lock,
            view.held_on,
            view.quorum,
            register(view.token)
        ),
        (None, true) => writeln!(
            out,
            "lock {}: free, last token {}",
            view.lock,
            register(view.token)
        ),
    };
    if let Some(progress) = view.progress {
        let _ = writeln!(out, "progress: {}", with_time(progress));
    }
    let mut rows = vec![[
        "NODE".to_string(),
        "HOLDER".to_string(),
        "TTL".to_string(),
        "FENCE".to_string(),
        "PROGRESS".to_string(),
    ]];
    for node in &view.nodes {
        rows.push(match &node.error {
            Some(error) => [
                node.node.clone(),
                format!("(no answer: {error})"),
                String::new(),
                String::new(),
                String::new(),
            ],
            None => [
                node.node.clone(),
                node.holder().unwrap_or("-").to_string(),
                node.ttl_ms
                    .map_or("-".into(), |ms| format!("{:.1}s", ms as f64 / 1000.0)),
                register(node.fence),
                node.progress.map_or("-".into(), |p| p.to_string()),
            ],
        });
    }
    let widths: Vec<usize> = (0..5)
        .map(|column| rows.iter().map(|r| r[column].len()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

fn register(value: Option<u64>) -> String {
    value.map_or("-".into(), |v| v.to_string())
}

/// A progress value, and the time it names when it is one (LockedJobs store the scheduled
/// time in unix milliseconds).
fn with_time(progress: u64) -> String {
    match i64::try_from(progress)
        .ok()
        .and_then(|ms| Timestamp::from_millisecond(ms).ok())
    {
        Some(t) if progress >= 1_000_000_000_000 => format!("{progress} ({t})"),
        _ => progress.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redlock::NodeView;

    fn node(label: &str, value: Option<&str>, fence: Option<u64>) -> NodeView {
        NodeView {
            node: label.into(),
            error: None,
            value: value.map(str::to_string),
            ttl_ms: value.map(|_| 12_345),
            fence,
            progress: Some(1_767_225_600_000),
        }
    }

    #[test]
    fn the_table_says_who_holds_the_lock_and_what_each_node_stores() {
        let held = LockView::new(
            "team-a/report",
            2,
            vec![
                node("redis://a:6379/0", Some("east/r1/x"), Some(7)),
                node("redis://b:6379/0", Some("east/r1/x"), Some(7)),
                NodeView::failed("redis://c:6379/0".into(), "timed out".into()),
            ],
        );
        let text = table(&held);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "lock team-a/report: held by east/r1 on 2 of 3 nodes (quorum 2), token 7"
        );
        assert_eq!(lines[1], "progress: 1767225600000 (2026-01-01T00:00:00Z)");
        assert!(
            lines[2].starts_with("NODE") && lines[2].contains("FENCE"),
            "{text}"
        );
        assert!(
            lines[3].contains("east/r1") && lines[3].contains("12.3s"),
            "{text}"
        );
        assert!(lines[5].contains("(no answer: timed out)"), "{text}");

        let free = LockView::new(
            "x",
            2,
            vec![node("a", None, Some(3)), node("b", None, Some(3))],
        );
        assert!(table(&free).starts_with("lock x: free, last token 3\n"));
        let lost = LockView::new(
            "x",
            2,
            vec![
                NodeView::failed("a".into(), "refused".into()),
                NodeView::failed("b".into(), "refused".into()),
            ],
        );
        assert!(table(&lost).starts_with("lock x: unknown, only 0 of 2 nodes answer (quorum 2)"));
    }
}
