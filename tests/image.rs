//! The Dockerfile against the workspace: the build context that `.dockerignore` lets through,
//! with the member stubs the Dockerfile makes, must still be a workspace cargo can load.
//! (`docker build .` once failed with "failed to load manifest for workspace member" after a
//! member was added, and nothing noticed.)

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(name: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// `cargo metadata --no-deps` of the workspace at `dir`.
fn cargo_metadata(dir: &Path) -> std::process::Output {
    Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(dir)
        .output()
        .expect("run cargo metadata")
}

/// The workspace's members other than the root package, as directories relative to the root.
fn other_members() -> Vec<String> {
    let out = cargo_metadata(Path::new(ROOT));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let mut members: Vec<String> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter_map(|package| {
            let manifest = PathBuf::from(package["manifest_path"].as_str()?);
            let dir = manifest.parent()?.strip_prefix(ROOT).ok()?.to_owned();
            (!dir.as_os_str().is_empty()).then(|| dir.to_string_lossy().into_owned())
        })
        .collect();
    members.sort();
    members
}

/// The members the Dockerfile stubs: its `for member in A B; do` loop.
fn stubbed_members(dockerfile: &str) -> Vec<String> {
    let line = dockerfile
        .lines()
        .find_map(|line| line.trim_start().strip_prefix("RUN for member in "))
        .expect("the Dockerfile stubs the members in a `RUN for member in ...; do` loop");
    let list = line.split(';').next().unwrap_or_default();
    let mut members: Vec<String> = list.split_whitespace().map(str::to_string).collect();
    members.sort();
    members
}

/// Copies what `.dockerignore` lets into the context (`*`, then `!path` lines) to `to`.
fn build_context(to: &Path) {
    for line in read(".dockerignore").lines() {
        let Some(path) = line.trim().strip_prefix('!') else {
            continue;
        };
        let from = Path::new(ROOT).join(path.trim_end_matches('/'));
        let into = to.join(path.trim_end_matches('/'));
        copy(&from, &into);
    }
}

fn copy(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("mkdir in the context");
        for entry in std::fs::read_dir(from).expect("read_dir") {
            let entry = entry.expect("a directory entry");
            copy(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).expect("mkdir in the context");
        }
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }
}

#[test]
fn the_dockerfile_stubs_every_workspace_member_and_cargo_loads_its_context() {
    let dockerfile = read("Dockerfile");
    let members = other_members();
    assert!(!members.is_empty(), "the workspace has other members");
    assert_eq!(
        stubbed_members(&dockerfile),
        members,
        "the Dockerfile's stub loop must name every workspace member"
    );
    for member in &members {
        let copy_line = format!("COPY {member}/Cargo.toml {member}/");
        assert!(
            dockerfile.lines().any(|line| line.trim() == copy_line),
            "the Dockerfile lacks `{copy_line}`"
        );
    }

    let context = tempfile::tempdir().expect("tempdir");
    build_context(context.path());
    for member in &members {
        let src = context.path().join(member).join("src");
        std::fs::create_dir_all(&src).expect("mkdir");
        std::fs::write(src.join("lib.rs"), "").expect("stub lib.rs");
        std::fs::write(src.join("main.rs"), "fn main() {}").expect("stub main.rs");
    }
    let out = cargo_metadata(context.path());
    assert!(
        out.status.success(),
        "cargo cannot load the image's build context: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
