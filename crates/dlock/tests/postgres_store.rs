#![cfg(feature = "postgres")]
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! What is specific to PostgreSQL, on real servers started by the test kit: killed sessions,
//! server restarts, table creation and checks, permissions, URL options.

mod sql_support;

use std::time::Duration;

use dlock::Error;
use dlock_testkit::server::{Postgres, ServerProcess};
use sqlx::PgPool;

/// A fresh server; a PostgreSQL missing now fails the test (`sql_support::start_server`).
fn server() -> Option<ServerProcess> {
    sql_support::start_server(
        Postgres::default(),
        "postgres",
        "postgres",
        "DLOCK_TEST_POSTGRES_BIN",
    )
}

async fn admin(server: &ServerProcess) -> PgPool {
    // The bounded-state test probes 64 names at once while its workload keeps the server busy:
    // a probe waits for a connection as long as it takes (sqlx's 30 s default failed a loaded
    // run with PoolTimedOut), and enough connections serve the probes side by side.
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(std::time::Duration::from_secs(600))
        .connect(&Postgres::url(server))
        .await
        .unwrap()
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_fires_lost_and_the_next_waiter_gets_the_lock() {
    let Some(server) = server() else { return };
    let url = format!(
        "{}?mode=session&check_interval=100ms",
        Postgres::url(&server)
    );
    let admin = admin(&server).await;
    sql_support::a_killed_session_fires_lost(&url, async || {
        // The holder's backend is the one with a granted advisory lock.
        let killed: Vec<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_locks
             WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()",
        )
        .fetch_all(&admin)
        .await
        .unwrap();
        assert_eq!(killed, [true]);
    })
    .await;
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_survives_its_connections_being_killed() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    sql_support::a_lease_survives_killed_connections(&Postgres::url(&server), async || {
        sqlx::query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        )
        .execute(&admin)
        .await
        .unwrap();
    })
    .await;
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_during_holds_and_waits() {
    let Some(mut server) = server() else { return };
    let url = Postgres::url(&server);
    sql_support::a_restart_during_holds_and_waits(&mut server, &url).await;
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
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
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('fresh_locks_waiters') IS NOT NULL")
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(exists, "the waiter queue was not created");
    // A foreign table where the waiter queue would go is refused too.
    sqlx::query("CREATE TABLE w_locks_waiters (id int PRIMARY KEY, name text)")
        .execute(&admin)
        .await
        .unwrap();
    let err = dlock::connect(&format!("{base}?table=w_locks"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::WrongType { ref key, .. } if key == "w_locks_waiters"),
        "{err:?}"
    );
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

/// A session-mode wait sets `lock_timeout` for its slice; the connection it waited on goes
/// back to the pool, and the next statement run on it (here a value write, which waits for
/// a row lock) must not inherit that timeout: a pooled connection comes back clean.
#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_wait_leaves_no_lock_timeout_on_its_pooled_connection() {
    let Some(server) = server() else { return };
    let base = Postgres::url(&server);
    let admin = admin(&server).await;
    // One connection, so the value write runs on the connection the wait used.
    let locks = dlock::connect(&format!("{base}?mode=session&max_connections=1"))
        .await
        .unwrap();
    let rival = dlock::connect(&format!("{base}?mode=session"))
        .await
        .unwrap();
    let counter = locks.value("counter");
    counter.set(b"0").await.unwrap();
    let held = rival.mutex("busy").acquire().await.unwrap();
    let waited = locks
        .mutex("busy")
        .wait(Duration::from_millis(300))
        .acquire()
        .await;
    assert!(
        matches!(waited, Err(Error::Timeout { .. })),
        "{:?}",
        waited.map(|_| "acquired")
    );
    // A row lock on the value, held well past the wait's slice.
    let mut blocker = admin.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM dlock_fences_values WHERE name = 'counter' FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let write = tokio::spawn(async move { counter.set(b"1").await });
    tokio::time::sleep(Duration::from_millis(1500)).await;
    blocker.commit().await.unwrap();
    let written = write.await.unwrap();
    assert!(
        written.is_ok(),
        "a value write after a session wait failed on the wait's lock_timeout: {written:?}"
    );
    held.release().await.unwrap();
}

