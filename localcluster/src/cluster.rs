//! One local control plane. Its processes are started from a thread of the cluster's own (so
//! `PR_SET_PDEATHSIG` ties them to the cluster, not to whichever test thread asked), which also
//! starts the real nodes; dropping the `LocalCluster` stops everything and removes its directory.

use crate::node::{ImageSource, NodeStart, PreparedNodes, RealNodes};
use crate::process::Daemon;
use crate::slots::{self, Slot};
use crate::{free_port, Binaries, Error, Pki};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// How a cluster is started.
#[derive(Debug, Clone)]
pub struct Options {
    /// Names the node (`<name>-node`) and the kubeconfig's context.
    pub name: String,
    /// Where the binaries are; `None`: `Binaries::locate()`.
    pub binaries: Option<Binaries>,
    /// A directory to keep (for `localcluster up DIR`); `None`: a temporary one, removed on drop.
    pub dir: Option<PathBuf>,
    /// How long to wait for each component to become ready.
    pub ready_timeout: Duration,
    /// Images beside the nodes' own: image reference (`repository:tag`; no tag means
    /// `latest`) -> what it is made of (a program of this machine, or an archive built
    /// elsewhere), pushed to the cluster's registry under that name.
    pub images: BTreeMap<String, ImageSource>,
    /// Write kube-apiserver's audit log (Metadata level: who, what, when; no bodies) to
    /// `audit.log` in the cluster directory. Benchmarks count API requests per client from it.
    pub audit_log: bool,
    /// How many nodes (1 to `node::MAX_NODES`): each a kubelet with containerd and runc and
    /// kube-proxy, in a network namespace of its own (`node/`); the API server listens on
    /// their link.
    pub nodes: u8,
}

impl Options {
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_string(),
            binaries: None,
            dir: None,
            ready_timeout: Duration::from_secs(180),
            images: BTreeMap::new(),
            audit_log: false,
            nodes: 1,
        }
    }
}

enum Request {
    StopApiserver(oneshot::Sender<()>),
    StartApiserver(oneshot::Sender<Result<(), Error>>),
    Shutdown,
}

enum Dir {
    Temporary(tempfile::TempDir),
    Kept(PathBuf),
}

impl Dir {
    fn path(&self) -> &Path {
        match self {
            Dir::Temporary(t) => t.path(),
            Dir::Kept(p) => p,
        }
    }
}

pub struct LocalCluster {
    name: String,
    apiserver_ip: Ipv4Addr,
    apiserver_port: u16,
    /// The image registry the nodes pull from.
    registry: SocketAddrV4,
    token: String,
    version: String,
    requests: mpsc::UnboundedSender<Request>,
    path: PathBuf,
    /// Where kubectl and helm (built with the control plane) are.
    bin_dir: PathBuf,
    /// Taken by the first shutdown (a `Mutex` so a shared `&'static` cluster can be stopped at
    /// exit); the directory is removed after the thread stopped every process.
    owned: Mutex<Option<(std::thread::JoinHandle<()>, Dir)>>,
    /// This process's room for the cluster (`slots`), given back once it has stopped.
    slot: Mutex<Option<Slot>>,
}

/// Everything the cluster's thread needs to (re)start its processes.
struct Layout {
    bins: Binaries,
    dir: PathBuf,
    pki: Pki,
    etcd_client_port: u16,
    etcd_peer_port: u16,
    /// 127.0.0.1, or the host's address on a real node's link.
    apiserver_ip: Ipv4Addr,
    apiserver_port: u16,
    /// `--service-cluster-ip-range`.
    service_cidr: String,
    kubeconfig: PathBuf,
    tokens: PathBuf,
    images: BTreeMap<String, ImageSource>,
    audit_log: bool,
}

/// Every request at Metadata level, once (at ResponseComplete; long watches also at
/// ResponseStarted), without managed fields.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nomitManagedFields: true\nrules:\n- level: Metadata\n";

impl Layout {
    /// `https://IP:PORT`, as the kubeconfigs name the API server.
    fn server(&self) -> String {
        format!("https://{}:{}", self.apiserver_ip, self.apiserver_port)
    }

