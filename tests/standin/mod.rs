//! An in-process stand-in for the Kubernetes API server, with a local kubelet. Test support,
//! not product code: no kube-apiserver can be installed on these machines, yet the operator
//! must be tested through the real `kube::Client` and `kube::runtime`. Several instances in one
//! test act as several clusters.
//!
//! Faithful where the operator depends on it (see the contract tests in
//! `tests/apiserver_contract.rs`); simplified, and documented, elsewhere:
//! - server-side apply is a merge patch (no managedFields, no conflict detection);
//!   strategic-merge patches are merge patches too;
//! - namespaces are not required to exist; there is no authentication or authorization
//!   (tokens only identify clients for fault injection);
//! - `limit`/`continue` are ignored: lists return everything at once;
//! - no OpenAPI documents: `kubectl apply` needs `--validate=false` (the server still enforces
//!   the CRD schema);
//! - only the LockedJob CRD's schema is enforced (with CEL); built-in types are not validated.
#![allow(dead_code, unused_imports)]

mod http;
mod kubelet;
mod resources;
mod schema;
mod selectors;
mod store;
mod table;

pub use http::Faults;
pub use resources::index_of;
pub use store::{Key, Store, Sub};

use http::State;
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub struct ApiServer {
    addr: SocketAddr,
    dir: tempfile::TempDir,
    state: Arc<State>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiServer {
    /// Starts a server on a free loopback port, with its kubelet.
    pub fn start() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("lockedjob-standin-")
            .tempdir()
            .expect("stand-in temp dir");
        std::fs::create_dir_all(dir.path().join("logs")).expect("logs dir");
        let mut schemas = HashMap::new();
        schemas.insert(
            index_of("lockedjob.dev", "lockedjobs"),
            schema::from_crd(&table::LOCKEDJOB_CRD_VALUE),
        );
        let (drop_watches, _) = tokio::sync::watch::channel(0u64);
        let state = Arc::new(State {
            store: Store::new(schemas),
            faults: std::sync::Mutex::new(Faults::default()),
            drop_watches,
            requests: std::sync::atomic::AtomicU64::new(0),
            logs: dir.path().join("logs"),
        });
        let (shutdown, shutdown_rx) = tokio::sync::oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let thread_state = Arc::clone(&state);
        let logs = dir.path().join("logs");
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("stand-in runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("stand-in bind");
                addr_tx
                    .send(listener.local_addr().expect("addr"))
                    .expect("send addr");
                let kubelet =
                    tokio::spawn(kubelet::Kubelet::new(Arc::clone(&thread_state), logs).run());
                let serve = async {
                    loop {
                        let Ok((stream, _)) = listener.accept().await else {
                            continue;
                        };
                        let state = Arc::clone(&thread_state);
                        tokio::spawn(async move {
                            let service = hyper::service::service_fn(move |req| {
                                http::handle(Arc::clone(&state), req)
                            });
                            let _ = hyper::server::conn::http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = shutdown_rx => {}
                }
                kubelet.abort();
            });
            // Dropping the runtime drops the kubelet's children (kill_on_drop).
        });
        let addr = addr_rx.recv().expect("stand-in started");
        let server = Self {
            addr,
            dir,
            state,
            shutdown: Some(shutdown),
            thread: Some(thread),
        };
        server.write_kubeconfig("standin-admin");
        server
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig whose user sends `token`; distinct tokens let a test cut one replica off.
    pub fn write_kubeconfig(&self, token: &str) -> PathBuf {
        let path = self.dir.path().join(format!("kubeconfig-{token}"));
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: standin\n  cluster:\n    server: {}\nusers:\n- name: {token}\n  user:\n    token: {token}\ncontexts:\n- name: standin\n  context:\n    cluster: standin\n    user: {token}\n    namespace: default\ncurrent-context: standin\n",
            self.url()
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig-standin-admin")
    }

    pub async fn client(&self) -> kube::Client {
        client_for(&self.kubeconfig()).await
    }

    pub fn store(&self) -> &Store {
        &self.state.store
    }

    pub fn set_faults(&self, update: impl FnOnce(&mut Faults)) {
        if let Ok(mut faults) = self.state.faults.lock() {
            update(&mut faults);
        }
    }

    /// Ends every open watch stream (clients must re-list or resume).
    pub fn drop_watches(&self) {
        self.state.drop_watches.send_modify(|n| *n += 1);
    }

    pub fn requests_served(&self) -> u64 {
        self.state
            .requests
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// What a pod's process wrote to stdout and stderr.
    pub fn pod_logs(&self, namespace: &str, pod: &str) -> (String, String) {
        let read = |stream: &str| {
            std::fs::read_to_string(kubelet::log_path(&self.state.logs, namespace, pod, stream))
                .unwrap_or_default()
        };
        (read("stdout"), read("stderr"))
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A kube client from a kubeconfig file (stand-in or real cluster).
pub async fn client_for(path: &Path) -> kube::Client {
    client_with_retries(path, true).await
}

/// Like [`client_for`]; without retries a 503 surfaces at once instead of after kube's
/// backoff (15 tries), which is what fault tests want to observe.
pub async fn client_with_retries(path: &Path, retries: bool) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("read kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("kubeconfig is usable");
    config.default_retry = retries;
    kube::Client::try_from(config).expect("kube client")
}

/// Server-side applies the LockedJob CRD as `manager` and waits (up to 60 s) until it is
/// established, on the stand-in or on a real cluster.
pub async fn install_lockedjob_crd(client: &kube::Client, manager: &str) -> Result<(), String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};
    use kube::CustomResourceExt;
    use lockedjob::api::LockedJob;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = "lockedjobs.lockedjob.dev";
    crds.patch(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(LockedJob::crd()),
    )
    .await
    .map_err(|e| format!("apply the LockedJob CRD: {e}"))?;
    let established = kube::runtime::wait::await_condition(
        crds,
        name,
        kube::runtime::wait::conditions::is_crd_established(),
    );
    match tokio::time::timeout(Duration::from_secs(60), established).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("watch the CRD: {e}")),
        Err(_) => Err("the LockedJob CRD was not established within 60 s".into()),
    }
}

/// Polls until `check` holds, for up to `limit`.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}
