//! The Helm chart and the manifests users apply, checked without a cluster or any tool: chart
//! metadata, values against `values.schema.json` (good and deliberately bad values files), the CRD
//! it ships, the values its templates use, the Dockerfile's last stage. Its Redis start script runs
//! in `redis/chart_node.rs`; helm and Kubernetes' schemas check it in `kubernetes/chart_render.rs`.

use support::{files_in, read, repo, yaml};
use testsupport as support;

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::Path;

const CHART: &str = "charts/lockedjob-operator";

/// Helm merges the user's values over the chart's defaults (maps key by key, everything else
/// replaced) and validates the result against values.schema.json.
fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(base), Value::Object(over)) => {
            for (key, value) in over {
                match base.get_mut(key) {
                    Some(slot) if slot.is_object() && value.is_object() => merge(slot, value),
                    _ => {
                        base.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (base, over) => *base = over.clone(),
    }
}

fn validator() -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(&read(&repo(&format!("{CHART}/values.schema.json"))))
        .expect("values.schema.json is JSON");
    jsonschema::draft7::new(&schema).expect("values.schema.json is a valid draft-07 schema")
}

fn defaults() -> Value {
    yaml(&repo(&format!("{CHART}/values.yaml")))
}

fn with_defaults(path: &Path) -> Value {
    let mut values = defaults();
    let over = yaml(path);
    if !over.is_null() {
        merge(&mut values, &over);
    }
    values
}

#[test]
fn chart_metadata_matches_the_crate() {
    let chart = yaml(&repo(&format!("{CHART}/Chart.yaml")));
    assert_eq!(chart["apiVersion"], "v2");
    assert_eq!(
        chart["name"], "lockedjob-operator",
        "the chart's folder name"
    );
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION")),
        "Chart.yaml appVersion must follow Cargo.toml's version (the image tag defaults to it)"
    );
    let version = chart["version"].as_str().expect("version");
    assert_eq!(version.split('.').count(), 3, "semver: {version}");
}

#[test]
fn default_and_ci_values_pass_the_schema() {
    let validator = validator();
    let mut checked = vec![("values.yaml".to_string(), defaults())];
    for file in files_in(&repo(&format!("{CHART}/ci")), "yaml") {
        checked.push((file.display().to_string(), with_defaults(&file)));
    }
    assert!(checked.len() >= 3, "values.yaml and the ci/ values files");
    for (name, values) in checked {
        let errors: Vec<String> = validator
            .iter_errors(&values)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{name}: {errors:#?}");
    }
}

#[test]
fn bad_values_are_rejected_at_the_field_they_name() {
    let validator = validator();
    let bad = files_in(&repo(&format!("{CHART}/tests/bad-values")), "yaml");
    assert!(bad.len() >= 10, "the bad values files are there");
    for file in bad {
        let text = read(&file);
        let expected = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# rejected at:"))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{}: first line '# rejected at: /path'", file.display()));
        let values = with_defaults(&file);
        let paths: Vec<String> = validator
            .iter_errors(&values)
            .map(|e| e.instance_path().to_string())
            .collect();
        assert!(
            paths.iter().any(|p| p == expected),
            "{}: expected an error at {expected:?}, got {paths:?}",
            file.display()
        );
    }
}

#[test]
fn the_chart_ships_the_crd_the_code_generates() {
    let shipped = read(&repo(&format!(
        "{CHART}/crds/lockedjob.dev_lockedjobs.yaml"
    )));
    assert!(
        shipped == lockedjob::api::crd_yaml(),
        "{CHART}/crds/ is stale: `cargo run -- crd | tee crds/lockedjob.dev_lockedjobs.yaml > {CHART}/crds/lockedjob.dev_lockedjobs.yaml`"
    );
}

/// Every `.Values.a.b` a template reads exists in values.yaml: a misspelt path renders as
/// empty in Helm, silently.
#[test]
fn templates_read_only_values_that_exist() {
    let values = defaults();
    let mut used = BTreeSet::new();
    let templates = files_in(&repo(&format!("{CHART}/templates")), "yaml")
        .into_iter()
        .chain(files_in(&repo(&format!("{CHART}/templates")), "tpl"))
        .chain(files_in(&repo(&format!("{CHART}/templates")), "txt"));
    for file in templates {
        let text = read(&file);
        let mut rest = text.as_str();
        while let Some(at) = rest.find(".Values.") {
            rest = &rest[at + ".Values.".len()..];
            let path: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_')
                .collect();
            used.insert((path.trim_end_matches('.').to_string(), file.clone()));
        }
    }
    assert!(used.len() > 30, "the templates were read: {}", used.len());
    for (path, file) in used {
        let mut node = &values;
        for part in path.split('.') {
            node = node.get(part).unwrap_or_else(|| {
                panic!(
                    "{} reads .Values.{path}, which values.yaml lacks",
                    file.display()
                )
            });
        }
    }
}

#[test]
fn dockerfile_builds_the_binary_into_a_non_root_image() {
    let dockerfile = read(&repo("Dockerfile"));
    let last_stage = dockerfile
        .rsplit_once("\nFROM ")
        .map(|(_, stage)| stage)
        .expect("a multi-stage Dockerfile");
    assert!(
        last_stage.contains("USER 65532"),
        "the final image runs as a non-root user"
    );
    assert!(last_stage.contains("ENTRYPOINT [\"/usr/local/bin/lockedjob\"]"));
    assert!(
        dockerfile.contains("--bin lockedjob"),
        "builds the lockedjob binary"
    );
    let ignore = read(&repo(".dockerignore"));
    for needed in ["!Cargo.toml", "!Cargo.lock", "!src/"] {
        assert!(
            ignore.lines().any(|l| l == needed),
            ".dockerignore lets {needed} in"
        );
    }
    // The dependency layer is built from the manifests alone: each member's manifest goes in,
    // and each bench the manifest names is stubbed (cargo refuses a manifest missing one).
    let manifest: toml_names::Manifest = toml_names::read(&repo("Cargo.toml"));
    for member in manifest.members.iter().filter(|m| *m != ".") {
        let needed = format!("!{member}/Cargo.toml");
        assert!(
            ignore.lines().any(|l| l == needed),
            ".dockerignore lets {needed} in"
        );
    }
    let stubs = dockerfile
        .lines()
        .find(|l| l.contains("for bench in"))
        .expect("the Dockerfile stubs the benches");
    for bench in &manifest.benches {
        assert!(
            stubs
                .split_whitespace()
                .any(|w| w == bench || w == format!("{bench};")),
            "the Dockerfile stubs bench {bench}: {stubs}"
        );
    }
}

/// The workspace members and bench names of a Cargo.toml, read line by line (the file keeps
/// `members` on one line and a `name` right under each `[[bench]]`).
mod toml_names {
    pub struct Manifest {
        pub members: Vec<String>,
        pub benches: Vec<String>,
    }

    pub fn read(path: &std::path::Path) -> Manifest {
        let text = super::read(path);
        let quoted = |line: &str| -> Vec<String> {
            line.split('"')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        let members = text
            .lines()
            .find(|l| l.starts_with("members = ["))
            .map(quoted)
            .expect("a [workspace] members line");
        let lines: Vec<&str> = text.lines().collect();
        let benches = lines
            .windows(2)
            .filter(|w| w[0] == "[[bench]]")
            .flat_map(|w| quoted(w[1]))
            .collect();
        Manifest { members, benches }
    }
}
