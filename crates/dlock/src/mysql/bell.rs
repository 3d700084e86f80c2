//! A lease-table client's doorbell: how a release wakes a waiter of another client without
//! polling. MariaDB has nothing like LISTEN/NOTIFY, so a client with waiters keeps two
//! connections of its own: one holds a named lock of the client's (`GET_LOCK`), the other
//! waits for it, and that second connection's id goes into the waiters' queue entries
//! (column `bell`). A release that frees the lock while waiters are queued looks up the
//! head's bell in the process list and ends exactly that wait with `KILL QUERY ID` (a query
//! id is never reused, so no other statement can be interrupted); the rung client wakes its
//! waiters, which try again at once.
//!
//! The wait is on a lock rather than in `SLEEP()`: MariaDB's `SLEEP` waits under one mutex
//! shared by every sleeping session, and a `KILL` that meets it taken stalls both sides for
//! two seconds (seen in `dlock bench`); a lock wait has a mutex of its own per session.
//!
//! A ring is a hint, never needed for safety: every grant is still the conditional `UPDATE`.
//! A waiter whose ring is missed (a bell between two waits for longer than the ringer
//! looks, a ringer of another database user without the right to `KILL` it, a client that
//! crashed before ringing) is found by its own polls, every `poll_max` at the head of the
//! queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use sqlx::{AssertSqlSafe, ConnectOptions, MySqlConnection, MySqlPool, Row};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::sql_common::Wakers;

use super::error::number;

/// How a bell's wait ends its text (sent as it is, outside prepared statements): how a ringer
/// tells a waiting bell from any other query of that connection.
pub(super) const BELL_MARK: &str = "/* dlock bell */";

/// ER_QUERY_INTERRUPTED, should a wait ended by `KILL QUERY` report it as an error (MariaDB
/// answers NULL).
const INTERRUPTED: u16 = 1317;

/// How long one wait of a bell lasts when nobody rings it.
const WAIT: Duration = Duration::from_secs(30);

/// How long past [`WAIT`] a bell waits for the server's answer before it counts as broken.
const ANSWER_LIMIT: Duration = Duration::from_secs(5);

/// How long a client whose bell could not be set up waits before trying again (its waiters
/// poll meanwhile).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Pauses before a ringer looks again at a bell found between two waits (its client is
/// waking its waiters and about to wait again); after the last one it gives up and the
/// waiter's own poll finds the lock.
const BETWEEN_WAITS: [Duration; 3] = [
    Duration::from_millis(1),
    Duration::from_millis(2),
    Duration::from_millis(4),
];

/// One client's doorbell: started by the first waiter that queues, stopped when a wait ends
/// with no waiter left in the client (or when the client is dropped).
#[derive(Debug)]
pub(super) struct Bell {
    owner: BellOwner,
    /// Held while a bell is set up or taken down; when setting one up last failed.
    setup: tokio::sync::Mutex<Option<Instant>>,
    /// The waiting connection's id while the bell is up (0: none).
    current: AtomicI64,
}

/// What the bell needs of its client.
#[derive(Clone, Debug)]
struct BellOwner {
    pool: MySqlPool,
    wakers: Arc<Wakers>,
    stop: CancellationToken,
    /// [`head_bell_sql`] and [`free_queued_sql`] for this client's tables.
    head_bell: Arc<str>,
    free_queued: Arc<str>,
}

/// Up to this many names waited on, a rung client wakes all its waiters; with more, it asks
/// which of their locks are free, so a ring does not send every waiter to the database.
const FEW_NAMES: usize = 4;

impl Bell {
    /// The doorbell of a client with lease table `locks`, waiter queue `waiters`, the
    /// database clock `now` and the oldest `seen` of a live entry, `live_since` (SQL).
    pub(super) fn new(
        pool: MySqlPool,
        wakers: Arc<Wakers>,
        stop: CancellationToken,
        (locks, waiters, now, live_since): (&str, &str, &str, &str),
    ) -> Bell {
        Bell {
            owner: BellOwner {
                pool,
                wakers,
                stop,
                head_bell: head_bell_sql(waiters, live_since).into(),
                free_queued: free_queued_sql(locks, waiters, now).into(),
            },
            setup: tokio::sync::Mutex::default(),
            current: AtomicI64::new(0),
        }
    }

