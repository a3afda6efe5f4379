//! Rotating the CA, the client certificate and the Redis password while work runs, with real
//! `redis-server` nodes that require client certificates or a password: three engines stand in
//! for three replicas running a job every second (`try_acquire_step`, as the operator does) and
//! a fourth holds a lease under its watchdog. No due time may be missed or run twice, the held
//! lease must never be lost, and the engines must end up on the new material (the nodes refuse
//! the old one by then, and every connection was cut). A bad file dropped in mid-run is
//! refused with a warning naming it, and the material read before keeps working. A request on
//! a connection the node closed is retried once on a fresh one.

use testsupport as support;

use lockedjob::redlock::{
    Credentials, LeaseTiming, LockError, Redlock, RedlockConfig, TlsFiles, Watchdog,
};
use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::pki::{CertFiles, TestCa, Validity};
use support::rotation::{
    bundle, install, install_pair, kill_clients, read, set_password_rule, tls_secret,
    RotatingNodes, SecretVolume,
};
use support::{lockedjob_bin, wait_until, NodeTls, Persistence, RedisNodes};

const JOB: &str = "rotation-job";
const PERIOD: Duration = Duration::from_secs(1);
const REPLICAS: usize = 3;
const RELOAD: Duration = Duration::from_millis(100);

fn engine(urls: Vec<String>, tls: TlsFiles, credentials: Credentials, holder: &str) -> Redlock {
    let mut config = RedlockConfig::new(urls);
    config.tls = tls;
    config.credentials = credentials;
    config.holder = format!("rotation/{holder}");
    config.reload_interval = RELOAD;
    // Generous: a TLS handshake on a loaded 2-core machine is not what this test measures.
    config.request_timeout = Duration::from_secs(2);
    config.connect_timeout = Duration::from_secs(2);
    Redlock::new(config).expect("valid engine configuration")
}

