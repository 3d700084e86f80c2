#![cfg(feature = "mysql")]
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]
//! What is specific to MySQL/MariaDB, on real MariaDB servers started by the test kit: killed
//! sessions, server restarts, table creation and checks, permissions, names, URL options.

mod sql_support;

use std::time::Duration;

use dlock::Error;
use dlock_testkit::server::{Mariadb, ServerProcess};
use sqlx::MySqlPool;

/// A fresh server; a MariaDB missing now fails the test (`sql_support::start_server`).
fn server() -> Option<ServerProcess> {
    sql_support::start_server(
        Mariadb::default(),
        "mariadb",
        "mariadbd",
        "DLOCK_TEST_MARIADB_BIN",
    )
}

async fn admin(server: &ServerProcess) -> MySqlPool {
    // The bounded-state test probes 64 names at once while its workload keeps the server busy:
    // a probe waits for a connection as long as it takes (sqlx's 30 s default failed a loaded
    // run with PoolTimedOut), and enough connections serve the probes side by side.
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(16)
        .acquire_timeout(std::time::Duration::from_secs(600))
        .connect(&Mariadb::url(server))
        .await
        .unwrap()
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_fires_lost_and_the_next_waiter_gets_the_lock() {
    let Some(server) = server() else { return };
    let url = format!(
        "{}?mode=session&check_interval=100ms",
        Mariadb::url(&server)
    );
    let admin = admin(&server).await;
    sql_support::a_killed_session_fires_lost(&url, async || {
        let holder: Option<i64> = sqlx::query_scalar(
            "SELECT CAST(IS_USED_LOCK(CONCAT('dlock:', LEFT(SHA2(?, 256), 58))) AS SIGNED)",
        )
        .bind("jobs/killed")
        .fetch_one(&admin)
        .await
        .unwrap();
        let holder = holder.expect("nobody holds the server-side lock");
        sqlx::query(sqlx::AssertSqlSafe(format!("KILL {holder}")))
            .execute(&admin)
            .await
            .unwrap();
    })
    .await;
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_survives_its_connections_being_killed() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    sql_support::a_lease_survives_killed_connections(&Mariadb::url(&server), async || {
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT CAST(ID AS SIGNED) FROM information_schema.PROCESSLIST
             WHERE ID <> CONNECTION_ID() AND USER = 'root'",
        )
        .fetch_all(&admin)
        .await
        .unwrap();
        for id in ids {
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("KILL {id}")))
                .execute(&admin)
                .await;
        }
    })
    .await;
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_during_holds_and_waits() {
    let Some(mut server) = server() else { return };
    let url = Mariadb::url(&server);
    sql_support::a_restart_during_holds_and_waits(&mut server, &url).await;
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_table_is_created_and_a_foreign_one_refused() {
    let Some(server) = server() else { return };
    let base = Mariadb::url(&server);
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
        let exists: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.TABLES
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
        )
        .bind(table)
        .fetch_one(&admin)
        .await
        .unwrap();
        assert_eq!(exists, 1, "{table} was not created");
    }
    let exists: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.TABLES
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'fresh_locks_waiters'",
    )
    .fetch_one(&admin)
    .await
    .unwrap();
    assert_eq!(exists, 1, "the waiter queue was not created");
    // A foreign table where the waiter queue would go is refused too.
    sqlx::query("CREATE TABLE w_locks_waiters (id INT PRIMARY KEY, name TEXT)")
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
    sqlx::query("CREATE TABLE foreign_t (id INT PRIMARY KEY, name TEXT)")
        .execute(&admin)
        .await
        .unwrap();
    // Right columns, but a case-insensitive name column: refused too.
    sqlx::query("CREATE TABLE typed_t (name VARCHAR(100) PRIMARY KEY, fence BIGINT NOT NULL)")
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