    /// The id to write into a queue entry: this client's bell, set up now if it is not up.
    /// `None` when it cannot be (the waiter then polls as it would without one).
    pub(super) async fn id(self: &Arc<Self>) -> Option<i64> {
        if let Some(id) = self.current() {
            return Some(id);
        }
        let mut failed_at = self.setup.lock().await;
        if let Some(id) = self.current() {
            return Some(id);
        }
        if failed_at.is_some_and(|at| at.elapsed() < RETRY_AFTER) {
            return None;
        }
        match connect(&self.owner.pool).await {
            Ok(connections) => {
                let id = connections.waiter_id;
                self.current.store(id, Ordering::SeqCst);
                *failed_at = None;
                tokio::spawn(self.clone().ring_loop(connections));
                Some(id)
            }
            Err(error) => {
                tracing::debug!(%error, "the waiters' doorbell could not be set up; they poll");
                *failed_at = Some(Instant::now());
                None
            }
        }
    }

    /// The bell's id while it is up.
    fn current(&self) -> Option<i64> {
        Some(self.current.load(Ordering::SeqCst)).filter(|id| *id != 0)
    }

    /// Rings the bell of the head of `name`'s queue, whose lock was just freed, unless it is
    /// this client's own (its waiters were woken in-process). Errors are logged: a missed
    /// ring only delays the waiter until its next poll.
    pub(super) async fn ring(&self, name: &str) {
        let (pool, own) = (&self.owner.pool, self.current());
        let mut pauses = BETWEEN_WAITS.iter();
        loop {
            let head: sqlx::Result<Option<(Option<i64>, Option<i64>)>> =
                sqlx::query_as(AssertSqlSafe(self.owner.head_bell.clone()))
                    .bind(name)
                    .fetch_optional(pool)
                    .await;
            let query = match head {
                // No waiter, or a head without a bell (an older dlock).
                Ok(None | Some((None, _))) => return,
                Ok(Some((Some(bell), _))) if Some(bell) == own => return,
                Ok(Some((Some(_), Some(query)))) => query,
                Ok(Some((Some(bell), None))) => match pauses.next() {
                    Some(pause) => {
                        tokio::time::sleep(*pause).await;
                        continue;
                    }
                    None => {
                        tracing::debug!(%name, bell, "a waiter's doorbell was not waiting; it finds the lock by polling");
                        return;
                    }
                },
                Err(error) => {
                    tracing::debug!(%error, %name, "looking up a waiter's doorbell failed; it finds the lock by polling");
                    return;
                }
            };
            // An integer, so the text is safe; KILL takes no parameters.
            let kill = format!("KILL QUERY ID {query}");
            if let Err(error) = sqlx::raw_sql(AssertSqlSafe(kill)).execute(pool).await {
                // Also when the wait ended just before (ER_NO_SUCH_QUERY): its client is awake.
                tracing::debug!(%error, %name, "ringing a waiter's doorbell failed");
            }
            return;
        }
    }

    /// Takes the bell down (under the set-up lock, so a waiter asking for the id meanwhile
    /// waits and then gets a new bell).
    async fn take_down(&self, unless_waited: bool) -> bool {
        let _setup = self.setup.lock().await;
        if unless_waited && self.owner.wakers.waited_names() > 0 {
            return false;
        }
        self.current.store(0, Ordering::SeqCst);
        true
    }