fn metric(engine: &Redlock, series: &str) -> u64 {
    let text = engine.metrics().render();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

const APPLIED: &str = r#"lockedjob_redis_credential_reloads_total{result="applied"}"#;
const REFUSED: &str = r#"lockedjob_redis_credential_reloads_total{result="refused"}"#;

/// Three replicas running `JOB` at every due time, and what each due time's attempts gave.
struct Replicas {
    started: Instant,
    runs: Arc<Mutex<BTreeMap<u64, Vec<usize>>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Replicas {
    fn start(engines: Vec<Redlock>) -> Self {
        let started = Instant::now();
        let runs = Arc::new(Mutex::new(BTreeMap::new()));
        let tasks = engines
            .iter()
            .enumerate()
            .map(|(replica, engine)| {
                let (engine, runs) = (engine.clone(), Arc::clone(&runs));
                tokio::spawn(async move {
                    for step in 1.. {
                        tokio::time::sleep_until((started + PERIOD * step as u32).into()).await;
                        run_once(&engine, step, replica, &runs).await;
                    }
                })
            })
            .collect();
        Self {
            started,
            runs,
            tasks,
        }
    }

    fn due_so_far(&self) -> u64 {
        (self.started.elapsed().as_millis() / PERIOD.as_millis()) as u64
    }

    async fn wait_for_steps(&self, steps: u64) {
        let target = self.due_so_far() + steps;
        while self.due_so_far() < target + 1 {
            tokio::time::sleep(PERIOD / 4).await;
        }
    }

    /// Stops, and checks that each due time before the stop ran once, on one replica.
    fn stop_and_check(self) {
        for task in &self.tasks {
            task.abort();
        }
        let runs = self.runs.lock().expect("runs");
        // The last due time may have been cut off by the stop.
        let last = self.due_so_far().saturating_sub(1);
        assert!(last >= 8, "the test ran for {last} due times only");
        for step in 1..=last {
            let winners = runs.get(&step).cloned().unwrap_or_default();
            assert_eq!(
                winners.len(),
                1,
                "due time {step} ran on replicas {winners:?} (missed when empty, doubled when two); all runs: {runs:?}"
            );
        }
    }
}

async fn run_once(
    engine: &Redlock,
    step: u64,
    replica: usize,
    runs: &Mutex<BTreeMap<u64, Vec<usize>>>,
) {
    // A replica that lost a race or found the step done moves on, as the operator does; any
    // other failure is retried until the next due time, as the operator's requeue does.
    let deadline = Instant::now() + PERIOD / 2;
    loop {
        match engine
            .try_acquire_step(JOB, Duration::from_secs(3), step)
            .await
        {
            Ok(lease) => {
                runs.lock()
                    .expect("runs")
                    .entry(step)
                    .or_default()
                    .push(replica);
                engine.release(&lease).await;
                return;
            }
            Err(LockError::Contended { .. } | LockError::StepDone { .. }) => return,
            Err(err) if Instant::now() < deadline => {
                eprintln!("replica {replica}, due time {step}: {err}; retrying");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(err) => {
                eprintln!("replica {replica}, due time {step}: {err}; giving up");
                return;
            }
        }
    }
}

/// Ids of the clients connected to a node other than the one asking (`CLIENT LIST`).
fn client_ids(nodes: &RedisNodes, node: usize) -> Vec<u64> {
    let list: String = nodes.nodes[node]
        .command(&["CLIENT", "LIST", "TYPE", "normal"])
        .expect("CLIENT LIST");
    list.lines()
        .filter(|line| !line.contains("cmd=client|list"))
        .filter_map(|line| line.strip_prefix("id=")?.split(' ').next()?.parse().ok())
        .collect()
}

/// The largest client id each node has handed out so far.
fn last_client_ids(nodes: &RedisNodes) -> Vec<u64> {
    (0..nodes.len())
        .map(|node| {
            nodes.nodes[node]
                .command::<u64>(&["CLIENT", "ID"])
                .expect("CLIENT ID")
        })
        .collect()
}

async fn hold_a_lease(engine: &Redlock) -> Watchdog {
    let ttl = Duration::from_secs(3);
    let lease = engine
        .try_acquire("rotation-leader", ttl)
        .await
        .expect("leader lease");
    Watchdog::spawn(engine.clone(), lease, LeaseTiming::from_ttl(ttl))
}

/// The replicas' engines and the leader's, all with the same files.
fn engines(urls: Vec<String>, tls: TlsFiles, credentials: Credentials) -> Vec<Redlock> {
    (0..REPLICAS + 1)
        .map(|i| {
            engine(
                urls.clone(),
                tls.clone(),
                credentials.clone(),
                &format!("r{i}"),
            )
        })
        .collect()
}

/// The last engine holds a lease under its watchdog; the others run the job, two due times
/// before anything rotates.
async fn start_work(engines: &[Redlock]) -> (Redlock, Watchdog, Replicas) {
    let leader = engines[REPLICAS].clone();
    let watchdog = hold_a_lease(&leader).await;
    let replicas = Replicas::start(engines[..REPLICAS].to_vec());
    replicas.wait_for_steps(2).await;
    (leader, watchdog, replicas)
}

/// An engine with what was rotated away gets no quorum.
async fn assert_refused(stale_engine: &Redlock, what: &str) {
    let refused = stale_engine
        .try_acquire("stale-check", Duration::from_secs(3))
        .await;
    assert!(
        matches!(&refused, Err(LockError::NoQuorum { .. })),
        "{what} is refused: {refused:?}"
    );
}

/// The lease held under the watchdog was never lost, and is released.
async fn assert_held_throughout(watchdog: Watchdog, leader: &Redlock) {
    assert!(!watchdog.is_lost(), "the held lease survived the rotation");
    assert!(watchdog.release(leader).await, "released at the end");
}

/// Waits until every engine applied one more change of its files than `before` says.
fn wait_applied(engines: &[Redlock], before: &[u64]) {
    let all = || {
        engines
            .iter()
            .zip(before)
            .all(|(engine, before)| metric(engine, APPLIED) > *before)
    };
    assert!(
        wait_until(Duration::from_secs(10), all),
        "every engine applies the new files"
    );
}

fn applied(engines: &[Redlock]) -> Vec<u64> {
    engines
        .iter()
        .map(|engine| metric(engine, APPLIED))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn the_ca_and_client_certificate_rotate_with_no_run_missed_doubled_or_lease_lost() {
    let old_ca = TestCa::new("old-ca");
    let new_ca = TestCa::new("new-ca");
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name);
    let lock_nodes = RotatingNodes::start(dir.path(), &old_ca);
    let nodes = &lock_nodes.nodes;
    // What the engines read: a CA bundle and a client certificate, from a Secret volume.
    let old_client = old_ca.client("client-old");
    let mut client = SecretVolume::new(
        path("client-secret"),
        &tls_secret(read(&old_ca.ca_file), &old_client),
    );
    let engines = engines(nodes.urls(), client.tls(), Credentials::default());
    let (leader, watchdog, replicas) = start_work(&engines).await;

    // 1. The nodes trust both CAs.
    lock_nodes.trust(&[&old_ca, &new_ca]);
    // 2. The clients trust both and present a certificate the new CA signed. Every engine
    // applies it and replaces each connection with one opened under it, before any is cut.
    let ids_before = last_client_ids(nodes);
    let before = applied(&engines);
    let new_client = new_ca.client("client-new");
    client.update(&tls_secret(bundle(&[&old_ca, &new_ca]), &new_client));
    wait_applied(&engines, &before);
    let replaced = || {
        (0..nodes.len()).all(|n| {
            let ids = client_ids(nodes, n);
            ids.len() >= engines.len() && ids.iter().all(|id| *id > ids_before[n])
        })
    };
    assert!(
        wait_until(Duration::from_secs(10), replaced),
        "every connection replaced by one opened with the new certificate: {:?} (ids before: {ids_before:?})",
        (0..nodes.len()).map(|n| client_ids(nodes, n)).collect::<Vec<_>>()
    );
    replicas.wait_for_steps(2).await;

    // 3. The nodes serve a certificate the new CA signed.
    lock_nodes.serve_certificates_of(&new_ca);
    // 4. The old CA is removed everywhere; then every connection is cut, so that each engine
    // must open new ones, which the nodes accept only with the new certificate.
    lock_nodes.trust(&[&new_ca]);
    let before = applied(&engines);
    client.update(&tls_secret(read(&new_ca.ca_file), &new_client));
    wait_applied(&engines, &before);
    kill_clients(nodes);
    replicas.wait_for_steps(3).await;

    // The old certificate no longer opens anything: what the engines use now is the new one.
    let stale = SecretVolume::new(
        path("stale-secret"),
        &tls_secret(read(&new_ca.ca_file), &old_client),
    );
    let stale_engine = engine(nodes.urls(), stale.tls(), Credentials::default(), "stale");
    assert_refused(&stale_engine, "the old client certificate").await;
    assert_held_throughout(watchdog, &leader).await;
    for engine in &engines {
        assert_eq!(metric(engine, "lockedjob_lease_losses_total"), 0);
        // The volume swaps all files at once: no engine ever saw a mix to refuse.
        assert_eq!(metric(engine, REFUSED), 0);
    }
    replicas.stop_and_check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn the_password_rotates_with_no_run_missed_doubled_or_lease_lost() {
    const USER: &str = "lockedjob";
    let nodes = RedisNodes::start(3, Persistence::None).expect("start nodes");
    set_password_rule(&nodes, USER, ">old-password");
    let dir = tempfile::tempdir().expect("temp dir");
    let password_file = dir.path().join("password");
    install(&password_file, b"old-password\n");
    let credentials = Credentials {
        username: Some(USER.into()),
        password_file: Some(password_file.clone()),
        ..Credentials::default()
    };
    let engines = engines(nodes.urls(), TlsFiles::default(), credentials.clone());
    let (leader, watchdog, replicas) = start_work(&engines).await;

    // The sequence of docs/security.md: the new password on every node, then the Secret, then the old
    // password removed once every replica uses the new one.
    set_password_rule(&nodes, USER, ">new-password");
    let before = applied(&engines);
    install(&password_file, b"new-password\n");
    wait_applied(&engines, &before);
    replicas.wait_for_steps(2).await;
    set_password_rule(&nodes, USER, "<old-password");
    kill_clients(&nodes);
    replicas.wait_for_steps(3).await;

    let mut stale = credentials.clone();
    stale.password_file = None;
    stale.password = Some("old-password".into());
    let stale_engine = engine(nodes.urls(), TlsFiles::default(), stale, "stale");
    assert_refused(&stale_engine, "the old password").await;
    assert_held_throughout(watchdog, &leader).await;
    replicas.stop_and_check();
}

#[tokio::test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn a_renewal_over_connections_the_nodes_closed_goes_through_on_fresh_ones() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start nodes");
    let engine = engine(
        nodes.urls(),
        TlsFiles::default(),
        Credentials::default(),
        "closed",
    );
    let lease = engine
        .try_acquire("closed", Duration::from_secs(10))
        .await
        .expect("lease");
    // As a node does when it restarts its TLS listener or an operator kills clients.
    kill_clients(&nodes);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let renewed = engine.extend(&lease).await;
    assert!(
        renewed.is_ok(),
        "each node's request is retried once on a fresh connection: {renewed:?}"
    );
    engine.release(&lease).await;
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn a_bad_certificate_dropped_in_mid_run_is_refused_by_name_and_the_old_one_keeps_working() {
    let ca = TestCa::new("nodes");
    let server = ca.server("redis", &["127.0.0.1"], Validity::Current);
    let admin = ca.client("admin");
    let node_tls = NodeTls {
        cert_file: server.cert.clone(),
        key_file: server.key.clone(),
        ca_file: ca.ca_file.clone(),
        require_client_cert: true,
        client: Some((admin.cert.clone(), admin.key.clone())),
        host: "127.0.0.1".into(),
    };
    let nodes = RedisNodes::start_tls(3, Persistence::None, &node_tls).expect("start mTLS nodes");
    let dir = tempfile::tempdir().expect("temp dir");
    let client = CertFiles {
        cert: dir.path().join("client.crt"),
        key: dir.path().join("client.key"),
    };
    install_pair(&client, &ca.client("exec"));
    // A certificate whose key is not the one in the key file: what copying one file of a pair
    // by hand gives. It parses; only the key check tells it apart.
    let other = ca.client("other");
    let marker = dir.path().join("bad-file-in-place");
    // The command swaps it in, waits for the reload to have seen it, then the test cuts every
    // connection: the lease must be renewed over new connections opened with the certificate
    // read before.
    let script = format!(
        "cp {other} {cert}.new && mv {cert}.new {cert} && touch {marker} && sleep 4",
        other = other.cert.display(),
        cert = client.cert.display(),
        marker = marker.display()
    );
    let child = Command::new(lockedjob_bin())
        .args([
            "exec", "--lock", "rotation", "--ttl", "2s", "--", "sh", "-c", &script,
        ])
        .env("LOCKEDJOB_REDIS_URLS", nodes.urls().join(","))
        .env("LOCKEDJOB_REDIS_CA_FILE", &ca.ca_file)
        .env("LOCKEDJOB_REDIS_CERT_FILE", &client.cert)
        .env("LOCKEDJOB_REDIS_KEY_FILE", &client.key)
        .env("LOCKEDJOB_RELOAD_INTERVAL", "100ms")
        .env("LOCKEDJOB_REQUEST_TIMEOUT", "2s")
        .env("LOCKEDJOB_CONNECT_TIMEOUT", "2s")
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start lockedjob exec");
    assert!(
        wait_until(Duration::from_secs(10), || marker.exists()),
        "the command ran"
    );
    std::thread::sleep(Duration::from_millis(500));
    kill_clients(&nodes);
    let out = child.wait_with_output().expect("exec ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the lease outlived the bad file and the cut connections: {stderr}"
    );
    assert!(
        stderr.contains("is not the key of the client certificate")
            && stderr.contains(&client.cert.display().to_string()),
        "a warning names the file: {stderr}"
    );
}
