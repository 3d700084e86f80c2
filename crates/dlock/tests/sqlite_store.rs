#![allow(clippy::expect_used, clippy::unwrap_used)]
//! What is specific to the SQLite backend: opening files that are not (or cannot be) a dlock
//! database. Lock behaviour itself is specified by the conformance suite.
#![cfg(feature = "sqlite")]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;

use dlock::Error;

fn url(path: &std::path::Path) -> String {
    format!("sqlite://{}", path.display())
}

#[tokio::test]
async fn a_directory_is_not_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let err = dlock::connect(&url(dir.path())).await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { ref reason, .. } if reason.contains("is a directory")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_missing_directory_is_reported_unless_create_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/locks.db");
    let err = dlock::connect(&url(&path)).await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument { ref reason, .. } if reason.contains("does not exist")),
        "{err:?}"
    );
    assert!(
        !path.parent().unwrap().exists(),
        "a failed connect created directories"
    );
    let locks = dlock::connect(&format!("{}?create_dirs=true", url(&path)))
        .await
        .unwrap();
    locks
        .mutex("x")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert!(path.is_file());
    // Private to the user, every directory it made (whatever the umask lets through).
    use std::os::unix::fs::PermissionsExt;
    for made in [dir.path().join("a"), dir.path().join("a/b")] {
        let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{} was created {mode:o}", made.display());
    }
}

#[tokio::test]
async fn a_text_file_is_wrong_type_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, "shopping list\n").unwrap();
    let err = dlock::connect(&url(&path)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongType {
                backend: "sqlite",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("not a SQLite database"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "shopping list\n");
}

/// The files SQLite and dlock may put beside `path`, with their contents (`None`: absent).
fn beside(path: &std::path::Path) -> Vec<(String, Option<Vec<u8>>)> {
    ["-wal", "-shm", "-journal", "-wake", "-holders"]
        .iter()
        .map(|suffix| {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            (suffix.to_string(), std::fs::read(name).ok())
        })
        .collect()
}

fn journal_mode(path: &std::path::Path) -> String {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap()
}

#[tokio::test]
async fn another_applications_database_is_wrong_type_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT);
             INSERT INTO users (name) VALUES ('ada'), ('grace');",
        )
        .unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    let mode = journal_mode(&path);
    assert_eq!(mode, "delete");
    let around = beside(&path);
    let err = dlock::connect(&url(&path)).await.unwrap_err();
    assert!(matches!(err, Error::WrongType { .. }), "{err:?}");
    assert!(err.to_string().contains("another application"), "{err}");
    assert!(
        std::fs::read(&path).unwrap() == bytes,
        "the foreign database file changed"
    );
    assert_eq!(beside(&path), around, "files appeared or changed beside it");
    assert_eq!(journal_mode(&path), mode, "the journal mode changed");
}

#[tokio::test]
async fn a_symlink_at_the_wake_files_path_is_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "precious\n").unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("locks.db-wake")).unwrap();
    let url = url(&path);
    let (a, b) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    // Releases ring the wake file, and a waiter watches it.
    for _ in 0..3 {
        let held = a.mutex("x").acquire().await.unwrap();
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.mutex("x").wait(Duration::from_secs(10)).acquire().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        held.release().await.unwrap();
        waiter.await.unwrap().unwrap().release().await.unwrap();
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
}

#[tokio::test]
async fn another_schema_version_is_wrong_type() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    dlock::connect(&url(&path)).await.unwrap();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute(
            "UPDATE dlock_meta SET value = '99' WHERE key = 'schema'",
            [],
        )
        .unwrap();
    }
    let err = dlock::connect(&url(&path)).await.unwrap_err();
    assert!(err.to_string().contains("schema version 99"), "{err}");
}

#[tokio::test]
async fn a_lock_table_of_the_wrong_shape_is_wrong_type() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    dlock::connect(&url(&path)).await.unwrap();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("DROP TABLE dlock_locks; CREATE TABLE dlock_locks (name TEXT)")
            .unwrap();
    }
    let err = dlock::connect(&url(&path)).await.unwrap_err();
    assert!(
        matches!(err, Error::WrongType { .. }) && err.to_string().contains("wrong shape"),
        "{err}"
    );
}

#[tokio::test]
async fn many_clients_opening_a_new_file_at_once_create_the_schema_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir.path().join("fresh.db"));
    let opens: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn({
                let url = url.clone();
                async move { dlock::connect(&url).await }
            })
        })
        .collect();
    for open in opens {
        open.await.unwrap().unwrap();
    }
}

#[tokio::test]
async fn fences_survive_reopening_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir.path().join("locks.db"));
    let first = {
        let locks = dlock::connect(&url).await.unwrap();
        let guard = locks.mutex("job").acquire().await.unwrap();
        let fence = guard.fence();
        guard.release().await.unwrap();
        fence
    };
    let locks = dlock::connect(&url).await.unwrap();
    let again = locks.mutex("job").acquire().await.unwrap();
    assert!(again.fence() > first);
}

