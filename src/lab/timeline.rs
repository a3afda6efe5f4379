//! Draws a lab history as an SVG timeline: a lane per client (lease held, critical section,
//! writes to the fenced store) and a lane per Redis node (up, down, paused, skewed, slow, cut
//! off), faults as dashed lines, violations in red. Pure: history and findings in, text out.

use super::checker::{sections, Findings, Verdict};
use super::history::{ClientOp, History, NodeState};
use std::collections::HashMap;
use std::fmt::Write;

const WIDTH: f64 = 1200.0;
const LEFT: f64 = 120.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 96.0;
const LANE: f64 = 24.0;
const GAP: f64 = 6.0;

const VIOLATION: &str = "#d32f2f";

struct Scale {
    end_us: f64,
}

impl Scale {
    fn x(&self, at_us: u64) -> f64 {
        LEFT + (at_us as f64 / self.end_us).min(1.0) * (WIDTH - LEFT - RIGHT)
    }
}

fn lane_y(lane: usize) -> f64 {
    TOP + lane as f64 * (LANE + GAP)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A lease as the client held it: from grant to release, loss or deadline, whichever first.
struct Holding {
    client: u32,
    token: u64,
    from_us: u64,
    to_us: u64,
    lost: bool,
}

fn holdings(history: &History) -> Vec<Holding> {
    let mut open: HashMap<(u32, u64), (u64, u64)> = HashMap::new(); // -> (from, deadline)
    let mut out = Vec::new();
    for e in &history.events {
        match &e.op {
            ClientOp::Acquired {
                token, deadline_us, ..
            } => {
                open.insert((e.client, *token), (e.at_us, *deadline_us));
            }
            ClientOp::Extended { token, deadline_us } => {
                if let Some(entry) = open.get_mut(&(e.client, *token)) {
                    entry.1 = entry.1.max(*deadline_us);
                }
            }
            ClientOp::Released { token } | ClientOp::LeaseLost { token } => {
                if let Some((from_us, deadline)) = open.remove(&(e.client, *token)) {
                    out.push(Holding {
                        client: e.client,
                        token: *token,
                        from_us,
                        to_us: e.at_us.min(deadline),
                        lost: matches!(e.op, ClientOp::LeaseLost { .. }),
                    });
                }
            }
            _ => {}
        }
    }
    for ((client, token), (from_us, deadline)) in open {
        out.push(Holding {
            client,
            token,
            from_us,
            to_us: deadline.min(history.end_us),
            lost: false,
        });
    }
    out
}

fn node_style(state: NodeState) -> (&'static str, String) {
    match state {
        NodeState::Up => ("#c8e6c9", String::new()),
        NodeState::Down => ("#757575", "down".into()),
        NodeState::Paused => ("#ffb74d", "paused".into()),
        NodeState::Skewed { offset_ms } => ("#ce93d8", format!("clock +{}s", offset_ms / 1000)),
        NodeState::Slow { delay_ms } => ("#fff176", format!("+{delay_ms} ms each way")),
        NodeState::Partitioned => ("#90a4ae", "cut off".into()),
        NodeState::Emptied => ("#80deea", "restarted empty".into()),
    }
}

/// The SVG document for `history`, titled with `title`.
pub fn render(title: &str, history: &History, findings: &Findings) -> String {
    let scale = Scale {
        end_us: history.end_us.max(1) as f64,
    };
    let lanes = (history.clients + history.nodes) as usize;
    let legend_y = lane_y(lanes) + 16.0;
    let height = legend_y + 66.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let verdict = findings.verdict();
    let verdict_color = match verdict {
        Verdict::Safe => "#2e7d32",
        Verdict::Fenced => "#ef6c00",
        Verdict::Unsafe => VIOLATION,
    };
    let _ = writeln!(
        svg,
        r#"<text x="10" y="20" font-size="15" font-weight="bold">{}</text><text x="10" y="38" fill="{verdict_color}" font-weight="bold">verdict: {:?} — {} overlaps, {} acts past a lease deadline, {} token-order violations, {} stale writes refused by the fenced store</text>"#,
        escape(title),
        verdict,
        findings.overlaps.len(),
        findings.past_deadline.len(),
        findings.token_order.len(),
        findings.stale_writes_rejected()
    );
    // Time axis: a tick per second (or coarser for long runs).
    let seconds = (history.end_us / 1_000_000).max(1);
    let step = [1, 2, 5, 10, 30, 60]
        .into_iter()
        .find(|s| seconds / s <= 20)
        .unwrap_or(120);
    for s in (0..=seconds).step_by(step as usize) {
        let x = scale.x(s * 1_000_000);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{}" stroke="#eeeeee"/><text x="{x:.1}" y="{}" text-anchor="middle" fill="#616161">{s}s</text>"##,
            TOP - 6.0,
            lane_y(lanes),
            TOP - 10.0
        );
    }
    // Lanes.
    for c in 0..history.clients {
        let y = lane_y(c as usize);
        let _ = writeln!(
            svg,
            r##"<text x="10" y="{:.1}" class="lane">client {c}</text><rect x="{LEFT}" y="{y:.1}" width="{:.1}" height="{LANE}" fill="#fafafa"/>"##,
            y + LANE * 0.65,
            WIDTH - LEFT - RIGHT
        );
    }
    for n in 0..history.nodes {
        let y = lane_y((history.clients + n) as usize);
        let _ = writeln!(
            svg,
            r#"<text x="10" y="{:.1}" class="lane">redis {n}</text>"#,
            y + LANE * 0.65
        );
        let mut states: Vec<_> = history
            .node_events
            .iter()
            .filter(|e| e.node == n)
            .map(|e| (e.at_us, e.state))
            .collect();
        if states.first().is_none_or(|(at, _)| *at > 0) {
            states.insert(0, (0, NodeState::Up));
        }
        for (i, (from, state)) in states.iter().enumerate() {
            let to = states.get(i + 1).map_or(history.end_us, |(t, _)| *t);
            let (fill, label) = node_style(*state);
            let (x1, x2) = (scale.x(*from), scale.x(to));
            let _ = writeln!(
                svg,
                r#"<rect x="{x1:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{fill}"><title>redis {n}: {} from {:.3}s</title></rect>"#,
                y + 4.0,
                (x2 - x1).max(0.5),
                LANE - 8.0,
                if label.is_empty() { "up" } else { &label },
                *from as f64 / 1e6
            );
            if !label.is_empty() && x2 - x1 > 40.0 {
                let _ = writeln!(
                    svg,
                    r#"<text x="{:.1}" y="{:.1}" font-size="10">{label}</text>"#,
                    x1 + 3.0,
                    y + LANE * 0.65
                );
            }
        }
    }
    // Leases held and critical sections.
    for h in holdings(history) {
        let y = lane_y(h.client as usize);
        let (x1, x2) = (scale.x(h.from_us), scale.x(h.to_us));
        let _ = writeln!(
            svg,
            r##"<rect x="{x1:.1}" y="{y:.1}" width="{:.1}" height="{LANE}" fill="#bbdefb" stroke="#64b5f6"><title>client {} lease, token {}{}</title></rect>"##,
            (x2 - x1).max(0.5),
            h.client,
            h.token,
            if h.lost { ", lost" } else { "" }
        );
        if x2 - x1 > 24.0 {
            let _ = writeln!(
                svg,
                r##"<text x="{:.1}" y="{:.1}" font-size="9" fill="#0d47a1">#{}</text>"##,
                x1 + 2.0,
                y + 9.0,
                h.token
            );
        }
        if h.lost {
            let _ = writeln!(
                svg,
                r##"<path d="M{x2:.1},{y:.1} l4,-6 h-8 z" fill="#ef6c00"><title>lease lost (watchdog)</title></path>"##
            );
        }
    }
    for section in sections(history) {
        let y = lane_y(section.client as usize);
        let (x1, x2) = (scale.x(section.start_us), scale.x(section.end_us));
        let _ = writeln!(
            svg,
            r##"<rect x="{x1:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#1565c0"><title>client {} in the critical section, token {}</title></rect>"##,
            y + 11.0,
            (x2 - x1).max(0.5),
            LANE - 17.0,
            section.client,
            section.token
        );
    }
    for e in &history.events {
        let ClientOp::Write { token, accepted } = e.op else {
            continue;
        };
        let y = lane_y(e.client as usize);
        let x = scale.x(e.at_us);
        let (color, top) = if accepted {
            ("#1b5e20", y + LANE - 6.0)
        } else {
            (VIOLATION, y - 4.0)
        };
        let _ = writeln!(
            svg,
            r#"<line x1="{x:.1}" y1="{top:.1}" x2="{x:.1}" y2="{:.1}" stroke="{color}" stroke-width="1.5"><title>write with token {token}: {}</title></line>"#,
            y + LANE,
            if accepted {
                "accepted"
            } else {
                "refused by the fenced store"
            }
        );
    }
    // Faults.
    for (i, f) in history.faults.iter().enumerate() {
        let x = scale.x(f.at_us);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#6a1b9a" stroke-dasharray="4,3"/><text x="{:.1}" y="{:.1}" fill="#6a1b9a" font-size="10">{}</text>"##,
            TOP - 4.0,
            lane_y(lanes),
            x + 2.0,
            58.0 + (i % 3) as f64 * 10.0,
            escape(&f.label)
        );
    }
    // Violations, over everything else.
    for o in &findings.overlaps {
        for c in [o.first.client, o.second.client] {
            let (x1, x2) = (scale.x(o.from_us), scale.x(o.to_us));
            let _ = writeln!(
                svg,
                r#"<rect x="{x1:.1}" y="{:.1}" width="{:.1}" height="{LANE}" fill="{VIOLATION}" fill-opacity="0.35" stroke="{VIOLATION}" stroke-width="2"><title>overlap: clients {} (token {}) and {} (token {})</title></rect>"#,
                lane_y(c as usize),
                (x2 - x1).max(2.0),
                o.first.client,
                o.first.token,
                o.second.client,
                o.second.token
            );
        }
    }
    for p in &findings.past_deadline {
        let x = scale.x(p.at_us);
        let y = lane_y(p.client as usize);
        let _ = writeln!(
            svg,
            r#"<circle cx="{x:.1}" cy="{:.1}" r="4" fill="{VIOLATION}"><title>client {} {:?} {:.0} ms after its lease (token {}) ended</title></circle>"#,
            y + LANE / 2.0,
            p.client,
            p.act,
            (p.at_us.saturating_sub(p.deadline_us)) as f64 / 1000.0,
            p.token
        );
    }
    for t in &findings.token_order {
        let x = scale.x(t.at_us);
        let y = lane_y(t.later_client as usize);
        let _ = writeln!(
            svg,
            r#"<text x="{x:.1}" y="{:.1}" fill="{VIOLATION}" font-weight="bold">token {} ≤ {}</text>"#,
            y - 2.0,
            t.later_token,
            t.earlier_token
        );
    }
    legend(&mut svg, legend_y);
    svg.push_str("</svg>\n");
    svg
}

