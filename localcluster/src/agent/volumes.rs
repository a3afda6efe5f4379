//! Pod volumes as a kubelet lays them out, for the kinds the operator's pods use: the
//! service-account volume the admission plugin adds to every pod (a projected token, the
//! cluster CA and the namespace), Secrets, ConfigMaps, downward API files and emptyDirs.
//!
//! Each volume is a directory under the pod's own; a container that mounts volumes starts in a
//! private mount namespace with each one bind-mounted at its `mountPath`, so a program reading
//! `/var/run/secrets/kubernetes.io/serviceaccount/token` (every in-cluster client does) reads
//! its own pod's token and nothing of the host's changes. That needs root (CAP_SYS_ADMIN);
//! without it a container with mounts fails to start with a message saying so.

use super::shared::Shared;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, ServiceAccount, Volume,
};
use kube::api::{Api, PostParams};
use kube::ResourceExt;
use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// A volume's directory bound at a path inside a container.
#[derive(Debug, Clone)]
pub(crate) struct Mount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

/// Writes every volume of the pod under `dir/volumes/<name>`; an error says which volume and
/// why (a missing Secret, say), and the caller retries as a kubelet does.
pub(crate) async fn prepare(
    shared: &Shared,
    pod: &Pod,
    dir: &Path,
) -> Result<BTreeMap<String, PathBuf>, String> {
    let mut prepared = BTreeMap::new();
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let path = dir.join("volumes").join(&volume.name);
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("volume {}: create {}: {e}", volume.name, path.display()))?;
        let files = contents(shared, pod, volume)
            .await
            .map_err(|e| format!("volume {}: {e}", volume.name))?;
        for (relative, bytes) in files {
            write_file(&path, &relative, &bytes)
                .map_err(|e| format!("volume {}: write {relative}: {e}", volume.name))?;
        }
        prepared.insert(volume.name.clone(), path);
    }
    Ok(prepared)
}

/// The container's volume mounts, resolved to the prepared directories (or files, for a
/// `subPath`). Mount points that do not exist yet are created on the host, as empty
/// directories or files, the way a container runtime creates them in an image.
pub(crate) fn mounts(
    container: &Container,
    volumes: &BTreeMap<String, PathBuf>,
) -> Result<Vec<Mount>, String> {
    let mut mounts = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let dir = volumes.get(&mount.name).ok_or_else(|| {
            format!(
                "container {} mounts volume {}, which the pod does not have",
                container.name, mount.name
            )
        })?;
        let source = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            Some(sub) => dir.join(sub),
            None => dir.clone(),
        };
        let target = PathBuf::from(&mount.mount_path);
        if !target.exists() {
            let made = if source.is_dir() {
                std::fs::create_dir_all(&target)
            } else {
                target
                    .parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::File::create(&target).map(drop))
            };
            made.map_err(|e| format!("create mount point {}: {e}", target.display()))?;
        }
        mounts.push(Mount {
            source,
            target,
            read_only: mount.read_only.unwrap_or(false),
        });
    }
    Ok(mounts)
}

/// Makes the command start in a private mount namespace with `mounts` bound in it.
pub(crate) fn bind_in_private_namespace(
    command: &mut std::process::Command,
    mounts: &[Mount],
) -> Result<(), String> {
    if mounts.is_empty() {
        return Ok(());
    }
    let c_path = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| format!("{} has a NUL byte", p.display()))
    };
    // Everything the child touches is allocated here, before the fork.
    let binds: Vec<(CString, CString, bool)> = mounts
        .iter()
        .map(|m| Ok((c_path(&m.source)?, c_path(&m.target)?, m.read_only)))
        .collect::<Result<_, String>>()?;
    let root = c"/";
    // SAFETY: unshare and mount are async-signal-safe system calls; the closure only reads
    // the C strings prepared above and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            let check = |rc: libc::c_int| {
                if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            check(libc::unshare(libc::CLONE_NEWNS))?;
            // Private, so the binds below never reach the host's mount table.
            check(libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            for (source, target, read_only) in &binds {
                check(libc::mount(
                    source.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
                if *read_only {
                    check(libc::mount(
                        std::ptr::null(),
                        target.as_ptr(),
                        std::ptr::null(),
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                        std::ptr::null(),
                    ))?;
                }
            }
            Ok(())
        });
    }
    Ok(())
}

