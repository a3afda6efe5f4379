//! TLS to real `redis-server` nodes serving TLS only, with certificates made per test: the
//! engine over `rediss://`, each way verification can fail (named node, stated reason), mutual
//! TLS, the configuration mistakes caught before any node is contacted, and `exec` over TLS.

use testsupport as support;

use lockedjob::redlock::{ConfigError, LockError, NodeErrorKind, Redlock, RedlockConfig, TlsFiles};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use support::pki::{CertFiles, TestCa, Validity};
use support::{lockedjob_bin, NodeChecks, NodeTls, Persistence, RedisNode, RedisNodes, SetChecks};

const TTL: Duration = Duration::from_secs(10);

fn node_tls(ca: &TestCa, server: &CertFiles, host: &str) -> NodeTls {
    NodeTls {
        cert_file: server.cert.clone(),
        key_file: server.key.clone(),
        ca_file: ca.ca_file.clone(),
        require_client_cert: false,
        client: None,
        host: host.to_string(),
    }
}

fn engine(urls: Vec<String>, tls: TlsFiles) -> Result<Redlock, ConfigError> {
    let mut config = RedlockConfig::new(urls);
    config.tls = tls;
    config.holder = "tls-test/runner".into();
    // Generous: a TLS handshake on a loaded 2-core machine is not what these tests measure.
    config.request_timeout = Duration::from_secs(2);
    config.connect_timeout = Duration::from_secs(2);
    Redlock::new(config)
}

fn trusting(ca: &TestCa) -> TlsFiles {
    TlsFiles {
        ca_file: Some(ca.ca_file.clone()),
        ..TlsFiles::default()
    }
}

/// The one failure of a single-node attempt that was refused.
async fn single_node_failure(url: String, tls: TlsFiles) -> (String, NodeErrorKind) {
    let engine = engine(vec![url], tls).expect("valid config");
    match engine.try_acquire("tls", TTL).await {
        Err(err @ LockError::NoQuorum { .. }) => {
            let failure = err.node_failures()[0].clone();
            (err.to_string(), failure.kind)
        }
        other => panic!("expected no quorum, got {other:?}"),
    }
}

#[tokio::test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn a_lock_over_rediss_on_five_tls_nodes() {
    let ca = TestCa::new("nodes");
    let server = ca.server("redis", &["127.0.0.1"], Validity::Current);
    let nodes = RedisNodes::start_tls(5, Persistence::None, &node_tls(&ca, &server, "127.0.0.1"))
        .expect("start TLS nodes");
    assert!(nodes.urls().iter().all(|u| u.starts_with("rediss://")));

    let engine = engine(nodes.urls(), trusting(&ca)).expect("valid config");
    let first = engine.try_acquire("tls", TTL).await.expect("lock over TLS");
    assert_eq!(first.token(), 1);
    for node in &nodes.nodes {
        assert_eq!(
            node.get("lockedjob:lock:tls").as_deref(),
            Some(first.value()),
            "every node holds the value (read back over TLS)"
        );
    }
    assert_eq!(engine.release(&first).await, 5);
    let second = engine.try_acquire("tls", TTL).await.expect("again");
    assert_eq!(
        second.token(),
        2,
        "the fence grows over TLS as in plain text"
    );
    engine.release(&second).await;
}

