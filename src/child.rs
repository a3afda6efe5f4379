//! The work that runs under a lease (`exec`, `elect`): started so that it cannot outlive its
//! supervisor, signalled as a process group, and stopped before the lease deadline.
//!
//! A supervisor killed with SIGKILL cannot stop its command, and the lock it held expires by
//! itself one TTL later: a command left running then would work beside the next holder. Two
//! mechanisms close that (docs/design.md, "The command dies with its supervisor"):
//! - the command gets `PR_SET_PDEATHSIG(SIGKILL)`. The kernel sends it when the *thread* that
//!   forked the command ends, so every command is forked on one thread that lives as long as
//!   the process ([`spawn`]);
//! - a group guard (`lockedjob group-guard`, once [`enable_group_guard`] was called) is started
//!   first, as the leader of a new process group that the command then joins. It holds the
//!   read end of a pipe whose only writer is the supervisor. The kernel closes that pipe when
//!   the supervisor dies, however it dies; the guard then kills the whole group, which reaches
//!   the children the command started (a `sh -c` script's pipeline) that the death signal
//!   does not.

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

/// The hidden subcommand that runs the group guard (see [`run_group_guard`]).
pub const GROUP_GUARD_SUBCOMMAND: &str = "group-guard";

/// What the supervisor writes to the guard when the command ended normally: leave the group.
const DISARM: u8 = b'd';

static GROUP_GUARD: AtomicBool = AtomicBool::new(false);

/// Starts a group guard beside every command from now on. Only the `lockedjob` binary calls
/// this: the guard re-runs the current executable with [`GROUP_GUARD_SUBCOMMAND`], which a
/// program embedding the library does not have.
pub fn enable_group_guard() {
    GROUP_GUARD.store(true, Ordering::Relaxed);
}

/// A running command: its process, its process group, and the guard that kills the group if
/// this process dies before the command ends.
pub struct Supervised {
    pub child: Child,
    group: Option<Pid>,
    guard: Option<GroupGuard>,
}

struct GroupGuard {
    process: std::process::Child,
    /// The supervisor's end of the pipe; closing it without a byte fires the guard.
    pipe: std::io::PipeWriter,
}

/// Starts `command` with the parent-death signal set, on the spawner thread. With the group
/// guard enabled, the guard starts first and leads a new process group that the command then
/// joins, so there is no moment when the command runs unguarded; without it, the command
/// leads a group of its own.
pub async fn spawn(mut command: Command) -> std::io::Result<Supervised> {
    let supervisor = std::process::id();
    let guard = if GROUP_GUARD.load(Ordering::Relaxed) {
        match GroupGuard::start() {
            Ok(guard) => Some(guard),
            Err(e) => {
                // The death signal still covers the command itself.
                tracing::warn!(error = %e, "cannot start the group guard; if this process is killed, children of the command may outlive it");
                None
            }
        }
    } else {
        None
    };
    let leader = guard.as_ref().map_or(0, |guard| guard.process.id() as i32);
    command.process_group(leader).kill_on_drop(true);
    // SAFETY: only async-signal-safe calls (prctl, getppid) between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The supervisor died between the fork and the prctl: the signal will never come.
            if libc::getppid() as u32 != supervisor {
                return Err(std::io::Error::other("the supervisor exited"));
            }
            Ok(())
        });
    }
    let runtime = tokio::runtime::Handle::current();
    let spawned = on_spawner_thread(move || {
        let _context = runtime.enter();
        command.spawn()
    })
    .await
    .and_then(|spawned| spawned);
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            if let Some(guard) = guard {
                guard.disarm();
            }
            return Err(e);
        }
    };
    let group = match leader {
        0 => child.id().map(|pid| Pid::from_raw(pid as i32)),
        leader => Some(Pid::from_raw(leader)),
    };
    Ok(Supervised {
        child,
        group,
        guard,
    })
}

impl GroupGuard {
    /// Starts the guard as the leader of a new process group.
    fn start() -> std::io::Result<Self> {
        // Both ends close-on-exec: the command inherits neither; the guard gets the read end
        // as its standard input.
        let (read, write) = std::io::pipe()?;
        let process = std::process::Command::new("/proc/self/exe")
            .arg(GROUP_GUARD_SUBCOMMAND)
            .process_group(0)
            .stdin(Stdio::from(read))
            .stdout(Stdio::null())
            .spawn()?;
        Ok(Self {
            process,
            pipe: write,
        })
    }

    /// The command ended on its own or was stopped: the guard leaves its group alone.
    fn disarm(mut self) {
        let _ = self.pipe.write_all(&[DISARM]);
        drop(self.pipe);
        let _ = self.process.wait();
    }
}

impl Supervised {
    /// Sends `sig` to the command's process group.
    pub fn signal(&self, sig: Signal) {
        if let Some(group) = self.group {
            // ESRCH: the group is already gone, which is what we wanted.
            let _ = killpg(group, sig);
        }
    }

