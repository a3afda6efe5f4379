//! Running a command under a lease (`exec`, `elect`): started with the lease in its
//! environment, the lease renewed while it runs, the command stopped before the deadline when
//! renewals fail, the lock released when it ends.

use crate::api::{ENV_FENCING_TOKEN, ENV_HOLDER, ENV_LOCK_NAME};
use crate::child::{self, Signals};
use crate::options::parse_duration;
use crate::redlock::{Lease, LeaseStatus, LeaseTiming, Redlock, Watchdog};
use std::process::ExitStatus;
use std::time::Duration;
use tokio::process::Command;

/// How a lease is kept and how its command is stopped when it is lost (`exec`, `elect`).
#[derive(Debug, Clone, clap::Args)]
pub struct LeaseOptions {
    /// How often to renew the lease (default: ttl/3).
    #[arg(long, value_parser = parse_duration)]
    pub renew_interval: Option<Duration>,
    /// Give the lease up this long before its deadline when renewals fail (default: ttl/10,
    /// at most 2s). The command is stopped within this margin.
    #[arg(long, value_parser = parse_duration)]
    pub safety_margin: Option<Duration>,
    /// After lease loss, time between SIGTERM and SIGKILL; always cut short so that the
    /// command is dead before the lease deadline.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub kill_grace: Duration,
}

impl LeaseOptions {
    /// The lease's timing for `ttl`: these options where they were given, the defaults of
    /// [`LeaseTiming::from_ttl`] otherwise.
    pub fn timing(&self, ttl: Duration) -> LeaseTiming {
        LeaseTiming::from_ttl_or(ttl, self.renew_interval, self.safety_margin)
    }
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self {
            renew_interval: None,
            safety_margin: None,
            kill_grace: Duration::from_secs(10),
        }
    }
}

/// A command to run under a lease (`exec`, `elect`).
pub(crate) struct Work<'a> {
    pub command: &'a [String],
    pub kill_grace: Duration,
    pub timing: LeaseTiming,
}

/// The watchdog's status once a renewal moved the deadline past `shown` (the status also
/// changes when an attempt starts); `None` once the watchdog is gone.
pub(crate) async fn next_deadline(
    statuses: &mut tokio::sync::watch::Receiver<LeaseStatus>,
    shown: std::time::Instant,
) -> Option<LeaseStatus> {
    statuses
        .wait_for(|status| status.deadline != shown)
        .await
        .ok()
        .map(|status| *status)
}

/// What [`Work::run`] tells its caller about the lease while the command runs.
pub(crate) enum LeaseEvent {
    /// Held, with this deadline (the first, or one a renewal pushed out).
    Held(LeaseStatus),
    /// Lost: the command is about to be stopped.
    Lost,
}

/// How a command under a lease ended. The lease is released (or was lost) in every case.
pub(crate) enum Ran {
    /// The command ended on its own (or after a forwarded signal) with the lease held.
    Finished(ExitStatus),
    /// The lease was lost; the command was stopped before the lease deadline.
    LeaseLost,
    /// `step_down` asked for the lease (a preferred candidate, `elect --priority`); the command
    /// was stopped and the lock released.
    SteppedDown,
    NotStarted(std::io::Error),
    WaitFailed(std::io::Error),
}

impl Work<'_> {
    /// Starts the command with the lease in its environment, forwards `signals` to it, keeps
    /// the lease renewed, stops the command before the deadline if renewal fails, and releases
    /// the lock when it ends. `on_lease` sees the first deadline, every renewed one, and the
    /// loss before the command is stopped.
    pub async fn run(
        &self,
        engine: &Redlock,
        lease: Lease,
        signals: &mut Signals,
        step_down: impl std::future::Future<Output = ()>,
        mut on_lease: impl FnMut(LeaseEvent),
    ) -> Ran {
        let mut running = match child::spawn(self.command_for(&lease)).await {
            Ok(running) => running,
            Err(e) => {
                engine.release(&lease).await;
                return Ran::NotStarted(e);
            }
        };
        let watchdog = Watchdog::spawn(engine.clone(), lease, self.timing);
        let lost = watchdog.lost();
        let mut deadlines = watchdog.subscribe();
        let mut shown = watchdog.status();
        on_lease(LeaseEvent::Held(shown));
        tokio::pin!(step_down);
        let status = loop {
            tokio::select! {
                status = running.wait() => break status,
                () = &mut step_down => {
                    on_lease(LeaseEvent::Lost);
                    self.stop(&mut running, watchdog.status().deadline).await;
                    watchdog.release(engine).await;
                    return Ran::SteppedDown;
                }
                kind = signals.next() => {
                    tracing::info!(signal = kind.as_raw_value(), "forwarding signal to the command");
                    running.signal(child::signal_of(kind));
                }
                _ = lost.cancelled() => {
                    on_lease(LeaseEvent::Lost);
                    self.stop(&mut running, watchdog.status().deadline).await;
                    watchdog.release(engine).await;
                    return Ran::LeaseLost;
                }
                Some(status) = next_deadline(&mut deadlines, shown.deadline) => {
                    shown = status;
                    on_lease(LeaseEvent::Held(status));
                }
            }
        };
        if !watchdog.release(engine).await {
            return Ran::LeaseLost;
        }
        match status {
            Ok(status) => Ran::Finished(status),
            Err(e) => Ran::WaitFailed(e),
        }
    }

    /// SIGTERM, then SIGKILL after the grace period, always before `deadline`.
    async fn stop(&self, running: &mut child::Supervised, deadline: std::time::Instant) {
        match running
            .stop_before(deadline, self.kill_grace, self.timing.safety_margin)
            .await
        {
            Ok(status) => tracing::info!(code = child::exit_code(status), "command stopped"),
            Err(e) => tracing::error!(error = %e, "waiting for the stopped command failed"),
        }
    }

    fn command_for(&self, lease: &Lease) -> Command {
        let mut command = Command::new(&self.command[0]);
        command
            .args(&self.command[1..])
            .env(ENV_FENCING_TOKEN, lease.token().to_string())
            .env(ENV_LOCK_NAME, lease.name())
            .env(ENV_HOLDER, lease.holder());
        command
    }
}
