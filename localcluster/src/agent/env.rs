//! A container's environment and command line, resolved as a kubelet does: the `kubernetes`
//! Service's variables first, then `envFrom`, then `env` in order, `$(VAR)` expanded against
//! what came before; `valueFrom` reads the pod's fields, Secrets and ConfigMaps.

use super::shared::Shared;
use k8s_openapi::api::core::v1::{ConfigMap, Container, EnvVar, Pod, Secret};
use kube::api::Api;
use kube::ResourceExt;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Expands `$(NAME)` from `vars`; `$$` is a literal `$`; unknown names stay as written.
pub(crate) fn expand(input: &str, vars: &[(String, String)]) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(stripped) = after.strip_prefix('$') {
            out.push('$');
            rest = stripped;
        } else if let Some(close) = after.strip_prefix('(').and_then(|a| a.find(')')) {
            let name = &after[1..=close];
            match vars.iter().rev().find(|(k, _)| k == name) {
                Some((_, value)) => out.push_str(value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &after[close + 2..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// `metadata.labels['x']` and friends.
pub(crate) fn field_ref(pod: &Pod, path: &str) -> Result<String, String> {
    let keyed = |prefix: &str, map: &BTreeMap<String, String>| -> Option<String> {
        let key = path.strip_prefix(prefix)?.strip_suffix("']")?;
        Some(map.get(key).cloned().unwrap_or_default())
    };
    let value = match path {
        "metadata.name" => pod.name_any(),
        "metadata.namespace" => pod.namespace().unwrap_or_default(),
        "metadata.uid" => pod.uid().unwrap_or_default(),
        "spec.nodeName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        "spec.serviceAccountName" => pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.hostIP" | "status.hostIPs" => super::config::HOST_IP.into(),
        "status.podIP" | "status.podIPs" => super::config::pod_ip(pod),
        _ => keyed("metadata.labels['", pod.labels())
            .or_else(|| keyed("metadata.annotations['", pod.annotations()))
            .ok_or_else(|| format!("fieldRef {path} is not supported by the node agent"))?,
    };
    Ok(value)
}

async fn secret(shared: &Shared, namespace: &str, name: &str) -> Result<Option<Secret>, String> {
    Api::<Secret>::namespaced(shared.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| format!("read Secret {namespace}/{name}: {e}"))
}

async fn config_map(
    shared: &Shared,
    namespace: &str,
    name: &str,
) -> Result<Option<ConfigMap>, String> {
    Api::<ConfigMap>::namespaced(shared.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| format!("read ConfigMap {namespace}/{name}: {e}"))
}

fn secret_entries(secret: &Secret) -> impl Iterator<Item = (String, String)> + '_ {
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
        .chain(
            secret
                .string_data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone())),
        )
}

async fn value_from(
    shared: &Shared,
    pod: &Pod,
    container: &Container,
    var: &EnvVar,
) -> Result<Option<String>, String> {
    let Some(source) = &var.value_from else {
        return Ok(None);
    };
    let namespace = pod.namespace().unwrap_or_default();
    if let Some(field) = &source.field_ref {
        return field_ref(pod, &field.field_path).map(Some);
    }
    if let Some(resource) = &source.resource_field_ref {
        // Limits, else requests, else "0": the agent enforces none of them.
        let resources = container.resources.as_ref();
        let (kind, name) = resource
            .resource
            .split_once('.')
            .unwrap_or(("limits", &resource.resource));
        let map = match kind {
            "requests" => resources.and_then(|r| r.requests.as_ref()),
            _ => resources.and_then(|r| r.limits.as_ref()),
        };
        return Ok(Some(
            map.and_then(|m| m.get(name))
                .map_or_else(|| "0".to_string(), |q| q.0.clone()),
        ));
    }
    if let Some(key) = &source.secret_key_ref {
        let optional = key.optional.unwrap_or(false);
        let found = secret(shared, &namespace, &key.name).await?;
        let value = found.as_ref().and_then(|s| {
            secret_entries(s)
                .find(|(k, _)| *k == key.key)
                .map(|(_, v)| v)
        });
        return match value {
            Some(v) => Ok(Some(v)),
            None if optional => Ok(None),
            None => Err(format!(
                "secret \"{}\" key \"{}\" not found (env {})",
                key.name, key.key, var.name
            )),
        };
    }
    if let Some(key) = &source.config_map_key_ref {
        let optional = key.optional.unwrap_or(false);
        let found = config_map(shared, &namespace, &key.name).await?;
        let value = found
            .as_ref()
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.get(&key.key).cloned());
        return match value {
            Some(v) => Ok(Some(v)),
            None if optional => Ok(None),
            None => Err(format!(
                "configmap \"{}\" key \"{}\" not found (env {})",
                key.name, key.key, var.name
            )),
        };
    }
    Ok(None)
}