fn legend(svg: &mut String, y: f64) {
    let items = [
        ("#bbdefb", "lease held"),
        ("#1565c0", "critical section"),
        ("#1b5e20", "write accepted"),
        ("#ef6c00", "lease lost"),
        (VIOLATION, "violation / write refused"),
        ("#c8e6c9", "node up"),
        ("#757575", "down"),
        ("#ffb74d", "paused"),
        ("#ce93d8", "clock moved"),
        ("#fff176", "slow"),
        ("#90a4ae", "cut off"),
        ("#80deea", "restarted empty"),
    ];
    // Client items on the first row, node states on the second.
    for (row, row_items) in [&items[..5], &items[5..]].into_iter().enumerate() {
        let y = y + row as f64 * 18.0;
        let mut x = LEFT;
        for (color, label) in row_items {
            let _ = writeln!(
                svg,
                r#"<rect x="{x:.1}" y="{y:.1}" width="12" height="12" fill="{color}"/><text x="{:.1}" y="{:.1}">{label}</text>"#,
                x + 16.0,
                y + 10.0
            );
            x += 30.0 + label.len() as f64 * 6.5;
        }
    }
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="{:.1}" fill="#616161">dashed lines: injected faults. Times from the start of the run (monotonic clock).</text>"##,
        y + 50.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::checker::check;
    use crate::lab::history::{Fault, NodeEvent};

    use crate::lab::history::event_at_ms as ev;

    fn sample(overlapping: bool) -> History {
        let second_start = if overlapping { 500 } else { 1500 };
        let mut events = vec![
            ev(
                0,
                0,
                ClientOp::Acquired {
                    token: 1,
                    validity_ms: 2000,
                    deadline_us: 2_000_000,
                },
            ),
            ev(10, 0, ClientOp::Enter { token: 1 }),
            ev(
                900,
                0,
                ClientOp::Write {
                    token: 1,
                    accepted: true,
                },
            ),
            ev(1000, 0, ClientOp::Exit { token: 1 }),
            ev(1000, 0, ClientOp::Released { token: 1 }),
            ev(
                second_start,
                1,
                ClientOp::Acquired {
                    token: 2,
                    validity_ms: 2000,
                    deadline_us: (second_start + 2000) * 1000,
                },
            ),
            ev(second_start + 10, 1, ClientOp::Enter { token: 2 }),
            ev(second_start + 100, 1, ClientOp::Exit { token: 2 }),
        ];
        events.sort_by_key(|e| e.at_us);
        History {
            clients: 2,
            nodes: 3,
            end_us: 3_000_000,
            events,
            node_events: vec![NodeEvent {
                at_us: 200_000,
                node: 1,
                state: NodeState::Down,
            }],
            faults: vec![Fault {
                at_us: 200_000,
                label: "kill -9 redis 1".into(),
            }],
            store_log: Vec::new(),
        }
    }

    fn count(haystack: &str, needle: &str) -> usize {
        haystack.matches(needle).count()
    }

    #[test]
    fn draws_a_lane_per_client_and_node_and_each_fault() {
        let h = sample(false);
        let svg = render("baseline <test>", &h, &check(&h));
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(count(&svg, "class=\"lane\">client "), 2, "client lanes");
        assert_eq!(count(&svg, "class=\"lane\">redis "), 3, "node lanes");
        assert_eq!(count(&svg, "in the critical section"), 2);
        assert!(svg.contains("kill -9 redis 1"));
        assert!(svg.contains("baseline &lt;test&gt;"), "title escaped");
        assert!(svg.contains("verdict: Safe"));
        assert!(!svg.contains("overlap: clients"), "no violation drawn");
    }

    #[test]
    fn an_overlap_is_drawn_in_red_on_both_lanes() {
        let h = sample(true);
        let findings = check(&h);
        assert_eq!(findings.overlaps.len(), 1);
        let svg = render("overlap", &h, &findings);
        assert_eq!(
            count(&svg, "overlap: clients 0 (token 1) and 1 (token 2)"),
            2
        );
        assert!(svg.contains(&format!("fill=\"{VIOLATION}\" fill-opacity")));
        assert!(svg.contains("verdict: Fenced"));
    }
}
