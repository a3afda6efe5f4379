//! The kubelet endpoint's log API, over TLS: kube-apiserver forwards `pods/{name}/log` here as
//! `GET /containerLogs/{namespace}/{pod}/{container}` with `tailLines`, `limitBytes` and
//! `follow`.

use super::config::AgentConfig;
use crate::Error;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::collections::HashMap;
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Debug, Clone)]
struct PodLogs {
    namespace: String,
    name: String,
    containers: HashMap<String, PathBuf>,
    running: bool,
}

/// Which log files belong to which pod, kept until the pod is gone from the API.
#[derive(Debug, Clone, Default)]
pub struct LogIndex {
    pods: Arc<Mutex<HashMap<String, PodLogs>>>,
}

impl LogIndex {
    pub(crate) fn add(
        &self,
        uid: &str,
        namespace: &str,
        name: &str,
        containers: impl Iterator<Item = (String, PathBuf)>,
    ) {
        if let Ok(mut pods) = self.pods.lock() {
            pods.insert(
                uid.to_string(),
                PodLogs {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    containers: containers.collect(),
                    running: true,
                },
            );
        }
    }

    pub(crate) fn finished(&self, uid: &str) {
        if let Ok(mut pods) = self.pods.lock() {
            if let Some(p) = pods.get_mut(uid) {
                p.running = false;
            }
        }
    }

    pub(crate) fn forget(&self, uid: &str) {
        if let Ok(mut pods) = self.pods.lock() {
            pods.remove(uid);
        }
    }

    /// The log file of a container (the newest pod of that name) and whether it still runs.
    fn find(&self, namespace: &str, name: &str, container: &str) -> Option<(PathBuf, String)> {
        let pods = self.pods.lock().ok()?;
        let (uid, pod) = pods
            .iter()
            .find(|(_, p)| p.namespace == namespace && p.name == name)?;
        let path = match pod.containers.get(container) {
            Some(path) => path.clone(),
            // kubectl leaves the container out when the pod has one.
            None if container.is_empty() && pod.containers.len() == 1 => {
                pod.containers.values().next()?.clone()
            }
            None => return None,
        };
        Some((path, uid.clone()))
    }

    fn running(&self, uid: &str) -> bool {
        self.pods
            .lock()
            .ok()
            .and_then(|p| p.get(uid).map(|p| p.running))
            .unwrap_or(false)
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn text(status: StatusCode, message: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(message)).boxed());
    *response.status_mut() = status;
    response
}

fn query(req: &Request<hyper::body::Incoming>) -> HashMap<String, String> {
    req.uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The last `lines` lines of `text` (all of it when `None`).
fn tail(text: &[u8], lines: Option<usize>) -> &[u8] {
    let Some(lines) = lines else { return text };
    let trimmed = text.strip_suffix(b"\n").unwrap_or(text);
    let mut seen = 0;
    for (i, byte) in trimmed.iter().enumerate().rev() {
        if *byte == b'\n' {
            seen += 1;
            if seen == lines {
                return &text[i + 1..];
            }
        }
    }
    if lines == 0 {
        &[]
    } else {
        text
    }
}

async fn handle(index: LogIndex, req: Request<hyper::body::Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path == "/healthz" {
        return text(StatusCode::OK, "ok".into());
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (namespace, name, container) = match parts.as_slice() {
        ["containerLogs", ns, pod, container] => (*ns, *pod, *container),
        ["containerLogs", ns, pod] => (*ns, *pod, ""),
        _ => return text(StatusCode::NOT_FOUND, format!("not served: {path}")),
    };
    let Some((file, uid)) = index.find(namespace, name, container) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("no logs of container {container:?} of pod {namespace}/{name} on this node"),
        );
    };
    let params = query(&req);
    let content = tokio::fs::read(&file).await.unwrap_or_default();
    let mut body = tail(
        &content,
        params.get("tailLines").and_then(|v| v.parse().ok()),
    )
    .to_vec();
    if let Some(limit) = params
        .get("limitBytes")
        .and_then(|v| v.parse::<usize>().ok())
    {
        body.truncate(limit);
    }
    if params.get("follow").map(String::as_str) != Some("true") {
        return text(StatusCode::OK, String::from_utf8_lossy(&body).into_owned());
    }
    // Follow: what is there, then what is appended, until the pod's processes ended.
    let offset = content.len() as u64;
    let first = futures::stream::once(async move { Ok(Frame::data(Bytes::from(body))) });
    let rest = futures::stream::unfold((offset, false), move |(offset, last)| {
        let file = file.clone();
        let index = index.clone();
        let uid = uid.clone();
        async move {
            if last {
                return None;
            }
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let ended = !index.running(&uid);
                let content = tokio::fs::read(&file).await.ok()?;
                if content.len() as u64 > offset {
                    let chunk = Bytes::copy_from_slice(&content[offset as usize..]);
                    return Some((Ok(Frame::data(chunk)), (content.len() as u64, ended)));
                }
                if ended {
                    return None;
                }
            }
        }
    });
    use futures::StreamExt;
    Response::new(BodyExt::boxed(StreamBody::new(first.chain(rest))))
}

/// Starts the HTTPS server on a free loopback port; returns the port.
pub(crate) async fn serve(
    config: &AgentConfig,
    index: LogIndex,
    cancel: CancellationToken,
    tasks: &TaskTracker,
) -> Result<u16, Error> {
    let tls_error = |e: rustls::pki_types::pem::Error| {
        Error::io("read the kubelet certificate", std::io::Error::other(e))
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&config.cert)
        .map_err(tls_error)?
        .collect::<Result<_, _>>()
        .map_err(tls_error)?;
    let key = PrivateKeyDer::from_pem_file(&config.key).map_err(tls_error)?;
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .and_then(|b| b.with_no_client_auth().with_single_cert(certs, key))
    .map_err(|e| {
        Error::io(
            "configure the kubelet endpoint's TLS",
            std::io::Error::other(e),
        )
    })?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| Error::io("bind the kubelet endpoint", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| Error::io("read the kubelet endpoint's address", e))?
        .port();
    let connections = tasks.clone();
    tasks.spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = cancel.cancelled() => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((stream, _)) = accepted else { continue };
            let acceptor = acceptor.clone();
            let index = index.clone();
            let cancel = cancel.clone();
            connections.spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req| {
                    let index = index.clone();
                    async move { Ok::<_, Infallible>(handle(index, req).await) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = connection => {}
                }
            });
        }
    });
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn tail_keeps_the_last_lines() {
        let text = b"a\nb\nc\n";
        let cases: [(Option<usize>, &[u8]); 5] = [
            (None, b"a\nb\nc\n"),
            (Some(0), b""),
            (Some(1), b"c\n"),
            (Some(2), b"b\nc\n"),
            (Some(10), b"a\nb\nc\n"),
        ];
        for (lines, expected) in cases {
            assert_eq!(tail(text, lines), expected, "{lines:?}");
        }
    }
}
