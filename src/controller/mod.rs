//! `lockedjob operator`: every replica reconciles every LockedJob; at each due time the replicas
//! race for the lock and only the winner creates and supervises the Job (docs/design.md, "A run's
//! life in the operator").

mod context;
mod decide;
mod error;
mod events;
mod health;
pub mod jobs;
mod memory;
mod names;
mod probes;
mod reconcile;
#[cfg(test)]
mod reconcile_tests;
mod rollout;
mod run;
mod runs;
pub mod status;
mod subject;

use context::{store_ready, JobCaches};
pub use context::{Context, MAX_LOCK_ATTEMPTS_IN_FLIGHT};
pub use error::Error;
pub use memory::return_large_allocations_to_the_system;
pub use names::{FINALIZER, MANAGER};

use crate::api::LockedJob;
use crate::exit;
use crate::metrics::Metrics;
use crate::options::RedisOptions;
use crate::redlock::Redlock;
use futures::{FutureExt, StreamExt};
use health::Health;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::{self, ReflectHandle, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use runs::Runs;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Debug, Clone, clap::Args)]
pub struct OperatorArgs {
    #[command(flatten)]
    pub redis: RedisOptions,
    /// Namespaces to watch, comma-separated; empty: all namespaces.
    #[arg(long, env = "LOCKEDJOB_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, env = "LOCKEDJOB_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Kubernetes API requests this replica has in flight at most (watches not counted once
    /// their stream has begun); more wait their turn. Each in-flight request needs a
    /// connection of its own (kube-rs speaks HTTP/1.1), with its TLS and read buffers. Bounds
    /// the reconciles in flight too, at twice this.
    #[arg(long, env = "LOCKEDJOB_API_CONCURRENCY", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..))]
    pub api_concurrency: u16,
    /// The lock nodes' StatefulSets (the chart's, `OnDelete`), as NAMESPACE/NAME, comma-separated:
    /// after their pod template changed, the operator restarts their pods one at a time, each
    /// only while every lock node is ready, so an upgrade never takes the quorum away.
    #[arg(long, env = "LOCKEDJOB_ROLL_LOCK_NODES", value_delimiter = ',')]
    pub roll_lock_nodes: Vec<rollout::NodeSet>,
}

/// Runs the operator until SIGTERM/SIGINT; returns the process exit code.
pub async fn run(args: OperatorArgs) -> i32 {
    let Some((client, engine, metrics)) = connect(&args).await else {
        return exit::USAGE;
    };
    let scopes = scopes(&args.namespaces);
    // Everything that runs beside the controllers; aborted when this returns.
    let mut background = JoinSet::new();
    let (job_caches, job_events) = watch_jobs(&client, &scopes, &mut background);
    let ctx = Arc::new(Context {
        client: client.clone(),
        engine,
        cluster_id: args.redis.cluster_id.clone(),
        holder: args.redis.holder(),
        runs: Runs::default(),
        health: Health::default(),
        shutdown: CancellationToken::new(),
        job_caches,
        lock_attempts: tokio::sync::Semaphore::new(MAX_LOCK_ATTEMPTS_IN_FLIGHT),
        tasks: TaskTracker::new(),
        metrics,
    });
    tracing::info!(holder = %ctx.holder, nodes = ?ctx.engine.node_labels(), namespaces = ?args.namespaces, "lockedjob operator starting");
    match probes::bind(args.metrics_addr).await {
        Ok(listener) => background.spawn(probes::serve(listener, Arc::clone(&ctx))),
        Err(e) => {
            tracing::error!(addr = %args.metrics_addr, error = %e, "cannot listen for /healthz, /readyz and /metrics");
            return exit::USAGE;
        }
    };
    background.spawn(probe_redis(Arc::clone(&ctx)));
    background.spawn(memory::trim_periodically());
    background.spawn(wait_for_shutdown(Arc::clone(&ctx)));
    background.spawn(rollout::roll_lock_nodes(
        client.clone(),
        args.roll_lock_nodes.clone(),
        ctx.shutdown.clone(),
    ));
    let reconciles = reconciles_in_flight(args.api_concurrency);
    let (controllers, stores) = controllers(&client, &scopes, job_events, &ctx, reconciles);
    background.spawn(mark_synced(Arc::clone(&ctx), stores.clone()));
    tokio::select! {
        _ = futures::future::join_all(controllers) => {}
        _ = stopped_before_first_list(&ctx, &stores) => {
            tracing::info!("shutdown before the first list of LockedJobs: no reconcile had started");
        }
    }
    hand_over(&ctx).await;
    tracing::info!("lockedjob operator stopped");
    0
}

