#![allow(clippy::expect_used, clippy::unwrap_used)]

//! Regression tests for bugs the safety suite found that its CI trials do not cover (the
//! others: `safety.rs`, `redlock::server_restart` and `zookeeper::server_sigstop`).

use std::time::Duration;

use dlock_testkit::fixture::{Fixture, MysqlFixture, PostgresFixture};

/// A session lock waits inside the server; its client-kept TTL must count from the grant,
/// not from before the wait, or a lock granted after a wait longer than its TTL is lost on
/// arrival.
async fn session_lock_granted_after_a_long_wait_is_held(fixture: &dyn Fixture) {
    let name = format!("regression/{}", uuid::Uuid::new_v4().simple());
    let (first, second) = (
        fixture.connect().await.unwrap(),
        fixture.connect().await.unwrap(),
    );
    let held = first
        .mutex(name.clone())
        .ttl(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let name = name.clone();
        async move {
            second
                .mutex(name)
                .ttl(Duration::from_millis(500))
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        }
    });
    // Longer than the waiter's TTL.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    held.release().await.unwrap();
    let granted = waiter.await.unwrap().unwrap();
    assert!(!granted.is_lost(), "{}: lost on arrival", fixture.backend());
    assert!(granted.is_owned().await.unwrap(), "{}", fixture.backend());
    granted.release().await.unwrap();
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread")]
async fn postgres_session_lock_granted_after_a_long_wait_is_held() {
    let fixtures = PostgresFixture::start_both().unwrap();
    // The build found the server (or this test is ignored): none now fails, not passes.
    assert!(
        !fixtures.is_empty(),
        "{}",
        dlock_testkit::require::missing_now("postgres")
    );
    for fixture in fixtures {
        if fixture.backend().ends_with("session") {
            session_lock_granted_after_a_long_wait_is_held(&*fixture).await;
        }
    }
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread")]
async fn mariadb_session_lock_granted_after_a_long_wait_is_held() {
    let fixtures = MysqlFixture::start_both().unwrap();
    // The build found the server (or this test is ignored): none now fails, not passes.
    assert!(
        !fixtures.is_empty(),
        "{}",
        dlock_testkit::require::missing_now("mariadb")
    );
    for fixture in fixtures {
        if fixture.backend().ends_with("session") {
            session_lock_granted_after_a_long_wait_is_held(&*fixture).await;
        }
    }
}
