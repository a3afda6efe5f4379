//! HTTP front of the stand-in: the Kubernetes REST paths, verbs, watch streams, tables for
//! kubectl, and the switchable faults.

use super::resources::{self, RESOURCES};
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{
    ApiError, DeleteOptions, Deleted, PatchKind, Propagation, Store, Sub, WatchFilter,
};
use super::table;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};

pub type Body = BoxBody<Bytes, Infallible>;

/// Faults a test can switch on while the server runs.
#[derive(Debug, Default, Clone)]
pub struct Faults {
    /// Every request gets 503.
    pub refuse_all: bool,
    /// Added before every response.
    pub latency: Duration,
    /// Requests with these bearer tokens get 503: a replica cut off from its API server.
    pub cut_tokens: HashSet<String>,
    /// Requests with these User-Agent values get 503.
    pub cut_agents: HashSet<String>,
}

pub struct State {
    pub store: Store,
    pub faults: Mutex<Faults>,
    /// Bumped to end every open watch stream.
    pub drop_watches: watch::Sender<u64>,
    pub requests: std::sync::atomic::AtomicU64,
    /// Where the kubelet writes pods' output, served by `pods/{name}/log`.
    pub logs: std::path::PathBuf,
}

fn respond(code: u16, body: &Value) -> Response<Body> {
    let bytes = Bytes::from(serde_json::to_vec(body).unwrap_or_default());
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .body(Full::new(bytes).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

fn error(e: ApiError) -> Response<Body> {
    respond(e.code, &e.status())
}

fn unavailable() -> Response<Body> {
    error(ApiError::new(
        503,
        "ServiceUnavailable",
        "the stand-in API server is refusing requests (fault injected)",
    ))
}

fn header<'a>(req: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

fn cut_off(faults: &Faults, req: &Request<Incoming>) -> bool {
    let token = header(req, "authorization").and_then(|v| v.strip_prefix("Bearer "));
    let agent = header(req, "user-agent");
    token.is_some_and(|t| faults.cut_tokens.contains(t))
        || agent.is_some_and(|a| faults.cut_agents.contains(a))
}

pub async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    state
        .requests
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let faults = state.faults.lock().map(|f| f.clone()).unwrap_or_default();
    if !faults.latency.is_zero() {
        tokio::time::sleep(faults.latency).await;
    }
    if faults.refuse_all || cut_off(&faults, &req) {
        return Ok(unavailable());
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query: HashMap<String, String> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let wants_table = header(&req, "accept").is_some_and(|a| a.contains("as=Table"));
    let content_type = header(&req, "content-type")
        .unwrap_or("application/json")
        .to_string();
    let body = match req.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let segments: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let response = match (method.clone(), segments.as_slice()) {
        (Method::GET, ["version"]) => respond(200, &resources::version()),
        (Method::GET, ["api"]) => respond(200, &resources::core_versions()),
        (Method::GET, ["apis"]) => respond(200, &resources::group_list()),
        (Method::GET, ["api", version]) => list_or_404(resources::resource_list("", version)),
        (Method::GET, ["apis", group, version]) => {
            list_or_404(resources::resource_list(group, version))
        }
        (Method::GET, ["api", "v1", "namespaces", namespace, "pods", pod, "log"]) => {
            pod_log(&state, namespace, pod)
        }
        (_, ["api", version, rest @ ..]) => {
            resource_request(
                &state,
                method,
                "",
                version,
                rest,
                &query,
                &content_type,
                &body,
                wants_table,
            )
            .await
        }
        (_, ["apis", group, version, rest @ ..]) => {
            resource_request(
                &state,
                method,
                group,
                version,
                rest,
                &query,
                &content_type,
                &body,
                wants_table,
            )
            .await
        }
        _ => error(ApiError::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )),
    };
    Ok(response)
}

/// `pods/{name}/log`: the container's output as plain text, stdout then stderr (a real
/// kubelet interleaves them). No `follow`, `tailLines` or `container`: the journal reader of the
/// end-to-end suites needs none.
fn pod_log(state: &State, namespace: &str, pod: &str) -> Response<Body> {
    let key = (
        resources::index_of("", "pods"),
        namespace.to_string(),
        pod.to_string(),
    );
    if let Err(e) = state.store.get(&key) {
        return error(e);
    }
    let read = |stream| {
        std::fs::read(super::kubelet::log_path(
            &state.logs,
            namespace,
            pod,
            stream,
        ))
    };
    match (read("stdout"), read("stderr")) {
        (Ok(mut out), Ok(err)) => {
            out.extend(err);
            Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "text/plain")
                .body(Full::new(Bytes::from(out)).boxed())
                .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
        }
        _ => error(ApiError::new(
            400,
            "BadRequest",
            format!("container of pod {pod:?} is waiting to start"),
        )),
    }
}

fn list_or_404(list: Option<Value>) -> Response<Body> {
    match list {
        Some(list) => respond(200, &list),
        None => error(ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )),
    }
}