    /// Waits for the command to end, then lets the guard go.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.child.wait().await;
        if let Some(guard) = self.guard.take() {
            let _ = tokio::task::spawn_blocking(move || guard.disarm()).await;
        }
        status
    }

    /// SIGTERM now, SIGKILL when `grace` ends, and never later than shortly before `deadline`
    /// (a quarter of the safety margin before it), so that the command is dead while the lease
    /// still holds.
    pub async fn stop_before(
        &mut self,
        deadline: Instant,
        grace: Duration,
        safety_margin: Duration,
    ) -> std::io::Result<ExitStatus> {
        tracing::warn!("sending SIGTERM to the command");
        self.signal(Signal::SIGTERM);
        let latest = deadline.checked_sub(safety_margin / 4).unwrap_or(deadline);
        let kill_at = (Instant::now() + grace).min(latest);
        if tokio::time::timeout_at(kill_at.into(), self.child.wait())
            .await
            .is_err()
        {
            tracing::warn!("grace over: sending SIGKILL to the command");
            self.signal(Signal::SIGKILL);
        }
        self.wait().await
    }
}

type SpawnJob = Box<dyn FnOnce() + Send>;

/// Runs `job` on the spawner thread, which is never stopped: a command forked there keeps its
/// parent-death signal until this whole process ends, not until some worker thread idles out.
async fn on_spawner_thread<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<T> {
    static SPAWNER: OnceLock<Option<Mutex<mpsc::Sender<SpawnJob>>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, queue) = mpsc::channel::<SpawnJob>();
        let thread = std::thread::Builder::new()
            .name("lockedjob-spawner".into())
            .spawn(move || {
                for job in queue {
                    job();
                }
            });
        thread.ok().map(|_| Mutex::new(jobs))
    });
    let Some(spawner) = spawner else {
        return Err(std::io::Error::other(
            "the spawner thread could not be started",
        ));
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    let job: SpawnJob = Box::new(move || {
        let _ = reply.send(job());
    });
    spawner
        .lock()
        .map_err(|_| std::io::Error::other("the spawner thread's queue is poisoned"))?
        .send(job)
        .map_err(|_| std::io::Error::other("the spawner thread is gone"))?;
    answer
        .await
        .map_err(|_| std::io::Error::other("the spawner thread dropped the request"))
}

/// `lockedjob group-guard`: leads the command's process group, waits on standard input (the
/// supervisor's pipe), and kills the whole group, itself included, when the pipe closes without
/// the disarm byte. Returns the exit code.
pub fn run_group_guard() -> i32 {
    // The signals the supervisor forwards to the group are the command's business; the guard
    // ends when the supervisor does.
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
    ] {
        // SAFETY: SIG_IGN installs no handler code.
        let _ = unsafe { nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigIgn) };
    }
    let mut byte = [0u8; 1];
    let disarmed = loop {
        match std::io::stdin().read(&mut byte) {
            Ok(0) => break false,
            Ok(_) => break byte[0] == DISARM,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break false,
        }
    };
    if !disarmed {
        let _ = killpg(nix::unistd::getpgrp(), Signal::SIGKILL);
    }
    0
}

/// Signals a supervisor passes on to its command's process group.
pub const FORWARDED: [SignalKind; 6] = [
    SignalKind::terminate(),
    SignalKind::interrupt(),
    SignalKind::hangup(),
    SignalKind::quit(),
    SignalKind::user_defined1(),
    SignalKind::user_defined2(),
];

/// The signals in [`FORWARDED`], watched from before the lock is taken so none is lost.
pub struct Signals(Vec<(SignalKind, tokio::signal::unix::Signal)>);

impl Signals {
    pub fn watch() -> Self {
        let mut streams = Vec::new();
        for kind in FORWARDED {
            match signal(kind) {
                Ok(stream) => streams.push((kind, stream)),
                Err(e) => tracing::warn!(error = %e, "cannot watch a signal"),
            }
        }
        Self(streams)
    }

    /// The next signal received.
    pub async fn next(&mut self) -> SignalKind {
        if self.0.is_empty() {
            return std::future::pending().await;
        }
        let futures = self
            .0
            .iter_mut()
            .map(|(kind, stream)| Box::pin(async move { stream.recv().await.map(|_| *kind) }));
        match futures::future::select_all(futures).await.0 {
            Some(kind) => kind,
            None => std::future::pending().await,
        }
    }
}

/// The nix signal of a tokio signal kind (SIGTERM for one nix does not know).
pub fn signal_of(kind: SignalKind) -> Signal {
    Signal::try_from(kind.as_raw_value()).unwrap_or(Signal::SIGTERM)
}

/// The shell convention: the exit code, or 128 + the signal that ended the process.
pub fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}
