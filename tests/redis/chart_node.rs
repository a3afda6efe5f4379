//! The chart's Redis configuration and start-up script (`start-redis.sh`) run for real with
//! `redis-server`: the restart delay, the durability settings, fences kept over a restart, the
//! next password, TLS from a certificate Secret.

use support::{read, repo};
use testsupport as support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHART: &str = "charts/lockedjob-operator";

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

/// The rules after the password in the ACL line of docs/security.md, and in the start script's user line.
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
/// the restart delay, then serves with AOF fsynced on every write, no FLUSHALL, docs/security.md's
/// least-privilege user for the engine and the user `monitoring` for monitoring only; nobody
/// logs in as the default user.
#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
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
        "the chart's nodes grant what docs/security.md documents"
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
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
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

/// The chart's part of a password rotation (docs/security.md, "Rotation"): a node started with the
/// Secret's next password accepts both; restarted once the Secret holds only the new one, it
/// refuses the old.
#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
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
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
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
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
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
