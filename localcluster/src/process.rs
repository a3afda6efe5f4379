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

    /// Waits until it accepts connections at `address`. A component that cannot bind
    /// its port exits a moment after it was started, often after the rest of the cluster
    /// looked ready: this makes that exit a start failure (retried on fresh ports) instead of
    /// a controller missing from a cluster that runs on.
    pub async fn wait_listening(
        &mut self,
        address: std::net::SocketAddr,
        timeout: Duration,
    ) -> Result<(), Error> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return Err(self.exited_error(status));
            }
            if tokio::net::TcpStream::connect(address).await.is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::NotReady {
                    process: self.name,
                    seconds: timeout.as_secs(),
                    log: self.log.clone(),
                    tail: self.log_tail(30),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(script: &str, log: &Path) -> Daemon {
        let args = ["-c".to_string(), script.to_string()];
        Daemon::spawn(Path::new("/bin/sh"), &args, log.to_path_buf())
            .expect("start /bin/sh")
            .named("component")
    }

    #[tokio::test]
    async fn a_component_that_cannot_bind_fails_the_wait_as_a_taken_port() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = crate::free_port().expect("a free port");
        let script = format!(
            "sleep 0.3; echo 'listen tcp 127.0.0.1:{port}: bind: address already in use'; exit 1"
        );
        let mut daemon = shell(&script, &dir.path().join("log"));
        let error = daemon
            .wait_listening(
                (std::net::Ipv4Addr::LOCALHOST, port).into(),
                Duration::from_secs(20),
            )
            .await
            .expect_err("the component exited");
        assert!(error.is_port_taken(), "{error}");
    }

    #[tokio::test]
    async fn a_component_that_listens_ends_the_wait() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let port = crate::free_port().expect("a free port");
        let script = format!(
            "sleep 0.3; exec python3 -c 'import socket, time; s = socket.socket(); \
             s.bind((\"127.0.0.1\", {port})); s.listen(); time.sleep(60)'"
        );
        let mut daemon = shell(&script, &dir.path().join("log"));
        daemon
            .wait_listening(
                (std::net::Ipv4Addr::LOCALHOST, port).into(),
                Duration::from_secs(20),
            )
            .await
            .expect("it listens");
        assert!(daemon.exited().is_none(), "{}", daemon.log_tail(5));
    }
}
