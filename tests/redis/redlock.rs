//! The lock engine against real `redis-server` nodes with real faults.

use testsupport as support;

use lockedjob::redlock::{
    Lease, LeaseTiming, LockError, NodeErrorKind, Redlock, RedlockConfig, StepHint, Watchdog,
    WatchdogEnd,
};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{FaultProxy, NodeChecks, Persistence, ProxyMode, RedisNode, RedisNodes, SetChecks};

const SECOND: Duration = Duration::from_secs(1);

/// An engine for tests that are not about latency: a generous per-node timeout, so that a
/// loaded 2-core machine (all tests run at once) cannot turn a slow reply into a failure.
fn engine(urls: Vec<String>, holder: &str) -> Redlock {
    engine_with_timeout(urls, holder, Duration::from_millis(500))
}

fn engine_with_timeout(urls: Vec<String>, holder: &str, request_timeout: Duration) -> Redlock {
    let mut config = RedlockConfig::new(urls);
    config.holder = holder.to_string();
    config.request_timeout = request_timeout;
    config.retry_base_delay = Duration::from_millis(5);
    config.retry_max_delay = Duration::from_millis(50);
    Redlock::new(config).expect("valid engine config")
}

/// Takes locks `job-0` .. `job-{count - 1}` for a minute each.
async fn acquire_jobs(engine: &Redlock, count: usize) -> Vec<Lease> {
    let mut leases = Vec::with_capacity(count);
    for job in 0..count {
        let lease = engine
            .try_acquire(&format!("job-{job}"), 60 * SECOND)
            .await
            .expect("acquire");
        leases.push(lease);
    }
    leases
}

/// Blocking harness calls (kill, restart) from async tests.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn second_client_is_refused_while_first_holds_and_succeeds_after_release() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let a = engine(nodes.urls(), "test/a");
    let b = engine(nodes.urls(), "test/b");
    let ttl = 10 * SECOND;

    let lease = a.try_acquire("report", ttl).await.expect("a acquires");
    assert!(
        lease.remaining() < ttl,
        "validity must be strictly below the TTL"
    );
    assert!(lease.remaining() > ttl / 2);
    assert_eq!(lease.holder(), "test/a");
    assert!(lease.value().starts_with("test/a/") && lease.value().len() == "test/a/".len() + 32);
    assert_eq!(nodes.count_key("lockedjob:lock:report"), 3);
    assert_eq!(
        nodes[0].get("lockedjob:lock:report").as_deref(),
        Some(lease.value())
    );

    let err = b
        .try_acquire("report", ttl)
        .await
        .expect_err("b must be refused");
    assert!(err.is_contended(), "expected Contended, got {err}");
    assert_eq!(err.node_failures().len(), 3);
    assert!(err
        .node_failures()
        .iter()
        .all(|f| f.kind == NodeErrorKind::WrongValue));
    // b's failed attempt must not have disturbed a's keys.
    assert_eq!(nodes.count_key("lockedjob:lock:report"), 3);
    assert_eq!(b.current_holder("report").await.as_deref(), Some("test/a"));

    assert_eq!(a.release(&lease).await, 3);
    assert_eq!(nodes.count_key("lockedjob:lock:report"), 0);
    let second = b
        .try_acquire("report", ttl)
        .await
        .expect("b acquires after release");
    assert!(second.token() > lease.token());
}

