//! `/healthz`, `/readyz` and `/metrics` (served by `crate::http`).

use super::context::Context;
use crate::http::Reply;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Answers `/healthz`, `/readyz` and `/metrics` until the returned future is dropped.
pub async fn serve(listener: TcpListener, ctx: Arc<Context>) {
    crate::http::serve(listener, move |path| route(&ctx, path)).await
}

fn route(ctx: &Context, path: &str) -> Reply {
    match path {
        "/healthz" => Reply::text(200, "ok\n"),
        "/readyz" if ctx.is_ready() => Reply::text(200, "ready\n"),
        "/readyz" => Reply::text(
            503,
            format!(
                "not ready: watch synced={}, redis nodes answering={} of {} (quorum {}), shutting down={}\n",
                ctx.health.synced(),
                ctx.health.reachable(),
                ctx.nodes(),
                ctx.engine.quorum(),
                ctx.shutdown.is_cancelled()
            ),
        ),
        "/metrics" => Reply::metrics(ctx.metrics.render()),
        _ => Reply::not_found(),
    }
}
