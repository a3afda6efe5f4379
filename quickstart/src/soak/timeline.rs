//! The soak as a picture (`timeline.svg`): a lane per lock with each run as a bar from entry to
//! exit (east blue, west green, a run that overlapped another red), a lane for the leader's
//! writes (a tick per accepted write, red when refused), and a lane per fault kind with each
//! fault from its start to its heal. Pure: what the soak saw in, SVG text out.

use super::faults::Executed;
use super::leader;
use super::store::StoreWrite;
use super::workload::Run;
use std::fmt::Write;

const WIDTH: f64 = 1600.0;
const LEFT: f64 = 130.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const LANE: f64 = 22.0;
const GAP: f64 = 6.0;
const RED: &str = "#d32f2f";

struct Scale {
    from: f64,
    to: f64,
}

impl Scale {
    fn x(&self, seconds: f64) -> f64 {
        let share = ((seconds - self.from) / (self.to - self.from).max(1.0)).clamp(0.0, 1.0);
        LEFT + share * (WIDTH - LEFT - RIGHT)
    }
}

fn lane_y(lane: usize) -> f64 {
    TOP + lane as f64 * (LANE + GAP)
}

fn colour(cluster: &str) -> &'static str {
    match cluster {
        "east" => "#1e88e5",
        _ => "#43a047",
    }
}

/// `locks` in lane order; `overlapping` the pods of runs that overlapped another.
pub fn render(
    title: &str,
    locks: &[String],
    runs: &[Run],
    writes: &[StoreWrite],
    faults: &[Executed],
    overlapping: &[String],
) -> String {
    let times = runs
        .iter()
        .map(|r| r.enter)
        .chain(runs.iter().filter_map(|r| r.exit))
        .chain(faults.iter().flat_map(|f| <[f64; 2]>::from(f.window())));
    let (from, to) = times.fold((f64::MAX, f64::MIN), |(a, b), t| (a.min(t), b.max(t)));
    let scale = Scale { from, to };
    let mut kinds: Vec<&str> = faults.iter().map(|f| f.kind).collect();
    kinds.sort();
    kinds.dedup();
    let lanes = locks.len() + 1 + kinds.len();
    let height = lane_y(lanes) + 30.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="10" y="20" font-size="14">{}</text>"#,
        escape(title)
    );
    for (lane, lock) in locks.iter().enumerate() {
        label(&mut svg, lane, lock);
        for run in runs.iter().filter(|r| &r.lock == lock) {
            let Some(exit) = run.exit else { continue };
            let fill = if overlapping.contains(&run.pod) {
                RED
            } else {
                colour(&run.cluster)
            };
            let (x, end) = (scale.x(run.enter), scale.x(exit));
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{LANE}" fill="{fill}"><title>{} {} token {} ({})</title></rect>"#,
                lane_y(lane),
                (end - x).max(1.0),
                escape(&run.scheduled),
                run.kind.name(),
                run.token,
                escape(&run.pod)
            );
        }
    }
    let leader_lane = locks.len();
    label(&mut svg, leader_lane, leader::LOCK);
    for write in writes.iter().filter(|w| w.lock == leader::LOCK) {
        let x = scale.x(write.call_us as f64 / 1e6);
        let stroke = if write.accepted { "#555" } else { RED };
        let y = lane_y(leader_lane);
        let _ = writeln!(
            svg,
            r#"<line x1="{x:.1}" y1="{y:.1}" x2="{x:.1}" y2="{:.1}" stroke="{stroke}"/>"#,
            y + LANE
        );
    }
    for (offset, kind) in kinds.iter().enumerate() {
        let lane = leader_lane + 1 + offset;
        label(&mut svg, lane, kind);
        for fault in faults.iter().filter(|f| f.kind == *kind && f.hit) {
            let (start, healed) = fault.window();
            let (x, end) = (scale.x(start), scale.x(healed));
            let fill = if fault.outside_the_model {
                "#fb8c00"
            } else {
                "#8e24aa"
            };
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{LANE}" fill="{fill}" opacity="0.7"><title>fault {}: {}</title></rect>"#,
                lane_y(lane),
                (end - x).max(2.0),
                fault.index,
                escape(&fault.target)
            );
        }
    }
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{:.1}">{:.0} s; runs: east blue, west green, overlapping red; faults: inside the model purple, outside orange</text>"#,
        height - 10.0,
        to - from
    );
    svg.push_str("</svg>\n");
    svg
}

fn label(svg: &mut String, lane: usize, text: &str) {
    let _ = writeln!(
        svg,
        r#"<text x="10" y="{:.1}">{}</text>"#,
        lane_y(lane) + LANE * 0.7,
        escape(text)
    );
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::workload::RunKind;

    fn run(pod: &str, cluster: &str, enter: f64, exit: Option<f64>) -> Run {
        Run {
            cluster: cluster.into(),
            pod: pod.into(),
            kind: RunKind::Scheduled,
            lock: "soak-forbid".into(),
            scheduled: "2026-12-06T10:00:00Z".into(),
            token: 1,
            holder: "east/r".into(),
            enter,
            exit,
        }
    }

    #[test]
    fn each_ended_run_and_each_fault_that_hit_is_drawn_and_overlaps_are_red() {
        let runs = [
            run("a", "east", 100.0, Some(103.0)),
            run("b", "west", 102.0, Some(105.0)),
            run("gone", "east", 110.0, None),
        ];
        let fault = |hit| Executed {
            index: 0,
            kind: "kill-node",
            outside_the_model: false,
            hit,
            target: "redis node <1>".into(),
            started_us: 101_000_000,
            healed_us: 104_000_000,
        };
        let svg = render(
            "seed 1",
            &["soak-forbid".to_string()],
            &runs,
            &[],
            &[fault(true), fault(false)],
            &["a".to_string(), "b".to_string()],
        );
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(
            svg.matches("<rect").count(),
            3,
            "2 runs with an end, 1 fault that hit"
        );
        assert_eq!(svg.matches(RED).count(), 2, "both overlapping runs are red");
        assert!(svg.contains("redis node &lt;1&gt;"), "text is escaped");
    }
}