#[tokio::test]
async fn a_waiter_in_the_same_process_is_woken_without_polling() {
    // With polling at its slowest, only a wake-up can hand over well inside one poll interval.
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "{}?poll_min=250ms&poll_max=250ms",
        url(&dir.path().join("locks.db"))
    );
    let (a, b) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    for _ in 0..5 {
        let holder = a.mutex("x").acquire().await.unwrap();
        let waiter = tokio::spawn({
            let b = b.clone();
            async move { b.mutex("x").wait(Duration::from_secs(60)).acquire().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let released = std::time::Instant::now();
        holder.release().await.unwrap();
        let guard = waiter.await.unwrap().unwrap();
        let handed_over = released.elapsed();
        assert!(
            handed_over < Duration::from_millis(150),
            "hand-off took {handed_over:?}: polled, not woken"
        );
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn polling_slower_than_the_queue_allows_is_refused() {
    let err = dlock::connect("sqlite:///tmp/x.db?poll_max=1s")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("above 250ms"), "{err}");
}

/// Holds SQLite's write lock from outside dlock, so every dlock write must wait on the worker.
fn block_writes(path: &std::path::Path) -> rusqlite::Connection {
    let raw = rusqlite::Connection::open(path).unwrap();
    raw.execute_batch("BEGIN IMMEDIATE").unwrap();
    raw
}

fn waiter_rows(path: &std::path::Path) -> i64 {
    let raw = rusqlite::Connection::open(path).unwrap();
    raw.query_row("SELECT count(*) FROM dlock_waiters", [], |r| r.get(0))
        .unwrap()
}

#[tokio::test]
async fn an_acquire_dropped_while_the_worker_grants_it_is_undone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let (a, b) = (
        dlock::connect(&url(&path)).await.unwrap(),
        dlock::connect(&url(&path)).await.unwrap(),
    );
    let raw = block_writes(&path);
    let attempt = a.mutex("x").ttl(Duration::from_secs(600)).acquire();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), attempt)
            .await
            .is_err(),
        "acquired through a held write lock"
    );
    // The stranded job now takes the lock for nobody; its undo must give it back at once.
    raw.execute_batch("COMMIT").unwrap();
    let next = b.mutex("x").wait(Duration::from_secs(3)).acquire().await;
    assert!(
        next.is_ok(),
        "the abandoned acquisition kept the lock: {next:?}"
    );
    next.unwrap().release().await.unwrap();
}

/// A grant that waited for SQLite's write lock keeps the whole lease its row was written
/// with: the keeper counts the lease from the write, on the clock the row uses, not from
/// before the wait (counted from there, a wait longer than the TTL told the holder at once
/// that it had lost a lock the file still gave it, for its whole TTL).
#[tokio::test]
async fn a_grant_that_waited_for_the_write_lock_keeps_its_whole_lease() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let (a, b) = (
        dlock::connect(&url(&path)).await.unwrap(),
        dlock::connect(&url(&path)).await.unwrap(),
    );
    let ttl = Duration::from_secs(3);
    let raw = block_writes(&path);
    let attempt = tokio::spawn({
        let a = a.clone();
        async move { a.mutex("waited").ttl(ttl).acquire().await }
    });
    // Longer than the TTL (and shorter than the 5 s busy timeout the worker waits for).
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    raw.execute_batch("COMMIT").unwrap();
    let guard = attempt.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !guard.is_lost(),
        "the hold was told lost at once: {:?}",
        guard.lost_reason()
    );
    assert!(
        b.mutex("waited").try_acquire().await.unwrap().is_none(),
        "the row no longer held the lock"
    );
    guard.release().await.unwrap();
}

#[tokio::test]
async fn a_waiter_dropped_before_its_queue_entry_was_written_leaves_none() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let (a, b) = (
        dlock::connect(&url(&path)).await.unwrap(),
        dlock::connect(&url(&path)).await.unwrap(),
    );
    let holder = a.mutex("x").acquire().await.unwrap();
    let raw = block_writes(&path);
    // Keep b's worker busy, so b's next attempt waits in the worker's queue, not yet started.
    let busy = tokio::spawn({
        let b = b.clone();
        async move { b.mutex("y").acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let waiter = b.mutex("x").fair().acquire();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), waiter)
            .await
            .is_err()
    );
    raw.execute_batch("COMMIT").unwrap();
    busy.await.unwrap().unwrap().release().await.unwrap();
    // The stranded attempt queues the waiter after it was dropped; the clean-up must run after
    // it (well before the 1 s after which a silent entry counts as stale).
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        waiter_rows(&path),
        0,
        "a dropped waiter stayed in the queue"
    );
    holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_stays_bounded_under_sustained_locking() {
    // Every acquire and release commits; without checkpoints the WAL would grow by a page or
    // more per commit (here: tens of MiB). The inline connection never checkpoints itself, so
    // this proves the WAL hook hands checkpoints to the worker, and that the checkpoint gets
    // its turn while two clients (two writers, as two processes would be) commit back to
    // back: a checkpoint that waited with SQLite's growing back-off let the WAL reach 44 MiB.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let locks = dlock::connect(&url(&path)).await.unwrap();
    let rival = dlock::connect(&url(&path)).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let rival_task = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let acquiring = rival.mutex(format!("rival/{}", rounds % 16)).acquire();
                acquiring.await.unwrap().release().await.unwrap();
                rounds += 1;
            }
            rounds
        }
    });
    let mut wal = path.clone().into_os_string();
    wal.push("-wal");
    let mut largest = 0;
    for i in 0..6000 {
        let guard = locks
            .mutex(format!("job/{}", i % 16))
            .ttl(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap();
        guard.release().await.unwrap();
        largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
    }
    stop.store(true, Ordering::Relaxed);
    assert!(rival_task.await.unwrap() > 0, "the rival never committed");
    // A checkpoint is asked for at 1,000 pages (about 4 MiB of log).
    assert!(largest < 8 * 1024 * 1024, "WAL grew to {largest} bytes");
}

