//! The least-privilege Redis user of docs/security.md, created on real nodes: the engine, `exec`
//! and the operator's calls work with exactly those rights, and each right taken away fails the
//! attempt with a message naming it, never a hang and never a lock counted as held.

use testsupport as support;

use lockedjob::redlock::{Credentials, LockError, Redlock, RedlockConfig};
use std::process::Command;
use std::time::Duration;
use support::{lockedjob_bin, NodeChecks, Persistence, RedisNodes, SetChecks};

const USER: &str = "lockedjob";
const PASSWORD: &str = "s3cret-for-tests";
const TTL: Duration = Duration::from_secs(10);
/// Bounds every call: a missing right must fail the call, not hang it.
const NO_HANG: Duration = Duration::from_secs(15);

fn engine(nodes: &RedisNodes) -> Redlock {
    let mut config = RedlockConfig::new(nodes.urls());
    config.credentials = Credentials {
        username: Some(USER.into()),
        password: Some(PASSWORD.into()),
        ..Default::default()
    };
    config.holder = "acl-test/runner".into();
    config.request_timeout = Duration::from_secs(2);
    config.connect_timeout = Duration::from_secs(2);
    Redlock::new(config).expect("valid config")
}

async fn bounded<T>(what: &str, call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(NO_HANG, call)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

#[tokio::test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn the_documented_user_is_enough_for_every_call_of_the_engine() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("redis nodes");
    support::create_acl_user(&nodes, &support::readme_acl_setuser(PASSWORD));
    let engine = engine(&nodes);

    assert_eq!(bounded("probe", engine.reachable_nodes()).await, 3);
    let lease = bounded("acquire", engine.try_acquire("acl", TTL))
        .await
        .expect("acquire as the ACL user");
    assert_eq!(lease.token(), 1);
    bounded("extend", engine.extend(&lease))
        .await
        .expect("extend as the ACL user");
    bounded("renew", engine.renew(&lease, Duration::from_millis(10)))
        .await
        .expect("renew as the ACL user");
    let hint = bounded("hint", engine.value_on_any_node("acl")).await;
    assert_eq!(hint.map(|(value, _)| value).as_deref(), Some(lease.value()));
    assert_eq!(
        bounded("holder", engine.current_holder("acl"))
            .await
            .as_deref(),
        Some("acl-test/runner")
    );
    assert_eq!(bounded("release", engine.release(&lease)).await, 3);
    let step = bounded("acquire a step", engine.try_acquire_step("acl", TTL, 42))
        .await
        .expect("step as the ACL user");
    assert_eq!(step.token(), 2);
    assert_eq!(
        nodes[0].get("lockedjob:progress:acl").as_deref(),
        Some("42")
    );
    let view = bounded("inspect", engine.inspect("acl")).await;
    assert!(
        view.nodes.iter().all(|n| n.error.is_none()),
        "status as the ACL user: {view:?}"
    );
    assert_eq!(
        (view.holder.as_deref(), view.token),
        (Some("acl-test/runner"), Some(2))
    );
    assert_eq!(bounded("release", engine.release(&step)).await, 3);
    assert_eq!(
        support::acl_denials(&nodes),
        Vec::<String>::new(),
        "nothing was denied"
    );

    let out = exec(&nodes);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "token=1");
    assert_eq!(nodes.count_key("lockedjob:lock:nightly"), 0, "released");
    assert_eq!(
        support::acl_denials(&nodes),
        Vec::<String>::new(),
        "nothing was denied"
    );
}

/// `lockedjob exec --lock nightly` as the ACL user, printing its token.
fn exec(nodes: &RedisNodes) -> std::process::Output {
    Command::new(lockedjob_bin())
        .args([
            "exec", "--lock", "nightly", "--ttl", "10s", "--", "sh", "-c",
        ])
        .arg("echo token=$LOCKEDJOB_FENCING_TOKEN")
        .env("LOCKEDJOB_REDIS_URLS", nodes.urls().join(","))
        .env("LOCKEDJOB_REDIS_USERNAME", USER)
        .env("LOCKEDJOB_REDIS_PASSWORD", PASSWORD)
        .env("LOCKEDJOB_REQUEST_TIMEOUT", "2s")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run lockedjob exec")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Without `del` the lock cannot be given back: the command still ran once, and the release
/// failure is reported with Redis's reason instead of passing in silence.
#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn a_release_the_user_may_not_do_is_reported() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("redis nodes");
    let mut acl = support::readme_acl_setuser(PASSWORD);
    acl.push("-del".into());
    support::create_acl_user(&nodes, &acl);
    let out = exec(&nodes);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(text(&out.stdout).trim(), "token=1");
    assert!(
        stderr.contains("release failed") && stderr.contains("DEL (called by the release script)"),
        "{stderr}"
    );
    assert_eq!(
        nodes.count_key("lockedjob:lock:nightly"),
        3,
        "the key waits for its TTL"
    );
}

