#![cfg(feature = "zookeeper")]
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! What is specific to ZooKeeper, on real servers started by the test kit: leader failover,
//! session expiry and closure, suspended connections, waiters' nodes, container clean-up,
//! czxid fences, digest ACLs.

use std::time::Duration;

use dlock::{Error, Hold};
use dlock_testkit::cli::Holder;
use dlock_testkit::server::{
    ServerProcess, Zookeeper, ZookeeperEnsemble, required, zookeeper_installed,
};
use zookeeper_client::Client;

fn installed() -> bool {
    if zookeeper_installed() {
        return true;
    }
    assert!(
        !required("zookeeper"),
        "zookeeper not installed, but DLOCK_TEST_REQUIRE requires it"
    );
    // The build found ZooKeeper (or these tests are ignored): missing now fails rather than
    // passing (`dlock_testkit::require`).
    panic!("{}", dlock_testkit::require::missing_now("zookeeper"));
}

fn server() -> Option<ServerProcess> {
    installed().then(|| {
        tokio::task::block_in_place(|| {
            ServerProcess::start(Zookeeper::default()).unwrap_or_else(|e| panic!("{e}"))
        })
    })
}

fn url(server: &ServerProcess, options: &str) -> String {
    format!("zk://{}/t?{options}", server.addr())
}

/// The dlock nodes in a lock's directory (`/t/<name>`), empty when the directory is gone.
async fn nodes(zk: &Client, name: &str) -> Vec<String> {
    match zk.list_children(&format!("/t/{name}")).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(e) => panic!("{e}"),
    }
}

async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..100 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within 10 s: {what}");
}

#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_held_locks_and_clients_reconnect() {
    if !installed() {
        return;
    }
    let mut ensemble = tokio::task::block_in_place(ZookeeperEnsemble::start).unwrap();
    // The longest session the servers allow (20 ticks of 500 ms): room for an election.
    let url = format!("zk://{}/t?session_timeout=10s", ensemble.connect_string());
    let (a, b) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    let held = a.mutex("failover").acquire().await.unwrap();
    let fence = held.fence();
    let waiter = tokio::spawn(async move {
        b.mutex("failover")
            .wait(Duration::from_secs(60))
            .acquire()
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let leader = ensemble.leader().expect("a leader");
    ensemble.nodes[leader].kill().unwrap();
    // A new leader is elected and both clients reconnect with their sessions.
    eventually("a new leader", async || ensemble.leader().is_some()).await;
    eventually("the holder sees its lock again", async || {
        matches!(held.is_owned().await, Ok(true))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!held.is_lost(), "the leader's death lost the lock");
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    held.release().await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not served after the failover")
        .unwrap()
        .unwrap();
    assert!(next.fence() > fence);
    next.release().await.unwrap();
}

#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_session_loses_the_lock_to_the_next_waiter() {
    let Some(server) = server() else { return };
    let url = url(&server, "session_timeout=2s");
    let holder = tokio::task::block_in_place(|| Holder::start(&url, "paused", &[])).unwrap();
    let pid = holder.child.id().to_string();
    let locks = dlock::connect(&url).await.unwrap();
    let stop = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    assert!(stop.success());
    let start = std::time::Instant::now();
    let next = locks
        .mutex("paused")
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .unwrap();
    // Not before its session (2 s) could have expired.
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    assert!(next.fence().get() > holder.fence);
    let resume = std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .unwrap();
    assert!(resume.success());
    // Resumed, the holder learns its session expired: `dlock hold` exits 76 (lost).
    let code = tokio::task::spawn_blocking(move || {
        let mut holder = holder;
        for _ in 0..100 {
            if let Some(status) = holder.child.try_wait().unwrap() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    })
    .await
    .unwrap();
    assert_eq!(
        code,
        Some(76),
        "the paused holder was not told it lost the lock"
    );
    next.release().await.unwrap();
}

#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspended_connection_makes_the_hold_uncertain_then_it_recovers() {
    let Some(mut server) = server() else { return };
    let url = url(&server, "session_timeout=6s");
    let locks = dlock::connect(&url).await.unwrap();
    let held = locks.mutex("suspended").acquire().await.unwrap();
    assert!(held.is_owned().await.unwrap());
    tokio::task::block_in_place(|| server.pause()).unwrap();
    // The client notices the silent server after 2/5 of the session: the hold is uncertain.
    let mut uncertain = false;
    for _ in 0..50 {
        match tokio::time::timeout(Duration::from_millis(300), held.is_owned()).await {
            Ok(Err(Error::Unavailable { .. })) => {
                uncertain = true;
                break;
            }
            Ok(Ok(true)) | Err(_) => {}
            Ok(other) => panic!("unexpected ownership answer while suspended: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::task::block_in_place(|| server.resume()).unwrap();
    assert!(uncertain, "the hold never reported an uncertain state");
    eventually("the hold is confirmed again", async || {
        matches!(held.is_owned().await, Ok(true))
    })
    .await;
    assert!(!held.is_lost());
    held.release().await.unwrap();
}

#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_time_out_or_are_cancelled_leave_no_node() {
    let Some(server) = server() else { return };
    let url = url(&server, "");
    let zk = Client::connect(&server.addr().to_string()).await.unwrap();
    let (a, b) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    let held = a.mutex("waiters").acquire().await.unwrap();
    assert_eq!(nodes(&zk, "waiters").await.len(), 1);
    // A timed-out waiter removes its node before `acquire` returns.
    let timed_out = b
        .mutex("waiters")
        .wait(Duration::from_millis(200))
        .acquire()
        .await;
    assert!(
        matches!(timed_out, Err(Error::Timeout { .. })),
        "{timed_out:?}"
    );
    assert_eq!(
        nodes(&zk, "waiters").await.len(),
        1,
        "a timed-out waiter left its node"
    );
    // A cancelled waiter's node is removed in the background, at once.
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("waiters").acquire().await }
    });
    eventually("the waiter queued", async || {
        nodes(&zk, "waiters").await.len() == 2
    })
    .await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    eventually("the cancelled waiter's node is gone", async || {
        nodes(&zk, "waiters").await.len() == 1
    })
    .await;
    // Acquires dropped at random points (some while their create is in flight) leave nothing.
    held.release().await.unwrap();
    for i in 0..30u64 {
        let attempt = b.mutex("waiters").acquire();
        if let Ok(guard) = tokio::time::timeout(Duration::from_micros(i * 100), attempt).await {
            guard.unwrap().release().await.unwrap();
        }
    }
    eventually("no node is left", async || {
        nodes(&zk, "waiters").await.is_empty()
    })
    .await;
}