#[tokio::test]
async fn a_release_in_another_process_wakes_the_waiter_without_polling() {
    // Polling at its slowest (a jittered 125–375 ms): only the wake file can hand over sooner.
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "{}?poll_min=250ms&poll_max=250ms",
        url(&dir.path().join("locks.db"))
    );
    let locks = dlock::connect(&url).await.unwrap();
    let mut hand_offs = Vec::new();
    for _ in 0..3 {
        let holder = tokio::task::spawn_blocking({
            let url = url.clone();
            move || dlock_testkit::cli::Holder::start(&url, "x", &[])
        })
        .await
        .unwrap()
        .unwrap();
        let waiter = tokio::spawn({
            let locks = locks.clone();
            async move {
                locks
                    .mutex("x")
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = std::time::Instant::now();
        // Closing its stdin makes `dlock hold` release and exit.
        let code = tokio::task::spawn_blocking(move || holder.finish())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(code, 0);
        let guard = waiter.await.unwrap().unwrap();
        hand_offs.push(released.elapsed());
        guard.release().await.unwrap();
    }
    hand_offs.sort();
    assert!(
        hand_offs[1] < Duration::from_millis(100),
        "hand-offs {hand_offs:?}: polled, not woken"
    );
}

#[tokio::test]
async fn a_multi_lock_attempt_takes_every_lock_in_one_transaction_or_none() {
    let dir = tempfile::tempdir().unwrap();
    let locks = dlock::connect(&url(&dir.path().join("locks.db")))
        .await
        .unwrap();
    locks
        .mutex("a")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let blocker = locks.mutex("b").acquire().await.unwrap();
    assert!(
        locks
            .multi_lock(["a", "b", "c"])
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    // Fences come from one counter for the file: taken one at a time, "a" would have been
    // granted and let go again, using the fence after the blocker's.
    let a = locks.mutex("a").acquire().await.unwrap();
    assert_eq!(
        a.fence().get(),
        blocker.fence().get() + 1,
        "a failed multi-lock attempt wrote to a lock"
    );
    assert!(locks.inspect("c").await.unwrap().is_none());
    let last = a.fence().get();
    a.release().await.unwrap();
    blocker.release().await.unwrap();
    let all = locks
        .multi_lock(["a", "b", "c"])
        .no_wait()
        .acquire()
        .await
        .unwrap();
    let fences: Vec<u64> = all.fences().map(|(_, fence)| fence.get()).collect();
    // One transaction: the next three fences of the file, one per lock.
    assert_eq!(fences, vec![last + 1, last + 2, last + 3]);
    all.release().await.unwrap();
}

/// The tables of schema 1 (leases on the wall clock), as dlock created them before schema 2.
const SCHEMA_1: &str = "
CREATE TABLE dlock_meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE dlock_locks (
    name TEXT PRIMARY KEY NOT NULL, fence INTEGER NOT NULL, token TEXT,
    holds INTEGER NOT NULL DEFAULT 0, expires_at INTEGER NOT NULL DEFAULT 0,
    acquired_at INTEGER NOT NULL DEFAULT 0, owner_label TEXT, host TEXT, pid INTEGER
) WITHOUT ROWID;
CREATE TABLE dlock_waiters (
    name TEXT NOT NULL, token TEXT NOT NULL, since_ms INTEGER NOT NULL, seen_ms INTEGER NOT NULL,
    PRIMARY KEY (name, token)
) WITHOUT ROWID;
CREATE INDEX dlock_waiters_order ON dlock_waiters (name, since_ms, token);
CREATE TABLE dlock_values (
    name TEXT PRIMARY KEY NOT NULL, version INTEGER NOT NULL, value BLOB NOT NULL
) WITHOUT ROWID;
INSERT INTO dlock_meta (key, value) VALUES ('schema', '1');
";

fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test]
async fn a_schema_1_store_is_migrated_keeping_fences_holds_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
        conn.execute_batch(SCHEMA_1).unwrap();
        let now = unix_ms();
        conn.execute(
            "INSERT INTO dlock_locks (name, fence, token, holds, expires_at, acquired_at, host, pid)
             VALUES ('held', 5, 'old-holder', 1, ?1, ?2, 'h', 1),
                    ('free', 7, NULL, 0, 0, ?2, 'h', 1),
                    ('expired', 3, 'gone', 1, ?3, ?2, 'h', 1)",
            rusqlite::params![now + 60_000, now - 5_000, now - 1_000],
        )
        .unwrap();
        conn.execute_batch(
            "INSERT INTO dlock_waiters VALUES ('held', 'w', 1, 1);
             INSERT INTO dlock_values VALUES ('stock', 4, x'3130');",
        )
        .unwrap();
    }
    // A dlock that still reads schema 1, with the file open while it is migrated.
    let old = rusqlite::Connection::open(&path).unwrap();
    let locks = dlock::connect(&url(&path)).await.unwrap();

    let info = locks
        .inspect("held")
        .await
        .unwrap()
        .expect("the hold was dropped");
    assert_eq!(info.fence.get(), 5);
    let left = info.ttl_left.unwrap();
    assert!(
        left > Duration::from_secs(50) && left <= Duration::from_secs(60),
        "{left:?} left of a 60 s lease"
    );
    assert!(locks.mutex("held").try_acquire().await.unwrap().is_none());
    let free = locks.mutex("free").acquire().await.unwrap();
    assert_eq!(free.fence().get(), 8);
    let expired = locks.mutex("expired").no_wait().acquire().await.unwrap();
    assert!(expired.fence().get() > 8, "fence {}", expired.fence());
    let stock = locks.value("stock").get().await.unwrap().unwrap();
    assert_eq!((stock.value.as_slice(), stock.version), (&b"10"[..], 4));

    // The old dlock's statements now fail instead of writing wall-clock leases.
    let refused = old.execute(
        "UPDATE dlock_locks SET expires_at = ?1 WHERE name = 'held'",
        [unix_ms() + 600_000],
    );
    assert!(refused.is_err(), "a schema-1 statement still ran");
    let waiters: i64 = old
        .query_row("SELECT count(*) FROM dlock_waiters", [], |r| r.get(0))
        .unwrap();
    assert_eq!(waiters, 0, "wall-clock queue entries were kept");
    let version: String = old
        .query_row(
            "SELECT value FROM dlock_meta WHERE key = 'schema'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, "3");
}

/// The tables of schema 2 (a fence counter per row, rows never deleted), as dlock created
/// them before schema 3.
const SCHEMA_2: &str = "
CREATE TABLE dlock_meta (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE dlock_locks (
    name TEXT PRIMARY KEY NOT NULL, fence INTEGER NOT NULL, token TEXT,
    holds INTEGER NOT NULL DEFAULT 0, expires_mono INTEGER NOT NULL DEFAULT 0, boot TEXT,
    holder TEXT, acquired_at INTEGER NOT NULL DEFAULT 0, owner_label TEXT, host TEXT,
    pid INTEGER
) WITHOUT ROWID;
CREATE TABLE dlock_waiters (
    name TEXT NOT NULL, token TEXT NOT NULL, since_mono INTEGER NOT NULL,
    seen_mono INTEGER NOT NULL, boot TEXT NOT NULL, PRIMARY KEY (name, token)
) WITHOUT ROWID;
CREATE INDEX dlock_waiters_order ON dlock_waiters (name, since_mono, token);
CREATE TABLE dlock_values (
    name TEXT PRIMARY KEY NOT NULL, version INTEGER NOT NULL, value BLOB NOT NULL
) WITHOUT ROWID;
INSERT INTO dlock_meta (key, value) VALUES ('schema', '2');
";

/// Schema 2 kept a fence counter in each name's row; schema 3 draws fences from one counter
/// for the file, so rows can go. A migrated file keeps its holds, every later fence of every
/// name is above all the old ones, and a dlock that still reads schema 2 (with the file open
/// while it is migrated) can no longer write a fence.
#[tokio::test]
async fn a_schema_2_store_is_migrated_keeping_holds_and_raising_fences() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    // A running hold: schema 2 already counted on the machine's monotonic clock of this boot;
    // read both the way dlock does.
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let boot = boot.trim().to_owned();
    let now_mono = {
        use nix::sys::time::TimeValLike;
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .unwrap()
            .num_milliseconds()
    };
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
        conn.execute_batch(SCHEMA_2).unwrap();
        conn.execute(
            "INSERT INTO dlock_locks (name, fence, token, holds, expires_mono, boot, acquired_at, host, pid)
             VALUES ('held', 5, 'old-holder', 1, ?1, ?2, 0, 'h', 1),
                    ('free', 70, NULL, 0, 0, ?2, 0, 'h', 1),
                    ('expired', 3, 'gone', 1, ?3, ?2, 0, 'h', 1)",
            rusqlite::params![now_mono + 60_000, boot, now_mono - 1_000],
        )
        .unwrap();
    }
    let old = rusqlite::Connection::open(&path).unwrap();
    let locks = dlock::connect(&url(&path)).await.unwrap();

    let info = locks
        .inspect("held")
        .await
        .unwrap()
        .expect("the hold was dropped");
    assert_eq!(info.fence.get(), 5);
    assert!(locks.mutex("held").try_acquire().await.unwrap().is_none());
    let mut fences = Vec::new();
    for name in ["free", "expired", "new"] {
        let guard = locks.mutex(name).no_wait().acquire().await.unwrap();
        fences.push(guard.fence().get());
        guard.release().await.unwrap();
    }
    assert!(
        fences.iter().all(|&f| f > 70),
        "fences {fences:?} after an old fence of 70"
    );
    // The old dlock's grant fails instead of counting a swept name's fences from 1.
    let refused = old.execute(
        "INSERT INTO dlock_locks (name, fence, token, holds, expires_mono) VALUES ('new', 1, 't', 1, 0)
         ON CONFLICT (name) DO UPDATE SET fence = fence + 1",
        [],
    );
    assert!(refused.is_err(), "a schema-2 grant still ran");
    let version: String = old
        .query_row(
            "SELECT value FROM dlock_meta WHERE key = 'schema'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(version, "3");
}

/// How many distinct names the bounded-state test uses: a tenth of the figure. Every
/// write of every client goes through the one file's write lock, and a debug build on the
/// shared 2-core VM (load about 15) managed 25 to 65 names a second, so 100,000 names took
/// over half an hour; 10,000 cross every path (release, vanished holder, vanished waiter,
/// full and partial sweep batches) many times over.
const BOUNDED_NAMES: usize = 10_000;

/// Per-name state is bounded: 10,000 names, each taken and released, or taken by a holder
/// that vanished without releasing, or waited for by a fair waiter that vanished while queued
/// (its acquire future forgotten once it has a waiter row, so no clean-up ran: what a crash
/// leaves), leave no rows once their leases and the waiters' places have ended. SQLite has no
/// server and dlock no background task for it: a client sweeps while it is used, at most every
/// few seconds, so the test keeps one client busy with another name meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_per_name_is_left_once_leases_and_waiters_end() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let (holders, waiters) = (
        dlock::connect(&url(&path)).await.unwrap(),
        dlock::connect(&url(&path)).await.unwrap(),
    );
    let probe = || {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        conn
    };
    let ttl = Duration::from_secs(2);
    let first = holders.mutex("bounded/1").ttl(ttl).acquire().await.unwrap();
    let first_fence = first.fence();
    first.release().await.unwrap();
    futures::stream::iter(0..BOUNDED_NAMES)
        .map(|i| {
            let (holders, waiters, path) = (holders.clone(), waiters.clone(), path.clone());
            async move {
                let name = format!("bounded/{i}");
                let guard = holders.mutex(&name).ttl(ttl).try_acquire().await.unwrap();
                let guard = guard.unwrap_or_else(|| panic!("{name} was busy"));
                match i % 3 {
                    // (Its lease may have run out already on a loaded machine.)
                    0 => match guard.release().await {
                        Ok(()) | Err(dlock::Error::NotOwned { .. }) => {}
                        Err(e) => panic!("{name}: {e}"),
                    },
                    // The holder vanishes: its lease runs out.
                    1 => std::mem::forget(guard),
                    // A fair waiter queues behind the holder, then vanishes.
                    _ => {
                        let mut waiting = Box::pin(
                            waiters
                                .mutex(&name)
                                // A fixed TTL: a waiter that gets the lock (below) vanishes
                                // as a holder, and a forgotten watchdog hold would be renewed
                                // for as long as its client lives.
                                .ttl(ttl)
                                .fair()
                                .wait(Duration::from_secs(60))
                                .acquire(),
                        );
                        let conn = rusqlite::Connection::open(&path).unwrap();
                        conn.busy_timeout(Duration::from_secs(10)).unwrap();
                        loop {
                            let polled =
                                tokio::time::timeout(Duration::from_millis(5), &mut waiting).await;
                            if let Ok(got) = polled {
                                // Only once the holder's lease ran out (a slow, loaded
                                // machine): this one vanishes as a holder instead.
                                std::mem::forget(got.unwrap());
                                std::mem::forget(guard);
                                return;
                            }
                            let queued: bool = conn
                                .query_row(
                                    "SELECT EXISTS (SELECT 1 FROM dlock_waiters WHERE name = ?1)",
                                    [&name],
                                    |r| r.get(0),
                                )
                                .unwrap();
                            if queued {
                                break;
                            }
                        }
                        std::mem::forget(waiting);
                        // The lease may have run out meanwhile on a loaded machine.
                        match guard.release().await {
                            Ok(()) | Err(dlock::Error::NotOwned { .. }) => {}
                            Err(e) => panic!("{name}: {e}"),
                        }
                    }
                }
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
    let rows = || -> (i64, i64) {
        probe()
            .query_row(
                "SELECT (SELECT count(*) FROM dlock_locks), (SELECT count(*) FROM dlock_waiters)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap()
    };
    let (locks, queue) = rows();
    assert!(
        locks > 0 && queue > 0,
        "the workload left nothing to clean up"
    );
    tokio::time::sleep(ttl + Duration::from_secs(1)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let poke = holders.mutex("poke").acquire().await.unwrap();
        poke.release().await.unwrap();
        let (locks, queue) = rows();
        if locks + queue <= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{locks} lock rows and {queue} waiter rows left for {BOUNDED_NAMES} names"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let again = holders
        .mutex("bounded/1")
        .try_acquire()
        .await
        .unwrap()
        .unwrap();
    assert!(again.fence() > first_fence);
    again.release().await.unwrap();
}

/// A `dlock hold` started from `cmd`, once it has printed `acquired <fence>`; dropping the
/// child's stdin makes it release, and the child is killed when the returned guard drops.
fn hold(cmd: &mut std::process::Command) -> KillOnDrop {
    use std::io::BufRead;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("acquired "), "dlock hold printed {line:?}");
    KillOnDrop(child)
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// libfaketime, which moves one process's wall clock: `DLOCK_TEST_FAKETIME_LIB`, else where
/// Debian's `libfaketime` puts it (`/usr/lib/<triplet>/faketime/libfaketime.so.1`).
fn faketime_lib() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("DLOCK_TEST_FAKETIME_LIB") {
        return Some(path.into());
    }
    std::fs::read_dir("/usr/lib")
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("faketime/libfaketime.so.1"))
        .find(|path| path.is_file())
}

/// `dlock ARGS...` with its wall clock moved by `offset` (a libfaketime offset such as `+60s`);
/// its monotonic clocks stay real.
fn dlock_at(url: &str, lib: &std::path::Path, offset: &str) -> std::process::Command {
    let mut cmd = dlock_testkit::cli::dlock_command(url).unwrap();
    cmd.env("LD_PRELOAD", lib)
        .env("FAKETIME", offset)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    cmd
}

#[tokio::test]
async fn a_wall_clock_step_neither_ends_nor_stretches_a_lease() {
    let Some(lib) = faketime_lib() else {
        assert!(
            !dlock_testkit::server::required("faketime"),
            "libfaketime (Debian package faketime) is required but not found"
        );
        eprintln!("not tested: libfaketime not found (Debian package faketime)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir.path().join("locks.db"));
    let locks = dlock::connect(&url).await.unwrap();

    // A holder with a true clock (30 s watchdog lease); a contender whose wall clock stepped
    // an hour forward must still find it held.
    let holder = tokio::task::spawn_blocking({
        let url = url.clone();
        move || dlock_testkit::cli::Holder::start(&url, "stepped", &[])
    })
    .await
    .unwrap()
    .unwrap();
    for offset in ["+60s", "+1h"] {
        let status = dlock_at(&url, &lib, offset)
            .args(["run", "--no-wait", "stepped", "--", "true"])
            .status()
            .unwrap();
        assert_eq!(
            status.code(),
            Some(75),
            "a contender {offset} ahead took a lock held for 30 s: {status}"
        );
    }
    drop(holder);

    // A holder whose wall clock is behind: its lease must not be over before it began.
    let holder = tokio::task::spawn_blocking({
        let (url, lib) = (url.clone(), lib.clone());
        move || hold(dlock_at(&url, &lib, "-60s").args(["hold", "behind"]))
    })
    .await
    .unwrap();
    assert!(
        locks.mutex("behind").try_acquire().await.unwrap().is_none(),
        "took a lock whose holder's wall clock is a minute behind"
    );
    let info = locks.inspect("behind").await.unwrap().unwrap();
    let left = info.ttl_left.unwrap();
    assert!(
        left > Duration::from_secs(20),
        "{left:?} left of a 30 s lease"
    );
    // The step was real: the holder wrote its wall-clock start a minute in the past.
    let shown = std::time::SystemTime::now()
        .duration_since(info.acquired_at)
        .unwrap();
    assert!(
        shown >= Duration::from_secs(55),
        "the holder's clock was not moved: {shown:?}"
    );
    drop(holder);
}

/// SIGKILLs a `dlock hold` (30 s watchdog lease) while this process waits for its lock, and
/// returns how long after the kill the waiter got the lock, with the fences before and after.
async fn kill_holder_and_wait(locks: &dlock::Locks, url: &str, name: &str) -> (Duration, u64, u64) {
    let mut holder = tokio::task::spawn_blocking({
        let (url, name) = (url.to_owned(), name.to_owned());
        move || dlock_testkit::cli::Holder::start(&url, &name, &[])
    })
    .await
    .unwrap()
    .unwrap();
    let waiter = tokio::spawn({
        let (locks, name) = (locks.clone(), name.to_owned());
        async move {
            locks
                .mutex(name)
                .wait(Duration::from_secs(60))
                .acquire()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "got a lock its live holder kept");
    let killed = std::time::Instant::now();
    holder.child.kill().unwrap();
    let guard = waiter.await.unwrap().unwrap();
    let recovered = killed.elapsed();
    holder.child.wait().unwrap();
    let fences = (holder.fence, guard.fence().get());
    guard.release().await.unwrap();
    (recovered, fences.0, fences.1)
}

#[tokio::test]
async fn a_holder_process_killed_on_this_machine_frees_its_lock_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir.path().join("locks.db"));
    let locks = dlock::connect(&url).await.unwrap();

    // A waiter is woken by the holder's death and takes over, well inside the 30 s lease.
    let (recovered, before, after) = kill_holder_and_wait(&locks, &url, "crashed").await;
    eprintln!("recovered {recovered:?} after SIGKILL");
    assert!(
        recovered < Duration::from_secs(10),
        "the lock came back after {recovered:?}: the dead holder's lease was waited out"
    );
    assert!(after > before, "fence {after} after {before}");

    // A fresh attempt after the kill needs no waiting at all.
    let mut holder = tokio::task::spawn_blocking({
        let url = url.clone();
        move || dlock_testkit::cli::Holder::start(&url, "crashed-again", &[])
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        locks
            .mutex("crashed-again")
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    assert!(locks.inspect("crashed-again").await.unwrap().is_some());
    holder.kill().unwrap();
    // Shown as free, as the next acquire will find it.
    assert!(locks.inspect("crashed-again").await.unwrap().is_none());
    let listed: Vec<_> = locks.list("crashed").collect().await;
    assert!(
        listed.is_empty(),
        "a dead holder's lock is listed: {listed:?}"
    );
    let next = locks.mutex("crashed-again").try_acquire().await.unwrap();
    let next = next.expect("a dead holder's lock is still held");
    assert!(next.fence().get() > holder.fence);
    next.release().await.unwrap();

    // Two clients of one process are two holders: each sees the other alive.
    let other = dlock::connect(&url).await.unwrap();
    let mine = other.mutex("neighbour").acquire().await.unwrap();
    assert!(
        locks
            .mutex("neighbour")
            .try_acquire()
            .await
            .unwrap()
            .is_none()
    );
    mine.release().await.unwrap();

    // The dead holders' files are swept by the next client that opens the store; left are
    // the two live clients' and that last client's own (swept by the next open).
    drop(dlock::connect(&url).await.unwrap());
    let files = std::fs::read_dir(dir.path().join("locks.db-holders"))
        .unwrap()
        .count();
    assert_eq!(files, 3, "holder files of dead processes were left behind");
}

#[tokio::test]
async fn a_stopped_holder_keeps_its_lock_for_its_lease() {
    // Alive but frozen (SIGSTOP): its lock stays held; only its lease ending frees it.
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir.path().join("locks.db"));
    let locks = dlock::connect(&url).await.unwrap();
    let holder = tokio::task::spawn_blocking({
        let url = url.clone();
        move || dlock_testkit::cli::Holder::start(&url, "frozen", &["--ttl", "2s"])
    })
    .await
    .unwrap()
    .unwrap();
    let signal = |sig: &str| {
        let pid = holder.child.id().to_string();
        let sent = std::process::Command::new("kill")
            .args([sig, &pid])
            .status();
        assert!(sent.unwrap().success());
    };
    signal("-STOP");
    let start = std::time::Instant::now();
    let next = locks
        .mutex("frozen")
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    // Renewed every third of its 2 s lease until stopped: at least 1.3 s were left.
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "a live (stopped) holder's lock was taken after {:?}",
        start.elapsed()
    );
    assert!(next.fence().get() > holder.fence);
    signal("-CONT");
    next.release().await.unwrap();
}

/// Recovery after SIGKILL, measured (not asserted): `cargo test -p dlock-rs --test sqlite_store
/// -- --ignored --nocapture recovery_time`.
#[tokio::test]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn recovery_time_after_a_holder_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir.path().join("locks.db"));
    let locks = dlock::connect(&url).await.unwrap();
    let mut times = Vec::new();
    for i in 0..30 {
        times.push(kill_holder_and_wait(&locks, &url, &format!("m{i}")).await.0);
    }
    times.sort();
    eprintln!(
        "recovery after SIGKILL over {} runs: min {:?} median {:?} max {:?}",
        times.len(),
        times[0],
        times[times.len() / 2],
        times[times.len() - 1]
    );
}

#[tokio::test]
async fn a_lock_is_free_for_the_next_caller_once_a_waiter_timed_out() {
    // The timed-out waiter's queue entry must be gone before its acquire returns: else, having
    // waited past the 5 ms after which waiters go first, it would still hold back a try.
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir.path().join("locks.db"));
    let (a, b) = (
        dlock::connect(&url).await.unwrap(),
        dlock::connect(&url).await.unwrap(),
    );
    for i in 0..50 {
        let name = format!("x{i}");
        let held = a.mutex(&name).acquire().await.unwrap();
        let waited = b
            .mutex(&name)
            .wait(Duration::from_millis(20))
            .acquire()
            .await;
        assert!(matches!(waited, Err(Error::Timeout { .. })), "{waited:?}");
        held.release().await.unwrap();
        let next = b.mutex(&name).try_acquire().await.unwrap();
        assert!(
            next.is_some(),
            "round {i}: a timed-out waiter held back the next try"
        );
    }
}

#[tokio::test]
async fn a_holder_directory_others_could_change_is_not_trusted() {
    // Whoever can swap a holder's file for an unlocked one could make a live holder look dead;
    // a directory writable by users who cannot write the database is not used.
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let holders = dir.path().join("locks.db-holders");
    std::fs::create_dir(&holders).unwrap();
    std::fs::set_permissions(&holders, std::fs::Permissions::from_mode(0o777)).unwrap();
    let locks = dlock::connect(&url(&path)).await.unwrap();
    let _held = locks.mutex("x").acquire().await.unwrap();
    assert_eq!(
        std::fs::read_dir(&holders).unwrap().count(),
        0,
        "a holder file was made in a world-writable directory"
    );
    let holder: Option<String> = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT holder FROM dlock_locks WHERE name = 'x'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(holder, None);
}

#[test]
fn the_clis_default_store_directory_is_private_to_the_user() {
    // The `dlock` command's default URL is a file in the user's state directory, created with
    // `create_dirs`; every directory it makes is the user's alone.
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(dlock_testkit::cli::dlock_binary().unwrap())
        .env("HOME", home.path())
        .env_remove("XDG_STATE_HOME")
        .env_remove("DLOCK_URL")
        .args(["run", "private", "--", "true"])
        .status()
        .unwrap();
    assert!(status.success(), "{status}");
    let state = home.path().join(".local/state/dlock");
    assert!(state.join("locks.db").is_file());
    for made in [
        home.path().join(".local"),
        home.path().join(".local/state"),
        state,
    ] {
        let mode = std::fs::metadata(&made).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{} was created {mode:o}", made.display());
    }
}

#[tokio::test]
async fn leases_and_queued_waiters_of_an_earlier_boot_are_over() {
    // Lease times count on the monotonic clock of one boot; after a reboot (simulated by
    // another boot id in the rows) nothing from before holds a lock or a place in the queue.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let (a, b) = (
        dlock::connect(&url(&path)).await.unwrap(),
        dlock::connect(&url(&path)).await.unwrap(),
    );
    let before = a
        .mutex("x")
        .ttl(Duration::from_secs(600))
        .acquire()
        .await
        .unwrap();
    assert!(b.mutex("x").try_acquire().await.unwrap().is_none());
    {
        let raw = rusqlite::Connection::open(&path).unwrap();
        raw.execute_batch(
            "UPDATE dlock_locks SET boot = '00000000-0000-0000-0000-000000000000';
             INSERT INTO dlock_waiters (name, token, since_mono, seen_mono, boot)
                 VALUES ('x', 'earlier', 0, 9223372036854775807, '00000000-0000-0000-0000-000000000000');",
        )
        .unwrap();
    }
    assert!(a.inspect("x").await.unwrap().is_none());
    let after = b.mutex("x").fair().no_wait().acquire().await.unwrap();
    assert!(after.fence() > before.fence());
    let err = before.release().await.unwrap_err();
    assert!(matches!(err, Error::NotOwned { .. }), "{err:?}");
    after.release().await.unwrap();
}

/// The uids of the default-store test: users with no passwd entry, so no home directory is
/// found and the default store falls back to the temp directory.
const VICTIM_UID: u32 = 54_321;
const OTHER_UID: u32 = 54_322;

/// Set in the child that connects to the default store as another user.
const PROBE: &str = "DLOCK_TEST_DEFAULT_STORE_PROBE";
const PROBE_TEST: &str = "the_default_store_in_the_temp_dir_refuses_what_another_user_could_write";

/// Connects to the default store (`dlock::default_url()`) as [`VICTIM_UID`], with `tmp` for its
/// temp directory and no home, so the store goes to its last-resort place: this test binary
/// (`exe`) run again as the probe. Exits 0 once connected; otherwise prints the error.
fn default_store_probe(exe: &std::path::Path, tmp: &std::path::Path) -> std::process::Output {
    std::process::Command::new("setpriv")
        .arg(format!("--reuid={VICTIM_UID}"))
        .arg(format!("--regid={VICTIM_UID}"))
        .arg("--clear-groups")
        .arg(exe)
        .args(["--exact", PROBE_TEST, "--nocapture", "--test-threads=1"])
        .env_clear()
        .env(PROBE, "1")
        .env("TMPDIR", tmp)
        .output()
        .unwrap()
}

/// The probe's side of [`default_store_probe`].
fn probe_the_default_store() -> ! {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let url = dlock::default_url();
    match runtime.block_on(dlock::connect(&url)) {
        Ok(_) => std::process::exit(0),
        Err(error) => {
            eprintln!("{url}: {error}");
            std::process::exit(1)
        }
    }
}

/// A temp directory as `/tmp` is: anyone may create in it, only the owner remove.
fn shared_tmp() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

fn chown(path: &std::path::Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
}

fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// With no state directory the default store lives in the temp directory, which every user
/// can write: a directory or an empty database file another user made there first (or one
/// anyone may write) is refused, not used, so nobody else can read or break the user's locks.
#[test]
fn the_default_store_in_the_temp_dir_refuses_what_another_user_could_write() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if std::env::var_os(PROBE).is_some() {
        probe_the_default_store();
    }
    // Running as other users needs root (`setpriv`); /proc/self is owned by our uid.
    if std::fs::metadata("/proc/self").unwrap().uid() != 0 {
        assert!(
            std::env::var_os("DLOCK_TEST_REQUIRE").is_none(),
            "the default store's ownership checks need root (to run as other users)"
        );
        eprintln!("not tested: the default store's ownership checks need root");
        return;
    }
    // This test binary, where the other uid can run it.
    let bin_dir = tempfile::tempdir().unwrap();
    chmod(bin_dir.path(), 0o755);
    let exe = bin_dir.path().join("probe");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();

    // Where the store goes when nobody interferes: a private directory of the user's.
    let clean = shared_tmp();
    let out = default_store_probe(&exe, clean.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store_dir = std::fs::read_dir(clean.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.join("locks.db").is_file())
        .expect("no default store created in the temp dir");
    let made = std::fs::metadata(&store_dir).unwrap();
    assert_eq!(made.uid(), VICTIM_UID, "{}", store_dir.display());
    assert_eq!(
        made.permissions().mode() & 0o077,
        0,
        "{}",
        store_dir.display()
    );
    let relative = store_dir.strip_prefix(clean.path()).unwrap().to_owned();

    // Each way another user could have prepared the place: (what, directory owner, its mode,
    // a planted empty database file's owner and mode).
    type Planted = Option<(u32, u32)>;
    let cases: [(&str, u32, u32, Planted); 4] = [
        ("a directory another user made", OTHER_UID, 0o777, None),
        (
            "a private directory of another user's",
            OTHER_UID,
            0o700,
            None,
        ),
        (
            "the user's directory, writable by all",
            VICTIM_UID,
            0o777,
            None,
        ),
        (
            "an empty database file another user made",
            VICTIM_UID,
            0o700,
            Some((OTHER_UID, 0o666)),
        ),
    ];
    let mut failures = Vec::new();
    for (what, owner, mode, planted) in cases {
        let tmp = shared_tmp();
        let dir = tmp.path().join(&relative);
        std::fs::create_dir(&dir).unwrap();
        if let Some((file_owner, file_mode)) = planted {
            let file = dir.join("locks.db");
            std::fs::write(&file, b"").unwrap();
            chown(&file, file_owner);
            chmod(&file, file_mode);
        }
        chown(&dir, owner);
        chmod(&dir, mode);
        let out = default_store_probe(&exe, tmp.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        let size = std::fs::metadata(dir.join("locks.db")).map_or(0, |m| m.len());
        if out.status.success() || !stderr.contains(&*dir.to_string_lossy()) || size > 0 {
            failures.push(format!(
                "{what}: exit {:?}, database {size} bytes, stderr: {stderr}",
                out.status.code()
            ));
        }
    }
    assert!(failures.is_empty(), "trusted: {failures:#?}");
}

/// `dlock --url URL ARGS...` in a time namespace of its own whose monotonic clock reads
/// `offset_secs` more than this process's (`unshare --time`, from util-linux; unprivileged it
/// needs a user namespace too). Panics when this machine cannot make one: the case it tests
/// would then pass without running.
fn dlock_in_time_namespace(url: &str, offset_secs: i64) -> std::process::Command {
    let is_root = nix::unistd::geteuid().is_root();
    let probe = std::process::Command::new("unshare")
        .args(if is_root {
            &[][..]
        } else {
            &["--map-root-user"][..]
        })
        .arg("--time")
        .arg(format!("--monotonic={offset_secs}"))
        .arg("true")
        .status()
        .expect("unshare (Debian package util-linux)");
    assert!(
        probe.success(),
        "this machine cannot make a time namespace (unshare --time): {probe}"
    );
    let mut cmd = std::process::Command::new("unshare");
    if !is_root {
        cmd.arg("--map-root-user");
    }
    cmd.arg("--time")
        .arg(format!("--monotonic={offset_secs}"))
        .arg(dlock_testkit::cli::dlock_binary().unwrap())
        .arg("--url")
        .arg(url);
    cmd
}

/// How long this machine's monotonic clock has run, in whole seconds.
fn monotonic_secs() -> i64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    now.tv_sec()
}

#[tokio::test]
async fn a_client_in_another_time_namespace_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir.path().join("locks.db"));
    // A holder whose monotonic clock is far behind ours: counted on our clock, its 30 s lease
    // ended long ago, though it lives and renews.
    let behind = -(monotonic_secs() - 1).min(3_600);
    assert!(behind < -60, "this machine booted too recently: {behind}");
    let _holder = tokio::task::spawn_blocking({
        let url = url.clone();
        move || hold(dlock_in_time_namespace(&url, behind).args(["hold", "namespaced"]))
    })
    .await
    .unwrap();
    let refused = dlock::connect(&url).await;
    let Err(Error::InvalidArgument { what, reason }) = &refused else {
        panic!(
            "a client opened a store in use from another time namespace: {:?}",
            refused.map(|locks| locks.info().name)
        );
    };
    assert_eq!(*what, "sqlite path");
    assert!(reason.contains("time namespace"), "{reason}");
}