    /// Waits until rung (then wakes the client's waiters and waits again), until the client
    /// is dropped, or until a wait ends on its own with no waiter left. The connections close
    /// when it returns, which frees the bell's lock.
    async fn ring_loop(self: Arc<Self>, connections: Connections) {
        let owner = &self.owner;
        let Connections {
            _holder,
            mut waiter,
            waiter_id: id,
            wait,
        } = connections;
        loop {
            let waiting = sqlx::raw_sql(AssertSqlSafe(wait.clone())).fetch_one(&mut waiter);
            let waited = tokio::select! {
                // A server that stopped answering (a cut network) breaks the bell.
                waited = tokio::time::timeout(WAIT + ANSWER_LIMIT, waiting) => match waited {
                    Ok(waited) => waited.and_then(|row| row.try_get::<Option<i64>, _>(0)),
                    Err(_) => Err(sqlx::Error::Protocol("the bell's wait went unanswered".into())),
                },
                () = owner.stop.cancelled() => return,
            };
            let broken = match waited {
                // Rung: the wait was killed (MariaDB answers NULL, or the interruption).
                Ok(None) => {
                    rung(owner, id);
                    continue;
                }
                Err(error) if number(&error) == Some(INTERRUPTED) => {
                    rung(owner, id);
                    continue;
                }
                // Timed out: goes on while the client has waiters.
                Ok(Some(0)) if self.take_down(true).await => return,
                Ok(Some(0)) => continue,
                // Granted: the holding connection is gone (the server closed it).
                Ok(Some(_)) => "its holding connection ended".to_owned(),
                Err(error) => error.to_string(),
            };
            tracing::debug!(error = %broken, bell = id, "the waiters' doorbell broke; they poll until it is set up again");
            self.take_down(false).await;
            // A ring may have been lost with it.
            owner.wakers.wake_all();
            return;
        }
    }
}

/// Wakes the client's waiters after its bell (`id`) rang: all of them when they wait on a
/// few names, otherwise those whose locks are free.
fn rung(owner: &BellOwner, id: i64) {
    if owner.wakers.waited_names() <= FEW_NAMES {
        owner.wakers.wake_all();
    } else {
        // In a task of its own: the bell waits again at once.
        tokio::spawn(wake_free(owner.clone(), id));
    }
}

/// Wakes the waiters of this client (bell `id`) whose locks are free.
async fn wake_free(owner: BellOwner, id: i64) {
    let names: sqlx::Result<Vec<Vec<u8>>> = sqlx::query_scalar(AssertSqlSafe(owner.free_queued))
        .bind(id)
        .fetch_all(&owner.pool)
        .await;
    match names {
        Ok(names) => {
            for name in names {
                owner.wakers.wake(&String::from_utf8_lossy(&name));
            }
        }
        Err(error) => {
            tracing::debug!(%error, "finding the rung waiters failed; waking them all");
            owner.wakers.wake_all();
        }
    }
}

/// The statement that names the locks, free now, that waiters of bell `?` are queued for.
fn free_queued_sql(locks: &str, waiters: &str, now: &str) -> String {
    format!(
        "SELECT DISTINCT q.name FROM {waiters} q LEFT JOIN {locks} l ON l.name = q.name
         WHERE q.bell = ? AND (l.token IS NULL OR l.expires_at <= {now})"
    )
}

/// A bell's two connections, of their own (outside the pool, where they would take locks'
/// places): one holds the bell's lock, the other waits for it.
struct Connections {
    _holder: MySqlConnection,
    waiter: MySqlConnection,
    /// The waiting connection's id, which queue entries carry.
    waiter_id: i64,
    /// The statement the waiter waits in.
    wait: Arc<str>,
}

async fn connect(pool: &MySqlPool) -> sqlx::Result<Connections> {
    let options = pool.connect_options();
    let mut holder = options.connect().await?;
    let mut waiter = options.connect().await?;
    // A name of this bell's own (the server's lock names are at most 64 characters).
    let lock = format!("dlock-bell:{}", uuid::Uuid::new_v4().simple());
    let held: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(&lock)
        .fetch_one(&mut holder)
        .await?;
    if held != Some(1) {
        return Err(sqlx::Error::Protocol(format!(
            "the bell's own lock was not granted ({held:?})"
        )));
    }
    let waiter_id: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
        .fetch_one(&mut waiter)
        .await?;
    Ok(Connections {
        _holder: holder,
        waiter,
        waiter_id,
        wait: format!("SELECT GET_LOCK('{lock}', {}) {BELL_MARK}", WAIT.as_secs()).into(),
    })
}

/// The statement that finds the bell of `waiters`' head for a name, and the id of the wait
/// it is in (NULL between two waits). Binds: the name.
fn head_bell_sql(waiters: &str, live_since: &str) -> String {
    format!(
        "SELECT h.bell, CAST(p.QUERY_ID AS SIGNED)
         FROM (SELECT bell FROM {waiters} WHERE name = ? AND seen > {live_since}
               ORDER BY since, token LIMIT 1) h
         LEFT JOIN information_schema.PROCESSLIST p ON p.ID = h.bell AND p.INFO LIKE '%{BELL_MARK}'"
    )
}
