//! Waiting for a request to stop, shared by the long-running subcommands.

use tokio::signal::unix::{signal, SignalKind};

/// Resolves on the first SIGTERM or SIGINT. Never resolves if the handlers cannot be installed
/// (the process then stops the default way, at once).
pub async fn sigterm_or_sigint() {
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
