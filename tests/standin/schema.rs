//! Enforces a CRD's structural OpenAPI schema on writes, as the API server does: defaults,
//! pruning of unknown fields, types, enums, ranges, lengths, required fields, and the CEL rules
//! (`x-kubernetes-validations`, evaluated by kube-cel).

use serde_json::Value;

fn type_matches(expected: &str, value: &Value) -> bool {
    match expected {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "integer" => {
            value.as_i64().is_some()
                || value.as_u64().is_some()
                || value.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        "number" => value.is_number(),
        _ => true,
    }
}

fn preserves_unknown(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

/// Fills in defaults for absent fields, top-down (a defaulted object then gets its own
/// nested defaults).
pub fn apply_defaults(schema: &Value, value: &mut Value) {
    if let (Some(props), Some(map)) = (
        schema.get("properties").and_then(Value::as_object),
        value.as_object_mut(),
    ) {
        for (name, child) in props {
            if !map.contains_key(name) {
                if let Some(default) = child.get("default") {
                    map.insert(name.clone(), default.clone());
                }
            }
            if let Some(v) = map.get_mut(name) {
                apply_defaults(child, v);
            }
        }
    }
    if let (Some(items), Some(list)) = (schema.get("items"), value.as_array_mut()) {
        for item in list {
            apply_defaults(items, item);
        }
    }
}

/// Drops fields the schema does not know, except where it preserves unknown fields.
pub fn prune(schema: &Value, value: &mut Value, root: bool) {
    if preserves_unknown(schema) {
        return;
    }
    if let Some(map) = value.as_object_mut() {
        let props = schema.get("properties").and_then(Value::as_object);
        let additional = schema.get("additionalProperties").filter(|a| a.is_object());
        let keys: Vec<String> = map.keys().cloned().collect();
        for key in keys {
            if root && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            match (props.and_then(|p| p.get(&key)), additional) {
                (Some(child), _) | (None, Some(child)) => {
                    if let Some(v) = map.get_mut(&key) {
                        prune(child, v, false);
                    }
                }
                (None, None) => {
                    map.remove(&key);
                }
            }
        }
    }
    if let (Some(items), Some(list)) = (schema.get("items"), value.as_array_mut()) {
        for item in list {
            prune(items, item, false);
        }
    }
}

/// Structural checks; returns `path: problem` lines.
pub fn check(schema: &Value, value: &Value, path: &str, problems: &mut Vec<String>) {
    if value.is_null() {
        if schema.get("nullable") != Some(&Value::Bool(true)) {
            problems.push(format!("{path}: Invalid value: \"null\": must not be null"));
        }
        return;
    }
    if let Some(expected) = schema.get("type").and_then(Value::as_str) {
        if !type_matches(expected, value) {
            problems.push(format!(
                "{path}: Invalid value: {value}: {path} in body must be of type {expected}"
            ));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array) {
        if !allowed.contains(value) {
            let list: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
            problems.push(format!(
                "{path}: Unsupported value: {value}: supported values: {}",
                list.join(", ")
            ));
        }
    }
    if let Some(n) = value.as_f64() {
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
            if n < min {
                problems.push(format!("{path}: Invalid value: {value}: {path} in body should be greater than or equal to {min}"));
            }
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
            if n > max {
                problems.push(format!("{path}: Invalid value: {value}: {path} in body should be less than or equal to {max}"));
            }
        }
    }
    if let Some(s) = value.as_str() {
        let len = s.chars().count() as u64;
        if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
            if len < min {
                problems.push(format!("{path}: Invalid value: {value}: {path} in body should be at least {min} chars long"));
            }
        }
        if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
            if len > max {
                problems.push(format!(
                    "{path}: Too long: may not be more than {max} bytes"
                ));
            }
        }
    }
    if let Some(map) = value.as_object() {
        if let Some(required) = schema.get("required").and_then(Value::as_array) {
            for name in required.iter().filter_map(Value::as_str) {
                if !map.contains_key(name) {
                    problems.push(format!("{path}.{name}: Required value"));
                }
            }
        }
        if let Some(props) = schema.get("properties").and_then(Value::as_object) {
            for (name, child) in props {
                if let Some(v) = map.get(name) {
                    check(child, v, &format!("{path}.{name}"), problems);
                }
            }
        }
    }
    if let (Some(items), Some(list)) = (schema.get("items"), value.as_array()) {
        for (i, item) in list.iter().enumerate() {
            check(items, item, &format!("{path}[{i}]"), problems);
        }
    }
}

/// Defaults, prunes and validates `object` (a whole custom resource) in place.
pub fn admit(schema: &Value, object: &mut Value, old: Option<&Value>) -> Result<(), Vec<String>> {
    apply_defaults(schema, object);
    prune(schema, object, true);
    let mut problems = Vec::new();
    // The root's apiVersion/kind/metadata are the server's business, not the schema's.
    let mut body = object.clone();
    if let Some(map) = body.as_object_mut() {
        for key in ["apiVersion", "kind", "metadata"] {
            map.remove(key);
        }
    }
    check(schema, &body, "", &mut problems);
    let problems: Vec<String> = problems
        .into_iter()
        .map(|p| p.trim_start_matches('.').to_string())
        .collect();
    if !problems.is_empty() {
        return Err(problems);
    }
    if let Err(errors) = kube_cel::validate(schema, object, old) {
        return Err(errors
            .into_vec()
            .iter()
            .map(|e| format!("{}: Invalid value: {}", e.field_path, e.message))
            .collect());
    }
    Ok(())
}

/// The openAPIV3Schema of a CRD document.
pub fn from_crd(crd: &Value) -> Value {
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}