/// The documented user with one right taken away, and what the engine does about it.
#[tokio::test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn each_missing_right_fails_the_call_with_a_message_naming_it() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("redis nodes");
    let documented = support::readme_acl_setuser(PASSWORD);
    let without = |taken: &[&str]| -> Vec<String> {
        let mut acl = documented.clone();
        acl.extend(taken.iter().map(|t| t.to_string()));
        acl
    };
    // (right taken away, ACL modifiers that take it, what the message must name)
    let table: [(&str, Vec<String>, &str); 6] = [
        ("script|load", without(&["-script|load"]), "script|load"),
        ("evalsha", without(&["-evalsha"]), "evalsha"),
        ("get", without(&["-get"]), "get"),
        ("set", without(&["-set"]), "set"),
        ("pexpire", without(&["-pexpire"]), "pexpire"),
        (
            "keys under the prefix",
            without(&["resetkeys", "~someone-else:*"]),
            "key",
        ),
    ];
    for (case, acl, named) in table {
        for node in &nodes.nodes {
            node.command::<()>(&["FLUSHALL"]).expect("FLUSHALL");
        }
        support::create_acl_user(&nodes, &acl);
        let engine = engine(&nodes);
        let failure = match bounded(case, engine.try_acquire("acl", TTL)).await {
            Err(err) => {
                assert!(
                    matches!(err, LockError::NoQuorum { .. }),
                    "{case}: refused for node trouble, not as held elsewhere: {err}"
                );
                err.to_string()
            }
            Ok(lease) => {
                // A right the acquire does not use fails the call that does.
                let extend = bounded(case, engine.extend(&lease)).await;
                bounded(case, engine.release(&lease)).await;
                extend.expect_err("extend refused").to_string()
            }
        };
        eprintln!("{case}: {failure}");
        assert!(failure.to_lowercase().contains(named), "{case}: {failure}");
        assert!(
            !support::acl_denials(&nodes).is_empty(),
            "{case}: the node logged the denial"
        );
    }
}

#[tokio::test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn a_wrong_password_or_unknown_user_is_reported_as_authentication() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("redis nodes");
    support::create_acl_user(&nodes, &support::readme_acl_setuser(PASSWORD));
    for (user, password) in [(USER, "not-the-password"), ("nobody", PASSWORD)] {
        let mut config = RedlockConfig::new(nodes.urls());
        config.credentials = Credentials {
            username: Some(user.into()),
            password: Some(password.into()),
            ..Default::default()
        };
        config.request_timeout = Duration::from_secs(2);
        let engine = Redlock::new(config).expect("valid config");
        let err = bounded(user, engine.try_acquire("acl", TTL))
            .await
            .expect_err("refused");
        let message = err.to_string();
        assert!(
            message.contains("authentication failed (check the Redis user/password)"),
            "{user}: {message}"
        );
        assert!(
            !message.contains(password),
            "{user}: the password leaked: {message}"
        );
    }
}

/// The answer of docs/security.md ("Other clients on the lock nodes") to "may other lock
/// clients share the nodes": the operator's user is refused `EVAL` (redsync's fallback when a
/// node's script cache is empty), and the user the page gives such a client runs `EVAL` on its
/// own keys but cannot touch the operator's.
#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn another_lock_client_needs_a_user_of_its_own_and_cannot_reach_the_operators_keys() {
    let nodes = RedisNodes::start(1, Persistence::None).expect("redis node");
    support::create_acl_user(&nodes, &support::readme_acl_setuser(PASSWORD));
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md"))
        .expect("docs/security.md");
    let other_user: Vec<String> = readme
        .lines()
        .find(|line| line.starts_with("ACL SETUSER redsync "))
        .expect("docs/security.md's line for another client's user")
        .split_whitespace()
        .map(|word| word.replace("<password>", "other-secret"))
        .collect();
    let args: Vec<&str> = other_user.iter().map(String::as_str).collect();
    nodes.nodes[0]
        .command::<()>(&args)
        .expect("create the other client's user");
    let port = nodes.nodes[0].port();
    let eval_as = |user: &str, password: &str, key: &str| -> redis::RedisResult<()> {
        let client = redis::Client::open(format!("redis://{user}:{password}@127.0.0.1:{port}"))?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        redis::cmd("EVAL")
            .arg("return redis.call('SET', KEYS[1], 'x')")
            .arg(1)
            .arg(key)
            .query(&mut conn)
    };
    let denied = |result: redis::RedisResult<()>| {
        result.is_err_and(|e| {
            e.to_string().contains("NOPERM") || e.to_string().contains("no permissions")
        })
    };
    assert!(
        denied(eval_as(USER, PASSWORD, "lockedjob:lock:x")),
        "the operator's user has no EVAL"
    );
    eval_as("redsync", "other-secret", "redsync:lock").expect("EVAL on its own keys");
    assert!(
        denied(eval_as("redsync", "other-secret", "lockedjob:fence:x")),
        "the other client cannot write the operator's fence"
    );
}
