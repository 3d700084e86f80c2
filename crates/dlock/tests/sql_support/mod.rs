//! What the PostgreSQL and MySQL/MariaDB store tests share: starting a server, and the
//! scenarios that run alike on both, with the server-specific step (killing a session)
//! passed in.

use std::time::Duration;

use dlock::Error;
use dlock_testkit::server::{ServerKind, ServerProcess, find_binary, required};

/// A fresh server of `kind`. Never `None`: a binary (`binary`, pointed to by the environment
/// variable `env`) missing at run time fails the test, as the build found it or the test
/// would be ignored (`dlock_testkit::require`).
pub(crate) fn start_server<K: ServerKind>(
    kind: K,
    backend: &str,
    binary: &str,
    env: &str,
) -> Option<ServerProcess> {
    if find_binary(&kind).is_none() {
        assert!(
            !required(backend),
            "{binary} not found, but DLOCK_TEST_REQUIRE requires it"
        );
        // The build found it (or these tests are ignored): missing now fails rather than
        // passing (`dlock_testkit::require`).
        panic!(
            "{} (set {env})",
            dlock_testkit::require::missing_now(backend)
        );
    }
    Some(tokio::task::block_in_place(|| {
        ServerProcess::start(kind).unwrap_or_else(|e| panic!("{e}"))
    }))
}

