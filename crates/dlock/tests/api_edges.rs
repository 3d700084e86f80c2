#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

//! Small API promises a new user relies on: builders are `Clone`, and the library names the
//! CLI's embedded default store.

use std::time::Duration;

#[tokio::test]
async fn a_builder_is_clone_and_each_clone_acquires_on_its_own() {
    let locks = dlock::connect("memory://api-edges-clone").await.unwrap();
    let builder = locks.mutex("jobs/a").ttl(Duration::from_secs(5)).no_wait();
    let first = builder.clone().acquire().await.unwrap();
    assert!(builder.clone().try_acquire().await.unwrap().is_none());
    first.release().await.unwrap();
    builder.acquire().await.unwrap().release().await.unwrap();

    let permits = locks.semaphore("pool", 1);
    let held = permits.clone().acquire().await.unwrap();
    assert!(permits.try_acquire().await.unwrap().is_none());
    held.release().await.unwrap();
    let reading = locks.rwlock("table");
    let _r = reading.clone().read().await.unwrap();
    assert!(reading.try_write().await.unwrap().is_none());
    let both = locks.multi_lock(["x", "y"]);
    let _b = both.clone().acquire().await.unwrap();
    assert!(both.try_acquire().await.unwrap().is_none());
}

#[cfg(feature = "sqlite")]
#[test]
fn default_url_is_a_sqlite_file_created_on_first_use() {
    let url = dlock::default_url();
    assert!(url.starts_with("sqlite://"), "{url}");
    assert!(url.ends_with("dlock/locks.db?create_dirs=true"), "{url}");
}

#[tokio::test]
async fn the_lost_token_and_the_list_stream_are_named_by_dlock() {
    let locks = dlock::connect("memory://api-edges-names").await.unwrap();
    let guard = locks.mutex("a").acquire().await.unwrap();
    let lost: dlock::CancellationToken = guard.lost_token();
    let listed: dlock::LockStream = locks.list("");
    use futures::TryStreamExt;
    assert_eq!(listed.try_collect::<Vec<_>>().await.unwrap().len(), 1);
    guard.release().await.unwrap();
    assert!(lost.is_cancelled());
}

#[cfg(feature = "blocking")]
#[tokio::test]
async fn the_blocking_facade_inside_a_runtime_says_what_to_do_instead() {
    let error = dlock::blocking::Locks::connect("memory://api-edges-blocking").unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("cannot run inside an async runtime")
            && message.contains("spawn_blocking"),
        "{message}"
    );
}

