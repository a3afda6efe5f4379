//! The Helm chart and the manifests users apply, checked without a cluster: chart metadata,
//! values against `values.schema.json` (good and deliberately bad values files), the CRD it
//! ships, the values its templates use, its Redis configuration and start-up script run for
//! real with `redis-server`, and Kubernetes' own schemas (`kubernetes-validate`) for the CRD and
//! the Job templates of the examples; `helm lint --strict` and `helm template` with the default
//! values and every `ci/` file (helm from scripts/k8s-bins.sh). `tests/helm.rs` installs it.

mod support;

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHART: &str = "charts/lockedjob-operator";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn yaml(path: &Path) -> Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn files_in(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("list {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    files
}

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

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The chart's start script with the environment the chart gives it, on loopback.
fn start_script(dir: &Path, port: u16, delay: u64) -> Command {
    let mut command = Command::new("sh");
    command
        .arg(repo(&format!("{CHART}/files/start-redis.sh")))
        .args(["--bind", "127.0.0.1"])
        .env("REDIS_PORT", port.to_string())
        .env("REDIS_DATA_DIR", dir)
        .env("RESTART_DELAY_SECONDS", delay.to_string())
        .env("REDIS_CONFIG", repo(&format!("{CHART}/files/redis.conf")))
        .env("REDIS_RUNTIME_DIR", dir.join("run"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// The rules after the password in the README's ACL line, and in the start script's user line.
fn rules_after_password(line: &str) -> Vec<String> {
    line.split_whitespace()
        .skip_while(|word| !(word.starts_with('>') || word.starts_with('#')))
        .skip(1)
        .map(String::from)
        .collect()
}

fn readme_acl_line() -> String {
    support::readme_acl_setuser("<password>").join(" ")
}

fn lock_with(urls: Vec<String>, tls: lockedjob::redlock::TlsFiles) -> Result<u64, String> {
    lock_as(urls, tls, PASSWORD)
}

fn lock_as(
    urls: Vec<String>,
    tls: lockedjob::redlock::TlsFiles,
    password: &str,
) -> Result<u64, String> {
    let mut config = lockedjob::redlock::RedlockConfig::new(urls);
    config.credentials = lockedjob::redlock::Credentials {
        username: Some("lockedjob".into()),
        password: Some(password.into()),
        ..Default::default()
    };
    config.tls = tls;
    config.request_timeout = Duration::from_secs(2);
    config.connect_timeout = Duration::from_secs(2);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let engine = lockedjob::redlock::Redlock::new(config).map_err(|e| e.to_string())?;
        let lease = engine
            .try_acquire("chart", Duration::from_secs(5))
            .await
            .map_err(|e| e.to_string())?;
        engine.release(&lease).await;
        Ok(lease.token())
    })
}

const PASSWORD: &str = "s3cr\"et";

/// The chart's redis.conf and start-redis.sh, run for real: the node stays out of service for
/// the restart delay, then serves with AOF fsynced on every write, no FLUSHALL, the README's
/// least-privilege user for the engine and the user `monitoring` for monitoring only; nobody
/// logs in as the default user.
#[test]
fn chart_redis_node_starts_after_its_delay_with_its_durability_settings() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = support::free_port();
    let delay = 2;
    let started = Instant::now();
    let _server = Server(
        start_script(dir.path(), port, delay)
            .env("REDIS_PASSWORD", PASSWORD)
            .env("REDIS_MONITORING_USER", "yes")
            .spawn()
            .expect("start start-redis.sh"),
    );
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let monitoring = redis::Client::open(format!("redis://monitoring:s3cr%22et@127.0.0.1:{port}/"))
        .expect("client with password");

    // Out of service during the delay: nothing listens yet.
    while started.elapsed() < Duration::from_millis(delay * 1000 / 2) {
        assert!(
            client.get_connection().is_err(),
            "the node served {:?} after start, inside its {delay}s restart delay",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let serving = support::wait_until(Duration::from_secs(60), || {
        monitoring
            .get_connection()
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok()
    });
    assert!(serving, "the node never served");
    assert!(
        started.elapsed() >= Duration::from_secs(delay),
        "served before its restart delay ended"
    );

    let mut conn = monitoring
        .get_connection()
        .expect("connect as the monitoring user");
    let config = |name: &str, conn: &mut redis::Connection| -> String {
        let pair: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query(conn)
            .expect("CONFIG GET");
        pair.get(1).cloned().unwrap_or_default()
    };
    assert_eq!(config("appendonly", &mut conn), "yes");
    assert_eq!(config("appendfsync", &mut conn), "always");
    assert_eq!(config("maxmemory-policy", &mut conn), "noeviction");
    assert_eq!(config("save", &mut conn), "");
    let read_a_key: redis::RedisResult<Option<String>> =
        redis::cmd("GET").arg("lockedjob:lock:x").query(&mut conn);
    assert!(
        read_a_key.is_err_and(|e| e.code() == Some("NOPERM")),
        "the monitoring user reads no keys"
    );

    assert_eq!(
        lock_with(
            vec![format!("redis://127.0.0.1:{port}")],
            Default::default()
        ),
        Ok(1)
    );
    let engine_user = redis::Client::open(format!("redis://lockedjob:s3cr%22et@127.0.0.1:{port}/"))
        .expect("client as the engine's user");
    let mut engine_conn = engine_user.get_connection().expect("connect as lockedjob");
    let flush: redis::RedisResult<String> = redis::cmd("FLUSHALL").query(&mut engine_conn);
    assert!(
        flush.is_err_and(|e| e.to_string().contains("unknown command")),
        "FLUSHALL must be disabled on a lock node"
    );
    let other_key: redis::RedisResult<Option<String>> =
        redis::cmd("GET").arg("elsewhere").query(&mut engine_conn);
    assert!(
        other_key.is_err_and(|e| e.code() == Some("NOPERM")),
        "the engine's user reaches only keys under its prefix"
    );

    let as_default = redis::Client::open(format!("redis://:s3cr%22et@127.0.0.1:{port}/"))
        .expect("client as the default user");
    assert!(
        as_default.get_connection().is_err(),
        "nobody logs in as the default user"
    );
    let mut anonymous = client.get_connection().expect("connect without password");
    let denied: redis::RedisResult<String> =
        redis::cmd("SET").arg("k").arg("v").query(&mut anonymous);
    assert!(
        denied.is_err_and(|e| e.code() == Some("NOAUTH")),
        "a client without the password is refused"
    );

    let node_conf = read(&dir.path().join("run/node.conf"));
    let user_line = node_conf
        .lines()
        .find(|line| line.starts_with("user lockedjob "))
        .expect("the engine's user");
    assert_eq!(
        rules_after_password(user_line),
        rules_after_password(&readme_acl_line()),
        "the chart's nodes grant what the README documents"
    );
    let password_in_ps =
        std::fs::read_to_string(format!("/proc/{}/cmdline", _server.0.id())).unwrap_or_default();
    assert!(
        !password_in_ps.contains("s3cr") && !node_conf.contains("s3cr"),
        "the password must be neither on the command line nor in the config"
    );
}

/// A chart node restarted on its volume keeps the fence its append-only file holds, with the
/// password on (the engine's user, the default user off or monitoring only). The engine's
/// scripts reach the file as MULTI/EXEC; Redis re-checks EXEC against the default user's
/// rights while loading it (redis/redis#14541, fixed after 8.2), so a default user without
/// rights silently dropped every lock and fence on restart: found on the real node.
#[test]
fn a_restarted_chart_node_keeps_its_fences_with_the_password_on() {
    for monitoring in ["no", "yes"] {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = support::free_port();
        let start = || {
            Server(
                start_script(dir.path(), port, 0)
                    .env("REDIS_PASSWORD", PASSWORD)
                    .env("REDIS_MONITORING_USER", monitoring)
                    .spawn()
                    .expect("start start-redis.sh"),
            )
        };
        let url = vec![format!("redis://127.0.0.1:{port}")];
        let server = start();
        let first = support::wait_until(Duration::from_secs(30), || {
            lock_with(url.clone(), Default::default()).is_ok()
        });
        assert!(first, "{:?}", lock_with(url.clone(), Default::default()));
        // kill -9: only what reached the file survives (appendfsync always: every write).
        drop(server);
        let _server = start();
        let mut token = Err(String::new());
        let served = support::wait_until(Duration::from_secs(30), || {
            token = lock_with(url.clone(), Default::default());
            token.is_ok()
        });
        assert!(served, "{token:?}");
        assert_eq!(
            token,
            Ok(2),
            "monitoring {monitoring}: the token after a restart (one lock before it)"
        );
    }
}

/// The chart's part of a password rotation (README, "Rotation"): a node started with the
/// Secret's next password accepts both; restarted once the Secret holds only the new one, it
/// refuses the old.
#[test]
fn a_chart_node_accepts_the_next_password_until_restarted_without_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = support::free_port();
    let url = vec![format!("redis://127.0.0.1:{port}")];
    let server = Server(
        start_script(dir.path(), port, 0)
            .env("REDIS_PASSWORD", PASSWORD)
            .env("REDIS_NEXT_PASSWORD", "the next one")
            .spawn()
            .expect("start start-redis.sh"),
    );
    let up = support::wait_until(Duration::from_secs(30), || {
        lock_as(url.clone(), Default::default(), PASSWORD).is_ok()
    });
    assert!(
        up,
        "{:?}",
        lock_as(url.clone(), Default::default(), PASSWORD)
    );
    assert!(
        lock_as(url.clone(), Default::default(), "the next one").is_ok(),
        "the next password is accepted beside the current one"
    );
    drop(server);
    let _server = Server(
        start_script(dir.path(), port, 0)
            .env("REDIS_PASSWORD", "the next one")
            .spawn()
            .expect("restart start-redis.sh"),
    );
    let up = support::wait_until(Duration::from_secs(30), || {
        lock_as(url.clone(), Default::default(), "the next one").is_ok()
    });
    assert!(up, "the new password after the restart");
    let old = lock_as(url.clone(), Default::default(), PASSWORD);
    assert!(
        old.as_ref()
            .is_err_and(|e| e.contains("authentication failed")),
        "the old password is refused: {old:?}"
    );
}

/// With a cert-manager style Secret mounted: TLS only, client certificates required, and the
/// operator's engine connects with the CA, its client certificate and the ACL user.
#[test]
fn chart_redis_node_serves_tls_only_from_a_certificate_secret() {
    use support::pki::{TestCa, Validity};
    let ca = TestCa::new("nodes");
    let server = ca.server("node", &["127.0.0.1"], Validity::Current);
    let client = ca.client("operator");
    let dir = tempfile::tempdir().expect("temp dir");
    let secret = dir.path().join("tls");
    std::fs::create_dir(&secret).expect("secret dir");
    for (from, to) in [
        (&server.cert, "tls.crt"),
        (&server.key, "tls.key"),
        (&ca.ca_file, "ca.crt"),
    ] {
        std::fs::copy(from, secret.join(to)).expect("copy into the secret dir");
    }
    let port = support::free_port();
    let _server = Server(
        start_script(dir.path(), port, 0)
            .env("REDIS_PASSWORD", PASSWORD)
            .env("REDIS_TLS_DIR", &secret)
            .env("REDIS_TLS_AUTH_CLIENTS", "yes")
            .spawn()
            .expect("start start-redis.sh"),
    );
    let tls = lockedjob::redlock::TlsFiles {
        ca_file: Some(ca.ca_file.clone()),
        cert_file: Some(client.cert.clone()),
        key_file: Some(client.key.clone()),
    };
    let url = format!("rediss://127.0.0.1:{port}");
    let locked = support::wait_until(Duration::from_secs(30), || {
        lock_with(vec![url.clone()], tls.clone()).is_ok()
    });
    assert!(locked, "{:?}", lock_with(vec![url.clone()], tls.clone()));

    let without_client_cert = lockedjob::redlock::TlsFiles {
        ca_file: Some(ca.ca_file.clone()),
        ..Default::default()
    };
    let refused = lock_with(vec![url], without_client_cert).expect_err("client cert required");
    assert!(
        refused.contains("requires a client certificate"),
        "{refused}"
    );
    let plain = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
    let plain_ping = plain
        .get_connection()
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
    assert!(plain_ping.is_err(), "no plain-text service: {plain_ping:?}");
}

#[test]
fn start_script_refuses_a_bad_delay() {
    let out = Command::new("sh")
        .arg(repo(&format!("{CHART}/files/start-redis.sh")))
        .env("RESTART_DELAY_SECONDS", "1m")
        .env("REDIS_CONFIG", repo(&format!("{CHART}/files/redis.conf")))
        .output()
        .expect("run start-redis.sh");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("whole number of seconds"));
}

/// As a module, so a pip install works without a console script on PATH.
fn kubernetes_validate() -> Command {
    let mut command = Command::new("python3");
    command.args(["-m", "kubernetes_validate"]);
    command
}

/// Kubernetes' own OpenAPI schemas, offline: the CRD as a CustomResourceDefinition, and each
/// example's `spec.jobTemplate` as the batch/v1 Job the operator will create from it.
#[test]
fn manifests_validate_against_kubernetes_schemas() {
    let installed = kubernetes_validate()
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        println!(
            "skipped: kubernetes-validate not installed (scripts/test.sh installs it from PyPI)"
        );
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let mut manifests = vec![repo("crds/lockedjob.dev_lockedjobs.yaml")];
    for example in files_in(&repo("examples"), "yaml") {
        let lj = yaml(&example);
        let job = serde_json::json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": lj["metadata"]["name"], "namespace": "default"},
            "spec": lj["spec"]["jobTemplate"]["spec"],
        });
        let path = dir.path().join(example.file_name().expect("name"));
        std::fs::write(&path, serde_json::to_string(&job).expect("json")).expect("write");
        manifests.push(path);
    }
    // A deliberately broken Job must fail, or the tool is not checking anything.
    let broken = dir.path().join("broken-job.yaml");
    std::fs::write(
        &broken,
        r#"{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"x"},"spec":{"template":{"spec":{"containers":[{"name":"a","image":"b","commandd":["x"]}]}}}}"#,
    )
    .expect("write");
    let run = |path: &Path| {
        kubernetes_validate()
            .args(["--strict", "--no-warn"])
            .arg(path)
            .output()
            .expect("run kubernetes-validate")
    };
    assert!(
        !run(&broken).status.success(),
        "kubernetes-validate accepted a broken Job"
    );
    for path in manifests {
        let out = run(&path);
        assert!(
            out.status.success(),
            "{}: {}{}",
            path.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The helm built with the control plane (scripts/k8s-bins.sh), never skipped.
fn helm() -> Command {
    let bins = localcluster::Binaries::locate()
        .unwrap_or_else(|e| panic!("helm comes with the control plane binaries: {e}"));
    let mut command = Command::new(bins.path("helm"));
    let home = std::env::temp_dir().join(format!("lockedjob-chart-helm-{}", std::process::id()));
    command
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"));
    command
}

#[test]
fn helm_lint_and_template_with_default_and_every_ci_values_file() {
    let chart = repo(CHART);
    let lint = helm()
        .args(["lint", "--strict"])
        .arg(&chart)
        .output()
        .expect("helm lint");
    assert!(
        lint.status.success(),
        "{}",
        String::from_utf8_lossy(&lint.stdout)
    );
    let mut values_files: Vec<Option<PathBuf>> = vec![None];
    values_files.extend(
        files_in(&repo(&format!("{CHART}/ci")), "yaml")
            .into_iter()
            .map(Some),
    );
    // Every optional object on, so each template renders at least once.
    let all_on = [
        "--set",
        "metrics.serviceMonitor.enabled=true,metrics.prometheusRule.enabled=true,redis.exporter.enabled=true,metrics.networkPolicy.enabled=true",
    ];
    for values in values_files {
        let mut command = helm();
        command.args(["template", "t", "--namespace", "locks"]);
        if let Some(values) = &values {
            command.arg("-f").arg(values);
        }
        let out = command
            .args(all_on)
            .arg(&chart)
            .output()
            .expect("helm template");
        assert!(
            out.status.success(),
            "{values:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        for kind in [
            "kind: Deployment",
            "kind: PrometheusRule",
            "kind: ServiceMonitor",
            "kind: NetworkPolicy\nmetadata:\n  name: t-lockedjob-operator-metrics\n",
        ] {
            assert!(text.contains(kind), "{values:?} renders {kind}");
        }
    }
}

/// The names of the cluster-scoped objects `helm template` renders for release `t` in `ns`.
fn cluster_scoped_names(ns: &str) -> Vec<String> {
    let out = helm()
        .args(["template", "t", "--namespace", ns])
        .arg(repo(CHART))
        .output()
        .expect("helm template");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut names = Vec::new();
    for document in text.split("\n---\n") {
        let object: Value = serde_saphyr::from_str(document).expect("a rendered object");
        let kind = object["kind"].as_str().unwrap_or_default();
        if kind.starts_with("Cluster") {
            names.push(format!(
                "{kind}/{}",
                object["metadata"]["name"].as_str().unwrap_or_default()
            ));
        }
    }
    names
}

/// Two releases of one name in two namespaces: were a ClusterRole or its binding named after
/// the release only, the later install would take it over and the other's operators would
/// lose every right (seen on the real node before the names carried the namespace).
#[test]
fn releases_of_one_name_in_two_namespaces_share_no_cluster_wide_object() {
    let first = cluster_scoped_names("team-a");
    let second = cluster_scoped_names("team-b");
    assert!(!first.is_empty(), "the default install is cluster-wide");
    for name in &first {
        assert!(!second.contains(name), "both releases render {name}");
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
    for needed in ["!Cargo.toml", "!Cargo.lock", "!src/", "!benches/"] {
        assert!(
            ignore.lines().any(|l| l == needed),
            ".dockerignore lets {needed} in"
        );
    }
}

/// TLS on with a plain-text external node would send the lock traffic in the clear to that
/// node: the chart refuses to render, naming it.
#[test]
fn tls_with_a_plain_text_external_node_is_refused() {
    let out = helm()
        .args(["template", "t", "--namespace", "locks"])
        .args(["--set", "redis.enabled=false"])
        .args([
            "--set-json",
            r#"redis.external=["rediss://a.example:6379","redis://b.example:6379","rediss://c.example:6379"]"#,
        ])
        .args(["--set", "redis.tls.enabled=true,redis.tls.existingSecret=ca"])
        .arg(repo(CHART))
        .output()
        .expect("helm template");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("must be rediss://, got redis://b.example:6379"),
        "{stderr}"
    );
}
