//! Label and field selectors, as the API server parses them.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

#[derive(Debug, Clone, Default)]
pub struct LabelSelector(Vec<(String, Op)>);

/// Splits on commas that are not inside parentheses.
fn split_top_level(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut current = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn values(list: &str) -> Result<Vec<String>, String> {
    let inner = list
        .trim()
        .strip_prefix('(')
        .and_then(|l| l.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised list, got {list:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let requirement = if let Some(key) = part.strip_prefix('!') {
                (key.trim().to_string(), Op::NotExists)
            } else if let Some((key, rest)) = part.split_once(" notin ") {
                (key.trim().to_string(), Op::NotIn(values(rest)?))
            } else if let Some((key, rest)) = part.split_once(" in ") {
                (key.trim().to_string(), Op::In(values(rest)?))
            } else if let Some((key, value)) = part.split_once("!=") {
                (key.trim().to_string(), Op::NotEq(value.trim().to_string()))
            } else if let Some((key, value)) = part.split_once("==") {
                (key.trim().to_string(), Op::Eq(value.trim().to_string()))
            } else if let Some((key, value)) = part.split_once('=') {
                (key.trim().to_string(), Op::Eq(value.trim().to_string()))
            } else {
                (part.trim().to_string(), Op::Exists)
            };
            if requirement.0.is_empty() || requirement.0.contains(' ') {
                return Err(format!("unable to parse requirement {part:?}"));
            }
            requirements.push(requirement);
        }
        Ok(Self(requirements))
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.0.iter().all(|(key, op)| {
            let value = labels.get(key).and_then(Value::as_str);
            match op {
                Op::Eq(v) => value == Some(v.as_str()),
                Op::NotEq(v) => value != Some(v.as_str()),
                Op::In(vs) => value.is_some_and(|x| vs.iter().any(|v| v == x)),
                Op::NotIn(vs) => value.is_none_or(|x| vs.iter().all(|v| v != x)),
                Op::Exists => value.is_some(),
                Op::NotExists => value.is_none(),
            }
        })
    }
}

#[derive(Debug, Clone, Default)]
pub struct FieldSelector(Vec<(&'static str, bool, String)>);

impl FieldSelector {
    /// Supports `metadata.name` and `metadata.namespace` with `=`, `==` and `!=`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(text) {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(format!("invalid field selector {part:?}"));
            };
            let field = match field.trim() {
                "metadata.name" => "name",
                "metadata.namespace" => "namespace",
                other => return Err(format!("field label not supported: {other}")),
            };
            requirements.push((field, equal, value.trim().to_string()));
        }
        Ok(Self(requirements))
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(field, equal, value)| {
            let actual = object["metadata"][*field].as_str().unwrap_or("");
            (actual == value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let obj = json!({"metadata": {"labels": {"app": "x", "tier": "web"}}});
        for (selector, expected) in [
            ("app=x", true),
            ("app==x", true),
            ("app!=x", false),
            ("app", true),
            ("!app", false),
            ("missing", false),
            ("!missing", true),
            ("tier in (web, db)", true),
            ("tier notin (web)", false),
            ("app=x,tier=db", false),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(selector).unwrap().matches(&obj),
                expected,
                "{selector}"
            );
        }
    }
}
