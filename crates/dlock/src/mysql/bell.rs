//! A lease-table client's doorbell: how a release wakes a waiter of another client without
//! polling. MariaDB has nothing like LISTEN/NOTIFY, so a client with waiters keeps one
//! connection of its own asleep in [`BELL_SLEEP`] and writes that connection's id into its
//! waiters' queue entries (column `bell`). A release that frees the lock while waiters are
//! queued looks up the head's bell in the process list and ends exactly that sleep with
//! `KILL QUERY ID` (a query id is never reused, so no other statement can be interrupted);
//! the rung client wakes its waiters, which try again at once.
//!
//! A ring is a hint, never needed for safety: every grant is still the conditional `UPDATE`.
//! A waiter whose ring is missed (a bell between two sleeps for longer than the ringer
//! looks, a ringer of another database user without the right to `KILL` it, a client that
//! crashed before ringing) is found by its own polls, every `poll_max` at the head of the
//! queue.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{AssertSqlSafe, ConnectOptions, MySqlConnection, MySqlPool};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::sql_common::Wakers;

use super::error::number;

/// The statement a bell sleeps in: the text (sent as it is, outside prepared statements) is
/// how a ringer tells a sleeping bell from any other query of that connection.
pub(super) const BELL_SLEEP: &str = "SELECT SLEEP(30) /* dlock bell */";

/// ER_QUERY_INTERRUPTED: what a `SLEEP` ended by `KILL QUERY` reports on MariaDB.
const INTERRUPTED: u16 = 1317;

/// How long a client whose bell could not be set up waits before trying again (its waiters
/// poll meanwhile).
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// Pauses before a ringer looks again at a bell found between two sleeps (its client is
/// waking its waiters and about to sleep again); after the last one it gives up and the
/// waiter's own poll finds the lock.
const BETWEEN_SLEEPS: [Duration; 3] = [
    Duration::from_millis(1),
    Duration::from_millis(2),
    Duration::from_millis(4),
];

/// One client's doorbell: started by the first waiter that queues, stopped when a sleep ends
/// with no waiter left in the client (or when the client is dropped).
#[derive(Debug, Default)]
pub(super) struct Bell {
    state: tokio::sync::Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The sleeping connection's id while the bell is up.
    id: Option<i64>,
    /// When setting it up last failed.
    failed_at: Option<Instant>,
}

/// What the bell's task needs of its client.
#[derive(Clone, Debug)]
pub(super) struct BellOwner {
    pub(super) pool: MySqlPool,
    pub(super) wakers: Arc<Wakers>,
    pub(super) stop: CancellationToken,
    /// [`free_queued_sql`] for this client's tables.
    pub(super) free_queued: Arc<str>,
}

/// Up to this many names waited on, a rung client wakes all its waiters; with more, it asks
/// which of their locks are free, so a ring does not send every waiter to the database.
const FEW_NAMES: usize = 4;

impl Bell {
    /// The id to write into a queue entry: this client's bell, set up now if it is not up.
    /// `None` when it cannot be (the waiter then polls as it would without one).
    pub(super) async fn id(self: &Arc<Self>, owner: &BellOwner) -> Option<i64> {
        let mut state = self.state.lock().await;
        if state.id.is_some() {
            return state.id;
        }
        if state.failed_at.is_some_and(|at| at.elapsed() < RETRY_AFTER) {
            return None;
        }
        match connect(&owner.pool).await {
            Ok((conn, id)) => {
                state.id = Some(id);
                state.failed_at = None;
                tokio::spawn(self.clone().ring_loop(conn, id, owner.clone()));
                Some(id)
            }
            Err(error) => {
                tracing::debug!(%error, "the waiters' doorbell could not be set up; they poll");
                state.failed_at = Some(Instant::now());
                None
            }
        }
    }

    /// The bell's id while it is up.
    pub(super) async fn current(&self) -> Option<i64> {
        self.state.lock().await.id
    }

    /// Sleeps on `conn` until rung (then wakes every waiter of the client and sleeps again),
    /// until the client is dropped, or until a sleep ends on its own with no waiter left.
    async fn ring_loop(self: Arc<Self>, mut conn: MySqlConnection, id: i64, owner: BellOwner) {
        loop {
            let slept = tokio::select! {
                slept = sqlx::raw_sql(BELL_SLEEP).execute(&mut conn) => slept,
                () = owner.stop.cancelled() => return,
            };
            match slept {
                Err(error) if number(&error) == Some(INTERRUPTED) => {
                    if owner.wakers.waited_names() <= FEW_NAMES {
                        owner.wakers.wake_all();
                    } else {
                        // In a task of its own: the bell goes back to sleep at once.
                        tokio::spawn(wake_free(owner.clone(), id));
                    }
                }
                Ok(_) => {
                    let mut state = self.state.lock().await;
                    // Under the lock, so a waiter that asks for the id now gets a new bell.
                    if owner.wakers.waited_names() == 0 {
                        state.id = None;
                        return;
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, bell = id, "the waiters' doorbell broke; they poll until it is set up again");
                    let mut state = self.state.lock().await;
                    state.id = None;
                    state.failed_at = Some(Instant::now());
                    drop(state);
                    // A ring may have been lost with the connection.
                    owner.wakers.wake_all();
                    return;
                }
            }
        }
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
pub(super) fn free_queued_sql(locks: &str, waiters: &str, now: &str) -> String {
    format!(
        "SELECT DISTINCT q.name FROM {waiters} q LEFT JOIN {locks} l ON l.name = q.name
         WHERE q.bell = ? AND (l.token IS NULL OR l.expires_at <= {now})"
    )
}

/// A connection of its own (outside the pool, where it would take a lock's place) and its id.
async fn connect(pool: &MySqlPool) -> sqlx::Result<(MySqlConnection, i64)> {
    let mut conn = pool.connect_options().connect().await?;
    let id: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
        .fetch_one(&mut conn)
        .await?;
    Ok((conn, id))
}

/// The statement that finds the bell of `waiters`' head for a name, and the id of the sleep
/// it is in (NULL between two sleeps). Binds: the name.
pub(super) fn head_bell_sql(waiters: &str, live_since: &str) -> String {
    format!(
        "SELECT h.bell, CAST(p.QUERY_ID AS SIGNED)
         FROM (SELECT bell FROM {waiters} WHERE name = ? AND seen > {live_since}
               ORDER BY since, token LIMIT 1) h
         LEFT JOIN information_schema.PROCESSLIST p ON p.ID = h.bell AND p.INFO = '{BELL_SLEEP}'"
    )
}

/// Rings the bell of the head of `name`'s queue (`head_bell`: [`head_bell_sql`]) unless it
/// is `own` (this client's waiters were woken in-process). Errors are logged: a missed ring
/// only delays the waiter until its next poll.
pub(super) async fn ring(pool: &MySqlPool, head_bell: &Arc<str>, name: &str, own: Option<i64>) {
    let mut pauses = BETWEEN_SLEEPS.iter();
    loop {
        let head: sqlx::Result<Option<(Option<i64>, Option<i64>)>> =
            sqlx::query_as(AssertSqlSafe(head_bell.clone()))
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
                    tracing::debug!(%name, bell, "a waiter's doorbell was not asleep; it finds the lock by polling");
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
            // Also when the sleep ended just before (ER_NO_SUCH_QUERY): its client is awake.
            tracing::debug!(%error, %name, "ringing a waiter's doorbell failed");
        }
        return;
    }
}