#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_lock_directories_are_removed_and_fences_keep_growing_across_them() {
    let Some(server) = server() else { return };
    let zk = Client::connect(&server.addr().to_string()).await.unwrap();
    let locks = dlock::connect(&url(&server, "")).await.unwrap();
    let first = locks.mutex("orders/1").acquire().await.unwrap();
    // One node under the percent-encoded name; its sequence number starts at 0.
    let held = nodes(&zk, "orders%2F1").await;
    assert_eq!(held.len(), 1);
    assert!(held[0].ends_with("-lock-0000000000"), "{held:?}");
    let fence = first.fence();
    first.release().await.unwrap();
    eventually("the empty directory is removed", async || {
        zk.check_stat("/t/orders%2F1").await.unwrap().is_none()
    })
    .await;
    // The directory is recreated and its sequence restarts, but the fence (czxid) still grows.
    let second = locks.mutex("orders/1").acquire().await.unwrap();
    let held = nodes(&zk, "orders%2F1").await;
    assert!(held[0].ends_with("-lock-0000000000"), "{held:?}");
    assert!(
        second.fence() > fence,
        "{:?} after {fence:?}",
        second.fence()
    );
    second.release().await.unwrap();
}

#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_credentials_protect_the_nodes_of_their_user() {
    let Some(server) = server() else { return };
    let alice = dlock::connect(&format!("zk://alice:s3cret@{}/acl", server.addr()))
        .await
        .unwrap();
    let held = alice.mutex("private").acquire().await.unwrap();
    let mallory = dlock::connect(&format!("zk://mallory:guess@{}/acl", server.addr()))
        .await
        .unwrap();
    let denied = mallory.mutex("private").no_wait().acquire().await;
    assert!(
        matches!(denied, Err(Error::PermissionDenied { .. })),
        "{denied:?}"
    );
    held.release().await.unwrap();
    let error = dlock::connect(&format!("zk://alice:s3cret@{}/acl?bogus=1", server.addr()))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::InvalidUrl { .. }));
    assert!(!error.to_string().contains("s3cret"), "{error}");
}

#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_ensemble_is_unavailable() {
    let port = dlock_testkit::server::free_port().unwrap();
    let error = dlock::connect(&format!("zk://127.0.0.1:{port}?connect_timeout=500ms"))
        .await
        .unwrap_err();
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
}