/// Every blocking guard: `is_owned()` asks the store, and dropping the guard has released the
/// hold by the time `drop` returns, so another client's `try_*` succeeds at once.
#[cfg(feature = "blocking")]
fn blocking_guards_release_on_drop(url: &str) {
    use dlock::blocking::Locks;
    let (mine, theirs) = (Locks::connect(url).unwrap(), Locks::connect(url).unwrap());
    let ttl = Duration::from_secs(60);

    let guard = mine.mutex("b/mutex").ttl(ttl).acquire().unwrap();
    assert!(guard.is_owned().unwrap());
    drop(guard);
    assert!(theirs.mutex("b/mutex").try_acquire().unwrap().is_some());

    let reading = mine
        .rwlock("b/rw")
        .max_readers(4)
        .ttl(ttl)
        .wait(Duration::from_secs(5))
        .read()
        .unwrap();
    assert!(reading.is_owned().unwrap());
    let builder = theirs.rwlock("b/rw").max_readers(4).no_wait();
    assert!(builder.clone().try_write().unwrap().is_none());
    drop(reading);
    let writing = builder
        .clone()
        .try_write()
        .unwrap()
        .expect("write after the read's drop");
    assert!(writing.is_owned().unwrap());
    assert!(
        mine.rwlock("b/rw")
            .max_readers(4)
            .try_read()
            .unwrap()
            .is_none()
    );
    drop(writing);
    assert!(
        mine.rwlock("b/rw")
            .max_readers(4)
            .try_read()
            .unwrap()
            .is_some()
    );

    let permit = mine.semaphore("b/sem", 1).ttl(ttl).acquire().unwrap();
    assert!(permit.is_owned().unwrap());
    assert!(
        theirs
            .semaphore("b/sem", 1)
            .try_acquire()
            .unwrap()
            .is_none()
    );
    drop(permit);
    let permit = theirs.semaphore("b/sem", 1).try_acquire().unwrap();
    assert!(permit.expect("a permit after the drop").is_owned().unwrap());

    let both = mine
        .multi_lock(["b/x", "b/y"])
        .ttl(ttl)
        .max_hold(Duration::from_secs(600))
        .acquire()
        .unwrap();
    assert!(both.is_owned().unwrap());
    assert!(both.fence("b/y").is_some());
    assert!(theirs.mutex("b/y").try_acquire().unwrap().is_none());
    drop(both);
    assert!(
        theirs
            .multi_lock(["b/y", "b/x"])
            .try_acquire()
            .unwrap()
            .is_some()
    );

    // A broken hold is told by the store.
    let broken = mine.mutex("b/broken").ttl(ttl).acquire().unwrap();
    if mine.info().capabilities.monitor {
        assert!(theirs.force_release("b/broken").unwrap());
        assert!(!broken.is_owned().unwrap());
        assert!(broken.is_lost());
    }
}

#[cfg(all(feature = "blocking", feature = "sqlite"))]
#[test]
fn blocking_guards_release_on_drop_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("locks.db").display());
    blocking_guards_release_on_drop(&url);
}

#[cfg(all(feature = "blocking", feature = "redis"))]
#[cfg_attr(
    dlock_test_missing = "redis",
    ignore = "redis-server not found: install redis-server (scripts/test.sh does) or set DLOCK_TEST_REDIS_BIN"
)]
#[test]
fn blocking_guards_release_on_drop_on_redis() {
    use dlock_testkit::fixture::{Fixture, RedisFixture};
    let redis = dlock_testkit::require::present("redis", RedisFixture::start()).unwrap();
    blocking_guards_release_on_drop(&redis.url().unwrap());
}

