//! Child processes that cannot outlive their owner: each gets `PR_SET_PDEATHSIG` (SIGKILL when
//! the thread that started it ends, which is the cluster's own thread) and its own process
//! group, and is killed with its whole group when its handle is dropped.

use crate::Error;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Makes the command's process die with the thread that spawns it, in a group of its own.
pub fn contain(command: &mut Command) -> &mut Command {
    command.process_group(0);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

/// A control-plane process with its output in a log file.
#[derive(Debug)]
pub struct Daemon {
    child: Child,
    log: PathBuf,
    name: &'static str,
}

impl Daemon {
    pub fn spawn(program: &Path, args: &[String], log: PathBuf) -> Result<Self, Error> {
        let mut command = Command::new(program);
        command.args(args);
        Self::spawn_command(command, log)
    }

    /// Starts a prepared command (its environment, a network namespace) the same way.
    pub fn spawn_command(mut command: Command, log: PathBuf) -> Result<Self, Error> {
        let file = std::fs::File::create(&log).map_err(|e| Error::io("create a log file", e))?;
        let err = file
            .try_clone()
            .map_err(|e| Error::io("open a log file", e))?;
        command.stdin(Stdio::null()).stdout(file).stderr(err);
        let child = contain(&mut command)
            .spawn()
            .map_err(|e| Error::io("start a control-plane process", e))?;
        Ok(Self {
            child,
            log,
            name: "process",
        })
    }

    /// Names it in errors.
    pub fn named(mut self, name: &'static str) -> Self {
        self.name = name;
        self
    }

    /// Exited already (it should not have): its exit status.
    pub fn exited(&mut self) -> Option<String> {
        self.child
            .try_wait()
            .ok()
            .flatten()
            .map(|status| status.to_string())
    }

    /// The error for its having exited with `status`, with the end of its log.
    pub fn exited_error(&self, status: String) -> Error {
        Error::Exited {
            process: self.name,
            status,
            log: self.log.clone(),
            tail: self.log_tail(30),
        }
    }

    /// The last lines of its log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// SIGTERM to the group, SIGKILL after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        let group = Pid::from_raw(self.child.id() as i32);
        let _ = killpg(group, Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = killpg(group, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// Fails with the log of the first of `daemons` that exited (none of them should).
pub fn all_alive<'a>(daemons: impl IntoIterator<Item = &'a mut Daemon>) -> Result<(), Error> {
    for daemon in daemons {
        if let Some(status) = daemon.exited() {
            return Err(daemon.exited_error(status));
        }
    }
    Ok(())
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(2));
    }
}