/// A grant draws its fence from session mode's one counter row after the advisory lock is
/// taken; a transaction elsewhere holding that row must not hang the acquire (it did, for as
/// long as the row was held): the statement is bounded, the grant fails as unavailable, and
/// closing its connection frees the advisory lock it had taken.
#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_grant_whose_fence_row_is_held_elsewhere_fails_instead_of_hanging() {
    let Some(server) = server() else { return };
    let base = Postgres::url(&server);
    let admin = admin(&server).await;
    let locks = dlock::connect(&format!("{base}?mode=session"))
        .await
        .unwrap();
    let mut blocker = admin.begin().await.unwrap();
    sqlx::query("SELECT counter FROM dlock_fences WHERE name = '' FOR UPDATE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let acquired = tokio::time::timeout(
        Duration::from_secs(60),
        locks.mutex("fence-row").no_wait().acquire(),
    )
    .await
    .expect("the acquire hung while the fence counter row was held elsewhere");
    assert!(
        matches!(acquired, Err(Error::Unavailable { .. })),
        "{:?}",
        acquired.map(|_| "acquired")
    );
    blocker.commit().await.unwrap();
    // Nothing was left held: the next client takes the lock at once.
    let next = dlock::connect(&format!("{base}?mode=session"))
        .await
        .unwrap()
        .mutex("fence-row")
        .no_wait()
        .acquire()
        .await
        .unwrap();
    next.release().await.unwrap();
}

/// PostgreSQL folds unquoted names to lowercase, so a table named with capitals would be
/// created under one name and looked up under another: such a name is refused at connect,
/// naming the option, and nothing is created.
#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_name_with_capitals_is_refused_at_connect() {
    let Some(server) = server() else { return };
    let base = Postgres::url(&server);
    let admin = admin(&server).await;
    for (query, table) in [
        ("?table=MyLocks", "MyLocks"),
        ("?mode=session&table=Fences", "Fences"),
    ] {
        let result = dlock::connect(&format!("{base}{query}")).await;
        assert!(
            matches!(result, Err(Error::InvalidUrl { ref reason, .. }) if reason.contains("table")),
            "{query}: expected InvalidUrl naming `table`, got {:?}",
            result.map(|_| "a client")
        );
        let mode = if query.contains("session") {
            dlock::postgres::Mode::Session
        } else {
            dlock::postgres::Mode::Lease
        };
        let built = dlock::postgres::PostgresBuilder::new(base.clone())
            .mode(mode)
            .table(table)
            .build()
            .await;
        assert!(
            matches!(built, Err(Error::InvalidArgument { what: "table", .. })),
            "builder table {table:?}: expected InvalidArgument for `table`, got {:?}",
            built.map(|_| "a backend")
        );
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_class WHERE lower(relname) LIKE lower($1) || '%'",
        )
        .bind(table)
        .fetch_one(&admin)
        .await
        .unwrap();
        assert_eq!(left, 0, "{query}: a refused table name left a table behind");
    }
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
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
    sqlx::query("GRANT SELECT ON dlock_locks, dlock_locks_waiters TO nopriv")
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

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
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

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
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

/// Puts an entry in the waiter queue of `name` as another client would, with arrival and
/// last refresh `since_s` / `seen_s` seconds from now.
async fn plant_waiter(admin: &PgPool, name: &str, token: &str, since_s: f64, seen_s: f64) {
    sqlx::query(
        "INSERT INTO dlock_locks_waiters (name, token, since, seen)
         VALUES ($1, $2, now() + $3 * interval '1 second', now() + $4 * interval '1 second')
         ON CONFLICT (name, token) DO UPDATE SET since = EXCLUDED.since, seen = EXCLUDED.seen",
    )
    .bind(name)
    .bind(token)
    .bind(since_s)
    .bind(seen_s)
    .execute(admin)
    .await
    .unwrap();
}