    fn etcd_args(&self) -> Vec<String> {
        let client = format!("http://127.0.0.1:{}", self.etcd_client_port);
        let peer = format!("http://127.0.0.1:{}", self.etcd_peer_port);
        vec![
            "--name=default".into(),
            format!("--data-dir={}", self.dir.join("etcd").display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=default={peer}"),
            // Test data: a crash loses nothing anyone needs, and fsync costs seconds on a
            // loaded disk.
            "--unsafe-no-fsync".into(),
            "--log-level=warn".into(),
        ]
    }

    fn apiserver_args(&self) -> Vec<String> {
        let p = &self.pki;
        let mut args = vec![
            format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_client_port),
            format!("--bind-address={}", self.apiserver_ip),
            format!("--advertise-address={}", self.apiserver_ip),
            format!("--secure-port={}", self.apiserver_port),
            format!("--tls-cert-file={}", p.apiserver_cert.display()),
            format!("--tls-private-key-file={}", p.apiserver_key.display()),
            format!("--client-ca-file={}", p.ca_cert.display()),
            format!("--token-auth-file={}", self.tokens.display()),
            // Node: a real kubelet reads only what its pods need.
            "--authorization-mode=Node,RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!(
                "--service-account-key-file={}",
                p.service_account_pub.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                p.service_account_key.display()
            ),
            format!("--service-cluster-ip-range={}", self.service_cidr),
            "--kubelet-preferred-address-types=InternalIP".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            format!(
                "--kubelet-client-certificate={}",
                p.node.apiserver_kubelet_client.cert.display()
            ),
            format!(
                "--kubelet-client-key={}",
                p.node.apiserver_kubelet_client.key.display()
            ),
            format!("--kubelet-certificate-authority={}", p.ca_cert.display()),
        ];
        if self.audit_log {
            args.extend([
                format!(
                    "--audit-policy-file={}",
                    self.dir.join("audit-policy.yaml").display()
                ),
                format!("--audit-log-path={}", self.dir.join("audit.log").display()),
                // Batched in the background, so auditing does not slow the requests it counts.
                "--audit-log-mode=batch".into(),
            ]);
        }
        args
    }

    fn component_args(&self, port: u16) -> Vec<String> {
        let kubeconfig = self.kubeconfig.display();
        vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            "--leader-elect=false".into(),
        ]
    }

    fn controller_manager_args(&self, port: u16) -> Vec<String> {
        let p = &self.pki;
        let mut args = self.component_args(port);
        args.extend([
            "--controllers=*".into(),
            format!(
                "--service-account-private-key-file={}",
                p.service_account_key.display()
            ),
            format!("--root-ca-file={}", p.ca_cert.display()),
            format!("--cluster-signing-cert-file={}", p.ca_cert.display()),
            format!("--cluster-signing-key-file={}", p.ca_key.display()),
            // The default 20 requests/s makes the Job controller, not the operator, the
            // bottleneck when a few hundred Jobs fall due at once.
            "--kube-api-qps=100".into(),
            "--kube-api-burst=200".into(),
        ]);
        args
    }

    fn spawn(&self, name: &'static str, args: &[String]) -> Result<Daemon, Error> {
        Daemon::spawn(
            &self.bins.path(name),
            args,
            self.dir.join(format!("{name}.log")),
        )
        .map(|d| d.named(name))
    }
}

fn port() -> Result<u16, Error> {
    free_port().map_err(|e| Error::io("find a free loopback port", e))
}

fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    // /dev/urandom: no extra dependency for a token only this machine sees.
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut bytes);
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A kubeconfig for `server` with the cluster's CA and a bearer token.
pub(crate) fn kubeconfig_text(name: &str, server: &str, ca: &Path, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}\n    certificate-authority: {}\nusers:\n- name: {name}-admin\n  user:\n    token: {token}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}-admin\n    namespace: default\ncurrent-context: {name}\n",
        ca.display()
    )
}

/// A client for a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> Result<kube::Client, Error> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| Error::Client(format!("read {}: {e}", kubeconfig.display())))?;
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .map_err(|e| Error::Client(e.to_string()))?;
    kube::Client::try_from(config).map_err(|e| Error::Client(e.to_string()))
}

impl LocalCluster {
    /// Starts a control plane and its nodes and waits until the API server is ready and
    /// the node is registered. Blocks: from async code call it in `spawn_blocking`.
    /// Starts a cluster of the caller's own, stopped when dropped. Waits while this process
    /// already runs as many clusters as it may (`slots`).
    pub fn start(options: Options) -> Result<Self, Error> {
        let slot = slots::take_for(&options);
        Self::start_with(options, slot)
    }

