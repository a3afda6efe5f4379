//! A wall clock that can be moved while a process runs: a small `LD_PRELOAD` shim that adds an
//! offset, read from a shared 8-byte file, to `CLOCK_REALTIME` (what Redis expires keys by),
//! leaving the monotonic clocks alone.
//!
//! Why not libfaketime: Debian's `redis-server` is linked with jemalloc, and libfaketime
//! deadlocks or fails at start-up under jemalloc (wolfcw/libfaketime#130, open since 2017):
//! its initialisation calls `dlsym`, which allocates, which makes jemalloc read the clock,
//! which re-enters libfaketime. The shim makes the system call itself and never allocates.

use super::error::HarnessError;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const SHIM_SOURCE: &str = include_str!("clock_skew.c");

/// The environment variable the shim reads the offset file's path from.
pub const SKEW_FILE_ENV: &str = "LOCKEDJOB_CLOCK_SKEW_FILE";

/// Where this process builds the shim; removed when the process exits.
static SHIM_DIR: OnceLock<PathBuf> = OnceLock::new();

extern "C" fn remove_shim_dir() {
    if let Some(dir) = SHIM_DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Builds the shim once per process (with the C compiler every Rust toolchain needs anyway).
fn shim() -> Result<&'static Path, HarnessError> {
    static SHIM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    SHIM.get_or_init(|| {
        let dir = SHIM_DIR.get_or_init(|| {
            std::env::temp_dir().join(format!("lockedjob-clock-shim-{}", std::process::id()))
        });
        // Removed at exit, or every test process leaves a directory in /tmp.
        // SAFETY: registers a plain extern "C" function with no arguments.
        unsafe { libc::atexit(remove_shim_dir) };
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let source = dir.join("clock_skew.c");
        let library = dir.join("clock_skew.so");
        std::fs::write(&source, SHIM_SOURCE).map_err(|e| e.to_string())?;
        let out = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .map_err(|e| format!("cannot run cc: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(library)
    })
    .as_ref()
    .map(PathBuf::as_path)
    .map_err(|e| HarnessError::ClockShim(e.clone()))
}

/// One process's clock offset.
pub struct SkewedClock {
    file: std::fs::File,
    path: PathBuf,
    library: &'static Path,
}

impl SkewedClock {
    pub fn new(path: &Path) -> Result<Self, HarnessError> {
        let library = shim()?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| HarnessError::Io("create the clock offset file", e))?;
        file.write_all_at(&0i64.to_le_bytes(), 0)
            .map_err(|e| HarnessError::Io("write the clock offset file", e))?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            library,
        })
    }

    /// Makes `cmd` run on this clock.
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("LD_PRELOAD", self.library)
            .env(SKEW_FILE_ENV, &self.path);
    }

    /// Sets the offset from the true time. Written in place: the shim has the file mapped.
    pub fn set(&self, offset: Duration) -> Result<(), HarnessError> {
        let millis = i64::try_from(offset.as_millis()).unwrap_or(i64::MAX);
        self.file
            .write_all_at(&millis.to_le_bytes(), 0)
            .map_err(|e| HarnessError::Io("write the clock offset file", e))
    }
}