type Files = Vec<(String, Vec<u8>)>;

async fn contents(shared: &Shared, pod: &Pod, volume: &Volume) -> Result<Files, String> {
    let namespace = pod.namespace().unwrap_or_default();
    if volume.empty_dir.is_some() {
        return Ok(Vec::new());
    }
    if let Some(source) = &volume.secret {
        let name = source.secret_name.clone().unwrap_or_default();
        return object_files(
            shared,
            Source::Secret,
            &namespace,
            &name,
            &source.items,
            source.optional,
        )
        .await;
    }
    if let Some(source) = &volume.config_map {
        return object_files(
            shared,
            Source::ConfigMap,
            &namespace,
            &source.name,
            &source.items,
            source.optional,
        )
        .await;
    }
    if let Some(source) = &volume.downward_api {
        return downward_files(pod, source.items.iter().flatten());
    }
    if let Some(projected) = &volume.projected {
        let mut files = Vec::new();
        for source in projected.sources.iter().flatten() {
            if let Some(token) = &source.service_account_token {
                let bytes = service_account_token(
                    shared,
                    pod,
                    token.audience.clone(),
                    token.expiration_seconds,
                )
                .await?;
                files.push((token.path.clone(), bytes));
            }
            if let Some(s) = &source.secret {
                let source = Source::Secret;
                files.extend(
                    object_files(shared, source, &namespace, &s.name, &s.items, s.optional).await?,
                );
            }
            if let Some(c) = &source.config_map {
                let source = Source::ConfigMap;
                files.extend(
                    object_files(shared, source, &namespace, &c.name, &c.items, c.optional).await?,
                );
            }
            if let Some(d) = &source.downward_api {
                files.extend(downward_files(pod, d.items.iter().flatten())?);
            }
        }
        return Ok(files);
    }
    Err(
        "this kind of volume is not supported by the local node agent (supported: emptyDir, \
         secret, configMap, downwardAPI, projected)"
            .into(),
    )
}

/// The pod's bound token, as the kubelet requests it: for the pod's ServiceAccount, bound to
/// the pod, so it stops working when the pod is deleted.
async fn service_account_token(
    shared: &Shared,
    pod: &Pod,
    audience: Option<String>,
    expiration_seconds: Option<i64>,
) -> Result<Vec<u8>, String> {
    let namespace = pod.namespace().unwrap_or_default();
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: audience.map(|a| vec![a]),
            expiration_seconds,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name_any()),
                uid: pod.uid(),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let issued = Api::<ServiceAccount>::namespaced(shared.client.clone(), &namespace)
        .create_token_request(&account, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("request a token for ServiceAccount {namespace}/{account}: {e}"))?;
    let token = issued
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| format!("the token request for {namespace}/{account} has no status"))?;
    Ok(token.into_bytes())
}

#[derive(Debug, Clone, Copy)]
enum Source {
    Secret,
    ConfigMap,
}

/// The files one Secret or ConfigMap puts in a volume: every key, or only `items`.
async fn object_files(
    shared: &Shared,
    source: Source,
    namespace: &str,
    name: &str,
    items: &Option<Vec<KeyToPath>>,
    optional: Option<bool>,
) -> Result<Files, String> {
    let (kind, data): (&str, Option<BTreeMap<String, Vec<u8>>>) = match source {
        Source::Secret => (
            "secret",
            get::<Secret>(shared, namespace, name).await?.map(|secret| {
                let strings = secret.string_data.into_iter().flatten();
                secret
                    .data
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k, v.0))
                    .chain(strings.map(|(k, v)| (k, v.into_bytes())))
                    .collect()
            }),
        ),
        Source::ConfigMap => (
            "configmap",
            get::<ConfigMap>(shared, namespace, name).await?.map(|map| {
                let binary = map.binary_data.into_iter().flatten();
                map.data
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k, v.into_bytes()))
                    .chain(binary.map(|(k, v)| (k, v.0)))
                    .collect()
            }),
        ),
    };
    match data {
        Some(data) => select(data, items, kind, name),
        None if optional.unwrap_or(false) => Ok(Vec::new()),
        None => Err(format!("{kind} \"{name}\" not found")),
    }
}