#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_locks_and_semaphores_are_native_queues() {
    let Some(server) = server() else { return };
    let url = url(&server, "");
    let zk = Client::connect(&server.addr().to_string()).await.unwrap();
    let (a, b) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    // Curator's recipe: one sequential node per hold or waiter, its kind in its name.
    let reader = a.rwlock("doc").read().await.unwrap();
    let writer = tokio::spawn({
        let b = b.clone();
        async move { b.rwlock("doc").write().await }
    });
    eventually("the writer queued", async || {
        nodes(&zk, "doc%00rw").await.len() == 2
    })
    .await;
    let kinds: Vec<char> = {
        let mut children = nodes(&zk, "doc%00rw").await;
        children.sort_by_key(|c| c.rsplit_once("-lock-").map(|(_, seq)| seq.to_owned()));
        children.iter().map(|c| c.chars().nth(3).unwrap()).collect()
    };
    assert_eq!(kinds, vec!['r', 'w'], "queue nodes by kind");
    // A reader arriving behind the waiting writer waits too.
    assert!(b.rwlock("doc").try_read().await.unwrap().is_none());
    reader.release().await.unwrap();
    let writer = writer.await.unwrap().unwrap();
    assert!(writer.fence() > dlock::FencingToken::new(0));
    // Deleting the writer's node (as an operator would) fires its lost signal.
    let node = nodes(&zk, "doc%00rw").await.pop().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await; // past the own-node watch delay
    zk.delete(&format!("/t/doc%00rw/{node}"), None)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), writer.lost())
        .await
        .expect("lost signal");

    // Semaphore: the first `permits` nodes in line hold; the rest wait for any to go.
    let p1 = a.semaphore("pool", 2).acquire().await.unwrap();
    let p2 = a.semaphore("pool", 2).acquire().await.unwrap();
    assert!(p2.fence() > p1.fence());
    let third = tokio::spawn({
        let b = b.clone();
        async move { b.semaphore("pool", 2).acquire().await }
    });
    eventually("the third waits", async || {
        nodes(&zk, "pool%00sem").await.len() == 3
    })
    .await;
    p1.release().await.unwrap();
    third.await.unwrap().unwrap().release().await.unwrap();
    p2.release().await.unwrap();
    eventually("no node is left", async || {
        nodes(&zk, "pool%00sem").await.is_empty()
    })
    .await;
    // Neither shows up as a lock.
    use futures::TryStreamExt;
    let listed: Vec<_> = a.list("").try_collect().await.unwrap();
    assert!(listed.is_empty(), "{listed:?}");
}

/// Per-name state is bounded: 10,000 names taken and released, held by a client that
/// crashed, or waited for by a client that crashed while queued, leave no node once the
/// crashed sessions have expired (4 s here) and the empty lock directories are reaped.
/// (10,000, not 100,000: every ZooKeeper acquire is a write through the ensemble's log, and
/// the count changes nothing in kind.)
#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_per_name_is_left_once_sessions_and_leases_end() -> anyhow::Result<()> {
    let Some(server) = server() else {
        return Ok(());
    };
    let zk = Client::connect(&server.addr().to_string()).await?;
    let probe = zk.clone();
    dlock_testkit::bounded::nothing_per_name_is_left(dlock_testkit::bounded::BoundedStore {
        holders: dlock::connect(&url(&server, "session_timeout=4s")).await?,
        upstream: server.addr(),
        url_via: Box::new(|addr| format!("zk://{addr}/t?session_timeout=4s")),
        names: 10_000,
        ttl: Duration::from_secs(2),
        queued: Box::new(move |name| {
            let zk = probe.clone();
            Box::pin(async move {
                let dir = format!("/t/{}", name.replace('/', "%2F"));
                Ok(match zk.list_children(&dir).await {
                    Ok(children) => children.len() >= 2,
                    Err(zookeeper_client::Error::NoNode) => false,
                    Err(e) => return Err(e.into()),
                })
            })
        }),
        left: Box::new(move || {
            let zk = zk.clone();
            Box::pin(async move {
                let dirs = match zk.list_children("/t").await {
                    Ok(children) => children,
                    Err(zookeeper_client::Error::NoNode) => Vec::new(),
                    Err(e) => return Err(e.into()),
                };
                Ok((dirs.len(), dirs.into_iter().take(5).collect()))
            })
        }),
        allowed: 0,
        settle: Duration::from_secs(90),
    })
    .await
}

#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_break_and_an_ended_session_say_why_the_hold_was_lost() {
    let Some(mut server) = server() else { return };
    let url = url(&server, "session_timeout=2s");
    let (a, b) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    // A break: the holder's watch sees its node deleted.
    let broken = a.mutex("broken").acquire().await.unwrap();
    assert!(b.force_release("broken").await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), broken.lost())
        .await
        .expect("the break was not signalled");
    assert_eq!(broken.lost_reason(), Some(dlock::LostReason::Broken));

    // A silent server: no request answered within two thirds of the session's timeout ends
    // the session here (the server may expire it at the timeout), for every hold on it.
    let fixed = a
        .mutex("session")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let watched = a.mutex("session-watchdog").acquire().await.unwrap();
    tokio::task::block_in_place(|| server.pause()).unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    tokio::task::block_in_place(|| server.resume()).unwrap();
    for held in [&fixed, &watched] {
        tokio::time::timeout(Duration::from_secs(10), held.lost())
            .await
            .expect("the ended session was not signalled");
        assert_eq!(
            held.lost_reason(),
            Some(dlock::LostReason::StoreUnreachable)
        );
    }
}

