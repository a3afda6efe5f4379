//! Server-side printing (`Accept: ...;as=Table`), which kubectl asks for: Name and Age for
//! every type, plus a CRD's additionalPrinterColumns.

use super::resources::RESOURCES;
use serde_json::{json, Value};
use std::sync::LazyLock;

pub const LOCKEDJOB_CRD: &str = include_str!("../../crds/lockedjob.dev_lockedjobs.yaml");

pub static LOCKEDJOB_CRD_VALUE: LazyLock<Value> =
    LazyLock::new(|| serde_saphyr::from_str(LOCKEDJOB_CRD).expect("committed CRD parses"));

/// A tiny JSONPath: `.a.b`, `.a[*].b`, `.a[0]`.
fn eval(path: &str, value: &Value) -> Vec<Value> {
    let mut current = vec![value.clone()];
    for part in path
        .trim_start_matches('.')
        .split('.')
        .filter(|p| !p.is_empty())
    {
        let (field, index) = match part.split_once('[') {
            Some((f, i)) => (f, Some(i.trim_end_matches(']'))),
            None => (part, None),
        };
        let mut next = Vec::new();
        for v in current {
            let child = if field.is_empty() {
                v
            } else {
                v.get(field).cloned().unwrap_or(Value::Null)
            };
            match index {
                None => next.push(child),
                Some("*") => next.extend(child.as_array().cloned().unwrap_or_default()),
                Some(i) => next.push(
                    i.parse::<usize>()
                        .ok()
                        .and_then(|i| child.get(i).cloned())
                        .unwrap_or(Value::Null),
                ),
            }
        }
        current = next;
    }
    current.into_iter().filter(|v| !v.is_null()).collect()
}

fn age(timestamp: &str) -> String {
    let Ok(then) = timestamp.parse::<jiff::Timestamp>() else {
        return "<invalid>".into();
    };
    let seconds = (jiff::Timestamp::now().as_second() - then.as_second()).max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

fn cell(kind: &str, values: Vec<Value>) -> Value {
    if values.is_empty() {
        return Value::String("<none>".into());
    }
    if kind == "date" {
        return Value::String(values[0].as_str().map(age).unwrap_or_default());
    }
    if values.len() == 1 {
        return values[0].clone();
    }
    Value::String(
        values
            .iter()
            .map(|v| {
                v.as_str()
                    .map(String::from)
                    .unwrap_or_else(|| v.to_string())
            })
            .collect::<Vec<_>>()
            .join(","),
    )
}

pub fn table(resource: usize, items: &[Value], rv: u64) -> Value {
    let res = &RESOURCES[resource];
    let mut columns: Vec<(String, String, String)> =
        vec![("Name".into(), "string".into(), ".metadata.name".into())];
    if res.plural == "lockedjobs" {
        for c in LOCKEDJOB_CRD_VALUE["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            columns.push((
                c["name"].as_str().unwrap_or("").into(),
                c["type"].as_str().unwrap_or("string").into(),
                c["jsonPath"].as_str().unwrap_or("").into(),
            ));
        }
    } else {
        columns.push((
            "Age".into(),
            "date".into(),
            ".metadata.creationTimestamp".into(),
        ));
    }
    let definitions: Vec<Value> = columns
        .iter()
        .map(|(name, kind, _)| {
            json!({"name": name, "type": if kind == "date" { "string" } else { kind.as_str() },
            "format": if name == "Name" { "name" } else { "" }, "description": "", "priority": 0})
        })
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .map(|item| {
            let cells: Vec<Value> = columns.iter().map(|(_, kind, path)| cell(kind, eval(path, item))).collect();
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": item["metadata"]}})
        })
        .collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv.to_string()},
           "columnDefinitions": definitions, "rows": rows})
}