    pub(crate) fn start_with(options: Options, slot: Slot) -> Result<Self, Error> {
        // Ports are picked free and bound by the components a moment later; another process
        // can take one in between. That failure is retried on fresh ports, nothing else is.
        let mut attempts = 0;
        loop {
            attempts += 1;
            match Self::start_once(&options) {
                Err(e) if attempts < 3 && e.is_port_taken() => {
                    eprintln!(
                        "localcluster: a port was taken while starting ({e}); again on fresh ports"
                    );
                }
                result => {
                    let cluster = result?;
                    *cluster.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(slot);
                    return Ok(cluster);
                }
            }
        }
    }

    fn start_once(options: &Options) -> Result<Self, Error> {
        let bins = match options.binaries.clone() {
            Some(b) => b,
            None => Binaries::locate()?,
        };
        let dir = match &options.dir {
            Some(path) => {
                std::fs::create_dir_all(path)
                    .map_err(|e| Error::io("create the cluster directory", e))?;
                Dir::Kept(path.clone())
            }
            None => Dir::Temporary(
                tempfile::Builder::new()
                    .prefix(&format!("localcluster-{}-", options.name))
                    .tempdir()
                    .map_err(|e| Error::io("create the cluster directory", e))?,
            ),
        };
        let path = dir.path().to_path_buf();
        let prepared = crate::node::prepare(&path, options.nodes)?;
        let pki = Pki::generate(&path.join("pki"), &prepared.identity(&options.name))?;
        let token = random_hex();
        let tokens = path.join("tokens.csv");
        std::fs::write(&tokens, format!("{token},admin,admin,system:masters\n"))
            .map_err(|e| Error::io("write the token file", e))?;
        let bin_dir = bins.dir().to_path_buf();
        let apiserver_ip = prepared.subnets().host_ip();
        let service_cidr = prepared.subnets().service_cidr();
        let registry = prepared.registry();
        let layout = Layout {
            bins,
            etcd_client_port: port()?,
            etcd_peer_port: port()?,
            apiserver_ip,
            apiserver_port: port()?,
            service_cidr,
            kubeconfig: path.join("kubeconfig"),
            tokens,
            pki,
            dir: path,
            images: options.images.clone(),
            audit_log: options.audit_log,
        };
        if layout.audit_log {
            std::fs::write(layout.dir.join("audit-policy.yaml"), AUDIT_POLICY)
                .map_err(|e| Error::io("write the audit policy", e))?;
        }
        let server = layout.server();
        std::fs::write(
            &layout.kubeconfig,
            kubeconfig_text(&options.name, &server, &layout.pki.ca_cert, &token),
        )
        .map_err(|e| Error::io("write the kubeconfig", e))?;

        let (requests, requests_rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let apiserver_port = layout.apiserver_port;
        let name = options.name.clone();
        let timeout = options.ready_timeout;
        let thread = std::thread::Builder::new()
            .name(format!("localcluster-{name}"))
            .spawn(move || run_cluster(layout, prepared, name, timeout, requests_rx, ready_tx))
            .map_err(|e| Error::io("start the cluster thread", e))?;
        let version = match ready_rx.recv() {
            Ok(Ok(version)) => version,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(Error::Gone);
            }
        };
        Ok(Self {
            name: options.name.clone(),
            apiserver_ip,
            apiserver_port,
            registry,
            token,
            version,
            requests,
            path: dir.path().to_path_buf(),
            bin_dir,
            owned: Mutex::new(Some((thread, dir))),
            slot: Mutex::new(None),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn dir(&self) -> &Path {
        &self.path
    }

    /// The admin kubeconfig (`system:masters`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir().join("kubeconfig")
    }

    /// The directory of kubectl and helm, built with the control plane.
    /// kube-apiserver's audit log, written when the cluster was started with
    /// [`Options::audit_log`]: one JSON event a line.
    pub fn audit_log(&self) -> PathBuf {
        self.path.join("audit.log")
    }

    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// `kubectl` or `helm` (the ones built with the control plane) on this cluster as its
    /// admin, with helm's configuration, cache and data in the cluster's directory.
    pub fn tool(&self, program: &str) -> std::process::Command {
        let mut command = std::process::Command::new(self.bin_dir.join(program));
        let helm = self.dir().join("helm");
        command
            .env("KUBECONFIG", self.kubeconfig())
            .env("HELM_CONFIG_HOME", helm.join("config"))
            .env("HELM_CACHE_HOME", helm.join("cache"))
            .env("HELM_DATA_HOME", helm.join("data"));
        command
    }

    pub fn ca_cert(&self) -> PathBuf {
        self.dir().join("pki/ca.crt")
    }

    /// `https://IP:PORT`: 127.0.0.1, or the host's address on a real node's link.
    pub fn server(&self) -> String {
        format!("https://{}", self.apiserver_addr())
    }

    /// The API server's address: 127.0.0.1, or with real nodes the host's end of their link,
    /// which pods reach (and where a test serves what its pods must reach on the host).
    pub fn host_ip(&self) -> Ipv4Addr {
        self.apiserver_ip
    }

    /// The image registry (`IP:PORT`, plain HTTP) the nodes' containerd pulls every image
    /// from, the images of `Options::images` and the node's own already pushed;
    /// `helm push CHART oci://IP:PORT/charts --plain-http` publishes a chart there.
    pub fn registry(&self) -> SocketAddrV4 {
        self.registry
    }

    pub fn apiserver_addr(&self) -> String {
        format!("{}:{}", self.apiserver_ip, self.apiserver_port)
    }

    /// The version the API server reports (`/version`'s gitVersion).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// An admin kubeconfig that reaches the API server at `server` instead (a proxy in front
    /// of it: the serving certificate names 127.0.0.1, so any loopback port verifies).
    pub fn kubeconfig_via(&self, server: &str, file_name: &str) -> Result<PathBuf, Error> {
        let path = self.dir().join(file_name);
        std::fs::write(
            &path,
            kubeconfig_text(&self.name, server, &self.ca_cert(), &self.token),
        )
        .map_err(|e| Error::io("write a kubeconfig", e))?;
        Ok(path)
    }

    pub async fn client(&self) -> Result<kube::Client, Error> {
        client_for(&self.kubeconfig()).await
    }

    /// Stops kube-apiserver (SIGTERM, then SIGKILL): the API server is down until
    /// `start_apiserver`.
    pub fn stop_apiserver(&self) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::StopApiserver(tx))
            .map_err(|_| Error::Gone)?;
        rx.blocking_recv().map_err(|_| Error::Gone)
    }

