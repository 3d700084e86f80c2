#![cfg(feature = "postgres")]
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! What is specific to PostgreSQL, on real servers started by the test kit: killed sessions,
//! server restarts, table creation and checks, permissions, URL options.

use std::time::Duration;

use dlock::Error;
use dlock_testkit::server::{Postgres, ServerProcess, find_binary, required};
use sqlx::PgPool;

/// A fresh server, or `None` (skip) when PostgreSQL is not installed and not required.
fn server() -> Option<ServerProcess> {
    if find_binary(&Postgres::default()).is_none() {
        assert!(
            !required("postgres"),
            "postgres not found, but DLOCK_TEST_REQUIRE requires it"
        );
        eprintln!("skipping: postgres not found (set DLOCK_TEST_POSTGRES_BIN)");
        return None;
    }
    Some(tokio::task::block_in_place(|| {
        ServerProcess::start(Postgres::default()).unwrap_or_else(|e| panic!("{e}"))
    }))
}

async fn admin(server: &ServerProcess) -> PgPool {
    PgPool::connect(&Postgres::url(server)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_fires_lost_and_the_next_waiter_gets_the_lock() {
    let Some(server) = server() else { return };
    let url = format!(
        "{}?mode=session&check_interval=100ms",
        Postgres::url(&server)
    );
    let (a, b) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    let held = a.mutex("jobs/killed").acquire().await.unwrap();
    let waiter = tokio::spawn(async move {
        b.mutex("jobs/killed")
            .wait(Duration::from_secs(20))
            .acquire()
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished());
    let admin = admin(&server).await;
    // The holder's backend is the one with a granted advisory lock.
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_locks
         WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()",
    )
    .fetch_all(&admin)
    .await
    .unwrap();
    assert_eq!(killed, [true]);
    tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .expect("the lost signal did not fire after pg_terminate_backend");
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter did not get the lock")
        .unwrap()
        .unwrap();
    assert!(next.fence() > held.fence());
    assert!(matches!(held.release().await, Err(Error::NotOwned { .. })));
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_survives_its_connections_being_killed() {
    // The lease table keeps no session state: a killed connection is replaced by the pool
    // and the lease goes on, as it would through a pooler that recycles connections.
    let Some(server) = server() else { return };
    let url = Postgres::url(&server);
    let a = dlock::connect(&url)
        .await
        .unwrap()
        .with_watchdog_lease(Duration::from_millis(900))
        .unwrap();
    let held = a.mutex("jobs/pooled").acquire().await.unwrap();
    let admin = admin(&server).await;
    for _ in 0..3 {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
        .execute(&admin)
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(!held.is_lost(), "a lease was lost with its connection");
    let b = dlock::connect(&url).await.unwrap();
    assert!(
        b.mutex("jobs/pooled")
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_during_holds_and_waits() {
    let Some(mut server) = server() else { return };
    let lease_url = Postgres::url(&server);
    let session_url = format!("{lease_url}?mode=session&check_interval=100ms");
    let lease = dlock::connect(&lease_url)
        .await
        .unwrap()
        .with_watchdog_lease(Duration::from_secs(6))
        .unwrap();
    let session = dlock::connect(&session_url).await.unwrap();
    let lease_held = lease.mutex("restart/lease").acquire().await.unwrap();
    let session_held = session.mutex("restart/session").acquire().await.unwrap();
    let (lease_b, session_b) = (
        dlock::connect(&lease_url).await.unwrap(),
        dlock::connect(&session_url).await.unwrap(),
    );
    let lease_waiter = tokio::spawn(async move {
        lease_b
            .mutex("restart/lease")
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    let session_waiter = tokio::spawn(async move {
        session_b
            .mutex("restart/session")
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    tokio::task::block_in_place(|| server.restart().unwrap());
    // The session lock died with its connection; the row of the lease table did not.
    tokio::time::timeout(Duration::from_secs(5), session_held.lost())
        .await
        .expect("the session lock was not reported lost after the restart");
    let session_next = tokio::time::timeout(Duration::from_secs(20), session_waiter)
        .await
        .expect("the session waiter did not get the lock after the restart")
        .unwrap()
        .unwrap();
    assert!(session_next.fence() > session_held.fence());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !lease_held.is_lost(),
        "the lease was lost over a short restart"
    );
    assert!(!lease_waiter.is_finished(), "the waiter took a held lease");
    let lease_fence = lease_held.fence();
    lease_held.release().await.unwrap();
    let lease_next = tokio::time::timeout(Duration::from_secs(5), lease_waiter)
        .await
        .expect("the lease waiter was not woken after the release")
        .unwrap()
        .unwrap();
    assert!(lease_next.fence() > lease_fence);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_created_and_a_foreign_one_refused() {
    let Some(server) = server() else { return };
    let base = Postgres::url(&server);
    let admin = admin(&server).await;
    for (query, table) in [
        ("?table=fresh_locks", "fresh_locks"),
        ("?mode=session&table=fresh_fences", "fresh_fences"),
    ] {
        let locks = dlock::connect(&format!("{base}{query}")).await.unwrap();
        locks
            .mutex("x")
            .acquire()
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
            .bind(table)
            .fetch_one(&admin)
            .await
            .unwrap();
        assert!(exists, "{table} was not created");
    }
    sqlx::query("CREATE TABLE foreign_t (id int PRIMARY KEY, name text)")
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE typed_t (name text PRIMARY KEY, fence text)")
        .execute(&admin)
        .await
        .unwrap();
    for query in [
        "?table=foreign_t",
        "?mode=session&table=foreign_t",
        "?mode=session&table=typed_t",
    ] {
        let err = dlock::connect(&format!("{base}{query}")).await.unwrap_err();
        assert!(
            matches!(err, Error::WrongType { ref key, .. } if key.ends_with("_t")),
            "{query}: {err:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_without_rights_get_typed_errors() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    // PostgreSQL 15 no longer lets every user create tables in `public`.
    sqlx::query("CREATE ROLE nopriv LOGIN")
        .execute(&admin)
        .await
        .unwrap();
    sqlx::query("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        .execute(&admin)
        .await
        .unwrap();
    let url = format!("postgres://nopriv@127.0.0.1:{}/postgres", server.port());
    let err = dlock::connect(&url).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    // A table it can read but not write: the first acquisition says so.
    dlock::connect(&Postgres::url(&server)).await.unwrap();
    sqlx::query("GRANT SELECT ON dlock_locks TO nopriv")
        .execute(&admin)
        .await
        .unwrap();
    let read_only = dlock::connect(&url).await.unwrap();
    let err = read_only.mutex("x").no_wait().acquire().await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    let unknown = format!("postgres://nobody@127.0.0.1:{}/postgres", server.port());
    let err = dlock::connect(&unknown).await.unwrap_err();
    assert!(matches!(err, Error::Unauthenticated { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_unavailable() {
    let Some(mut server) = server() else { return };
    let url = format!("{}?connect_timeout=500ms", Postgres::url(&server));
    let locks = dlock::connect(&url).await.unwrap();
    tokio::task::block_in_place(|| server.kill().unwrap());
    let err = locks.mutex("x").no_wait().acquire().await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_retryable());
    let err = dlock::connect(&url).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
}

#[tokio::test]
async fn bad_url_options_are_invalid_urls() {
    for url in [
        "postgres://u:hunter2@127.0.0.1:1/db?mode=exclusive",
        "postgres://u:hunter2@127.0.0.1:1/db?table=locks;drop",
        "postgres://u:hunter2@127.0.0.1:1/db?poll_max=1s",
        "postgres://u:hunter2@127.0.0.1:1/db?sslmode=maybe",
        "postgres://u:hunter2@127.0.0.1:1/db?colour=blue",
        "postgresql://u:hunter2@127.0.0.1:1/db?connect_timeout=0s",
    ] {
        let err = dlock::connect(url).await.unwrap_err();
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    }
}