/// The engine (with the operator's metrics) and a Kubernetes client (in-cluster config or
/// KUBECONFIG); `None` after logging why not.
async fn connect(args: &OperatorArgs) -> Option<(Client, Redlock, Metrics)> {
    let metrics = Metrics::new();
    let engine = match Redlock::with_metrics(args.redis.engine_config(), metrics.lock().clone()) {
        Ok(engine) => engine,
        Err(e) => {
            tracing::error!(error = %e, "bad Redis configuration; the operator cannot start");
            return None;
        }
    };
    let client = async {
        let mut config = kube::Config::infer().await.map_err(|e| e.to_string())?;
        config
            .headers
            .push((http::header::USER_AGENT, user_agent(&args.redis.holder())));
        // Without a bound, a minute's burst of runs at 1,000 LockedJobs opened hundreds of
        // connections at once, and their buffers, kept in the idle pool, were most of a
        // replica's peak memory.
        let limit = tower::limit::ConcurrencyLimitLayer::new(usize::from(args.api_concurrency));
        let builder = kube::client::ClientBuilder::try_from(config).map_err(|e| e.to_string())?;
        Ok::<_, String>(builder.with_layer(&limit).build())
    };
    match client.await {
        Ok(client) => Some((client, engine, metrics)),
        Err(e) => {
            tracing::error!(error = %e, "cannot build a Kubernetes client (in-cluster config or KUBECONFIG)");
            None
        }
    }
}

/// `lockedjob-operator/VERSION (CLUSTER/RUNNER)`: names the replica in the API server's audit
/// log (`userAgent`); kube-rs sends no User-Agent of its own.
fn user_agent(holder: &str) -> http::HeaderValue {
    let text = format!(
        "lockedjob-operator/{} ({holder})",
        env!("CARGO_PKG_VERSION")
    );
    // A holder with bytes a header may not carry (from --runner-name) falls back to the bare name.
    http::HeaderValue::from_str(&text).unwrap_or_else(|_| {
        http::HeaderValue::from_static(concat!("lockedjob-operator/", env!("CARGO_PKG_VERSION")))
    })
}

/// The watched scopes: the listed namespaces, or all (`None`).
fn scopes(namespaces: &[String]) -> Vec<Option<String>> {
    let listed: Vec<Option<String>> = namespaces
        .iter()
        .map(|n| n.trim())
        .filter(|n| !n.is_empty())
        .map(|n| Some(n.to_string()))
        .collect();
    if listed.is_empty() {
        vec![None]
    } else {
        listed
    }
}

/// Job changes a scope's watch may have sent that its controller has not taken yet; the watch
/// waits beyond that (the controller takes them as they come).
const JOB_EVENTS_BUFFER: usize = 1024;

/// One watch per scope feeds a cache of the operator's Jobs, which runs and reconciles read,
/// and the scope's controller, which reconciles a Job's owner when the Job changes (a shared
/// stream: one watch and one copy of each Job, not a second watch of the controller's own).
fn watch_jobs(
    client: &Client,
    scopes: &[Option<String>],
    background: &mut JoinSet<()>,
) -> (JobCaches, Vec<ReflectHandle<Job>>) {
    let mut caches = Vec::new();
    let mut events = Vec::new();
    for scope in scopes {
        let (cache, writer) = reflector::store_shared(JOB_EVENTS_BUFFER);
        let subscriber = writer.subscribe();
        events.push(subscriber.expect("a writer made by store_shared has subscribers"));
        let watch = watcher(
            scoped_api::<Job>(client, scope),
            watcher::Config::default().labels(jobs::LABEL_LOCKED_JOB),
        )
        .default_backoff()
        // Reconciles and supervisors read a cached Job's metadata and status only: without
        // its pod template and managedFields a replica holds thousands of Jobs in a fraction
        // of the memory.
        .modify(|job| {
            job.spec = None;
            job.metadata.managed_fields = None;
        })
        .reflect_shared(writer);
        background.spawn(watch.for_each(|_| async {}));
        caches.push((scope.clone(), cache));
    }
    (caches, events)
}

/// Reconciles one controller runs at once. A reconcile makes at most a couple of API writes
/// and spawns its runs; any beyond what the client lets through at once would only wait for
/// a request slot, holding their futures and their copy of the LockedJob's Jobs (at 1,000
/// LockedJobs falling due in the same second, a thousand of them).
fn reconciles_in_flight(api_concurrency: u16) -> u16 {
    api_concurrency.saturating_mul(2)
}