    /// Starts kube-apiserver again on the same port and waits until it is ready.
    pub fn start_apiserver(&self) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::StartApiserver(tx))
            .map_err(|_| Error::Gone)?;
        rx.blocking_recv().map_err(|_| Error::Gone)?
    }

    /// Stops every process and removes the directory (unless it was given to keep).
    pub(crate) fn shutdown(&self) {
        let owned = self.owned.lock().ok().and_then(|mut o| o.take());
        if let Some((thread, dir)) = owned {
            let _ = self.requests.send(Request::Shutdown);
            let _ = thread.join();
            drop(dir);
        }
        let slot = self.slot.lock().ok().and_then(|mut s| s.take());
        drop(slot);
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The cluster's thread: starts the processes and the nodes, then serves requests until
/// shutdown. Processes started here die with this thread (PDEATHSIG) if anything goes wrong.
fn run_cluster(
    layout: Layout,
    prepared: PreparedNodes,
    name: String,
    timeout: Duration,
    mut requests: mpsc::UnboundedReceiver<Request>,
    ready: std::sync::mpsc::Sender<Result<String, Error>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(Error::io("start the cluster runtime", e)));
            return;
        }
    };
    runtime.block_on(async move {
        let mut started = match start_control_plane(&layout, prepared, &name, timeout).await {
            Ok(s) => s,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        let _ = ready.send(Ok(started.version.clone()));
        let mut watch = tokio::time::interval(Duration::from_secs(1));
        let mut reported = false;
        loop {
            let request = tokio::select! {
                request = requests.recv() => request,
                _ = watch.tick() => {
                    // Nothing restarts a component that died: say so once, with its log.
                    if !reported {
                        if let Err(e) = started.check_alive() {
                            eprintln!("localcluster {name}: {e}");
                            reported = true;
                        }
                    }
                    continue;
                }
            };
            let Some(request) = request else { break };
            match request {
                Request::StopApiserver(reply) => {
                    // Blocks this thread for the few seconds kube-apiserver takes to stop:
                    // nothing it does matters while the API server is going away.
                    if let Some(mut apiserver) = started.apiserver.take() {
                        apiserver.stop(Duration::from_secs(5));
                    }
                    let _ = reply.send(());
                }
                Request::StartApiserver(reply) => {
                    let result = match started.apiserver {
                        Some(_) => Ok(()),
                        None => start_apiserver(&layout, timeout).await.map(|(a, _)| {
                            started.apiserver = Some(a);
                        }),
                    };
                    let _ = reply.send(result);
                }
                Request::Shutdown => break,
            }
        }
        // The nodes (their pods go with them), then the controllers, so none of them acts on
        // a half-stopped cluster.
        drop(started.node.take());
        for mut daemon in started.daemons.drain(..).rev() {
            daemon.stop(Duration::from_secs(2));
        }
        if let Some(mut apiserver) = started.apiserver.take() {
            apiserver.stop(Duration::from_secs(2));
        }
        started.etcd.stop(Duration::from_secs(2));
    });
}

