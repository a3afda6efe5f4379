//! The committed CRD, its schema's shape, and the example manifests.

use lockedjob::api::{crd_yaml, validate, LockedJob};
use serde_json::Value;
use std::path::{Path, PathBuf};

const CRD_PATH: &str = "crds/lockedjob.dev_lockedjobs.yaml";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn committed_crd_matches_the_generated_one() {
    let committed = std::fs::read_to_string(repo(CRD_PATH)).expect("read committed CRD");
    assert!(
        committed == crd_yaml(),
        "{CRD_PATH} is stale: regenerate it with `cargo run -- crd | tee {CRD_PATH} > charts/lockedjob-operator/{CRD_PATH}`"
    );
}

fn schema() -> Value {
    let crd: Value = serde_saphyr::from_str(&crd_yaml()).expect("CRD parses as YAML");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// The API server's structural-schema rules, as far as this CRD can break them: every node
/// has a type (unless it preserves unknown fields), arrays have items, no $ref/definitions,
/// no logical junctions, no properties beside additionalProperties.
fn check_structural(
    node: &Value,
    path: &str,
    open_paths: &mut Vec<String>,
    problems: &mut Vec<String>,
) {
    let Some(map) = node.as_object() else {
        problems.push(format!("{path}: not an object"));
        return;
    };
    let open = map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
    if open {
        open_paths.push(path.to_string());
    }
    let int_or_string = map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    match map.get("type").and_then(Value::as_str) {
        Some("object" | "array" | "string" | "integer" | "number" | "boolean") => {}
        Some(other) => problems.push(format!("{path}: unknown type {other:?}")),
        None if open || int_or_string => {}
        None => problems.push(format!("{path}: no type")),
    }
    for forbidden in [
        "$ref",
        "definitions",
        "$defs",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "$schema",
    ] {
        if map.contains_key(forbidden) {
            problems.push(format!("{path}: uses {forbidden}"));
        }
    }
    if map.contains_key("properties") && map.contains_key("additionalProperties") {
        problems.push(format!(
            "{path}: properties and additionalProperties together"
        ));
    }
    if map.get("type").and_then(Value::as_str) == Some("array") {
        match map.get("items") {
            Some(items) => check_structural(items, &format!("{path}[]"), open_paths, problems),
            None => problems.push(format!("{path}: array without items")),
        }
    }
    if let Some(props) = map.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            check_structural(child, &format!("{path}.{name}"), open_paths, problems);
        }
    }
    if let Some(extra) = map.get("additionalProperties").filter(|v| v.is_object()) {
        check_structural(extra, &format!("{path}.*"), open_paths, problems);
    }
}

#[test]
fn schema_is_structural_and_open_only_for_the_job_template() {
    let mut open = Vec::new();
    let mut problems = Vec::new();
    check_structural(&schema(), "", &mut open, &mut problems);
    assert!(problems.is_empty(), "not structural: {problems:#?}");
    assert_eq!(open, vec![".spec.jobTemplate".to_string()]);
}

#[test]
fn schema_carries_defaults_enums_ranges_and_cel_rules() {
    let spec = &schema()["properties"]["spec"];
    let props = &spec["properties"];
    assert_eq!(props["concurrencyPolicy"]["default"], "Forbid");
    assert_eq!(
        props["concurrencyPolicy"]["enum"],
        serde_json::json!(["Allow", "Forbid", "Replace", "BufferOne"])
    );
    assert_eq!(props["catchUp"]["default"], "Latest");
    assert_eq!(
        props["catchUp"]["enum"],
        serde_json::json!(["Latest", "All"])
    );
    assert_eq!(props["maxCatchUp"]["maximum"].as_f64(), Some(1000.0));
    assert_eq!(props["successfulJobsHistoryLimit"]["default"], 3);
    assert_eq!(props["failedJobsHistoryLimit"]["default"], 1);
    assert_eq!(props["lock"]["properties"]["ttlSeconds"]["default"], 30);
    assert_eq!(
        props["lock"]["properties"]["ttlSeconds"]["minimum"].as_f64(),
        Some(1.0)
    );
    let rules: Vec<&str> = props["lock"]["x-kubernetes-validations"]
        .as_array()
        .expect("CEL rules on lock")
        .iter()
        .filter_map(|r| r["rule"].as_str())
        .collect();
    assert!(
        rules
            .iter()
            .any(|r| r.contains("self.renewIntervalSeconds < self.ttlSeconds")),
        "{rules:?}"
    );
    let required = spec["required"].as_array().expect("required");
    assert!(
        required.contains(&Value::from("schedule"))
            && required.contains(&Value::from("jobTemplate"))
    );
}

fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo(dir))
        .expect("read examples")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

fn load(path: &Path) -> (String, LockedJob) {
    let text = std::fs::read_to_string(path).expect("read example");
    let job: LockedJob =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (text, job)
}

#[test]
fn examples_parse_and_validate() {
    let files = yaml_files("examples");
    assert!(files.len() >= 3, "examples missing: {files:?}");
    for path in files {
        let (_, job) = load(&path);
        let namespace = job
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = job.metadata.name.clone().expect("example has a name");
        if let Err(errors) = validate(&namespace, &name, &job.spec) {
            panic!("{}: {errors:?}", path.display());
        }
    }
}

#[test]
fn broken_examples_fail_with_the_expected_message() {
    let files = yaml_files("examples/invalid");
    assert!(files.len() >= 3);
    for path in files {
        let (text, job) = load(&path);
        let expected = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect-error: "))
            .unwrap_or_else(|| panic!("{}: no '# expect-error:' line", path.display()));
        let (field, fragment) = expected
            .split_once(": ")
            .expect("'# expect-error: FIELD: TEXT'");
        let name = job.metadata.name.clone().expect("name");
        let errors = validate("default", &name, &job.spec).expect_err(&path.display().to_string());
        assert!(
            errors
                .iter()
                .any(|e| e.field == field && e.message.contains(fragment)),
            "{}: expected {expected:?} in {errors:?}",
            path.display()
        );
    }
}