async fn get<K>(shared: &Shared, namespace: &str, name: &str) -> Result<Option<K>, String>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    Api::<K>::namespaced(shared.client.clone(), namespace)
        .get_opt(name)
        .await
        .map_err(|e| format!("read {} {namespace}/{name}: {e}", K::kind(&())))
}

/// All keys as files, or only the listed ones at their paths.
fn select(
    mut data: BTreeMap<String, Vec<u8>>,
    items: &Option<Vec<KeyToPath>>,
    kind: &str,
    name: &str,
) -> Result<Files, String> {
    let Some(items) = items else {
        return Ok(data.into_iter().collect());
    };
    items
        .iter()
        .map(|item| {
            data.remove(&item.key)
                .map(|bytes| (item.path.clone(), bytes))
                .ok_or_else(|| format!("{kind} \"{name}\" has no key {}", item.key))
        })
        .collect()
}

fn downward_files<'a>(
    pod: &Pod,
    items: impl Iterator<Item = &'a DownwardAPIVolumeFile>,
) -> Result<Files, String> {
    items
        .map(|item| {
            let field = item.field_ref.as_ref().ok_or_else(|| {
                format!(
                    "downward API file {}: only fieldRef is supported by the local node agent",
                    item.path
                )
            })?;
            let value = super::env::field_ref(pod, &field.field_path)?;
            Ok((item.path.clone(), value.into_bytes()))
        })
        .collect()
}

/// Writes `relative` under `dir`, refusing paths that would leave it (as the API server's
/// validation already does; this is the agent's own guard).
fn write_file(dir: &Path, relative: &str, bytes: &[u8]) -> std::io::Result<()> {
    let relative = Path::new(relative);
    if relative.is_absolute()
        || relative
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "path leaves the volume",
        ));
    }
    let path = dir.join(relative);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, bytes)
}

#[cfg(test)]
mod tests {
    use super::{select, write_file};
    use k8s_openapi::api::core::v1::KeyToPath;
    use std::collections::BTreeMap;

    #[test]
    fn items_pick_keys_and_paths() {
        let data: BTreeMap<String, Vec<u8>> = [("a", "1"), ("b", "2")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        let all = select(data.clone(), &None, "secret", "s").expect("all keys");
        assert_eq!(all.len(), 2);
        let items = Some(vec![KeyToPath {
            key: "b".into(),
            path: "dir/b.txt".into(),
            ..KeyToPath::default()
        }]);
        let picked = select(data.clone(), &items, "secret", "s").expect("one key");
        assert_eq!(picked, vec![("dir/b.txt".to_string(), b"2".to_vec())]);
        let wrong = Some(vec![KeyToPath {
            key: "c".into(),
            path: "c".into(),
            ..KeyToPath::default()
        }]);
        let error = select(data, &wrong, "secret", "s").expect_err("no key c");
        assert!(error.contains("no key c"), "{error}");
    }

    #[test]
    fn files_stay_inside_their_volume() {
        let dir = tempfile::tempdir().expect("temp dir");
        write_file(dir.path(), "a/b", b"x").expect("nested file");
        assert_eq!(std::fs::read(dir.path().join("a/b")).expect("read"), b"x");
        assert!(write_file(dir.path(), "../escape", b"x").is_err());
        assert!(write_file(dir.path(), "/etc/escape", b"x").is_err());
    }
}