/// Whether MySQL keeps a table name's case depends on the server (`lower_case_table_names`)
/// and dlock's shape checks compare names as written, so a table named with capitals is
/// refused at connect, naming the option, and nothing is created.
#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_name_with_capitals_is_refused_at_connect() {
    let Some(server) = server() else { return };
    let base = Mariadb::url(&server);
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
            dlock::mysql::Mode::Session
        } else {
            dlock::mysql::Mode::Lease
        };
        let built = dlock::mysql::MysqlBuilder::new(base.clone())
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
            "SELECT COUNT(*) FROM information_schema.TABLES
             WHERE TABLE_SCHEMA = DATABASE() AND LOWER(TABLE_NAME) LIKE CONCAT(LOWER(?), '%')",
        )
        .bind(table)
        .fetch_one(&admin)
        .await
        .unwrap();
        assert_eq!(left, 0, "{query}: a refused table name left a table behind");
    }
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_without_rights_get_typed_errors() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    for statement in [
        "CREATE DATABASE app",
        "CREATE USER 'nopriv'@'%'",
        "GRANT SELECT ON app.* TO 'nopriv'@'%'",
    ] {
        sqlx::query(statement).execute(&admin).await.unwrap();
    }
    let url = format!("mysql://nopriv@127.0.0.1:{}/app", server.port());
    let err = dlock::connect(&url).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    // A table it can read but not write: the first acquisition says so.
    dlock::connect(&format!("mysql://root@127.0.0.1:{}/app", server.port()))
        .await
        .unwrap();
    let read_only = dlock::connect(&url).await.unwrap();
    let err = read_only.mutex("x").no_wait().acquire().await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err:?}");
    let wrong = format!("mysql://root:wrong@127.0.0.1:{}/app", server.port());
    let err = dlock::connect(&wrong).await.unwrap_err();
    assert!(matches!(err, Error::Unauthenticated { .. }), "{err:?}");
    assert!(!format!("{err:?}").contains(":wrong@"));
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_differing_in_case_or_trailing_spaces_stay_distinct() {
    let Some(server) = server() else { return };
    for query in ["", "?mode=session"] {
        let locks = dlock::connect(&format!("{}{query}", Mariadb::url(&server)))
            .await
            .unwrap();
        let mut guards = Vec::new();
        for name in ["Report", "report", "report ", "REPORT", "repört"] {
            let guard = locks.mutex(name).try_acquire().await.unwrap();
            guards.push(guard.unwrap_or_else(|| panic!("{query}: {name:?} collided")));
        }
        for guard in guards {
            guard.release().await.unwrap();
        }
    }
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_unavailable() {
    let Some(mut server) = server() else { return };
    let url = format!("{}?connect_timeout=500ms", Mariadb::url(&server));
    let locks = dlock::connect(&url).await.unwrap();
    tokio::task::block_in_place(|| server.kill().unwrap());
    let err = locks.mutex("x").no_wait().acquire().await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    let err = dlock::connect(&url).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test]
async fn bad_url_options_are_invalid_urls() {
    for url in [
        "mysql://u:hunter2@127.0.0.1:1/db?mode=exclusive",
        "mariadb://u:hunter2@127.0.0.1:1/db?table=a-b",
        "mysql://u:hunter2@127.0.0.1:1/db?ssl-mode=maybe",
        "mysql://u:hunter2@127.0.0.1:1/db?colour=blue",
        "mysql://u:hunter2@127.0.0.1:1/db?poll_min=1s&poll_max=10ms",
        "mariadb://u:hunter2@127.0.0.1:1/db?max_connections=lots",
    ] {
        let err = dlock::connect(url).await.unwrap_err();
        assert!(matches!(err, Error::InvalidUrl { .. }), "{url}: {err:?}");
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
    }
}

/// The database clock in µs since the epoch, as the lease table keeps it.
const NOW_US: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// Puts an entry in the waiter queue of `name` as another client would, with arrival and
/// last refresh `since_s` / `seen_s` seconds from now.
async fn plant_waiter(admin: &MySqlPool, name: &str, token: &str, since_s: i64, seen_s: i64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO dlock_locks_waiters (name, token, since, seen)
         VALUES (?, ?, {NOW_US} + ? * 1000000, {NOW_US} + ? * 1000000)
         ON DUPLICATE KEY UPDATE since = VALUES(since), seen = VALUES(seen)"
    )))
    .bind(name)
    .bind(token)
    .bind(since_s)
    .bind(seen_s)
    .execute(admin)
    .await
    .unwrap();
}