struct Target {
    resource: usize,
    namespace: Option<String>,
    name: Option<String>,
    sub: Sub,
}

fn parse_target(group: &str, version: &str, rest: &[&str]) -> Result<Target, ApiError> {
    let not_found = || {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [plural] => (*plural, None, Sub::Main),
        [plural, name] => (*plural, Some(name.to_string()), Sub::Main),
        [plural, name, "status"] => (*plural, Some(name.to_string()), Sub::Status),
        _ => return Err(not_found()),
    };
    let resource = resources::find(group, version, plural).ok_or_else(not_found)?;
    let res = &RESOURCES[resource];
    if sub == Sub::Status && !res.status {
        return Err(not_found());
    }
    if res.namespaced && name.is_some() && namespace.is_none() {
        return Err(not_found());
    }
    Ok(Target {
        resource,
        namespace,
        name,
        sub,
    })
}

fn filter(target: &Target, query: &HashMap<String, String>) -> Result<WatchFilter, ApiError> {
    let bad = |e: String| ApiError::new(400, "BadRequest", e);
    Ok(WatchFilter {
        resource: target.resource,
        namespace: if RESOURCES[target.resource].namespaced {
            target.namespace.clone()
        } else {
            None
        },
        labels: LabelSelector::parse(query.get("labelSelector").map_or("", String::as_str))
            .map_err(bad)?,
        fields: FieldSelector::parse(query.get("fieldSelector").map_or("", String::as_str))
            .map_err(bad)?,
    })
}

fn parse_body(content_type: &str, body: &Bytes) -> Result<Value, ApiError> {
    let bad = |e: String| {
        ApiError::new(
            400,
            "BadRequest",
            format!("the request body could not be decoded: {e}"),
        )
    };
    if content_type.contains("yaml") {
        let text = std::str::from_utf8(body).map_err(|e| bad(e.to_string()))?;
        serde_saphyr::from_str::<Value>(text).map_err(|e| bad(e.to_string()))
    } else {
        serde_json::from_slice(body).map_err(|e| bad(e.to_string()))
    }
}

#[allow(clippy::too_many_arguments)]
async fn resource_request(
    state: &Arc<State>,
    method: Method,
    group: &str,
    version: &str,
    rest: &[&str],
    query: &HashMap<String, String>,
    content_type: &str,
    body: &Bytes,
    wants_table: bool,
) -> Response<Body> {
    let target = match parse_target(group, version, rest) {
        Ok(t) => t,
        Err(e) => return error(e),
    };
    let res = &RESOURCES[target.resource];
    let namespace = if res.namespaced {
        target.namespace.clone().unwrap_or_default()
    } else {
        String::new()
    };
    let result = match (&method, &target.name) {
        (&Method::GET, None) => {
            let filter = match filter(&target, query) {
                Ok(f) => f,
                Err(e) => return error(e),
            };
            if matches!(query.get("watch").map(String::as_str), Some("true" | "1")) {
                return watch_stream(state, filter, query);
            }
            let (items, rv) = state.store.list(&filter);
            if wants_table {
                return respond(200, &table::table(target.resource, &items, rv));
            }
            Ok(
                json!({"kind": format!("{}List", res.kind), "apiVersion": res.api_version(),
                      "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
            )
            .map(ok)
        }
        (&Method::POST, None) => match parse_body(content_type, body) {
            Ok(object) if query.get("dryRun").is_some() => Ok((201, object)),
            Ok(object) => state
                .store
                .create(target.resource, &namespace, object)
                .map(|o| (201, o)),
            Err(e) => Err(e),
        },
        (&Method::GET, Some(name)) => {
            let got = state
                .store
                .get(&(target.resource, namespace.clone(), name.clone()));
            if wants_table {
                return match got {
                    Ok(obj) => respond(
                        200,
                        &table::table(target.resource, &[obj], state.store.current_rv()),
                    ),
                    Err(e) => error(e),
                };
            }
            got.map(ok)
        }
        (&Method::PUT, Some(name)) => match parse_body(content_type, body) {
            Ok(object) => state
                .store
                .update(
                    &(target.resource, namespace.clone(), name.clone()),
                    object,
                    target.sub,
                )
                .map(ok),
            Err(e) => Err(e),
        },
        (&Method::PATCH, Some(name)) => {
            let kind = if content_type.contains("json-patch") {
                PatchKind::Json
            } else if content_type.contains("strategic-merge-patch") {
                PatchKind::Strategic
            } else if content_type.contains("apply-patch") {
                if query.get("fieldManager").is_none_or(|m| m.is_empty()) {
                    return error(ApiError::new(
                        400,
                        "BadRequest",
                        "PATCH with apply requires a fieldManager",
                    ));
                }
                PatchKind::Apply
            } else {
                PatchKind::Merge
            };
            match parse_body(content_type, body) {
                Ok(patch) => state
                    .store
                    .patch(
                        &(target.resource, namespace.clone(), name.clone()),
                        kind,
                        &patch,
                        target.sub,
                    )
                    .map(ok),
                Err(e) => Err(e),
            }
        }
        (&Method::DELETE, Some(name)) => {
            let options = delete_options(body, query);
            match state.store.delete(
                &(target.resource, namespace.clone(), name.clone()),
                &options,
            ) {
                Ok(Deleted::Pending(obj)) => Ok((200, obj)),
                Ok(Deleted::Gone(obj)) => Ok((
                    200,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                    "details": {"name": name, "group": res.group, "kind": res.plural, "uid": obj["metadata"]["uid"]}}),
                )),
                Err(e) => Err(e),
            }
        }
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{method} is not supported here"),
        )),
    };
    match result {
        Ok((code, obj)) => respond(code, &obj),
        Err(e) => error(e),
    }
}