/// A session lock on `url` (in session mode) is reported lost when `kill` ends the session
/// holding it, and the waiter behind it gets the lock with a higher fence.
pub(crate) async fn a_killed_session_fires_lost(url: &str, kill: impl AsyncFnOnce()) {
    let (a, b) = (
        dlock::connect(url).await.unwrap(),
        dlock::connect(url).await.unwrap(),
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
    kill().await;
    tokio::time::timeout(Duration::from_secs(5), held.lost())
        .await
        .expect("the lost signal did not fire after the session was killed");
    assert_eq!(held.lost_reason(), Some(dlock::LostReason::SessionEnded));
    let next = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter did not get the lock")
        .unwrap()
        .unwrap();
    assert!(next.fence() > held.fence());
    assert!(matches!(held.release().await, Err(Error::NotOwned { .. })));
    next.release().await.unwrap();
}

/// The lease table keeps no session state: when `kill_all` ends every client connection
/// (three times over), the pool replaces them and the lease goes on, as it would through a
/// pooler that recycles connections.
pub(crate) async fn a_lease_survives_killed_connections(url: &str, kill_all: impl AsyncFn()) {
    let a = dlock::connect(url)
        .await
        .unwrap()
        .with_watchdog_lease(Duration::from_secs(3))
        .unwrap();
    let held = a.mutex("jobs/pooled").acquire().await.unwrap();
    for _ in 0..3 {
        kill_all().await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(!held.is_lost(), "a lease was lost with its connection");
    let b = dlock::connect(url).await.unwrap();
    assert!(
        b.mutex("jobs/pooled")
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    held.release().await.unwrap();
}

/// A restart of `server` while a lease (on `lease_url`) and a session lock are held and
/// waited for: the session lock dies with its connection and goes to its waiter; the row of
/// the lease table does not, and goes to its waiter on release.
pub(crate) async fn a_restart_during_holds_and_waits(server: &mut ServerProcess, lease_url: &str) {
    let session_url = format!("{lease_url}?mode=session&check_interval=100ms");
    let lease = dlock::connect(lease_url)
        .await
        .unwrap()
        .with_watchdog_lease(Duration::from_secs(6))
        .unwrap();
    let session = dlock::connect(&session_url).await.unwrap();
    let lease_held = lease.mutex("restart/lease").acquire().await.unwrap();
    let session_held = session.mutex("restart/session").acquire().await.unwrap();
    let (lease_b, session_b) = (
        dlock::connect(lease_url).await.unwrap(),
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

/// A session lock whose connection drops with all the others (a restart of `server`) is
/// reported lost at once, not at its own next check, 20 minutes away here (`check_interval=1h`,
/// a 1 h TTL): the server frees the lock the moment the connection drops, so a holder that
/// learns of it later overlaps the next one. The client's watcher connection fails with the
/// others and wakes the holder. The bound below only keeps a broken build from hanging.
pub(crate) async fn a_restart_is_heard_at_once_by_session_holders(
    server: &mut ServerProcess,
    url: &str,
) {
    let session_url = format!("{url}?mode=session&check_interval=1h");
    let locks = dlock::connect(&session_url).await.unwrap();
    let held = locks
        .mutex("restart/heard")
        .ttl(Duration::from_secs(3600))
        .acquire()
        .await
        .unwrap();
    tokio::task::block_in_place(|| server.restart().unwrap());
    tokio::time::timeout(Duration::from_secs(60), held.lost())
        .await
        .expect("the holder was not told that the restart ended its session");
    let other = dlock::connect(&session_url).await.unwrap();
    let next = other
        .mutex("restart/heard")
        .try_acquire()
        .await
        .unwrap()
        .expect("the lock is free on the server after the restart");
    assert!(next.fence() > held.fence());
    assert!(matches!(held.release().await, Err(Error::NotOwned { .. })));
}

/// A session lock's `release()` on a hung server (paused with SIGSTOP) returns a clear
/// "unavailable" error naming the release and the time it waited, instead of hanging as long
/// as TCP would; after the server resumes, the lock is free again (the connection was closed).
pub(crate) async fn release_on_a_hung_server_is_bounded(server: &mut ServerProcess, url: &str) {
    let locks = dlock::connect(url).await.unwrap();
    let held = locks.mutex("jobs/hung").acquire().await.unwrap();
    tokio::task::block_in_place(|| server.pause()).unwrap();
    let released = tokio::time::timeout(Duration::from_secs(30), held.release()).await;
    tokio::task::block_in_place(|| server.resume()).unwrap();
    let error = released
        .expect("release() hung on a paused server")
        .expect_err("release() cannot be confirmed by a paused server");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("release") && text.contains("5s"), "{text}");
    let other = dlock::connect(url).await.unwrap();
    let next = other
        .mutex("jobs/hung")
        .wait(Duration::from_secs(20))
        .acquire()
        .await
        .expect("the lock stayed held after its connection was closed");
    next.release().await.unwrap();
}

/// How many distinct names the bounded-state tests use: 10,000, as on SQLite, etcd and
/// ZooKeeper (100,000 took PostgreSQL and MariaDB 10 minutes each, most of the suite's time,
/// and a leak per name shows at either count).
pub(crate) const BOUNDED_NAMES: usize = 10_000;

/// A future that says something about the store.
pub(crate) type Probe<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// Per-name state is bounded: `names` distinct names on the lease table at `url` (a server
/// at `upstream`), taken and released, held by a client that crashed, or waited for by a
/// client that crashed while queued (the workload of `dlock_testkit::bounded`), leave no rows
/// once their leases and the waiters' places have ended. `queued` says whether a name has a
/// waiter row, `rows` counts the lock and waiter rows. The fences of a name still rise after
/// its row is gone.
pub(crate) async fn nothing_per_name_is_left(
    url: &str,
    upstream: std::net::SocketAddr,
    names: usize,
    queued: impl Fn(String) -> Probe<bool> + Send + Sync + 'static,
    rows: impl Fn() -> Probe<(i64, i64)> + Send + Sync + 'static,
) {
    // The workload keeps 64 requests in flight on each client's pool of 20 connections: on
    // 2 loaded cores one can wait for a connection longer than the default 5 s (the pool's
    // wait is the connect timeout), which fails the request rather than the property.
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{separator}connect_timeout=60s");
    let url = url.as_str();
    let holders = dlock::connect(url).await.unwrap();
    let first = holders.mutex("bounded/1").acquire().await.unwrap();
    let first_fence = first.fence();
    first.release().await.unwrap();
    let (url_owned, at) = (url.to_owned(), upstream.to_string());
    dlock_testkit::bounded::nothing_per_name_is_left(dlock_testkit::bounded::BoundedStore {
        holders: holders.clone(),
        upstream,
        url_via: Box::new(move |proxy| url_owned.replace(&at, &proxy.to_string())),
        names,
        ttl: Duration::from_secs(2),
        queued: Box::new(move |name| {
            let queued = queued(name);
            Box::pin(async move { Ok(queued.await) })
        }),
        left: Box::new(move || {
            let rows = rows();
            Box::pin(async move {
                let (locks, queue) = rows.await;
                let left = usize::try_from(locks + queue).unwrap_or(usize::MAX);
                Ok((
                    left,
                    vec![format!("{locks} lock rows, {queue} waiter rows")],
                ))
            })
        }),
        // The sweepers delete ended rows within their interval (5 s, jittered); a row or two
        // of names in use by the check itself may remain.
        allowed: 2,
        settle: Duration::from_secs(120),
    })
    .await
    .unwrap();
    let again = holders
        .mutex("bounded/1")
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(
        again.fence() > first_fence,
        "fence {} after {first_fence}",
        again.fence()
    );
    again.release().await.unwrap();
}

/// Session mode's fences come from one counter row, however many names are used, and a table
/// of the older per-name layout is migrated: its counter starts above every fence it holds,
/// an older client's statement fails, and a missing counter row is refused with a clear
/// error that leaves no lock held. `exec` runs SQL as an administrator (`Err` with the
/// server's message), `count` reads one number; `old_ddl` creates the per-name layout of
/// the table `old_fences`.
pub(crate) async fn session_fences_are_one_row_and_migrate(
    url: &str,
    old_ddl: &str,
    exec: impl Fn(String) -> Probe<Result<(), String>>,
    count: impl Fn(String) -> Probe<i64>,
) {
    exec(old_ddl.to_owned()).await.unwrap();
    exec("INSERT INTO old_fences (name, fence) VALUES ('a', 41), ('b', 7)".into())
        .await
        .unwrap();
    let url = format!("{url}?mode=session&table=old_fences");
    let locks = dlock::connect(&url).await.unwrap();
    let b = locks.mutex("b").acquire().await.unwrap();
    assert!(
        b.fence().get() > 41,
        "after the migration, {} is not above every fence of the old table (41)",
        b.fence()
    );
    let mut last = b.fence().get();
    b.release().await.unwrap();
    // An older dlock, still running, can no longer count on its own row.
    let old_client = exec("INSERT INTO old_fences (name, fence) VALUES ('c', 1)".into()).await;
    assert!(
        old_client.is_err(),
        "an older client's statement still works"
    );
    for i in 0..1_000 {
        let guard = locks.mutex(format!("many/{i}")).acquire().await.unwrap();
        assert!(
            guard.fence().get() > last,
            "fence {} after {last}",
            guard.fence()
        );
        last = guard.fence().get();
        guard.release().await.unwrap();
    }
    let rows = count("SELECT COUNT(*) FROM old_fences".into()).await;
    assert_eq!(
        rows, 1,
        "{rows} rows for 1,002 names: the table grows with names"
    );
    // The counter row deleted by hand: refused, and nothing is held.
    exec("DELETE FROM old_fences".into()).await.unwrap();
    let error = locks.mutex("z").acquire().await.unwrap_err();
    assert!(
        matches!(error, dlock::Error::Backend { .. }) && error.to_string().contains("counter row"),
        "{error:?}"
    );
    exec("INSERT INTO old_fences (name, counter) VALUES ('', 100000)".into())
        .await
        .unwrap();
    let other = dlock::connect(&url).await.unwrap();
    let z = other.mutex("z").try_acquire().await.unwrap();
    let z = z.expect("the refused acquire left the lock held");
    assert!(z.fence().get() > 100_000, "{}", z.fence());
    z.release().await.unwrap();
}

/// A lease table of the older per-name-counter layout (column `fence`, rows kept) is migrated
/// on connect: every later fence, of an old name or a new one, is above every fence the table
/// held, and an older client's statement on the old column fails. `old_ddl` creates the table
/// `old_locks` and `seed` puts free rows with fences 41 (`a`) and 7 (`b`) in it.
pub(crate) async fn an_old_lease_table_is_migrated(
    url: &str,
    old_ddl: &str,
    seed: &str,
    exec: impl Fn(String) -> Probe<Result<(), String>>,
) {
    exec(old_ddl.to_owned()).await.unwrap();
    exec(seed.to_owned()).await.unwrap();
    let locks = dlock::connect(&format!("{url}?table=old_locks"))
        .await
        .unwrap();
    for name in ["b", "a", "new"] {
        let guard = locks.mutex(name).acquire().await.unwrap();
        assert!(
            guard.fence().get() > 41,
            "{name}: fence {} after the migration, not above the old table's 41",
            guard.fence()
        );
        guard.release().await.unwrap();
    }
    let old_client = exec("UPDATE old_locks SET fence = fence + 1 WHERE name = 'a'".into()).await;
    assert!(
        old_client.is_err(),
        "an older client's statement still works"
    );
}

/// A closure that runs SQL on the pool `$pool` as an administrator: `Err` with the server's
/// message (for the helpers above that take `exec`).
macro_rules! run_sql {
    ($pool:expr) => {{
        let pool = $pool.clone();
        move |sql: String| -> sql_support::Probe<Result<(), String>> {
            let pool = pool.clone();
            Box::pin(async move {
                sqlx::query(sqlx::AssertSqlSafe(sql))
                    .execute(&pool)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        }
    }};
}
pub(crate) use run_sql;

/// A closure that reads one number with SQL on the pool `$pool` (for `count`).
macro_rules! read_number {
    ($pool:expr) => {{
        let pool = $pool.clone();
        move |sql: String| -> sql_support::Probe<i64> {
            let pool = pool.clone();
            Box::pin(async move {
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
                    .fetch_one(&pool)
                    .await
                    .unwrap()
            })
        }
    }};
}
pub(crate) use read_number;

/// The lease keeper's renewals of one pass reach the server as one statement, and each
/// lease is answered alone: 40 watchdog holds (a 3 s lease: a pass every second; a shorter
/// lease is lost to a loaded CI machine's delays) with one broken by another client, `writes`
/// counting the server's writes over 4.5 s (about 200 one per renewal, a few per pass
/// gathered). The broken one alone is told.
pub(crate) async fn renewals_of_one_pass_are_one_statement(
    url: &str,
    writes: impl AsyncFn() -> u64,
) {
    let locks = dlock::connect(url)
        .await
        .unwrap()
        .with_watchdog_lease(Duration::from_secs(3))
        .unwrap();
    let mut guards = Vec::new();
    for i in 0..40 {
        guards.push(
            locks
                .mutex(format!("gathered/{i}"))
                .acquire()
                .await
                .unwrap(),
        );
    }
    let breaker = dlock::connect(url).await.unwrap();
    assert!(breaker.force_release("gathered/7").await.unwrap());
    let before = writes().await;
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let counted = writes().await - before;
    assert!(
        counted < 60,
        "{counted} writes for the renewals of 40 leases in 4.5 s: not gathered"
    );
    tokio::time::timeout(Duration::from_secs(5), guards[7].lost())
        .await
        .expect("the broken lock's guard was not told");
    for (i, guard) in guards.iter().enumerate() {
        assert!(
            i == 7 || !guard.is_lost(),
            "lock {i} was lost with the broken one ({:?})",
            guard.lost_reason()
        );
    }
}