/// Kills `kill` of `total` nodes and checks whether an acquisition succeeds.
async fn acquire_with_killed(total: usize, kill: usize) -> (Result<u64, LockError>, RedisNodes) {
    let mut nodes = RedisNodes::start(total, Persistence::None).expect("start redis-server");
    let client = engine(nodes.urls(), "test/quorum");
    blocking(|| (0..kill).for_each(|i| nodes[i].kill9()));
    let result = client
        .try_acquire("quorum", 10 * SECOND)
        .await
        .map(|lease| lease.token());
    (result, nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn acquire_survives_a_minority_of_dead_nodes() {
    for (total, kill) in [(3, 1), (5, 2)] {
        let (result, nodes) = acquire_with_killed(total, kill).await;
        assert!(result.is_ok(), "{kill} of {total} dead: {result:?}");
        assert_eq!(nodes.count_key("lockedjob:lock:quorum"), total - kill);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn acquire_fails_without_quorum_and_leaves_no_key_behind() {
    for (total, kill) in [(3, 2), (5, 3)] {
        let (result, nodes) = acquire_with_killed(total, kill).await;
        let err = result.expect_err("a majority is dead");
        assert!(matches!(err, LockError::NoQuorum { .. }), "{err}");
        let refused = err
            .node_failures()
            .iter()
            .filter(|f| f.kind == NodeErrorKind::Refused)
            .count();
        assert_eq!(refused, kill, "each dead node is named: {err}");
        assert_eq!(
            nodes.count_key("lockedjob:lock:quorum"),
            0,
            "no key left behind"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn hung_node_costs_about_one_timeout_not_seconds() {
    let mut nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let proxy = FaultProxy::start(&nodes[2].addr()).expect("start proxy");
    let urls = vec![nodes[0].url(), nodes[1].url(), proxy.url()];
    let client = engine_with_timeout(urls, "test/hung", Duration::from_millis(200));
    // Warm connections so the test measures requests, then hang node 0 and blackhole node 2.
    client.try_acquire("warm", SECOND).await.expect("warm-up");
    blocking(|| nodes[0].pause().expect("SIGSTOP redis-server"));
    proxy.set_mode(ProxyMode::Blackhole);

    // 2 of 3 hung: fails, and names both as timed out.
    let started = Instant::now();
    let err = client
        .try_acquire("hung", 10 * SECOND)
        .await
        .expect_err("no quorum");
    let took = started.elapsed();
    let timeouts = err
        .node_failures()
        .iter()
        .filter(|f| f.kind == NodeErrorKind::Timeout)
        .count();
    assert_eq!(timeouts, 2, "{err}");
    // The per-node figures say which nodes were slow, and how.
    let labels = client.node_labels();
    assert_eq!(node_requests(&client, &labels[0], "acquire", "timeout"), 1);
    assert_eq!(node_requests(&client, &labels[2], "acquire", "timeout"), 1);
    assert_eq!(node_requests(&client, &labels[1], "acquire", "timeout"), 0);
    assert_eq!(
        node_requests(&client, &labels[1], "acquire", "ok"),
        2,
        "warm-up and this one"
    );
    // Phase 1 and the release after it each wait one 200 ms timeout. The bound is loose on
    // purpose (a loaded machine); an unbounded client would hang here until the node resumed.
    assert!(took < 2 * SECOND, "took {took:?}");

    // Only node 0 hung: succeeds with validity close to the TTL.
    proxy.set_mode(ProxyMode::Forward);
    let started = Instant::now();
    let lease = client
        .try_acquire("hung", 10 * SECOND)
        .await
        .expect("quorum of 2");
    assert!(
        started.elapsed() < 2 * SECOND,
        "took {:?}",
        started.elapsed()
    );
    assert!(lease.remaining() > 8 * SECOND);
    blocking(|| nodes[0].resume().expect("SIGCONT redis-server"));
}

/// An orphan check's reads share rounds too: ten hints are one request to one node, ten
/// holder reads one request a node, and each read answers for its own lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn orphan_check_reads_share_a_round_and_answer_for_their_own_lock() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let mut config = RedlockConfig::new(nodes.urls());
    config.holder = "test/a".to_string();
    // One node after the other, each waited for: every node holds the locks before the reads.
    let holder = Redlock::new_sequential(config).expect("valid engine config");
    let leases = acquire_jobs(&holder, 5).await;
    let reader = engine(nodes.urls(), "test/b");
    let names: Vec<String> = (0..10).map(|job| format!("job-{job}")).collect();
    let (hints, holders) = tokio::join!(
        futures::future::join_all(names.iter().map(|name| reader.value_on_any_node(name))),
        futures::future::join_all(names.iter().map(|name| reader.current_holder(name))),
    );
    assert_eq!(requests(&reader, "hint"), 1, "ten hints in one request");
    assert_eq!(
        requests(&reader, "holder"),
        3,
        "ten holder reads in one round"
    );
    for (job, (hint, holder)) in hints.iter().zip(&holders).enumerate() {
        match leases.get(job) {
            Some(lease) => {
                let (value, left) = hint.as_ref().expect("a held lock's hint");
                assert_eq!(value, lease.value(), "job-{job}");
                assert!(
                    *left > Duration::ZERO && *left <= 60 * SECOND,
                    "job-{job}: {left:?}"
                );
                assert_eq!(holder.as_deref(), Some("test/a"), "job-{job}");
            }
            None => assert_eq!((hint, holder), (&None, &None), "job-{job} is free"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn non_holder_release_deletes_nothing_and_extend_never_recreates() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let a = engine(nodes.urls(), "test/a");
    let b = engine(nodes.urls(), "test/b");
    let key = "lockedjob:lock:shared";

    // a's lease runs out; b takes the lock; a's late release must not free b's lock.
    let stale = a
        .try_acquire("shared", Duration::from_millis(200))
        .await
        .expect("a");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let current = b
        .try_acquire("shared", 10 * SECOND)
        .await
        .expect("b after expiry");
    assert_eq!(a.release(&stale).await, 0, "stale holder deleted nothing");
    assert_eq!(nodes.count_key(key), 3);
    assert_eq!(nodes[1].get(key).as_deref(), Some(current.value()));

    // Extending an expired lease fails without touching the nodes.
    let err = a.extend(&stale).await.expect_err("expired lease");
    assert!(matches!(err, LockError::Expired { .. }), "{err}");

    // Keys gone while the local deadline still runs (evicted, or expired on fast node clocks):
    // extend must fail and must not write the key back.
    let lease = a.try_acquire("evicted", 10 * SECOND).await.expect("a");
    for node in &nodes.nodes {
        let _: i64 = node.query(&["DEL", "lockedjob:lock:evicted"]);
    }
    let err = a.extend(&lease).await.expect_err("keys are gone");
    assert!(matches!(err, LockError::NoQuorum { .. }), "{err}");
    assert!(
        err.node_failures()
            .iter()
            .all(|f| f.kind == NodeErrorKind::WrongValue),
        "{err}"
    );
    assert_eq!(
        nodes.count_key("lockedjob:lock:evicted"),
        0,
        "extend re-created the key"
    );

    // And a successful extend pushes the deadline out.
    let before = current.deadline();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let after = b.extend(&current).await.expect("b extends");
    assert!(after > before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn fencing_tokens_strictly_increase_across_node_crashes_and_restarts() {
    let mut nodes =
        RedisNodes::start(5, Persistence::AppendFsyncAlways).expect("start redis-server");
    let clients: Vec<Redlock> = (0..3)
        .map(|i| engine(nodes.urls(), &format!("test/c{i}")))
        .collect();
    let mut tokens = Vec::with_capacity(200);
    let mut down: Option<usize> = None;
    for i in 0..200usize {
        if i % 10 == 5 {
            // Restart the node that was down and crash another one: at most one is down, and
            // over the run every node goes down and comes back with its AOF.
            let victim = (i / 10) % 5;
            blocking(|| {
                if let Some(previous) = down.take() {
                    nodes[previous].restart().expect("restart redis-server");
                }
                nodes[victim].kill9();
            });
            down = Some(victim);
        }
        let client = &clients[i % clients.len()];
        let lease = client
            .acquire("fenced", 5 * SECOND, Some(5 * SECOND))
            .await
            .unwrap_or_else(|e| panic!("acquisition {i}: {e}"));
        tokens.push(lease.token());
        client.release(&lease).await;
    }
    for pair in tokens.windows(2) {
        assert!(
            pair[1] > pair[0],
            "tokens must strictly increase: {tokens:?}"
        );
    }
    assert_eq!(tokens[0], 1);
}

/// A refusal by a holder's quorum is `Contended`; nodes split between contenders with no value
/// on a quorum is a `SplitVote` (nobody holds the lock, so retrying soon is right), and the
/// attempt gives its own part back either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn a_split_vote_is_told_from_a_held_lock() {
    let nodes = RedisNodes::start(5, Persistence::None).expect("start redis-server");
    let client = engine(nodes.urls(), "test/split");
    let key = "lockedjob:lock:split";
    let put = |node: usize, value: &str| {
        let _: () = nodes[node].query(&["SET", key, value, "PX", "10000"]);
    };
    let clear = || {
        for node in 0..5 {
            let _: i64 = nodes[node].query(&["DEL", key]);
        }
    };

    // Two other contenders with 2 and 1 nodes; this attempt gets the other 2.
    put(0, "x/1");
    put(1, "x/1");
    put(2, "y/2");
    let err = client
        .try_acquire("split", 10 * SECOND)
        .await
        .expect_err("no quorum for anyone");
    assert!(
        matches!(
            err,
            LockError::SplitVote {
                granted: 2,
                strongest_other: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_contended());
    assert_eq!(nodes.count_key(key), 3, "our two grants were given back");

    // One other value on 3 of 5 nodes: a holder.
    clear();
    for node in 0..3 {
        put(node, "x/1");
    }
    let err = client
        .try_acquire("split", 10 * SECOND)
        .await
        .expect_err("held");
    assert!(matches!(err, LockError::Contended { .. }), "{err}");
    assert_eq!(nodes.count_key(key), 3);
}

/// Work between acquiring and starting the watchdog (the operator creates the Job first) must
/// not cost the lease: the first renewal is due a renew interval into the lease's life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn watchdog_started_late_renews_at_once_instead_of_giving_up() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let client = engine(nodes.urls(), "test/late-watchdog");
    let ttl = 3 * SECOND;
    let timing = LeaseTiming::from_ttl(ttl); // renew every 1 s, give up 300 ms before the end
    let lease = client.try_acquire("late", ttl).await.expect("acquire");
    // Past the first renewal's time, 0.7 s before the give-up point.
    tokio::time::sleep(2 * SECOND).await;
    let watchdog = Watchdog::spawn(client.clone(), lease, timing);
    tokio::time::sleep(2 * SECOND).await;
    let status = watchdog.status();
    assert!(!watchdog.is_lost(), "lease given up: {status:?}");
    assert!(status.renewals >= 1, "{status:?}");
    assert!(watchdog.release(&client).await, "still held at release");
}

/// A holder that drops its watchdog without `stop()` (it returned early or panicked) must not
/// leave a task renewing the lease forever: the renewals end with the handle and the lock
/// expires by itself, so another runner can take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn a_dropped_watchdog_stops_renewing_and_the_lease_expires() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let client = engine(nodes.urls(), "test/dropped-watchdog");
    let ttl = SECOND;
    let lease = client.try_acquire("dropped", ttl).await.expect("acquire");
    let key = client.lock_key("dropped");
    let watchdog = Watchdog::spawn(client.clone(), lease, LeaseTiming::from_ttl(ttl));
    // Renewing while held: the key outlives its first TTL.
    tokio::time::sleep(2 * ttl).await;
    assert_eq!(
        nodes.count_key(&key),
        3,
        "renewed while the watchdog is held"
    );
    drop(watchdog);
    // Without renewals the key is gone within a TTL (plus a renewal that was in flight).
    tokio::time::sleep(3 * ttl).await;
    assert_eq!(
        nodes.count_key(&key),
        0,
        "a dropped watchdog renewed the lease on"
    );
    let other = engine(nodes.urls(), "test/next-holder");
    other
        .try_acquire("dropped", ttl)
        .await
        .expect("the next holder takes the expired lock");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn watchdog_keeps_the_lease_alive_then_fires_before_the_deadline_on_quorum_loss() {
    let mut nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let client = engine(nodes.urls(), "test/watchdog");
    let ttl = SECOND;
    let timing = LeaseTiming::from_ttl(ttl);
    let lease = client.try_acquire("watched", ttl).await.expect("acquire");
    let watchdog = Watchdog::spawn(client.clone(), lease, timing);
    let key = "lockedjob:lock:watched";

    // Three TTLs later the key is still there, its PTTL refreshed well above zero.
    let mut lowest = i64::MAX;
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let pttl = blocking(|| nodes[0].pttl(key));
        lowest = lowest.min(pttl);
    }
    assert!(lowest > 0, "key expired while the watchdog was renewing");
    assert!(watchdog.status().renewals >= 3, "{:?}", watchdog.status());
    assert!(!watchdog.is_lost());

    // Lose the majority: the lost signal must fire before the lease deadline.
    let lost = watchdog.lost();
    blocking(|| {
        nodes[0].kill9();
        nodes[1].kill9();
    });
    tokio::time::timeout(5 * ttl, lost.cancelled())
        .await
        .expect("lost signal fires");
    let fired_at = Instant::now();
    let status = watchdog.status();
    assert!(
        fired_at < status.deadline,
        "fired after the deadline: {status:?}"
    );
    let last_attempt = status.last_attempt.expect("renewals were attempted");
    assert!(last_attempt < status.deadline);

    // No renewal after the loss: the surviving key's PTTL only goes down, then it is gone.
    let first = blocking(|| nodes[2].pttl(key));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = blocking(|| nodes[2].pttl(key));
    assert!(
        second < first || second == -2,
        "PTTL went from {first} to {second}"
    );
    assert_eq!(watchdog.status().renewals, status.renewals);
    match watchdog.stop().await {
        WatchdogEnd::Lost(lease) => assert!(lease.is_expired() || lease.remaining() < ttl),
        WatchdogEnd::Stopped(_) => panic!("the watchdog should report the loss"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn contention_never_lets_two_holders_into_the_critical_section() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let counter_node = RedisNode::start(Persistence::None).expect("start redis-server");
    let counter_client = redis::Client::open(counter_node.url()).expect("counter url");
    let peak = Arc::new(AtomicI64::new(0));
    let mut tasks = Vec::new();
    for c in 0..8 {
        let client = engine(nodes.urls(), &format!("test/contender{c}"));
        let counter_client = counter_client.clone();
        let peak = Arc::clone(&peak);
        tasks.push(tokio::spawn(async move {
            let mut counter = counter_client
                .get_multiplexed_async_connection()
                .await
                .expect("counter connection");
            let mut tokens = Vec::new();
            for _ in 0..200 {
                let lease = client
                    .acquire("contended", 5 * SECOND, Some(60 * SECOND))
                    .await
                    .expect("acquire eventually");
                let inside: i64 = redis::cmd("INCR")
                    .arg("inside")
                    .query_async(&mut counter)
                    .await
                    .expect("INCR");
                peak.fetch_max(inside, Ordering::SeqCst);
                let _: i64 = redis::cmd("DECR")
                    .arg("inside")
                    .query_async(&mut counter)
                    .await
                    .expect("DECR");
                tokens.push(lease.token());
                client.release(&lease).await;
            }
            tokens
        }));
    }
    let mut all_tokens = Vec::new();
    for task in tasks {
        all_tokens.extend(task.await.expect("contender task"));
    }
    assert_eq!(
        peak.load(Ordering::SeqCst),
        1,
        "two holders were inside at once"
    );
    all_tokens.sort_unstable();
    all_tokens.dedup();
    assert_eq!(
        all_tokens.len(),
        1600,
        "every acquisition got its own token"
    );
}

#[test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
fn unreachable_nodes_are_an_error_not_a_hang_or_panic() {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        // Free ports with nothing listening.
        let urls = support::free_ports(3)
            .into_iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect();
        let client = engine(urls, "test/nobody");
        let err = client
            .acquire("x", SECOND, None)
            .await
            .expect_err("nothing is up");
        assert!(matches!(err, LockError::WaitExpired { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("127.0.0.1") && text.contains("refused"),
            "{text}"
        );
    });
}

/// A step (the operator's scheduled time) runs once across holders: the progress register is
/// read in phase 1 and raised in phase 2, on a quorum, so a later holder sees it even with a
/// node down, and a loser's refused nodes keep no value of its attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn a_step_is_started_once_across_holders_even_with_a_node_down() {
    let mut nodes = RedisNodes::start(5, Persistence::None).expect("start redis-server");
    let a = engine(nodes.urls(), "test/a");
    let b = engine(nodes.urls(), "test/b");
    let ttl = 10 * SECOND;

    let lease = a
        .try_acquire_step("sweep", ttl, 100)
        .await
        .expect("a starts step 100");
    // b loses the race; the nodes that refused it hold nothing of b's.
    let err = b
        .try_acquire_step("sweep", ttl, 100)
        .await
        .expect_err("b refused");
    assert!(err.is_contended(), "{err}");
    assert_eq!(
        (0..5)
            .filter(|i| nodes[*i].get("lockedjob:lock:sweep").as_deref() == Some(lease.value()))
            .count(),
        5,
        "a still holds every node"
    );
    a.release(&lease).await;
    assert_eq!(
        (0..5)
            .filter(|i| nodes[*i].get("lockedjob:progress:sweep").as_deref() == Some("100"))
            .count(),
        5,
        "progress recorded with the fence"
    );

    // Two nodes down (a minority); the step is still seen as started.
    blocking(|| {
        nodes.nodes[0].kill9();
        nodes.nodes[1].kill9();
    });
    for step in [100, 99] {
        match b.try_acquire_step("sweep", ttl, step).await {
            Err(LockError::StepDone { step: s, done, .. }) => {
                assert_eq!((s, done), (step, 100));
            }
            other => panic!("step {step} must be reported done, got {other:?}"),
        }
    }
    assert_eq!(
        nodes.count_key("lockedjob:lock:sweep"),
        0,
        "a StepDone attempt leaves no lock behind"
    );
    let next = b
        .try_acquire_step("sweep", ttl, 101)
        .await
        .expect("b starts step 101");
    assert!(next.token() > lease.token(), "tokens grow across steps");
    b.release(&next).await;
    // try_acquire (no step) neither reads nor moves the register.
    let plain = a.try_acquire("sweep", ttl).await.expect("plain acquire");
    a.release(&plain).await;
    assert_eq!(
        nodes[2].get("lockedjob:progress:sweep").as_deref(),
        Some("101")
    );
}

/// A step in a register of its own (a backfill): ordered and once within that register, while
/// the lock and its fence stay shared with the lock's own steps, which it neither reads nor moves.
/// One node's value is the adoption hint: it names the holder while held, nothing after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn a_step_in_another_register_shares_the_lock_but_not_the_progress() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let a = engine(nodes.urls(), "test/a");
    let b = engine(nodes.urls(), "test/b");
    let ttl = 10 * SECOND;
    let scheduled = a
        .try_acquire_step("sweep", ttl, 500)
        .await
        .expect("step 500");
    for which in 0..4 {
        let (value, left) = b
            .value_on_node("sweep", which)
            .await
            .unwrap_or_else(|| panic!("node {which} (modulo 3) has no value"));
        assert_eq!(value, scheduled.value(), "node {which} names the holder");
        assert!(
            left > Duration::ZERO && left <= ttl,
            "node {which} keeps it for the rest of the TTL at most: {left:?}"
        );
    }
    let held = b
        .try_acquire_step_in("sweep", ttl, "sweep#backfill:1-2", 100)
        .await
        .expect_err("the lock is shared: a backfill step waits for the scheduled run");
    assert!(held.is_contended(), "{held}");
    a.release(&scheduled).await;
    assert_eq!(b.value_on_node("sweep", 1).await, None, "released: no hint");
    let filled = b
        .try_acquire_step_in("sweep", ttl, "sweep#backfill:1-2", 100)
        .await
        .expect("a backfill step below the schedule's progress runs in its own register");
    assert!(filled.token() > scheduled.token(), "one fence for both");
    b.release(&filled).await;
    match a
        .try_acquire_step_in("sweep", ttl, "sweep#backfill:1-2", 100)
        .await
    {
        Err(LockError::StepDone { done, .. }) => assert_eq!(done, 100),
        other => panic!("step 100 of the backfill ran: {other:?}"),
    }
    assert_eq!(
        nodes[0].get("lockedjob:progress:sweep").as_deref(),
        Some("500"),
        "the lock's own register is untouched"
    );
    assert_eq!(
        nodes[0]
            .get("lockedjob:progress:sweep#backfill:1-2")
            .as_deref(),
        Some("100")
    );
}

/// One node is the hint of the replicas that held back: a time a winner started (or a later
/// one) is there on every node of its quorum; a held lock shows as held; a free lock with a
/// later time, or a node that does not answer, says nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn one_node_tells_a_started_step_or_a_held_lock() {
    let mut nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let a = engine(nodes.urls(), "test/a");
    let b = engine(nodes.urls(), "test/b");
    let ttl = 10 * SECOND;
    let backfill = "report#backfill:1-2";
    assert_eq!(
        b.step_hint("report", "report", 500, 0).await,
        StepHint::Unknown,
        "nothing started or held yet"
    );
    let lease = a
        .try_acquire_step("report", ttl, 500)
        .await
        .expect("step 500");
    for which in 0..3 {
        // (register, step, hint)
        let table = [
            ("report", 499, StepHint::Started),
            ("report", 500, StepHint::Started),
            ("report", 501, StepHint::Held),
            (backfill, 500, StepHint::Held),
        ];
        for (register, step, hint) in table {
            assert_eq!(
                b.step_hint("report", register, step, which).await,
                hint,
                "node {which}, {register} step {step}"
            );
        }
    }
    a.release(&lease).await;
    assert_eq!(
        b.step_hint("report", "report", 500, 1).await,
        StepHint::Started,
        "a release leaves the register"
    );
    assert_eq!(
        b.step_hint("report", "report", 501, 1).await,
        StepHint::Unknown,
        "released: nothing held, the next time not started"
    );
    blocking(|| nodes[1].kill9());
    assert_eq!(
        b.step_hint("report", "report", 500, 1).await,
        StepHint::Unknown,
        "a node that does not answer proves nothing"
    );
    assert_eq!(
        b.step_hint("report", "report", 500, 2).await,
        StepHint::Started
    );
}

/// A server that answers every command `+OK`, whatever it was: a broken proxy or a
/// misconfigured port. Commands are counted by their RESP array headers.
async fn garbage_node() -> (String, tokio::task::JoinHandle<()>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("redis://{}", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            connections.spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    let chunk = &buf[..n];
                    let commands = usize::from(chunk.first() == Some(&b'*'))
                        + chunk.windows(3).filter(|w| w == b"\r\n*").count();
                    if socket
                        .write_all(&b"+OK\r\n".repeat(commands))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (url, task)
}

#[tokio::test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn nodes_that_answer_garbage_fail_the_attempt_with_a_message_never_a_wrong_token() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let (garbage_a, task_a) = garbage_node().await;
    let (garbage_b, task_b) = garbage_node().await;

    // Two of five nodes answer garbage: three real votes still make a quorum, and the token
    // comes from the real fences only.
    let mut urls = nodes.urls();
    urls.extend([garbage_a.clone(), garbage_b.clone()]);
    let five = engine(urls, "garbage-test");
    let lease = five
        .try_acquire("garbage", 10 * SECOND)
        .await
        .expect("3 of 5");
    assert_eq!(lease.token(), 1);
    five.release(&lease).await;

    // Garbage on a quorum: refused, with the garbage nodes named.
    let mut urls: Vec<String> = nodes.urls()[..1].to_vec();
    urls.extend([garbage_a.clone(), garbage_b.clone()]);
    let three = engine(urls, "garbage-test");
    let err = three
        .try_acquire("garbage", 10 * SECOND)
        .await
        .expect_err("no quorum of real nodes");
    let message = err.to_string();
    assert!(matches!(err, LockError::NoQuorum { .. }), "{message}");
    for url in [&garbage_a, &garbage_b] {
        assert!(message.contains(url.as_str()), "{message}");
    }
    task_a.abort();
    task_b.abort();
}

#[tokio::test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn keys_of_the_wrong_type_or_value_fail_the_attempt_instead_of_issuing_a_token() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let engine = engine(nodes.urls(), "wrong-type-test");
    // (what is on every node, what the message says)
    let table: [(&[&[&str]], &str); 4] = [
        (
            &[&["SET", "lockedjob:fence:wt", "not-a-number"]],
            "unexpected reply",
        ),
        (&[&["SET", "lockedjob:fence:wt", "-5"]], "unexpected reply"),
        (&[&["HSET", "lockedjob:fence:wt", "f", "1"]], "WRONGTYPE"),
        (&[&["HSET", "lockedjob:lock:wt", "f", "1"]], "WRONGTYPE"),
    ];
    for (setup, expected) in table {
        for node in &nodes.nodes {
            node.command::<()>(&["FLUSHALL"]).expect("FLUSHALL");
            for command in setup {
                node.command::<()>(command).expect("setup");
            }
        }
        let err = engine
            .try_acquire("wt", 10 * SECOND)
            .await
            .expect_err("refused: no node gave a usable fence");
        let message = err.to_string();
        assert!(
            matches!(err, LockError::NoQuorum { .. }),
            "{setup:?}: {message}"
        );
        assert!(message.contains(expected), "{setup:?}: {message}");
        let locks_left = nodes
            .nodes
            .iter()
            .filter(|node| {
                node.command::<String>(&["TYPE", "lockedjob:lock:wt"])
                    .expect("TYPE")
                    == "string"
            })
            .count();
        assert_eq!(locks_left, 0, "{setup:?}: no lock of ours left behind");
    }

    // One node with a broken fence: the other two are a quorum and the token exceeds theirs.
    for node in &nodes.nodes {
        node.command::<()>(&["FLUSHALL"]).expect("FLUSHALL");
        node.command::<()>(&["SET", "lockedjob:fence:wt", "7"])
            .expect("fence");
    }
    nodes[0]
        .command::<()>(&["SET", "lockedjob:fence:wt", "garbage"])
        .expect("broken fence");
    let lease = engine.try_acquire("wt", 10 * SECOND).await.expect("2 of 3");
    assert_eq!(lease.token(), 8);
    engine.release(&lease).await;
}

/// The value of one series of an engine's metrics (`name{labels}`), 0 when absent.
fn series(engine: &Redlock, series: &str) -> u64 {
    engine
        .metrics()
        .render()
        .lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// Node requests of one kind an engine has made: `lockedjob_redis_requests_total{op}`.
fn requests(engine: &Redlock, op: &str) -> u64 {
    series(
        engine,
        &format!("lockedjob_redis_requests_total{{op=\"{op}\"}}"),
    )
}

/// Requests to one node for `op` that ended as `result`:
/// `lockedjob_redis_request_duration_seconds_count{node, op, result}`.
fn node_requests(engine: &Redlock, node: &str, op: &str, result: &str) -> u64 {
    let labels = format!("node=\"{node}\",op=\"{op}\",result=\"{result}\"");
    series(
        engine,
        &format!("lockedjob_redis_request_duration_seconds_count{{{labels}}}"),
    )
}

/// Phase-2 (fallback) node requests an engine has made.
fn fence_requests(engine: &Redlock) -> u64 {
    requests(engine, "fence")
}

/// Renewals waiting at the same time go to each node as one script call, and each lease still
/// gets its own answer: a lease whose keys are gone fails alone, and nothing re-creates them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn renewals_share_a_round_and_each_lease_keeps_its_own_answer() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let engine = engine(nodes.urls(), "a");
    let leases = acquire_jobs(&engine, 20).await;
    for node in &nodes.nodes {
        let _: i64 = node.query(&["DEL", "lockedjob:lock:job-7"]);
    }
    let before = requests(&engine, "extend");
    let results =
        futures::future::join_all(leases.iter().map(|lease| engine.renew(lease, SECOND))).await;
    assert_eq!(
        requests(&engine, "extend") - before,
        3,
        "20 renewals queued together take one round, one request a node"
    );
    for (job, (lease, result)) in leases.iter().zip(&results).enumerate() {
        let key = format!("lockedjob:lock:job-{job}");
        if job == 7 {
            let err = result.as_ref().expect_err("job-7's keys are gone");
            assert!(matches!(err, LockError::NoQuorum { .. }), "{err}");
            assert_eq!(nodes.count_key(&key), 0, "a renewal re-created the key");
            continue;
        }
        let deadline = result.as_ref().expect("renewed");
        assert!(
            *deadline > lease.deadline(),
            "job-{job}: deadline not pushed out"
        );
        assert_eq!(nodes.count_key(&key), 3, "job-{job}");
    }
    for lease in &leases {
        engine.release(lease).await;
    }
}

/// The token is settled in phase 1 when this engine's proposal (one above the last token it
/// saw) is still above the fence on a quorum; when another client went higher meanwhile, the
/// proposal falls short and phase 2 issues a token above everything seen. Tokens grow either way.
#[tokio::test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn phase_one_settles_the_token_unless_another_client_went_higher() {
    let nodes = RedisNodes::start(3, Persistence::None).expect("start redis-server");
    let a = engine(nodes.urls(), "test/a");
    let b = engine(nodes.urls(), "test/b");
    let mut tokens = Vec::new();
    // (engine, expected token, phase 2 needed)
    let steps: [(&Redlock, u64, bool); 5] = [
        (&a, 1, false), // a fresh lock: proposal 1 holds
        (&a, 2, false), // a saw 1: proposes 2
        (&b, 3, true),  // b never saw this lock: proposes 1, the fence is 2
        (&a, 4, true),  // a saw 2, proposes 3; b took 3
        (&a, 5, false), // a saw 4
    ];
    for (i, (engine, token, fallback)) in steps.into_iter().enumerate() {
        let before = fence_requests(engine);
        let lease = engine
            .try_acquire("proposal", 10 * SECOND)
            .await
            .unwrap_or_else(|e| panic!("step {i}: {e}"));
        assert_eq!(lease.token(), token, "step {i}");
        assert_eq!(
            fence_requests(engine) > before,
            fallback,
            "step {i}: phase 2 used?"
        );
        tokens.push(lease.token());
        engine.release(&lease).await;
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");

    // Two engines that both saw token 5 race with the same proposal: whoever reaches a node
    // first takes its lock and its fence, so at most one can hold a quorum of both.
    let (first, second) = tokio::join!(
        a.try_acquire("proposal", 10 * SECOND),
        b.try_acquire("proposal", 10 * SECOND)
    );
    let winners: Vec<u64> = [&first, &second]
        .into_iter()
        .filter_map(|r| r.as_ref().ok().map(|l| l.token()))
        .collect();
    assert!(winners.len() <= 1, "two holders: {first:?} {second:?}");
    assert!(winners.iter().all(|&t| t > 5), "{winners:?}");
    for lease in [first, second].into_iter().flatten() {
        a.release(&lease).await;
    }
}

/// Kleppmann's clock jump: a holder with exactly a quorum, one of whose nodes' clock jumps past
/// the TTL; a second client then gets a quorum too (Redlock's known overlap). Its proposal
/// falls short on the node the first holder fenced, and phase 2 gives it a token above the
/// first holder's, so fenced storage refuses the first.
#[tokio::test]
#[ignore = "redis tier: real redis-server; run with scripts/test.sh redis"]
async fn after_a_clock_jump_the_second_holder_still_gets_the_larger_token() {
    let mut nodes =
        RedisNodes::start_where(5, Persistence::None, |i| i == 2).expect("start redis-server");
    let first = engine(nodes.urls(), "test/first");
    let second = engine(nodes.urls(), "test/second");
    // The first holder reaches nodes 0-2 only.
    nodes[3].pause().expect("pause");
    nodes[4].pause().expect("pause");
    let held = first
        .try_acquire("jump", 10 * SECOND)
        .await
        .expect("quorum of 3 of 5");
    nodes[3].resume().expect("resume");
    nodes[4].resume().expect("resume");
    // Node 2's clock jumps past the TTL: it forgets the first holder's key.
    nodes[2]
        .shift_clock(60 * SECOND)
        .expect("move node 2's clock");
    let before = fence_requests(&second);
    let overlapping = second
        .try_acquire("jump", 10 * SECOND)
        .await
        .expect("nodes 2-4 grant the lock: the overlap Redlock cannot prevent");
    assert!(
        fence_requests(&second) > before,
        "the proposal fell short on node 2 and phase 2 issued the token"
    );
    assert!(
        overlapping.token() > held.token(),
        "second {} must exceed first {}",
        overlapping.token(),
        held.token()
    );
    nodes[2]
        .shift_clock(Duration::ZERO)
        .expect("reset the clock");
}