async fn queued(admin: &PgPool, name: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM dlock_locks_waiters WHERE name = $1")
        .bind(name)
        .fetch_one(admin)
        .await
        .unwrap()
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiter_queue_decides_who_gets_a_free_lock() {
    let Some(server) = server() else { return };
    let locks = dlock::connect(&Postgres::url(&server)).await.unwrap();
    let admin = admin(&server).await;
    let name = "queue/planted";
    let once = locks.mutex(name).acquire().await.unwrap();
    once.release().await.unwrap();
    // A live waiter (its next refresh far ahead) that has waited a second heads the queue.
    plant_waiter(&admin, name, "elsewhere", -1.0, 3600.0).await;
    let fair = locks.mutex(name).fair().try_acquire().await.unwrap();
    assert!(fair.is_none(), "a fair newcomer passed a queued waiter");
    let unfair = locks.mutex(name).try_acquire().await.unwrap();
    assert!(
        unfair.is_none(),
        "an unfair newcomer passed a waiter past the starvation threshold"
    );
    // A head that has only just arrived: unfair newcomers may still pass it, fair ones not.
    plant_waiter(&admin, name, "elsewhere", 3600.0, 3600.0).await;
    assert!(
        locks
            .mutex(name)
            .fair()
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    let passed = locks.mutex(name).try_acquire().await.unwrap();
    passed
        .expect("an unfair newcomer waited behind a fresh waiter")
        .release()
        .await
        .unwrap();
    // A waiter that stopped refreshing is gone: it holds nobody back, and a grant sweeps it.
    plant_waiter(&admin, name, "elsewhere", -5.0, -2.0).await;
    let guard = locks.mutex(name).fair().try_acquire().await.unwrap();
    guard
        .expect("a stale waiter stalled the queue")
        .release()
        .await
        .unwrap();
    assert_eq!(
        queued(&admin, name).await,
        0,
        "the grant did not sweep the stale entry"
    );
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_leaves_the_queue_and_notifies() {
    let Some(server) = server() else { return };
    let url = Postgres::url(&server);
    let (a, b) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    let admin = admin(&server).await;
    // Held: the waiter times out, and its entry is gone right after.
    let held = a.mutex("queue/held").acquire().await.unwrap();
    let err = b
        .mutex("queue/held")
        .fair()
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    wait_until_unqueued(&admin, "queue/held").await;
    held.release().await.unwrap();
    // Free, but a live planted waiter comes first: one leaving behind it tells the others
    // the lock is free (it may have been the head they deferred to).
    let once = a.mutex("queue/free").acquire().await.unwrap();
    once.release().await.unwrap();
    plant_waiter(&admin, "queue/free", "elsewhere", -1.0, 3600.0).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&admin)
        .await
        .unwrap();
    listener.listen("dlock_locks").await.unwrap();
    let err = b
        .mutex("queue/free")
        .fair()
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err:?}");
    let heard = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("no NOTIFY after a waiter left the queue of a free lock")
        .unwrap();
    assert_eq!(heard.payload(), "queue/free");
    assert_eq!(
        queued(&admin, "queue/free").await,
        1,
        "only the planted waiter is left"
    );
}

async fn wait_until_unqueued(admin: &PgPool, name: &str) {
    // The leave runs in a task of its own once the call returns; a stale entry would stay.
    for _ in 0..100 {
        if queued(admin, name).await == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the waiter's entry is still queued");
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_release_on_a_hung_server_returns_within_its_limit() {
    let Some(mut server) = server() else { return };
    let url = format!("{}?mode=session", Postgres::url(&server));
    sql_support::release_on_a_hung_server_is_bounded(&mut server, &url).await;
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_per_name_is_left_once_leases_and_waiters_end() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    let probe = admin.clone();
    sql_support::nothing_per_name_is_left(
        &Postgres::url(&server),
        server.addr(),
        sql_support::BOUNDED_NAMES,
        move |name| {
            let admin = probe.clone();
            Box::pin(async move {
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM dlock_locks_waiters WHERE name = $1)")
                    .bind(name)
                    .fetch_one(&admin)
                    .await
                    .unwrap()
            })
        },
        move || {
            let admin = admin.clone();
            Box::pin(async move {
                sqlx::query_as(
                    "SELECT (SELECT count(*) FROM dlock_locks), (SELECT count(*) FROM dlock_locks_waiters)",
                )
                .fetch_one(&admin)
                .await
                .unwrap()
            })
        },
    )
    .await;
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_is_heard_at_once_by_session_holders() {
    let Some(mut server) = server() else { return };
    let url = Postgres::url(&server);
    sql_support::a_restart_is_heard_at_once_by_session_holders(&mut server, &url).await;
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_fences_are_one_row_and_an_old_table_is_migrated() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    sql_support::session_fences_are_one_row_and_migrate(
        &Postgres::url(&server),
        r#"CREATE TABLE old_fences (name text COLLATE "C" PRIMARY KEY, fence bigint NOT NULL)"#,
        sql_support::run_sql!(admin),
        sql_support::read_number!(admin),
    )
    .await;
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_lease_table_is_migrated_with_fences_above_its_own() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    sql_support::an_old_lease_table_is_migrated(
        &Postgres::url(&server),
        r#"CREATE TABLE old_locks (name text COLLATE "C" PRIMARY KEY, fence bigint NOT NULL, token text, holds integer NOT NULL DEFAULT 0, expires_at timestamptz NOT NULL, acquired_at timestamptz NOT NULL, owner_label text, host text, pid bigint)"#,
        "INSERT INTO old_locks (name, fence, expires_at, acquired_at) VALUES ('a', 41, now(), now()), ('b', 7, now(), now())",
        sql_support::run_sql!(admin),
    )
    .await;
}

/// Session mode inspects what the server shows: the holder (from its connection's tag), the
/// waiters (ungranted entries of the same key), and a foreign holder of the key without a tag;
/// breaking ends the holder's connection, and its client is told.
#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_locks_are_inspected_and_broken_through_the_server() {
    let Some(server) = server() else { return };
    let url = format!(
        "{}?mode=session&check_interval=100ms",
        Postgres::url(&server)
    );
    let holder = dlock::connect(&url)
        .await
        .unwrap()
        .with_label("nightly")
        .unwrap();
    let observer = dlock::connect(&url).await.unwrap();
    let guard = holder.mutex("report").acquire().await.unwrap();
    let waiter = dlock::connect(&url).await.unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .mutex("report")
            .wait(Duration::from_secs(30))
            .acquire()
            .await
    });
    let mut info = observer.inspect("report").await.unwrap().unwrap();
    for _ in 0..100 {
        if info.waiters == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        info = observer.inspect("report").await.unwrap().unwrap();
    }
    assert_eq!(info.waiters, Some(1), "{info:?}");
    assert_eq!(info.fence, guard.fence());
    assert_eq!(info.owner.label.as_deref(), Some("nightly"));
    assert_eq!(info.owner.pid, std::process::id());
    assert_eq!(info.ttl_left, None);
    assert!(observer.inspect("other").await.unwrap().is_none());
    let listed: Result<Vec<_>, _> = futures::TryStreamExt::try_collect(observer.list("")).await;
    assert!(
        matches!(listed, Err(Error::Unsupported { .. })),
        "{listed:?}"
    );

    // Broken: the holder's connection ends, its client is told, the waiter gets the lock.
    assert!(observer.force_release("report").await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the broken holder was not told");
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(next.fence() > info.fence);
    let shown = observer.inspect("report").await.unwrap().unwrap();
    assert_eq!((shown.fence, shown.waiters), (next.fence(), Some(0)));
    next.release().await.unwrap();

    // A holder of the same key that is not dlock's is shown as such.
    let admin = admin(&server).await;
    let mut foreign = admin.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(hashtextextended('report', $1))")
        .bind(0x64_6c_6f_63_6b_i64)
        .execute(&mut *foreign)
        .await
        .unwrap();
    let shown = observer.inspect("report").await.unwrap().unwrap();
    assert_eq!(shown.owner.label.as_deref(), Some("not a dlock holder"));
}

#[cfg_attr(
    dlock_test_missing = "postgres",
    ignore = "PostgreSQL not found: install postgresql (scripts/test.sh does) or set DLOCK_TEST_POSTGRES_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_one_pass_are_one_statement() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    // Each writing transaction takes a transaction id (the probe's own takes one too).
    let writes = async || -> u64 {
        let id: String = sqlx::query_scalar("SELECT pg_current_xact_id()::text")
            .fetch_one(&admin)
            .await
            .unwrap();
        id.parse().unwrap()
    };
    sql_support::renewals_of_one_pass_are_one_statement(&Postgres::url(&server), writes).await;
}
