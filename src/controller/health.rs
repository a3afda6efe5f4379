//! `/healthz`, `/readyz` and `/metrics` over a minimal HTTP/1.1 responder.

use super::Context;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What readiness is made of, apart from the run bookkeeping: the watches' first lists and
/// the Redis nodes that answered the last probe.
#[derive(Debug, Default)]
pub struct Health {
    synced: AtomicBool,
    reachable: AtomicUsize,
}

impl Health {
    pub fn set_synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
    }

    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    pub fn set_reachable(&self, nodes: usize) {
        self.reachable.store(nodes, Ordering::Relaxed);
    }

    pub fn reachable(&self) -> usize {
        self.reachable.load(Ordering::Relaxed)
    }
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Answers each request in a task of its own until the returned future is dropped.
pub async fn serve(listener: TcpListener, ctx: Arc<Context>) {
    let mut connections = tokio::task::JoinSet::new();
    while let Ok((mut stream, _)) = listener.accept().await {
        // Reap the finished ones so the set stays small.
        while connections.try_join_next().is_some() {}
        let ctx = Arc::clone(&ctx);
        connections.spawn(async move {
                let mut buf = [0u8; 2048];
                let Ok(n) = stream.read(&mut buf).await else {
                    return;
                };
                let request = String::from_utf8_lossy(&buf[..n]);
                let path = request.split_whitespace().nth(1).unwrap_or("/");
                let (code, body) = match path {
                    "/healthz" => (200, "ok\n".to_string()),
                    "/readyz" if ctx.is_ready() => (200, "ready\n".to_string()),
                    "/readyz" => (503, format!(
                        "not ready: watch synced={}, redis nodes answering={} of {} (quorum {}), shutting down={}\n",
                        ctx.health.synced(),
                        ctx.health.reachable(),
                        ctx.nodes(), ctx.engine.quorum(), ctx.shutdown.is_cancelled())),
                    "/metrics" => (200, ctx.metrics.render()),
                    _ => (404, "not found\n".to_string()),
                };
                let reason = match code {
                    200 => "OK",
                    503 => "Service Unavailable",
                    _ => "Not Found",
                };
                let content_type = if path == "/metrics" {
                    "application/openmetrics-text; version=1.0.0; charset=utf-8"
                } else {
                    "text/plain"
                };
                let response = format!("HTTP/1.1 {code} {reason}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len());
                let _ = stream.write_all(response.as_bytes()).await;
            });
    }
}
