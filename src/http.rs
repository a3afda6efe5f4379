//! A small HTTP/1.1 server (hyper) for what a kubelet or Prometheus asks of a process: the
//! operator's `/healthz`, `/readyz` and `/metrics`, the sidecar's `/leader` and `/metrics`.
//! Keep-alive as HTTP/1.1 has it; a client that sends no complete request head within
//! [`HEADER_READ_TIMEOUT`] is dropped, so a stalled connection cannot hold a task forever.

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The Prometheus text format's content type.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a route answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.into(),
        }
    }

    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Self {
            status,
            content_type: "application/json",
            body: body.into(),
        }
    }

    pub fn metrics(body: String) -> Self {
        Self {
            status: 200,
            content_type: OPENMETRICS,
            body,
        }
    }

    pub fn not_found() -> Self {
        Self::text(404, "not found\n")
    }
}

/// Answers requests by path with `route` until the returned future is dropped, which also
/// ends every open connection (their tasks belong to it).
pub async fn serve<R>(listener: TcpListener, route: R)
where
    R: Fn(&str) -> Reply + Send + Sync + 'static,
{
    let route = Arc::new(route);
    let mut connections = tokio::task::JoinSet::new();
    while let Ok((stream, _)) = listener.accept().await {
        // Reap the finished ones so the set stays small.
        while connections.try_join_next().is_some() {}
        let route = Arc::clone(&route);
        connections.spawn(async move {
            let service = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                let reply = route(request.uri().path());
                async move { Ok::<_, Infallible>(response(reply)) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn response(reply: Reply) -> hyper::Response<Full<Bytes>> {
    let mut response = hyper::Response::new(Full::new(Bytes::from(reply.body)));
    *response.status_mut() = hyper::StatusCode::from_u16(reply.status)
        .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(reply.content_type),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

    async fn server() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(serve(listener, |path| match path {
            "/hello" => Reply::text(200, "hi\n"),
            _ => Reply::not_found(),
        }));
        (addr, task)
    }

    /// Reads one response: its status line and its body (by content-length).
    async fn read_response(reader: &mut BufReader<tokio::net::TcpStream>) -> (String, String) {
        let mut status = String::new();
        reader.read_line(&mut status).await.expect("status line");
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).await.expect("header");
            if line == "\r\n" {
                break;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().expect("a length");
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).await.expect("body");
        (
            status.trim().to_string(),
            String::from_utf8_lossy(&body).into_owned(),
        )
    }

    #[tokio::test]
    async fn one_connection_carries_several_requests() {
        let (addr, server) = server().await;
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut reader = BufReader::new(stream);
        for (path, expected) in [
            ("/hello", ("200", "hi\n")),
            ("/nope", ("404", "not found\n")),
            ("/hello", ("200", "hi\n")),
        ] {
            let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
            reader
                .get_mut()
                .write_all(request.as_bytes())
                .await
                .expect("send");
            let (status, body) = read_response(&mut reader).await;
            assert!(
                status.starts_with(&format!("HTTP/1.1 {}", expected.0)),
                "{path}: {status}"
            );
            assert_eq!(body, expected.1, "{path}");
        }
        server.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_head_that_never_ends_is_dropped() {
        let (addr, server) = server().await;
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(b"GET /hello HTTP/1.1\r\nhost: x\r\n")
            .await
            .expect("send");
        // Paused time runs ahead to the header timeout; the server then closes the connection.
        let mut rest = Vec::new();
        let read = tokio::time::timeout(HEADER_READ_TIMEOUT * 6, stream.read_to_end(&mut rest))
            .await
            .expect("the server closed the connection");
        let text = String::from_utf8_lossy(&rest);
        assert!(
            read.is_err() || rest.is_empty() || text.starts_with("HTTP/1.1 408"),
            "{read:?}: {text}"
        );
        server.abort();
    }
}