#[tokio::test]
async fn a_client_started_in_another_time_namespace_refuses_a_store_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let url = url(&dir.path().join("locks.db"));
    let locks = dlock::connect(&url).await.unwrap();
    let held = locks.mutex("ours").acquire().await.unwrap();
    // A contender whose monotonic clock is an hour ahead of ours sees our lease as over.
    let out = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            dlock_in_time_namespace(&url, 3_600)
                .args(["run", "--no-wait", "ours", "--", "true"])
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(125),
        "a contender in another time namespace ran under our lock: {} {stderr}",
        out.status
    );
    assert!(stderr.contains("time namespace"), "{stderr}");
    assert!(!held.is_lost());
    held.release().await.unwrap();
}

#[tokio::test]
async fn a_live_client_of_another_boot_is_refused_and_a_dead_one_is_not() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let url = url(&db);
    // The store is made and closed by a client of this boot.
    dlock::connect(&url).await.unwrap().close().await.unwrap();
    // A client of another kernel sharing the folder (a VM and its host, two containers of
    // two machines) has its holder file there, locked while it lives.
    let holders = dir.path().join("locks.db-holders");
    let id = uuid::Uuid::new_v4().simple().to_string();
    let mut file = std::fs::File::create(holders.join(&id)).unwrap();
    writeln!(file, "boot 8f2b7c1e-0000-4000-8000-000000000000").unwrap();
    let live = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock).unwrap();
    let before = holder_files(&holders);
    let refused = dlock::connect(&url).await;
    let Err(Error::InvalidArgument { reason, .. }) = &refused else {
        panic!("a client opened a store in use by another boot: {refused:?}");
    };
    assert!(reason.contains("another boot"), "{reason}");
    assert_eq!(
        holder_files(&holders),
        before,
        "the refused client left a holder file behind"
    );
    // Once that client is gone (its lock with it), the store opens again.
    drop(live);
    let locks = dlock::connect(&url).await.unwrap();
    locks
        .mutex("after")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

fn holder_files(dir: &std::path::Path) -> std::collections::BTreeSet<std::ffi::OsString> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect()
}
