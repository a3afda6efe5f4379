//! The operator image, built from the Dockerfile as a user's CI would build it: `scripts/image.sh`
//! runs `buildah bud` on the Dockerfile as it is, with the base images it names made here
//! (Debian bookworm by debootstrap, this machine's Rust toolchain, distroless/cc's packages).
//! A Dockerfile that no longer matches the workspace fails here (`docker build .` once failed
//! with "failed to load manifest for workspace member" after a member was added, and again
//! after a bench was added that the dependency step did not stub; nothing noticed either).
//! Then the image is opened as a runtime would: its configuration (user 65532, entrypoint,
//! port), its files (no shell, CA certificates, nonroot's passwd entry), and the binary run
//! from its root file system as user 65532, which fails if a shared library it loads is
//! missing; and its size, at most 50 MB uncompressed. The chart's image on the real node is
//! this one (`tests/kubernetes/real_node_chart.rs`).
//! Needs root.

use testsupport as support;

use localcluster::node::ImageSource;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The chart's image name, as CI's build and `tests/kubernetes/real_node_chart.rs` ask for it: one
/// archive serves all three.
fn build() -> PathBuf {
    match support::dockerfile_image(&support::chart_image()) {
        ImageSource::Archive(path) => path,
        other => panic!("scripts/image.sh gave {other:?}, not an archive"),
    }
}

/// A docker archive's files by name; a link (buildah writes each layer once and links to
/// it from `ID/layer.tar`) maps to the name of the file it points to.
struct Archive {
    files: HashMap<PathBuf, Vec<u8>>,
    links: HashMap<PathBuf, PathBuf>,
}

impl Archive {
    fn read(path: &Path) -> Self {
        let file = std::fs::File::open(path).expect("open the archive");
        let mut tar = tar::Archive::new(file);
        let (mut files, mut links) = (HashMap::new(), HashMap::new());
        for entry in tar.entries().expect("read the archive") {
            let mut entry = entry.expect("an archive entry");
            let name = entry.path().expect("a path").into_owned();
            if let Some(target) = entry.link_name().expect("a link name") {
                // Relative to the link's directory, which is one level down: "../X.tar".
                let target = target.strip_prefix("..").unwrap_or(&target).to_owned();
                links.insert(name, target);
                continue;
            }
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes).expect("read an archive entry");
            files.insert(name, bytes);
        }
        Self { files, links }
    }

    fn file(&self, name: &str) -> &[u8] {
        let name = Path::new(name);
        let name = self.links.get(name).map_or(name, PathBuf::as_path);
        self.files
            .get(name)
            .unwrap_or_else(|| panic!("{} is not in the archive", name.display()))
    }

    /// The image's configuration and its layers, in order (`manifest.json`).
    fn manifest(&self) -> (serde_json::Value, Vec<String>) {
        let manifest: serde_json::Value =
            serde_json::from_slice(self.file("manifest.json")).expect("manifest.json");
        let image = &manifest[0];
        let tag = support::chart_image();
        assert_eq!(image["RepoTags"], serde_json::json!([tag]), "{manifest}");
        let config = image["Config"].as_str().expect("a Config entry");
        let config = serde_json::from_slice(self.file(config)).expect("the image config");
        let layers = image["Layers"].as_array().expect("Layers");
        let layers = layers
            .iter()
            .map(|l| l.as_str().expect("a layer's name").to_string())
            .collect();
        (config, layers)
    }

    /// The layers unpacked one over the other, owners and modes kept, into `root`.
    fn unpack(&self, layers: &[String], root: &Path) {
        for layer in layers {
            let mut tar = tar::Archive::new(self.file(layer));
            tar.set_preserve_ownerships(true);
            tar.set_preserve_permissions(true);
            tar.unpack(root)
                .unwrap_or_else(|e| panic!("unpack layer {layer}: {e}"));
        }
    }
}

#[test]
#[ignore = "kubernetes tier: root and a local cluster; run with scripts/test.sh kubernetes"]
fn the_dockerfile_builds_an_image_like_distroless_cc_that_runs_as_nonroot() {
    let _turn = crate::beside();
    let archive = Archive::read(&build());
    let (config, layers) = archive.manifest();
    let config = &config["config"];
    assert_eq!(config["User"], "65532:65532", "{config}");
    assert_eq!(
        config["Entrypoint"],
        serde_json::json!(["/usr/local/bin/lockedjob"])
    );
    assert_eq!(config["Cmd"], serde_json::json!(["operator"]));
    assert!(config["ExposedPorts"].get("8080/tcp").is_some(), "{config}");

    let root = tempfile::tempdir().expect("tempdir");
    archive.unpack(&layers, root.path());
    // Every node pulls the image on every upgrade (issue 46): the layers, uncompressed, as
    // `docker images` counts them (MB of 10^6 bytes).
    let size: usize = layers.iter().map(|l| archive.file(l).len()).sum();
    let binary = std::fs::metadata(root.path().join("usr/local/bin/lockedjob"))
        .expect("the binary")
        .len();
    eprintln!("the image: {size} bytes uncompressed, the binary {binary}");
    assert!(
        size <= 50_000_000,
        "the image is {size} bytes uncompressed, the binary {binary}: over 50 MB"
    );
    let has = |path: &str| root.path().join(path).symlink_metadata().is_ok();
    for shell in [
        "bin/sh",
        "usr/bin/sh",
        "bin/bash",
        "usr/bin/bash",
        "bin/busybox",
    ] {
        assert!(!has(shell), "the image has a shell: {shell}");
    }
    assert!(
        has("etc/ssl/certs/ca-certificates.crt"),
        "no CA certificates"
    );
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd")).expect("etc/passwd");
    assert!(
        passwd
            .lines()
            .any(|l| l.starts_with("nonroot:x:65532:65532:")),
        "{passwd}"
    );

    let out = Command::new("chroot")
        .args(["--userspec=65532:65532"])
        .arg(root.path())
        .args(["/usr/local/bin/lockedjob", "--version"])
        .output()
        .expect("run chroot");
    assert!(
        out.status.success(),
        "the image's lockedjob does not run as 65532: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(
        version.contains(env!("CARGO_PKG_VERSION")),
        "the image's binary is not this workspace's: {version}"
    );
}