struct Started {
    etcd: Daemon,
    apiserver: Option<Daemon>,
    /// Controller manager and scheduler.
    daemons: Vec<Daemon>,
    node: Option<RealNodes>,
    version: String,
}

impl Started {
    /// Fails with the log of the first component that exited (none of them should).
    fn check_alive(&mut self) -> Result<(), Error> {
        let control_plane = std::iter::once(&mut self.etcd)
            .chain(self.apiserver.as_mut())
            .chain(self.daemons.iter_mut());
        crate::process::all_alive(control_plane)?;
        self.node.as_mut().map_or(Ok(()), RealNodes::check_alive)
    }
}

async fn start_control_plane(
    layout: &Layout,
    prepared: PreparedNodes,
    name: &str,
    timeout: Duration,
) -> Result<Started, Error> {
    let etcd = layout.spawn("etcd", &layout.etcd_args())?;
    let (apiserver, version) = start_apiserver(layout, timeout).await?;
    let ports = [port()?, port()?];
    let mut daemons = vec![
        layout.spawn(
            "kube-controller-manager",
            &layout.controller_manager_args(ports[0]),
        )?,
        layout.spawn("kube-scheduler", &layout.component_args(ports[1]))?,
    ];
    // Before the nodes: their CoreDNS waits on the scheduler, so a controller that could not
    // start would show as a timeout minutes later instead of its own log now.
    for (daemon, port) in daemons.iter_mut().zip(ports) {
        daemon
            .wait_listening((Ipv4Addr::LOCALHOST, port).into(), timeout)
            .await?;
    }
    let client = client_for(&layout.kubeconfig).await?;
    let server = layout.server();
    let node = RealNodes::start(
        prepared,
        NodeStart {
            cluster_name: name,
            bin_dir: layout.bins.dir(),
            pki: &layout.pki,
            server: &server,
            admin_kubeconfig: &layout.kubeconfig,
            images: &layout.images,
            client,
            timeout,
        },
    )
    .await?;
    let mut started = Started {
        etcd,
        apiserver: Some(apiserver),
        daemons,
        node: Some(node),
        version,
    };
    // A component that exited while the rest started (a port taken since it was picked) fails
    // the start here, with its log, rather than as a timeout later.
    started.check_alive()?;
    Ok(started)
}

/// Starts kube-apiserver and waits for `/readyz`; returns it with the version it reports.
async fn start_apiserver(layout: &Layout, timeout: Duration) -> Result<(Daemon, String), Error> {
    let mut apiserver = layout.spawn("kube-apiserver", &layout.apiserver_args())?;
    let client = client_for(&layout.kubeconfig).await?;
    let deadline = Instant::now() + timeout;
    loop {
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .map_err(|e| Error::Client(e.to_string()))?;
        if let Ok(text) = client.request_text(request).await {
            if text.trim() == "ok" {
                break;
            }
        }
        if let Some(status) = apiserver.exited() {
            return Err(apiserver.exited_error(status));
        }
        if Instant::now() >= deadline {
            return Err(Error::NotReady {
                process: "kube-apiserver",
                seconds: timeout.as_secs(),
                log: apiserver.log_path().to_path_buf(),
                tail: apiserver.log_tail(30),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let version = client
        .apiserver_version()
        .await
        .map_err(|e| Error::Client(format!("read /version: {e}")))?
        .git_version;
    Ok((apiserver, version))
}