#[tokio::test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn each_verification_failure_names_the_node_and_the_reason() {
    let ca = TestCa::new("nodes");
    let other_ca = TestCa::new("other");
    let good = ca.server("good", &["127.0.0.1"], Validity::Current);
    let expired = ca.server("expired", &["127.0.0.1"], Validity::Expired);
    let wrong_name = ca.server("wrong-name", &["localhost"], Validity::Current);

    let good_node =
        RedisNode::start_tls(Persistence::None, node_tls(&ca, &good, "127.0.0.1")).expect("node");
    let expired_node =
        RedisNode::start_tls(Persistence::None, node_tls(&ca, &expired, "127.0.0.1"))
            .expect("node");
    let wrong_name_node =
        RedisNode::start_tls(Persistence::None, node_tls(&ca, &wrong_name, "localhost"))
            .expect("node");
    let plain_node = RedisNode::start(Persistence::None).expect("node");

    let table: Vec<(&str, String, TlsFiles, &str)> = vec![
        (
            "CA that did not sign the node's certificate",
            good_node.url(),
            trusting(&other_ca),
            "not signed by a trusted CA",
        ),
        (
            "expired certificate",
            expired_node.url(),
            trusting(&ca),
            "certificate has expired",
        ),
        (
            "certificate for another name",
            // The certificate names localhost; the URL says 127.0.0.1.
            format!("rediss://127.0.0.1:{}", wrong_name_node.port()),
            trusting(&ca),
            "does not name the host in its URL",
        ),
    ];
    for (case, url, tls, reason) in table {
        let (message, kind) = single_node_failure(url.clone(), tls).await;
        assert!(matches!(kind, NodeErrorKind::Tls(_)), "{case}: {kind:?}");
        assert!(
            message.contains(&format!("rediss://127.0.0.1:{}", url_port(&url))),
            "{case}: the message names the node: {message}"
        );
        assert!(message.contains(reason), "{case}: {message}");
    }

    // A plain-text Redis reads a ClientHello as the start of an inline command and waits for
    // its end: that costs one timeout, and nothing is written.
    let url = format!("rediss://127.0.0.1:{}", plain_node.port());
    let (message, kind) = single_node_failure(url, trusting(&ca)).await;
    assert_eq!(kind, NodeErrorKind::Timeout, "{message}");
    assert_eq!(plain_node.get("lockedjob:lock:tls"), None);

    // The right CA, the right name: the same node works.
    let engine = engine(vec![good_node.url()], trusting(&ca)).expect("config");
    let lease = engine.try_acquire("tls", TTL).await.expect("verified");
    engine.release(&lease).await;
}

fn url_port(url: &str) -> &str {
    url.rsplit(':').next().expect("a port")
}

