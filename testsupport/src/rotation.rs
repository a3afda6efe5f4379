//! Rotating what clients and nodes authenticate with, the way Kubernetes and Redis do it: files
//! replaced as a Secret volume replaces them, and the nodes told with `CONFIG SET`.

use super::pki::{CertFiles, TestCa, Validity};
use super::{NodeTls, Persistence, RedisNodes};
use lockedjob::redlock::TlsFiles;
use std::path::{Path, PathBuf};

/// Replaces `to` with `contents` the way the kubelet updates a Secret volume: all at once.
pub fn install(to: &Path, contents: &[u8]) {
    let staging = to.with_extension("new");
    std::fs::write(&staging, contents).expect("write staging file");
    std::fs::rename(&staging, to).expect("rename into place");
}

pub fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// One PEM file holding every CA given: a trust bundle.
pub fn bundle(cas: &[&TestCa]) -> Vec<u8> {
    cas.iter().flat_map(|ca| read(&ca.ca_file)).collect()
}

pub fn install_pair(to: &CertFiles, from: &CertFiles) {
    install(&to.key, &read(&from.key));
    install(&to.cert, &read(&from.cert));
}

/// A directory laid out as the kubelet lays out a Secret volume: each file a symlink into
/// `..data`, itself a symlink to a directory of one version, swapped in one rename. A reader
/// sees the old files or the new ones, never a mix (a new certificate with the old key).
pub struct SecretVolume {
    dir: PathBuf,
    versions: u32,
}

impl SecretVolume {
    pub fn new(dir: PathBuf, files: &[(&str, Vec<u8>)]) -> Self {
        std::fs::create_dir_all(&dir).expect("volume dir");
        let mut volume = Self { dir, versions: 0 };
        volume.update(files);
        for (name, _) in files {
            std::os::unix::fs::symlink(format!("..data/{name}"), volume.path(name))
                .expect("file symlink");
        }
        volume
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn update(&mut self, files: &[(&str, Vec<u8>)]) {
        self.versions += 1;
        let version = format!("..v{}", self.versions);
        std::fs::create_dir(self.dir.join(&version)).expect("version dir");
        for (name, contents) in files {
            std::fs::write(self.dir.join(&version).join(name), contents).expect("write");
        }
        let staging = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &staging).expect("data symlink");
        std::fs::rename(&staging, self.dir.join("..data")).expect("swap ..data");
    }

    /// The engine's TLS files: `ca.crt`, `tls.crt`, `tls.key`, as cert-manager names them.
    pub fn tls(&self) -> TlsFiles {
        TlsFiles {
            ca_file: Some(self.path("ca.crt")),
            cert_file: Some(self.path("tls.crt")),
            key_file: Some(self.path("tls.key")),
        }
    }
}

pub fn tls_secret(ca: Vec<u8>, pair: &CertFiles) -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("ca.crt", ca),
        ("tls.crt", read(&pair.cert)),
        ("tls.key", read(&pair.key)),
    ]
}

pub fn kill_clients(nodes: &RedisNodes) {
    for node in &nodes.nodes {
        let _: u64 = node
            .command(&["CLIENT", "KILL", "TYPE", "normal"])
            .expect("CLIENT KILL");
    }
}

pub fn config_set(nodes: &RedisNodes, parameter: &str, value: &Path) {
    for node in &nodes.nodes {
        let _: String = node
            .command(&["CONFIG", "SET", parameter, &value.display().to_string()])
            .unwrap_or_else(|e| panic!("CONFIG SET {parameter} on {}: {e}", node.url()));
    }
}

/// The user `user` of docs/security.md on every node, its passwords changed by `change` (`>new` adds one,
/// `<old` removes one), as an operator of the nodes does during a rotation.
pub fn set_password_rule(nodes: &RedisNodes, user: &str, change: &str) {
    let documented = super::readme_acl_setuser("unused");
    let mut args: Vec<&str> = vec!["ACL", "SETUSER", user];
    // The rights of docs/security.md, without its password.
    args.extend(
        documented
            .iter()
            .skip(3)
            .filter(|word| !word.starts_with('>'))
            .map(String::as_str),
    );
    args.push(change);
    for node in &nodes.nodes {
        let _: String = node
            .command(&args)
            .unwrap_or_else(|e| panic!("ACL SETUSER {args:?} on {}: {e}", node.url()));
    }
}

/// Three lock nodes that require client certificates, from files a test replaces (their CA
/// bundle, their certificate, and the certificate the test's own checks present), with
/// `appendfsync always`.
pub struct RotatingNodes {
    pub nodes: RedisNodes,
    node_ca: PathBuf,
    server: CertFiles,
    admin: CertFiles,
}

impl RotatingNodes {
    pub fn start(dir: &Path, ca: &TestCa) -> Self {
        let node_ca = dir.join("node-ca.crt");
        install(&node_ca, &read(&ca.ca_file));
        let pair = |name: &str| CertFiles {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
        };
        let (server, admin) = (pair("node"), pair("admin"));
        install_pair(
            &server,
            &ca.server("server-old", &["127.0.0.1"], Validity::Current),
        );
        install_pair(&admin, &ca.client("admin-old"));
        let tls = NodeTls {
            cert_file: server.cert.clone(),
            key_file: server.key.clone(),
            ca_file: node_ca.clone(),
            require_client_cert: true,
            client: Some((admin.cert.clone(), admin.key.clone())),
            host: "127.0.0.1".into(),
        };
        let nodes = RedisNodes::start_tls(3, Persistence::AppendFsyncAlways, &tls)
            .expect("start mTLS nodes");
        Self {
            nodes,
            node_ca,
            server,
            admin,
        }
    }

    /// The nodes trust exactly `cas` for client certificates from now on.
    pub fn trust(&self, cas: &[&TestCa]) {
        install(&self.node_ca, &bundle(cas));
        config_set(&self.nodes, "tls-ca-cert-file", &self.node_ca);
    }

    /// The nodes serve, and the test's checks present, certificates `ca` signed.
    pub fn serve_certificates_of(&self, ca: &TestCa) {
        install_pair(
            &self.server,
            &ca.server("server-new", &["127.0.0.1"], Validity::Current),
        );
        install_pair(&self.admin, &ca.client("admin-new"));
        config_set(&self.nodes, "tls-cert-file", &self.server.cert);
    }
}