type Reconciles = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// A controller per scope, ending when shutdown is requested and its reconciles in flight
/// are done; and their LockedJob stores.
fn controllers(
    client: &Client,
    scopes: &[Option<String>],
    job_events: Vec<ReflectHandle<Job>>,
    ctx: &Arc<Context>,
    concurrency: u16,
) -> (Vec<Reconciles>, Vec<Store<LockedJob>>) {
    let mut stores = Vec::new();
    let mut controllers = Vec::new();
    for (scope, job_events) in scopes.iter().zip(job_events) {
        let (store, writer) = reflector::store();
        let lockedjobs = watcher(
            scoped_api::<LockedJob>(client, scope),
            watcher::Config::default().any_semantic(),
        )
        .default_backoff()
        // managedFields were most of a cached LockedJob (three replicas' status writes each
        // leave an entry), and nothing here reads them: at 1,000 LockedJobs the store was
        // the largest item of a replica's heap.
        .modify(|lj| lj.metadata.managed_fields = None)
        .reflect(writer)
        .applied_objects();
        let controller = Controller::for_stream(lockedjobs, store)
            .owns_shared_stream(job_events)
            .with_config(controller::Config::default().concurrency(concurrency));
        stores.push(controller.store());
        let shutdown = ctx.shutdown.clone();
        let reconciles = controller
            .graceful_shutdown_on(async move { shutdown.cancelled().await })
            .run(
                reconcile::reconcile,
                reconcile::error_policy,
                Arc::clone(ctx),
            )
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "reconcile failed");
                }
            });
        controllers.push(Box::pin(reconciles) as Reconciles);
    }
    (controllers, stores)
}

/// Ready once every watch of every scope has its first list.
async fn mark_synced(ctx: Arc<Context>, stores: Vec<Store<LockedJob>>) {
    let jobs =
        futures::future::join_all(ctx.job_caches.iter().map(|(_, cache)| store_ready(cache)));
    let lockedjobs = futures::future::join_all(stores.iter().map(store_ready));
    let (jobs, lockedjobs) = futures::future::join(jobs, lockedjobs).await;
    if jobs.iter().chain(lockedjobs.iter()).all(|ready| *ready) {
        ctx.health.set_synced();
    }
}

/// Resolves when shutdown was requested while a controller's store still lacks its first list.
/// kube-runtime holds a controller's reconciles until its store is ready, and a graceful
/// shutdown stops the watch that would fill it, so such a controller never ends: an operator
/// told to stop in its first milliseconds, or while the API server is unreachable, hung until
/// killed. None of its reconciles has started then, and any that starts after the shutdown
/// returns at once, so dropping the controllers loses nothing.
async fn stopped_before_first_list(ctx: &Context, stores: &[Store<LockedJob>]) {
    ctx.shutdown.cancelled().await;
    let all_listed = stores
        .iter()
        .all(|store| store.wait_until_ready().now_or_never().is_some());
    if all_listed {
        // The controllers end by themselves once their reconciles in flight are done.
        std::future::pending::<()>().await;
    }
}

/// Runs hand themselves over on shutdown (they release their locks): waits for every one,
/// including runs still acquiring or creating their Job, within the pod's grace period.
async fn hand_over(ctx: &Context) {
    ctx.tasks.close();
    if tokio::time::timeout(SHUTDOWN_WAIT, ctx.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            unfinished = ctx.tasks.len(),
            "runs still busy at exit; their leases expire by themselves"
        );
    }
}

/// How long shutdown waits for the runs to hand over: within the chart's 30-second
/// termination grace period, and longer than a Job create that retries while its lease lasts.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(25);

/// The API of `K` in one watched scope: a namespace, or all of them.
fn scoped_api<K>(client: &Client, scope: &Option<String>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match scope {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

async fn probe_redis(ctx: Arc<Context>) {
    let mut steady = health::SteadyCount::default();
    let mut settled = health::SettledView::default();
    loop {
        let reachable = steady.observe(ctx.engine.reachable_nodes().await);
        ctx.health.set_reachable(reachable);
        let reported = settled.observe(reachable, ctx.nodes(), std::time::Instant::now());
        ctx.health.set_reported(reported);
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

async fn wait_for_shutdown(ctx: Arc<Context>) {
    crate::shutdown::sigterm_or_sigint().await;
    tracing::info!(
        "shutdown requested: no new runs; running Jobs are handed over to the other replicas"
    );
    ctx.shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_agent_names_the_replica_or_falls_back_to_the_bare_name() {
        let version = env!("CARGO_PKG_VERSION");
        for (holder, expected) in [
            (
                "prod-eu/lockedjob-0",
                format!("lockedjob-operator/{version} (prod-eu/lockedjob-0)"),
            ),
            ("local/bad\nname", format!("lockedjob-operator/{version}")),
        ] {
            assert_eq!(user_agent(holder), expected.as_str(), "holder {holder:?}");
        }
    }

    /// The readiness wait polls first, the Controller's own wait on the same store polls
    /// after it (and takes the store's one waker); the first list must still make the replica
    /// ready. With `wait_until_ready` alone the first waiter is never woken.
    #[tokio::test]
    async fn readiness_sees_the_first_list_when_another_task_waits_on_the_store_too() {
        let (store, mut writer) = reflector::store::<Job>();
        let ours = tokio::spawn({
            let store = store.clone();
            async move { store_ready(&store).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let theirs = tokio::spawn({
            let store = store.clone();
            async move { store.wait_until_ready().await.is_ok() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let both = tokio::time::timeout(Duration::from_secs(10), async {
            (ours.await, theirs.await)
        })
        .await;
        assert!(
            matches!(both, Ok((Ok(true), Ok(true)))),
            "both waiters see the store ready: {both:?}"
        );
    }
}