#[tokio::test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn mutual_tls_needs_a_client_certificate_the_nodes_ca_signed() {
    let ca = TestCa::new("nodes");
    let stranger_ca = TestCa::new("stranger");
    let server = ca.server("redis", &["127.0.0.1"], Validity::Current);
    let client = ca.client("operator");
    let stranger = stranger_ca.client("stranger");
    let tls = NodeTls {
        require_client_cert: true,
        client: Some((client.cert.clone(), client.key.clone())),
        ..node_tls(&ca, &server, "127.0.0.1")
    };
    let nodes = RedisNodes::start_tls(3, Persistence::None, &tls).expect("start mTLS nodes");

    let with_cert = |cert: &CertFiles| TlsFiles {
        ca_file: Some(ca.ca_file.clone()),
        cert_file: Some(cert.cert.clone()),
        key_file: Some(cert.key.clone()),
    };
    let engine_with = engine(nodes.urls(), with_cert(&client)).expect("config");
    let lease = engine_with
        .try_acquire("mtls", TTL)
        .await
        .expect("mTLS lock");
    assert_eq!(nodes.count_key("lockedjob:lock:mtls"), 3);
    engine_with.release(&lease).await;

    for (case, tls) in [
        ("no client certificate", trusting(&ca)),
        ("a certificate another CA signed", with_cert(&stranger)),
    ] {
        let engine = engine(nodes.urls(), tls).expect("config");
        let err = engine
            .try_acquire("mtls", TTL)
            .await
            .expect_err("refused by every node");
        let message = err.to_string();
        assert_eq!(err.node_failures().len(), 3, "{case}: {message}");
        for failure in err.node_failures() {
            assert!(
                matches!(failure.kind, NodeErrorKind::Tls(_)),
                "{case}: {failure}"
            );
        }
        assert!(
            message.contains("requires a client certificate"),
            "{case}: {message}"
        );
        assert_eq!(nodes.count_key("lockedjob:lock:mtls"), 0, "{case}");
    }
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn tls_mistakes_are_caught_before_any_node_is_contacted() {
    let ca = TestCa::new("nodes");
    let client = ca.client("operator");
    let other = ca.client("other");
    let not_pem = ca.dir().join("not.pem");
    std::fs::write(&not_pem, "hello").expect("write");
    let missing = PathBuf::from("/nonexistent/ca.crt");
    let tls_url = || vec!["rediss://127.0.0.1:1".to_string()];

    let cases: Vec<(&str, Vec<String>, TlsFiles, &str)> = vec![
        (
            "missing CA file",
            tls_url(),
            TlsFiles {
                ca_file: Some(missing.clone()),
                ..TlsFiles::default()
            },
            "/nonexistent/ca.crt",
        ),
        (
            "CA file without a certificate",
            tls_url(),
            TlsFiles {
                ca_file: Some(not_pem.clone()),
                ..TlsFiles::default()
            },
            "holds no PEM certificate",
        ),
        (
            "certificate without its key",
            tls_url(),
            TlsFiles {
                cert_file: Some(client.cert.clone()),
                ..TlsFiles::default()
            },
            "go together",
        ),
        (
            "key file holding a certificate",
            tls_url(),
            TlsFiles {
                cert_file: Some(client.cert.clone()),
                key_file: Some(client.cert.clone()),
                ..TlsFiles::default()
            },
            "holds no PEM private key",
        ),
        (
            "key of another certificate",
            tls_url(),
            TlsFiles {
                cert_file: Some(client.cert.clone()),
                key_file: Some(other.key.clone()),
                ..TlsFiles::default()
            },
            "is not the key of the client certificate",
        ),
        (
            "TLS files with a plain-text node",
            vec!["rediss://127.0.0.1:1".into(), "redis://127.0.0.1:2".into()],
            trusting(&ca),
            "redis://127.0.0.1:2/0 is plain redis://",
        ),
        (
            "verification turned off in the URL",
            vec!["rediss://127.0.0.1:1/#insecure".into()],
            TlsFiles::default(),
            "cannot be turned off",
        ),
    ];
    for (case, urls, tls, expected) in cases {
        match engine(urls, tls) {
            Err(err) => assert!(err.to_string().contains(expected), "{case}: {err}"),
            Ok(_) => panic!("{case}: accepted"),
        }
    }
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn exec_runs_a_command_under_a_lock_over_mutual_tls_from_the_environment() {
    let ca = TestCa::new("nodes");
    let server = ca.server("redis", &["127.0.0.1"], Validity::Current);
    let client = ca.client("exec");
    let tls = NodeTls {
        require_client_cert: true,
        client: Some((client.cert.clone(), client.key.clone())),
        ..node_tls(&ca, &server, "127.0.0.1")
    };
    let nodes = RedisNodes::start_tls(3, Persistence::None, &tls).expect("start mTLS nodes");
    let exec = |with_client_cert: bool| {
        let mut cmd = Command::new(lockedjob_bin());
        cmd.args(["exec", "--lock", "nightly", "--", "sh", "-c"])
            .arg("echo token=$LOCKEDJOB_FENCING_TOKEN")
            .env("LOCKEDJOB_REDIS_URLS", nodes.urls().join(","))
            .env("LOCKEDJOB_REDIS_CA_FILE", &ca.ca_file)
            .env("LOCKEDJOB_REQUEST_TIMEOUT", "2s")
            .env("LOCKEDJOB_CONNECT_TIMEOUT", "2s")
            .env("RUST_LOG", "warn");
        if with_client_cert {
            cmd.env("LOCKEDJOB_REDIS_CERT_FILE", &client.cert)
                .env("LOCKEDJOB_REDIS_KEY_FILE", &client.key);
        }
        cmd.output().expect("run lockedjob exec")
    };

    let out = exec(true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "token=1");

    let refused = exec(false);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_ne!(refused.status.code(), Some(0));
    assert!(
        stderr.contains("requires a client certificate"),
        "exec says why: {stderr}"
    );
}