/// A port nothing listens on (bound, then closed).
#[cfg(feature = "redis")]
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// What `anyhow`'s `{:#}` prints: every error of the `source()` chain, joined by `: `.
#[cfg(feature = "redis")]
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![error.to_string()];
    let mut next = error.source();
    while let Some(cause) = next {
        parts.push(cause.to_string());
        next = cause.source();
    }
    parts.join(": ")
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_store_error_reported_with_its_chain_names_each_cause_once() {
    let url = format!("redis://127.0.0.1:{}?connect_timeout=2s", closed_port());
    let error = dlock::connect(&url).await.unwrap_err();
    assert_eq!(error.backend(), Some("redis"));
    for shown in [chain(&error), format!("{:#}", anyhow::Error::from(error))] {
        assert_eq!(
            shown.matches("Connection refused").count(),
            1,
            "each cause once: {shown}"
        );
    }
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn a_redlock_error_names_redlock_and_every_node_with_its_error() {
    let ports = [closed_port(), closed_port(), closed_port()];
    let url = format!(
        "redlock://127.0.0.1:{},127.0.0.1:{},127.0.0.1:{}",
        ports[0], ports[1], ports[2]
    );
    let error = dlock::connect(&url).await.unwrap_err();
    assert_eq!(error.backend(), Some("redlock"), "{error}");
    let shown = chain(&error);
    assert!(shown.starts_with("redlock: "), "{shown}");
    for (i, port) in ports.iter().enumerate() {
        let node = format!("node {} (redis://127.0.0.1:{port}", i + 1);
        assert!(shown.contains(&node), "{node} missing: {shown}");
    }
    assert_eq!(
        shown.matches("refused").count(),
        3,
        "one error per node: {shown}"
    );
}

/// The lease keeper runs as a task on the runtime of the first registration. When that
/// runtime is dropped, holds taken from another runtime sharing the client must still be
/// renewed: a watchdog hold from the second runtime outlives several of its leases, and
/// nobody else gets the lock meanwhile.
#[test]
fn a_watchdog_hold_outlives_the_runtime_that_started_the_keeper() {
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let lease = Duration::from_millis(300);
    let (first, second) = (runtime(), runtime());
    let (locks, rival) = first.block_on(async {
        let locks = dlock::connect("memory://api-edges-keeper-runtimes")
            .await
            .unwrap()
            .with_watchdog_lease(lease)
            .unwrap();
        let rival = dlock::connect("memory://api-edges-keeper-runtimes")
            .await
            .unwrap();
        (locks, rival)
    });
    // A hold from the first runtime starts the keeper there.
    let early = first.block_on(locks.mutex("first").acquire()).unwrap();
    let held = second.block_on(locks.mutex("second").acquire()).unwrap();
    first.block_on(early.release()).unwrap();
    drop(first);
    second.block_on(async {
        tokio::time::sleep(lease * 5).await;
        assert!(
            !held.is_lost(),
            "the hold was given up: {:?}",
            held.lost_reason()
        );
        assert!(
            rival.mutex("second").try_acquire().await.unwrap().is_none(),
            "another client got the lock while its holder's watchdog should have renewed it: \
             renewals stopped with the runtime that started the keeper"
        );
        held.release().await.unwrap();
    });
}

/// Every kind of guard says why it was lost, through its own method and through `Hold`: a
/// fixed TTL that runs out is `Expired`, and a broken lock is `Broken`.
#[tokio::test]
async fn every_guard_says_why_it_was_lost() {
    use dlock::{Hold, LostReason};
    let locks = dlock::connect("memory://api-edges-lost-reason")
        .await
        .unwrap();
    let ttl = Duration::from_millis(150);
    let permit = locks.semaphore("pool", 2).ttl(ttl).acquire().await.unwrap();
    let read = locks.rwlock("table").ttl(ttl).read().await.unwrap();
    let write = locks.rwlock("other").ttl(ttl).write().await.unwrap();
    let multi = locks
        .multi_lock(["m/a", "m/b"])
        .ttl(ttl)
        .acquire()
        .await
        .unwrap();
    assert_eq!(permit.lost_reason(), None);
    assert_eq!(read.lost_reason(), None);
    assert_eq!(write.lost_reason(), None);
    assert_eq!(multi.lost_reason(), None);
    let holds: Vec<Box<dyn Hold>> = vec![
        Box::new(permit),
        Box::new(read),
        Box::new(write),
        Box::new(multi),
    ];
    for hold in &holds {
        tokio::time::timeout(Duration::from_secs(5), hold.lost())
            .await
            .unwrap_or_else(|_| panic!("{hold:?} was not lost"));
        assert_eq!(hold.lost_reason(), Some(LostReason::Expired), "{hold:?}");
        assert!(matches!(
            Hold::extend(hold, Duration::from_secs(5)).await,
            Err(dlock::Error::NotOwned { .. })
        ));
    }

    let permit = locks.semaphore("broken-pool", 1).acquire().await.unwrap();
    let slot = permit.slot().as_str().to_owned();
    locks.force_release(&slot).await.unwrap();
    assert_eq!(permit.lost_reason(), Some(LostReason::Broken));
    let multi = locks.multi_lock(["n/a", "n/b"]).acquire().await.unwrap();
    locks.force_release("n/b").await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), multi.lost())
        .await
        .unwrap();
    assert_eq!(multi.lost_reason(), Some(LostReason::Broken));
    assert_eq!(
        Hold::fence(&multi),
        multi.fences().map(|(_, f)| f).max().unwrap()
    );
}
