//! The docs hold together: every `docs/design.md, "Section"` the code cites is a heading there,
//! and every relative link in README.md and docs/ reaches a file (and its heading, with `#`).

use testsupport as support;

use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The headings of a Markdown file, without their `#`s.
fn headings(markdown: &str) -> Vec<String> {
    let mut fenced = false;
    markdown
        .lines()
        .filter(|line| {
            if line.starts_with("```") {
                fenced = !fenced;
            }
            !fenced && line.starts_with('#')
        })
        .map(|line| line.trim_start_matches('#').trim().to_string())
        .collect()
}

/// GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A source file's text with comment markers and line breaks folded into spaces, so that a
/// citation broken across comment lines reads whole.
fn folded(source: &str) -> String {
    source
        .lines()
        .map(|line| {
            let line = line.trim_start();
            line.strip_prefix("//!")
                .or_else(|| line.strip_prefix("///"))
                .or_else(|| line.strip_prefix("//"))
                .unwrap_or(line)
                .trim()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every `design.md, "Section"` (or `design.md "Section"`) in `text`.
fn citations(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("design.md") {
        rest = &rest[at + "design.md".len()..];
        let after = rest.trim_start_matches(',').trim_start();
        if let Some(quoted) = after.strip_prefix('"') {
            if let Some((section, _)) = quoted.split_once('"') {
                found.push(section.to_string());
            }
        }
    }
    found
}

#[test]
fn every_design_citation_in_the_code_names_a_heading() {
    let design = headings(&read(&Path::new(ROOT).join("docs/design.md")));
    let mut files = Vec::new();
    for dir in [
        "src",
        "redlock",
        "localcluster",
        "quickstart",
        "tests",
        "benches",
    ] {
        rust_files(&Path::new(ROOT).join(dir), &mut files);
    }
    let mut missing = Vec::new();
    let mut cited = 0;
    // This file spells citations as examples.
    files.retain(|file| !file.ends_with("tests/checks/docs.rs"));
    for file in &files {
        for section in citations(&folded(&read(file))) {
            cited += 1;
            let found = design.iter().any(|h| {
                *h == section
                    || h.starts_with(&format!("{section} ("))
                    || h.starts_with(&format!("{section}("))
            });
            if !found {
                missing.push(format!("{}: {section:?}", file.display()));
            }
        }
    }
    assert!(cited > 5, "the scan found only {cited} citations");
    assert!(
        missing.is_empty(),
        "cited sections that are not headings of docs/design.md:\n{}",
        missing.join("\n")
    );
}

/// `[text](target)` links in `markdown` whose target is relative (no scheme, not `mailto:`).
fn relative_links(markdown: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = markdown;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = &rest[..end];
        if !target.contains("://") && !target.starts_with("mailto:") && !target.is_empty() {
            links.push(target.to_string());
        }
    }
    links
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let mut pages = vec![Path::new(ROOT).join("README.md")];
    for entry in std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/")
        .flatten()
    {
        if entry.path().extension().is_some_and(|e| e == "md") {
            pages.push(entry.path());
        }
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = read(page);
        let dir = page.parent().expect("a page's directory");
        for link in relative_links(&text) {
            checked += 1;
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", page.display()));
                continue;
            }
            if !fragment.is_empty() {
                let anchors: Vec<String> =
                    headings(&read(&target)).iter().map(|h| anchor(h)).collect();
                if !anchors.iter().any(|a| a == fragment) {
                    broken.push(format!("{}: {link} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(checked > 3, "the scan found only {checked} links");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_follow_githubs_rule() {
    assert_eq!(
        anchor("The command dies with its supervisor (`src/child.rs`)"),
        "the-command-dies-with-its-supervisor-srcchildrs"
    );
    assert_eq!(anchor("Install with Helm"), "install-with-helm");
    assert_eq!(
        citations(r#"see docs/design.md, "Acquire", and design.md "Renewal""#),
        ["Acquire", "Renewal"]
    );
}

/// The README's OCI install names the chart version Chart.yaml gives (a version bump that
/// forgets the README would send users to a package `helm package` no longer makes).
#[test]
fn the_readmes_chart_version_is_the_charts() {
    let version = support::chart_field("version");
    let readme = read(&Path::new(ROOT).join("README.md"));
    let named: Vec<&str> = readme
        .split("lockedjob-operator-")
        .skip(1)
        .filter_map(|rest| rest.split_once(".tgz").map(|(v, _)| v))
        .chain(
            readme
                .split("--version ")
                .skip(1)
                .filter_map(|rest| rest.split_whitespace().next()),
        )
        .collect();
    assert!(!named.is_empty(), "the README names the chart's package");
    for v in named {
        assert_eq!(
            v, version,
            "README.md names chart version {v}, Chart.yaml {version}"
        );
    }
}