fn ok(object: Value) -> (u16, Value) {
    (200, object)
}

fn delete_options(body: &Bytes, query: &HashMap<String, String>) -> DeleteOptions {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let policy = parsed["propagationPolicy"]
        .as_str()
        .map(String::from)
        .or_else(|| query.get("propagationPolicy").cloned());
    let propagation = match policy.as_deref() {
        Some("Foreground") => Some(Propagation::Foreground),
        Some("Background") => Some(Propagation::Background),
        Some("Orphan") => Some(Propagation::Orphan),
        _ => match parsed["orphanDependents"].as_bool() {
            Some(true) => Some(Propagation::Orphan),
            Some(false) => Some(Propagation::Background),
            None => None,
        },
    };
    DeleteOptions {
        propagation,
        uid: parsed["preconditions"]["uid"].as_str().map(String::from),
        resource_version: parsed["preconditions"]["resourceVersion"]
            .as_str()
            .map(String::from),
        grace_period: parsed["gracePeriodSeconds"]
            .as_i64()
            .or_else(|| query.get("gracePeriodSeconds").and_then(|g| g.parse().ok())),
    }
}

fn line(event_type: &str, object: &Value) -> Bytes {
    let mut bytes =
        serde_json::to_vec(&json!({"type": event_type, "object": object})).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn watch_stream(
    state: &Arc<State>,
    filter: WatchFilter,
    query: &HashMap<String, String>,
) -> Response<Body> {
    let initial = query.get("sendInitialEvents").is_some_and(|v| v == "true");
    let from = match query.get("resourceVersion").map(String::as_str) {
        _ if initial => None,
        None | Some("") | Some("0") => None,
        Some(rv) => match rv.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                return error(ApiError::new(
                    400,
                    "BadRequest",
                    format!("invalid resourceVersion {rv:?}"),
                ))
            }
        },
    };
    let bookmarks = query
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let kind = RESOURCES[filter.resource].kind;
    let api_version = RESOURCES[filter.resource].api_version();
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(1024);
    let state = Arc::clone(state);
    let mut drop_signal = state.drop_watches.subscribe();
    drop_signal.mark_unchanged();
    let setup = state.store.watch(&filter, from);
    tokio::spawn(async move {
        let (replay, mut live) = match setup {
            Ok(setup) => setup,
            Err(e) => {
                let _ = tx.send(Ok(Frame::data(line("ERROR", &e.status())))).await;
                return;
            }
        };
        let mut last_rv = from.unwrap_or(0);
        for event in replay {
            last_rv = last_rv.max(event.rv);
            if tx
                .send(Ok(Frame::data(line(event.kind.as_str(), &event.object))))
                .await
                .is_err()
            {
                return;
            }
        }
        let bookmark = |rv: u64, initial_end: bool| {
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if initial_end {
                meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
            }
            line(
                "BOOKMARK",
                &json!({"kind": kind, "apiVersion": api_version, "metadata": meta}),
            )
        };
        if initial {
            last_rv = last_rv.max(state.store.current_rv());
            if tx
                .send(Ok(Frame::data(bookmark(last_rv, true))))
                .await
                .is_err()
            {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(Duration::from_secs(1));
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = drop_signal.changed() => return,
                _ = ticker.tick(), if bookmarks => {
                    let rv = last_rv.max(state.store.current_rv());
                    if tx.send(Ok(Frame::data(bookmark(rv, false)))).await.is_err() { return; }
                }
                received = live.recv() => match received {
                    Ok(event) => {
                        if event.rv <= last_rv || !filter.matches_object(event.resource, &event.namespace, &event.object) {
                            continue;
                        }
                        last_rv = event.rv;
                        if tx.send(Ok(Frame::data(line(event.kind.as_str(), &event.object)))).await.is_err() { return; }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let gone = ApiError::new(410, "Expired", "watch fell too far behind; list again");
                        let _ = tx.send(Ok(Frame::data(line("ERROR", &gone.status())))).await;
                        return;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    });
    let stream = tokio_stream_from(rx);
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>> + Send + Sync + 'static {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