#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_session_signals_every_hold_on_it() {
    let Some(mut server) = server() else { return };
    let url = url(&server, "session_timeout=2s");
    let (a, b) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    let mut held: Vec<Box<dyn Hold>> = Vec::new();
    for i in 0..3 {
        held.push(Box::new(a.mutex(format!("w{i}")).acquire().await.unwrap()));
    }
    held.push(Box::new(
        a.mutex("fixed")
            .ttl(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap(),
    ));
    held.push(Box::new(a.semaphore("sem", 2).acquire().await.unwrap()));
    held.push(Box::new(a.rwlock("rw").read().await.unwrap()));
    // Silent past the session's timeout: the client gives the session up, then the server
    // expires it as it runs again.
    tokio::task::block_in_place(|| server.pause()).unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    tokio::task::block_in_place(|| server.resume()).unwrap();
    for hold in &held {
        tokio::time::timeout(Duration::from_secs(10), hold.lost())
            .await
            .expect("a hold of the lost session was not signalled");
        assert_eq!(
            hold.lost_reason(),
            Some(dlock::LostReason::StoreUnreachable)
        );
    }
    // Its nodes went with it: the locks are free.
    for name in ["w0", "w1", "w2", "fixed"] {
        let taken = b
            .mutex(name)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        taken.release().await.unwrap();
    }
}

/// The server's count of packets received (`mntr`).
fn packets_received(server: &ServerProcess) -> u64 {
    use std::io::{Read, Write};
    let mut socket = std::net::TcpStream::connect(server.addr()).unwrap();
    socket.write_all(b"mntr").unwrap();
    let mut text = String::new();
    socket.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("zk_packets_received\t"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no packet count in mntr's answer: {text}"))
}

/// The zxid of a new write: the difference of two is one more than the writes between them.
async fn next_zxid(zk: &Client) -> i64 {
    let (stat, _) = zk
        .create(
            "/zxid-",
            &[],
            &zookeeper_client::CreateMode::PersistentSequential
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap();
    stat.czxid
}

#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_renewals_send_nothing_to_the_store() {
    const HOLDS: usize = 50;
    const LEASE: Duration = Duration::from_millis(300);
    let Some(server) = server() else { return };
    let locks = dlock::connect(&url(&server, "session_timeout=6s"))
        .await
        .unwrap()
        .with_watchdog_lease(LEASE)
        .unwrap();
    let zk = Client::connect(&server.addr().to_string()).await.unwrap();
    let mut held = Vec::new();
    for i in 0..HOLDS {
        held.push(locks.mutex(format!("renewed/{i}")).acquire().await.unwrap());
    }
    // Past the setting of each hold's own watch.
    tokio::time::sleep(LEASE).await;
    let (zxid, packets) = (next_zxid(&zk).await, packets_received(&server));
    // Nine renewal passes (one every third of the lease).
    tokio::time::sleep(LEASE * 3).await;
    let (writes, sent) = (
        next_zxid(&zk).await - zxid - 1,
        packets_received(&server) - packets,
    );
    assert!(held.iter().all(|guard| !guard.is_lost()));
    assert_eq!(writes, 0, "renewals wrote to the store");
    // One call per hold per pass would be 450; the session's own heartbeat, the probes and
    // the counting connections are a handful.
    assert!(
        sent < HOLDS as u64,
        "{sent} packets reached the server in nine renewal passes of {HOLDS} holds"
    );
    for guard in held {
        guard.release().await.unwrap();
    }
}

/// On an ensemble another client sees every write answered before its read: a lock one client
/// just took is never inspected as free by another, nor a value it just wrote read as missing.
/// A ZooKeeper server answers reads from its own copy, which on a follower may not yet hold a
/// write another client's server already answered: each such read is preceded by a `sync`.
#[cfg_attr(
    dlock_test_missing = "zookeeper",
    ignore = "ZooKeeper not found: install zookeeper (scripts/test.sh does) or set DLOCK_TEST_ZOOKEEPER_JAR"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_an_ensemble_another_client_never_reads_a_lock_just_taken_as_free() {
    const TASKS: usize = 16;
    const ROUNDS: usize = 64;
    if !installed() {
        return;
    }
    let ensemble = tokio::task::block_in_place(ZookeeperEnsemble::start).unwrap();
    let url = format!("zk://{}/t", ensemble.connect_string());
    let stale = dlock_testkit::read_after_write::read_as_free(&url, TASKS, ROUNDS)
        .await
        .unwrap();
    assert_eq!(
        stale,
        0,
        "{stale} of {} locks read as free by another client right after they were taken",
        TASKS * ROUNDS
    );
}
