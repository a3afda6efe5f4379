//! The Dockerfile against the workspace: its build stage's steps, run here on the build context
//! that `.dockerignore` lets through, with `cargo build` replaced by loading the workspace as
//! a build does (no compiling), must succeed at every step. (`docker build .` once failed with
//! "failed to load manifest for workspace member" after a member was added, and again after a
//! bench was added that the dependency step did not stub; nothing noticed either.)

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(name: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The build stage's instructions (from its `FROM` to the next), continuation lines joined,
/// comments dropped.
fn build_stage(dockerfile: &str) -> Vec<String> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in dockerfile.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && current.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                instructions.push(std::mem::take(&mut current));
            }
        }
    }
    let stages: Vec<usize> = instructions
        .iter()
        .enumerate()
        .filter(|(_, instruction)| instruction.starts_with("FROM "))
        .map(|(at, _)| at)
        .collect();
    assert!(stages.len() >= 2, "a build stage and a final stage");
    instructions[stages[0] + 1..stages[1]].to_vec()
}

/// Copies what `.dockerignore` lets into the context (`*`, then `!path` lines) to `to`.
fn build_context(to: &Path) {
    for line in read(".dockerignore").lines() {
        let Some(path) = line.trim().strip_prefix('!') else {
            continue;
        };
        let path = path.trim_end_matches('/');
        copy(&Path::new(ROOT).join(path), &to.join(path));
    }
}

fn copy(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read_dir") {
            let entry = entry.expect("a directory entry");
            copy(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).expect("mkdir");
        }
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }
}

/// `COPY SRC... DEST` from the context into the work directory, as Docker does: a source that
/// is missing from the context fails the build; a directory's contents go into DEST.
fn run_copy(args: &str, context: &Path, workdir: &Path) {
    let words: Vec<&str> = args.split_whitespace().collect();
    let (dest, sources) = words.split_last().expect("COPY SRC DEST");
    for source in sources {
        let from = context.join(source);
        assert!(
            from.exists(),
            "`COPY {args}`: {source} is not in the build context (.dockerignore)"
        );
        let into = if dest.ends_with('/') && from.is_file() {
            workdir
                .join(dest)
                .join(from.file_name().expect("a file name"))
        } else {
            workdir.join(dest)
        };
        copy(&from, &into);
    }
}

/// A `cargo` whose `build` loads the workspace as a build would and builds nothing: every
/// manifest and every target it names must be there (`cargo metadata` and `cargo tree` do not
/// look for targets; `check` does, before it finds no such binary), the lock file must be
/// current (`--locked`), and the binary the image ships must be a target.
fn cargo_shim(dir: &Path) -> PathBuf {
    let script = format!(
        r#"#!/bin/sh
[ "$1" = build ] || {{ echo "the test's cargo only stands in for builds: $*" >&2; exit 2; }}
'{cargo}' tree --offline --locked --edges normal >/dev/null || exit 1
out=$('{cargo}' check --offline --bin no-such-target-here 2>&1)
case "$out" in
  *"no bin target named"*) ;;
  *) echo "$out" >&2; exit 1 ;;
esac
printf '%s\n' "$out" | grep -qx '    lockedjob' || {{ echo "no binary lockedjob: $out" >&2; exit 1; }}
"#,
        cargo = env!("CARGO")
    );
    let shim = dir.join("cargo");
    std::fs::write(&shim, script).expect("write the cargo shim");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir.to_owned()
}

#[test]
fn the_dockerfiles_build_stage_loads_the_workspace_at_every_step() {
    let context = tempfile::tempdir().expect("tempdir");
    let workdir = tempfile::tempdir().expect("tempdir");
    let shims = tempfile::tempdir().expect("tempdir");
    build_context(context.path());
    let path = format!(
        "{}:{}",
        cargo_shim(shims.path()).display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let stage = build_stage(&read("Dockerfile"));
    let builds = stage.iter().filter(|i| i.contains("cargo build")).count();
    assert!(
        builds >= 2,
        "a dependency build and the real build: {stage:#?}"
    );
    for instruction in &stage {
        let (verb, args) = instruction.split_once(' ').unwrap_or((instruction, ""));
        match verb {
            "WORKDIR" => {}
            "COPY" => run_copy(args, context.path(), workdir.path()),
            "RUN" => {
                let out = Command::new("sh")
                    .args(["-ec", args])
                    .current_dir(workdir.path())
                    .env("PATH", &path)
                    .output()
                    .expect("run sh");
                assert!(
                    out.status.success(),
                    "`RUN {args}` fails:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            other => panic!("the test does not know `{other}` in the build stage"),
        }
    }
}