/// The container's environment, in the order a kubelet builds it.
pub(crate) async fn resolve(
    shared: &Shared,
    pod: &Pod,
    container: &Container,
) -> Result<Vec<(String, String)>, String> {
    let port = shared.config.apiserver_port.to_string();
    let mut vars: Vec<(String, String)> = vec![
        (
            "KUBERNETES_SERVICE_HOST".into(),
            super::config::HOST_IP.into(),
        ),
        ("KUBERNETES_SERVICE_PORT".into(), port.clone()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".into(), port.clone()),
        (
            "KUBERNETES_PORT".into(),
            format!("tcp://{}:{port}", super::config::HOST_IP),
        ),
    ];
    let namespace = pod.namespace().unwrap_or_default();
    for source in container.env_from.iter().flatten() {
        let prefix = source.prefix.clone().unwrap_or_default();
        if let Some(reference) = &source.secret_ref {
            match secret(shared, &namespace, &reference.name).await? {
                Some(s) => {
                    vars.extend(secret_entries(&s).map(|(k, v)| (format!("{prefix}{k}"), v)))
                }
                None if reference.optional.unwrap_or(false) => {}
                None => return Err(format!("secret \"{}\" not found (envFrom)", reference.name)),
            }
        }
        if let Some(reference) = &source.config_map_ref {
            match config_map(shared, &namespace, &reference.name).await? {
                Some(c) => vars.extend(
                    c.data
                        .into_iter()
                        .flatten()
                        .map(|(k, v)| (format!("{prefix}{k}"), v)),
                ),
                None if reference.optional.unwrap_or(false) => {}
                None => {
                    return Err(format!(
                        "configmap \"{}\" not found (envFrom)",
                        reference.name
                    ))
                }
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match &var.value {
            Some(v) => Some(expand(v, &vars)),
            None => value_from(shared, pod, container, var).await?,
        };
        if let Some(value) = value {
            vars.push((var.name.clone(), value));
        } else if var.value_from.is_none() {
            vars.push((var.name.clone(), String::new()));
        }
    }
    Ok(vars)
}

/// `command` + `args` with `$(VAR)` expanded. The agent runs no images, so a container must
/// name its command.
pub(crate) fn command_line(
    container: &Container,
    vars: &[(String, String)],
    images: &BTreeMap<String, PathBuf>,
) -> Result<Vec<String>, String> {
    let entrypoint: Vec<String> = match container.command.as_ref().filter(|c| !c.is_empty()) {
        Some(command) => command.clone(),
        None => {
            let image = container.image.as_deref().unwrap_or_default();
            let program = images
                .get(super::config::repository_of(image))
                .ok_or_else(|| {
                    format!(
                        "container {} has no command and its image {image:?} is not one the local \
                     node agent maps to a program on this machine (images it knows: {:?})",
                        container.name,
                        images.keys().collect::<Vec<_>>()
                    )
                })?;
            vec![program.display().to_string()]
        }
    };
    let argv = entrypoint
        .iter()
        .chain(container.args.iter().flatten())
        .map(|a| expand(a, vars))
        .collect();
    Ok(argv)
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn expansion_follows_the_kubelet_rules() {
        let vars = vec![
            ("A".to_string(), "1".to_string()),
            ("B".to_string(), "two".to_string()),
            ("A".to_string(), "3".to_string()),
        ];
        let cases = [
            ("plain", "plain"),
            ("$(A)", "3"),
            ("x$(B)y", "xtwoy"),
            ("$$(A)", "$(A)"),
            ("$(MISSING)", "$(MISSING)"),
            ("cost $5", "cost $5"),
            ("$(unclosed", "$(unclosed"),
            ("$", "$"),
        ];
        for (input, expected) in cases {
            assert_eq!(expand(input, &vars), expected, "{input}");
        }
    }
}
