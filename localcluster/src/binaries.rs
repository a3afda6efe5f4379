//! Where the control plane's binaries are: `$LOCKEDJOB_K8S_BIN`, or the cache that
//! `scripts/k8s-bins.sh` fills (the script is run when the variable is unset; a cold build takes
//! many minutes, a warm one a second).

use crate::Error;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Names the directory holding the binaries; skips running the build script.
pub const BIN_DIR_ENV: &str = "LOCKEDJOB_K8S_BIN";

#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
}

const REQUIRED: [&str; 5] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
];

impl Binaries {
    pub fn in_dir(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        let dir = dir.into();
        for name in REQUIRED {
            if !dir.join(name).is_file() {
                return Err(Error::MissingBinary {
                    name,
                    dir: dir.clone(),
                });
            }
        }
        Ok(Self { dir })
    }

    /// `$LOCKEDJOB_K8S_BIN`, else the last line `scripts/k8s-bins.sh` prints (building them
    /// first if the cache is cold; its progress goes to this process's stderr).
    pub fn locate() -> Result<Self, Error> {
        if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
            return Self::in_dir(dir);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/k8s-bins.sh");
        let output = Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| Error::io("run scripts/k8s-bins.sh", e))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        match stdout.lines().last() {
            Some(dir) if output.status.success() => Self::in_dir(dir.trim()),
            _ => Err(Error::BuildScript {
                script,
                status: output.status.to_string(),
            }),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}