async fn queued(admin: &MySqlPool, name: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM dlock_locks_waiters WHERE name = ?")
        .bind(name)
        .fetch_one(admin)
        .await
        .unwrap()
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiter_queue_decides_who_gets_a_free_lock() {
    let Some(server) = server() else { return };
    let locks = dlock::connect(&Mariadb::url(&server)).await.unwrap();
    let admin = admin(&server).await;
    let name = "queue/planted";
    let once = locks.mutex(name).acquire().await.unwrap();
    once.release().await.unwrap();
    // A live waiter (its next refresh far ahead) that has waited a second heads the queue.
    plant_waiter(&admin, name, "elsewhere", -1, 3600).await;
    let fair = locks.mutex(name).fair().try_acquire().await.unwrap();
    assert!(fair.is_none(), "a fair newcomer passed a queued waiter");
    let unfair = locks.mutex(name).try_acquire().await.unwrap();
    assert!(
        unfair.is_none(),
        "an unfair newcomer passed a waiter past the starvation threshold"
    );
    // A head that has only just arrived: unfair newcomers may still pass it, fair ones not.
    plant_waiter(&admin, name, "elsewhere", 3600, 3600).await;
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
    // A waiter that stopped refreshing is gone: it holds nobody back, and a grant to a
    // queued waiter sweeps it.
    plant_waiter(&admin, name, "elsewhere", -5, -2).await;
    let guard = locks.mutex(name).fair().try_acquire().await.unwrap();
    guard
        .expect("a stale waiter stalled the queue")
        .release()
        .await
        .unwrap();
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_leaves_the_queue_when_it_gives_up_or_gets_the_lock() {
    let Some(server) = server() else { return };
    let url = Mariadb::url(&server);
    let (a, b) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    let admin = admin(&server).await;
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
    // A waiter that gets the lock leaves too, and sweeps entries that went stale.
    plant_waiter(&admin, "queue/held", "dead", -5, -2).await;
    let waiter = tokio::spawn(async move {
        b.mutex("queue/held")
            .fair()
            .wait(Duration::from_secs(20))
            .acquire()
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        queued(&admin, "queue/held").await,
        2,
        "the waiter did not queue"
    );
    held.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert_eq!(queued(&admin, "queue/held").await, 0);
    next.release().await.unwrap();
}

async fn wait_until_unqueued(admin: &MySqlPool, name: &str) {
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
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_release_on_a_hung_server_returns_within_its_limit() {
    let Some(mut server) = server() else { return };
    let url = format!("{}?mode=session", Mariadb::url(&server));
    sql_support::release_on_a_hung_server_is_bounded(&mut server, &url).await;
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_per_name_is_left_once_leases_and_waiters_end() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    let probe = admin.clone();
    sql_support::nothing_per_name_is_left(
        &Mariadb::url(&server),
        server.addr(),
        sql_support::BOUNDED_NAMES,
        move |name| {
            let admin = probe.clone();
            Box::pin(async move {
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM dlock_locks_waiters WHERE name = ?)")
                    .bind(name.into_bytes())
                    .fetch_one(&admin)
                    .await
                    .unwrap()
            })
        },
        move || {
            let admin = admin.clone();
            Box::pin(async move {
                sqlx::query_as(
                    "SELECT (SELECT COUNT(*) FROM dlock_locks), (SELECT COUNT(*) FROM dlock_locks_waiters)",
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
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_is_heard_at_once_by_session_holders() {
    let Some(mut server) = server() else { return };
    let url = Mariadb::url(&server);
    sql_support::a_restart_is_heard_at_once_by_session_holders(&mut server, &url).await;
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_fences_are_one_row_and_an_old_table_is_migrated() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    sql_support::session_fences_are_one_row_and_migrate(
        &Mariadb::url(&server),
        "CREATE TABLE old_fences (name VARBINARY(512) NOT NULL PRIMARY KEY, fence BIGINT NOT NULL) ENGINE=InnoDB",
        sql_support::run_sql!(admin),
        sql_support::read_number!(admin),
    )
    .await;
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_lease_table_is_migrated_with_fences_above_its_own() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    sql_support::an_old_lease_table_is_migrated(
        &Mariadb::url(&server),
        "CREATE TABLE old_locks (name VARBINARY(512) NOT NULL PRIMARY KEY, fence BIGINT NOT NULL, token VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NULL, holds INT NOT NULL DEFAULT 0, expires_at BIGINT NOT NULL DEFAULT 0, acquired_at BIGINT NOT NULL DEFAULT 0, owner_label VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, host VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, pid BIGINT NULL) ENGINE=InnoDB",
        "INSERT INTO old_locks (name, fence) VALUES ('a', 41), ('b', 7)",
        sql_support::run_sql!(admin),
    )
    .await;
}

/// The doorbell of `name`'s queue head: its connection id and the id of the wait it is in,
/// once the waiter has queued with one that waits.
async fn waiting_bell(admin: &MySqlPool, name: &str) -> (i64, i64) {
    for _ in 0..200 {
        let bell: Option<(i64, i64)> = sqlx::query_as(
            "SELECT q.bell, CAST(p.QUERY_ID AS SIGNED) FROM dlock_locks_waiters q
             JOIN information_schema.PROCESSLIST p ON p.ID = q.bell
             WHERE q.name = ? AND p.INFO LIKE '%/* dlock bell */'",
        )
        .bind(name)
        .fetch_optional(admin)
        .await
        .unwrap();
        if let Some(bell) = bell {
            return bell;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no waiter of {name} queued with a waiting doorbell");
}

/// The query the connection `id` runs now, if any.
async fn running_query(admin: &MySqlPool, id: i64) -> Option<i64> {
    sqlx::query_scalar(
        "SELECT CAST(QUERY_ID AS SIGNED) FROM information_schema.PROCESSLIST
         WHERE ID = ? AND INFO IS NOT NULL",
    )
    .bind(id)
    .fetch_optional(admin)
    .await
    .unwrap()
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_rings_the_doorbell_of_a_waiter_in_another_client() {
    let Some(server) = server() else { return };
    let url = Mariadb::url(&server);
    let (a, b) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    let admin = admin(&server).await;
    let held = a
        .mutex("bell/rung")
        .ttl(Duration::from_secs(60))
        .acquire()
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        b.mutex("bell/rung")
            .wait(Duration::from_secs(20))
            .acquire()
            .await
    });
    let (bell, wait) = waiting_bell(&admin, "bell/rung").await;
    held.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    // Left alone, the wait lasts 30 s, and the waiter would have found the lock by polling
    // while it still ran: the release ended that very query.
    // (Between two waits the connection runs nothing for a moment.)
    let now = running_query(&admin, bell).await;
    assert!(
        now != Some(wait),
        "the doorbell's wait {wait} was not rung (connection {bell} now runs {now:?})"
    );
    next.release().await.unwrap();
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_queue_of_an_older_dlock_gets_the_doorbell_column() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    sqlx::query(
        "CREATE TABLE dlock_locks_waiters (
            name VARBINARY(512) NOT NULL, token VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
            since BIGINT NOT NULL, seen BIGINT NOT NULL, PRIMARY KEY (name, token)) ENGINE=InnoDB",
    )
    .execute(&admin)
    .await
    .unwrap();
    // An older client's entry, without a bell, that has waited past the starvation threshold.
    plant_waiter(&admin, "bell/old", "older", -1, 3600).await;
    let locks = dlock::connect(&Mariadb::url(&server)).await.unwrap();
    let bell: Option<i64> =
        sqlx::query_scalar("SELECT bell FROM dlock_locks_waiters WHERE token = 'older'")
            .fetch_one(&admin)
            .await
            .unwrap();
    assert_eq!(bell, None, "the older entry has no bell");
    // The queue works on as before: the older waiter still comes first.
    let passed = locks.mutex("bell/old").try_acquire().await.unwrap();
    assert!(
        passed.is_none(),
        "a newcomer passed the older client's waiter"
    );
}

/// A session lock lives as long as its connection: a fenced write goes over that connection,
/// and once the connection was killed (the lock freed) it is refused with nothing written,
/// before the hold's own periodic check has noticed.
#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_fenced_write_after_its_connection_was_killed_is_refused() {
    let Some(server) = server() else { return };
    let url = format!("{}?mode=session&check_interval=10m", Mariadb::url(&server));
    let admin = admin(&server).await;
    let locks = dlock::connect(&url).await.unwrap();
    let guard = locks
        .mutex("jobs/fenced-killed")
        .ttl(std::time::Duration::from_secs(600))
        .acquire()
        .await
        .unwrap();
    let state = locks.value("jobs/fenced-killed/state");
    let version = state.set_fenced(&guard, b"mine").await.unwrap();
    let holder: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(IS_USED_LOCK(CONCAT('dlock:', LEFT(SHA2(?, 256), 58))) AS SIGNED)",
    )
    .bind("jobs/fenced-killed")
    .fetch_one(&admin)
    .await
    .unwrap();
    let holder = holder.expect("nobody holds the server-side lock");
    sqlx::query(sqlx::AssertSqlSafe(format!("KILL {holder}")))
        .execute(&admin)
        .await
        .unwrap();
    let refused = state.set_fenced(&guard, b"late").await;
    assert!(
        matches!(refused, Err(dlock::Error::Lost { .. })),
        "{refused:?}"
    );
    let now = state.get().await.unwrap().unwrap();
    assert_eq!((now.version, now.value.as_slice()), (version, &b"mine"[..]));
}

/// A new name is never answered "busy": its free row may be swept (a loaded machine lets the
/// sweeper in between the row's creation and its grant) or taken and freed by another client
/// between the attempt's statements, and a request that does not wait looks again rather
/// than report a lock nobody held. Here an administrator deletes free rows as fast as it can.
#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_name_is_never_busy_while_its_free_row_is_swept() {
    let Some(server) = server() else { return };
    let locks = dlock::connect(&Mariadb::url(&server)).await.unwrap();
    let admin = admin(&server).await;
    // The table exists once the first grant created it.
    locks
        .mutex("swept/0")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let sweeper = tokio::spawn({
        let (admin, stop) = (admin.clone(), stop.clone());
        async move {
            let mut deleted = 0;
            while !stop.is_cancelled() {
                let done = sqlx::query("DELETE FROM dlock_locks WHERE token IS NULL")
                    .execute(&admin)
                    .await
                    .unwrap();
                deleted += done.rows_affected();
            }
            deleted
        }
    });
    let mut busy = Vec::new();
    for i in 1..=400 {
        let name = format!("swept/{i}");
        match locks.mutex(&name).try_acquire().await.unwrap() {
            Some(guard) => guard.release().await.unwrap(),
            None => busy.push(name),
        }
    }
    stop.cancel();
    let deleted = sweeper.await.unwrap();
    assert!(deleted > 0, "the sweeping loop deleted no free row");
    assert!(busy.is_empty(), "free names answered busy: {busy:?}");
}

#[cfg_attr(
    dlock_test_missing = "mariadb",
    ignore = "mariadbd not found: install mariadb-server (scripts/test.sh does) or set DLOCK_TEST_MARIADB_BIN"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_of_one_pass_are_one_statement() {
    let Some(server) = server() else { return };
    let admin = admin(&server).await;
    // The UPDATE statements the server ran, every client's.
    let writes = async || -> u64 {
        let (_, count): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Com_update'")
            .fetch_one(&admin)
            .await
            .unwrap();
        count.parse().unwrap()
    };
    sql_support::renewals_of_one_pass_are_one_statement(&Mariadb::url(&server), writes).await;
}
