//! Lease-table mode: a row per held lock with an owner token, a fence and an expiry computed
//! by the database's clock; every change is one atomic statement, so it works through
//! transaction-mode poolers. Waiters are woken by NOTIFY on release, heard by one LISTEN
//! connection per client. Fences come from one sequence for the whole table, so a row whose
//! lease is over carries nothing worth keeping: each client's sweeper deletes such rows, and
//! stale waiter rows.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::postgres::PgListener;
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgExecutor, PgPool, Row};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::backend::wait::{Attempt, Backoff, acquire_loop};
use crate::backend::{
    AcquireRequest, Lease, LeaseCore, ListPage, ListQuery, LockInfo, MonitorStore, StoreLease,
};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};
use crate::sql_common::{
    LeaveQueue, ModeStore, QueueSpot, STARVATION_US, SWEEP_BATCH, Sweeper, WAITER_STALE_MS, Wakers,
    detached_attempt, ms, queued_hint,
};

use super::error::from_sqlx;

/// The statements, with the table name spliced in once.
#[derive(Debug)]
struct Statements {
    acquire: Arc<str>,
    leave: Arc<str>,
    release: Arc<str>,
    extend: Arc<str>,
    force_release: Arc<str>,
    inspect: Arc<str>,
    list: Arc<str>,
    sweep_locks: Arc<str>,
    sweep_waiters: Arc<str>,
}

impl Statements {
    fn new(t: &str) -> Statements {
        // `l.*` is the row before the change. The same token on a live row keeps the fence:
        // a re-entry ($7) counts a hold, a retry whose granting reply was lost takes its grant
        // as it is; anything else that passes the WHERE is a fresh hold of a free or expired
        // row (or of a new one): its fence is the table's sequence's next value.
        //
        // That value is drawn under a transaction-level advisory lock on the name, so the
        // acquire statements of one name run one after another: a later grant's fence is
        // drawn after an earlier grant committed, so it is higher, even when the sweeper
        // deleted the row in between (a fence drawn by a statement that then stalled before
        // inserting could otherwise be lower than one a quicker statement gave out meanwhile).
        // The two-key form keeps clear of session mode's one-key advisory locks.
        let w = super::schema::waiters_table(t);
        let seq = super::schema::fence_sequence(t);
        let name_lock = format!("pg_advisory_xact_lock(hashtext('{t}'), hashtext($1))");
        // The waiter queue: `head` is the oldest live waiter (entries not refreshed for
        // WAITER_STALE are ignored, and swept by the next grant). A free lock goes to anyone
        // only while nobody else heads the queue, or (unfair) while the head has waited
        // under the starvation threshold. The snapshot read of the queue is enough: a waiter
        // queueing concurrently arrived after this attempt.
        let acquire = format!(
            "WITH head AS (
                SELECT token, since FROM {w}
                WHERE name = $1 AND seen > now() - interval '{WAITER_STALE_MS} milliseconds'
                ORDER BY since, token LIMIT 1
            ), granted AS (
                INSERT INTO {t} AS l (name, hold_fence, token, holds, expires_at, acquired_at, owner_label, host, pid)
                VALUES ($1, (SELECT nextval('{seq}') FROM (SELECT {name_lock}) AS locked),
                        $2, 1, now() + $3 * interval '1 millisecond', now(), $4, $5, $6)
                ON CONFLICT (name) DO UPDATE SET
                    hold_fence = CASE WHEN l.token = EXCLUDED.token AND l.expires_at > now()
                                 THEN l.hold_fence ELSE EXCLUDED.hold_fence END,
                    holds = CASE WHEN l.token = EXCLUDED.token AND l.expires_at > now()
                                 THEN l.holds + (CASE WHEN $7 THEN 1 ELSE 0 END) ELSE 1 END,
                    expires_at = CASE WHEN l.token = EXCLUDED.token AND l.expires_at > now()
                                 THEN GREATEST(l.expires_at, EXCLUDED.expires_at) ELSE EXCLUDED.expires_at END,
                    acquired_at = CASE WHEN l.token = EXCLUDED.token AND l.expires_at > now()
                                 THEN l.acquired_at ELSE EXCLUDED.acquired_at END,
                    token = EXCLUDED.token, owner_label = EXCLUDED.owner_label,
                    host = EXCLUDED.host, pid = EXCLUDED.pid
                WHERE ((l.token IS NULL OR l.expires_at <= now())
                       AND NOT EXISTS (SELECT 1 FROM head WHERE head.token <> $2
                           AND ($8 OR head.since <= now() - interval '{STARVATION_US} microseconds')))
                   OR (l.token = EXCLUDED.token AND l.expires_at > now())
                RETURNING hold_fence
            ), queued AS (
                INSERT INTO {w} (name, token, since, seen)
                SELECT $1, $2, now(), now() WHERE $9 AND NOT EXISTS (SELECT 1 FROM granted)
                ON CONFLICT (name, token) DO UPDATE SET seen = EXCLUDED.seen
                RETURNING 1
            ), left_queue AS (
                DELETE FROM {w}
                WHERE name = $1 AND EXISTS (SELECT 1 FROM granted)
                  AND (token = $2 OR seen <= now() - interval '{WAITER_STALE_MS} milliseconds')
            )
            SELECT (SELECT hold_fence FROM granted),
                   (SELECT GREATEST(0, ceil(extract(epoch FROM expires_at - now()) * 1000))::bigint
                      FROM {t} WHERE name = $1 AND token IS NOT NULL AND expires_at > now()),
                   EXISTS (SELECT 1 FROM queued)"
        );
        // A waiter giving up: if the lock is free, whoever is next may be waiting for it.
        let leave = format!(
            "WITH gone AS (
                DELETE FROM {w} WHERE name = $1 AND token = $2 RETURNING name
            )
            SELECT (SELECT 1 FROM pg_notify($3, $1)) FROM gone
            WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE name = $1 AND token IS NOT NULL
                                                  AND expires_at > now())"
        );
        // NOTIFY is sent at commit, so a woken waiter finds the row already free.
        let release = format!(
            "WITH released AS (
                UPDATE {t} SET holds = holds - 1,
                    token = CASE WHEN holds > 1 THEN token END,
                    expires_at = CASE WHEN holds > 1 THEN expires_at ELSE now() END
                WHERE name = $1 AND token = $2 AND hold_fence = $3 AND expires_at > now()
                RETURNING holds
            )
            SELECT holds, CASE WHEN holds = 0 THEN (SELECT 1 FROM pg_notify($4, $1)) END
            FROM released"
        );
        let extend = format!(
            "UPDATE {t} SET expires_at = GREATEST(expires_at, now() + $4 * interval '1 millisecond')
             WHERE name = $1 AND token = $2 AND hold_fence = $3 AND expires_at > now()"
        );
        let force_release = format!(
            "WITH broken AS (
                UPDATE {t} SET token = NULL, holds = 0, expires_at = now()
                WHERE name = $1 AND token IS NOT NULL AND expires_at > now()
                RETURNING name
            )
            SELECT (SELECT 1 FROM pg_notify($2, $1)) FROM broken"
        );
        // The last column counts the name's live waiters (the holder left the queue when
        // it was granted).
        let columns = format!(
            "name, hold_fence, holds,
            (extract(epoch FROM acquired_at) * 1000000)::bigint,
            GREATEST(0, floor(extract(epoch FROM expires_at - now()) * 1000))::bigint,
            owner_label, host, pid,
            (SELECT count(*) FROM {w} q WHERE q.name = l.name
                AND q.seen > now() - interval '{WAITER_STALE_MS} milliseconds')"
        );
        let inspect = format!(
            "SELECT {columns} FROM {t} l
             WHERE name = $1 AND token IS NOT NULL AND expires_at > now()"
        );
        let list = format!(
            "SELECT {columns} FROM {t} l
             WHERE name >= $1 AND name > $2 AND starts_with(name, $1)
               AND token IS NOT NULL AND expires_at > now()
             ORDER BY name LIMIT $3"
        );
        // Rows whose lease is over (released, broken or expired: `expires_at` is in the past
        // for all three), oldest first by the expiry index; rows another statement has locked
        // are skipped, not waited for. Nothing is lost: the fence comes from the sequence, and
        // the holder of an ended lease is refused with or without its row.
        let sweep_locks = format!(
            "WITH ended AS (
                SELECT name FROM {t} WHERE expires_at <= now()
                ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
            )
            DELETE FROM {t} l USING ended WHERE l.name = ended.name AND l.expires_at <= now()"
        );
        let sweep_waiters = format!(
            "WITH gone AS (
                SELECT name, token FROM {w}
                WHERE seen <= now() - interval '{WAITER_STALE_MS} milliseconds'
                ORDER BY seen LIMIT $1 FOR UPDATE SKIP LOCKED
            )
            DELETE FROM {w} q USING gone WHERE q.name = gone.name AND q.token = gone.token"
        );
        Statements {
            sweep_locks: sweep_locks.into(),
            sweep_waiters: sweep_waiters.into(),
            acquire: acquire.into(),
            leave: leave.into(),
            release: release.into(),
            extend: extend.into(),
            force_release: force_release.into(),
            inspect: inspect.into(),
            list: list.into(),
        }
    }
}

/// One hold of a row in the lease table.
type TableLease = StoreLease<Shared>;

/// The lease-table store of one client.
#[derive(Debug)]
pub(crate) struct LeaseStore {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    pool: PgPool,
    sql: Statements,
    /// The NOTIFY channel: the table's name.
    channel: String,
    wakers: Arc<Wakers>,
    listener: Mutex<Option<JoinHandle<()>>>,
    sweeper: Sweeper,
    /// Stops the listener and the sweeper when the client is dropped.
    _stop: DropGuard,
    stop: CancellationToken,
}

impl LeaseStore {
    pub(super) fn new(pool: PgPool, table: &str) -> LeaseStore {
        let stop = CancellationToken::new();
        LeaseStore {
            shared: Arc::new(Shared {
                pool,
                sql: Statements::new(table),
                channel: table.to_owned(),
                wakers: Arc::default(),
                listener: Mutex::new(None),
                sweeper: Sweeper::default(),
                _stop: stop.clone().drop_guard(),
                stop,
            }),
        }
    }
}

#[async_trait]
impl ModeStore for LeaseStore {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        let shared = &self.shared;
        shared.ensure_sweeper();
        let spot = Arc::new(QueueSpot::default());
        let leave = LeaveQueue::new(
            spot.clone(),
            leave_queue(
                shared.clone(),
                req.name.as_str().to_owned(),
                req.token.clone(),
            ),
        );
        let acquired = acquire_loop(
            req.wait,
            None,
            || detached_attempt(try_acquire(shared.clone(), req.clone(), spot.clone())),
            || {
                shared.ensure_listener();
                let mut changed = shared.wakers.subscribe(req.name.as_str());
                async move {
                    let _ = changed.changed().await;
                }
            },
        )
        .await;
        leave.after(matches!(acquired, Ok(Some(_)))).await;
        acquired
    }
}

#[async_trait]
impl MonitorStore for LeaseStore {
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let row = sqlx::query(AssertSqlSafe(self.shared.sql.inspect.clone()))
            .bind(name.as_str())
            .fetch_optional(&self.shared.pool)
            .await
            .map_err(from_sqlx)?;
        row.map(|r| to_info(&r)).transpose()
    }

    async fn list_page(&self, query: ListQuery<'_>) -> Result<ListPage> {
        let (prefix, cursor, limit) = (query.prefix, query.cursor, query.limit);
        let limit = i64::try_from(limit.max(1)).unwrap_or(i64::MAX);
        let rows = sqlx::query(AssertSqlSafe(self.shared.sql.list.clone()))
            .bind(prefix)
            .bind(cursor.unwrap_or_default())
            .bind(limit)
            .fetch_all(&self.shared.pool)
            .await
            .map_err(from_sqlx)?;
        let locks = rows.iter().map(to_info).collect::<Result<Vec<_>>>()?;
        let full = i64::try_from(locks.len()).unwrap_or(i64::MAX) >= limit;
        let next = full.then(|| locks.last().map(|l| l.name.clone())).flatten();
        Ok(ListPage::new(locks, next))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let rows = sqlx::query(AssertSqlSafe(self.shared.sql.force_release.clone()))
            .bind(name.as_str())
            .bind(&self.shared.channel)
            .fetch_all(&self.shared.pool)
            .await
            .map_err(from_sqlx)?;
        if rows.is_empty() {
            return Ok(false);
        }
        self.shared.wakers.wake(name.as_str());
        Ok(true)
    }
}

impl Shared {
    /// Starts this client's sweeper (see [`Sweeper`]); it holds the shared state weakly, so
    /// it never keeps a dropped client alive.
    fn ensure_sweeper(self: &Arc<Self>) {
        let shared = Arc::downgrade(self);
        self.sweeper.ensure(&self.stop, move || {
            let shared = shared.clone();
            async move {
                let Some(shared) = shared.upgrade() else {
                    return Ok(0);
                };
                let mut deleted = 0;
                for sql in [&shared.sql.sweep_locks, &shared.sql.sweep_waiters] {
                    let done = sqlx::query(AssertSqlSafe(sql.clone()))
                        .bind(SWEEP_BATCH)
                        .execute(&shared.pool)
                        .await
                        .map_err(from_sqlx)?;
                    deleted = deleted.max(done.rows_affected());
                }
                Ok(deleted)
            }
        });
    }

    /// Starts the LISTEN task with the first waiter, and again if it ended (its runtime
    /// shut down under it).
    fn ensure_listener(self: &Arc<Self>) {
        let mut slot = self.listener.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        *slot = Some(runtime.spawn(listen(
            self.pool.clone(),
            self.channel.clone(),
            Arc::downgrade(&self.wakers),
            self.stop.clone(),
        )));
    }
}

/// Hears every release of the table (NOTIFY carries the name) and wakes this client's waiters
/// of that name. After any gap (connecting, reconnecting) it wakes every waiter, since
/// notifications may have been missed; the waiters' own timers cover the rest.
async fn listen(pool: PgPool, channel: String, wakers: Weak<Wakers>, stop: CancellationToken) {
    let mut backoff = Backoff::steady(Duration::from_millis(50), Duration::from_secs(2));
    loop {
        let connected = async {
            let mut listener = PgListener::connect_with(&pool).await?;
            listener.listen(&channel).await?;
            Ok::<_, sqlx::Error>(listener)
        };
        let mut listener = tokio::select! {
            () = stop.cancelled() => return,
            connected = connected => match connected {
                Ok(listener) => listener,
                Err(error) => {
                    tracing::debug!(%error, "LISTEN failed; waiters poll until it is back");
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(backoff.next()) => {}
                    }
                    continue;
                }
            },
        };
        backoff.reset();
        let Some(w) = wakers.upgrade() else { return };
        w.wake_all();
        drop(w);
        loop {
            let received = tokio::select! {
                () = stop.cancelled() => return,
                received = listener.try_recv() => received,
            };
            let Some(w) = wakers.upgrade() else { return };
            match received {
                Ok(Some(notification)) => w.wake(notification.payload()),
                // The connection dropped; the next call reconnects and listens again.
                Ok(None) => w.wake_all(),
                Err(error) => {
                    tracing::debug!(%error, "LISTEN connection lost");
                    w.wake_all();
                    break;
                }
            }
        }
    }
}

/// Removes a waiter that gave up; NOTIFY (in the statement) and a local wake-up tell the
/// others when the lock is free, since the one leaving may have been the head they defer to.
async fn leave_queue(shared: Arc<Shared>, name: String, token: String) {
    let left = sqlx::query(AssertSqlSafe(shared.sql.leave.clone()))
        .bind(&name)
        .bind(&token)
        .bind(&shared.channel)
        .fetch_optional(&shared.pool)
        .await;
    match left {
        Ok(Some(_)) => shared.wakers.wake(&name),
        Ok(None) => {}
        Err(error) => {
            tracing::debug!(%error, %name, "leaving the waiter queue failed; the entry goes stale");
        }
    }
}

/// One attempt: a single statement that takes the lock if it is free and nobody queued
/// comes first, and otherwise queues (or refreshes) this waiter.
async fn try_acquire(
    shared: Arc<Shared>,
    req: AcquireRequest,
    spot: Arc<QueueSpot>,
) -> Result<Attempt> {
    let _gate = spot.gate.lock().await;
    let start = Instant::now();
    let waits = req.wait != crate::backend::Wait::No;
    let row = sqlx::query(AssertSqlSafe(shared.sql.acquire.clone()))
        .bind(req.name.as_str())
        .bind(&req.token)
        .bind(ms(req.ttl))
        .bind(req.owner.label.as_deref())
        .bind(&req.owner.host)
        .bind(i64::from(req.owner.pid))
        .bind(req.reentrant)
        .bind(req.fair)
        .bind(waits)
        .fetch_one(&shared.pool)
        .await
        .map_err(from_sqlx)?;
    let granted: Option<i64> = row.try_get(0).map_err(from_sqlx)?;
    let free_in: Option<i64> = row.try_get(1).map_err(from_sqlx)?;
    let queued: bool = row.try_get(2).map_err(from_sqlx)?;
    let free_in = free_in.map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
    Ok(match granted {
        Some(fence) => {
            // The same statement took this waiter out of the queue.
            spot.set_queued(false);
            Attempt::Acquired(Arc::new(TableLease::new(
                shared,
                req.name.as_str().to_owned(),
                req.token,
                LeaseCore::new(FencingToken::from_signed(fence), start),
            )))
        }
        None if queued => {
            spot.set_queued(true);
            // NOTIFY wakes a queued waiter; the hint only keeps its entry fresh.
            Attempt::Busy {
                free_in: Some(queued_hint(free_in, None)),
            }
        }
        None => Attempt::Busy { free_in },
    })
}

fn to_info(row: &sqlx::postgres::PgRow) -> Result<LockInfo> {
    let get = |e: sqlx::Error| from_sqlx(e);
    let name: String = row.try_get(0).map_err(get)?;
    let fence_value: i64 = row.try_get(1).map_err(get)?;
    let holds: i32 = row.try_get(2).map_err(get)?;
    let acquired_us: i64 = row.try_get(3).map_err(get)?;
    let left_ms: i64 = row.try_get(4).map_err(get)?;
    let label: Option<String> = row.try_get(5).map_err(get)?;
    let host: Option<String> = row.try_get(6).map_err(get)?;
    let pid: Option<i64> = row.try_get(7).map_err(get)?;
    let waiters: i64 = row.try_get(8).map_err(get)?;
    Ok(LockInfo::new(
        name,
        FencingToken::from_signed(fence_value),
        Owner::from_columns(label, host, pid),
        UNIX_EPOCH + Duration::from_micros(u64::try_from(acquired_us).unwrap_or(0)),
        Some(Duration::from_millis(u64::try_from(left_ms).unwrap_or(0))),
        u32::try_from(holds).unwrap_or(0),
    )
    .with_waiters(u32::try_from(waiters).unwrap_or(u32::MAX)))
}

#[async_trait]
impl Lease for TableLease {
    fn core(&self) -> &LeaseCore {
        self.lease_core()
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let shared = self.store();
        let done = sqlx::query(AssertSqlSafe(shared.sql.extend.clone()))
            .bind(self.name())
            .bind(self.token())
            .bind(self.fence().signed())
            .bind(ms(ttl))
            .execute(&shared.pool)
            .await
            .map_err(from_sqlx)?;
        if done.rows_affected() == 0 {
            return Err(Error::not_owned(self.name()));
        }
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        self.release_on(&self.store().pool).await
    }

    async fn release_elsewhere(&self) -> Result<()> {
        // The pool's connections are driven by the client's runtime, which is shutting down
        // and may never answer: one fresh connection on this runtime, for this one statement.
        let options = self.store().pool.connect_options();
        let mut connection = PgConnection::connect_with(&options)
            .await
            .map_err(from_sqlx)?;
        let released = self.release_on(&mut connection).await;
        // The release is done (or failed) either way; a failed goodbye only drops the socket.
        let _ = connection.close().await;
        released
    }
}

impl TableLease {
    /// The release statement on `executor`, which also notifies other clients' waiters.
    async fn release_on<'e>(&self, executor: impl PgExecutor<'e>) -> Result<()> {
        let shared = self.store();
        let left: Option<i32> = sqlx::query_scalar(AssertSqlSafe(shared.sql.release.clone()))
            .bind(self.name())
            .bind(self.token())
            .bind(self.fence().signed())
            .bind(&shared.channel)
            .fetch_optional(executor)
            .await
            .map_err(from_sqlx)?;
        match left {
            None => Err(Error::not_owned(self.name())),
            Some(left) => {
                if left == 0 {
                    // NOTIFY reaches the other clients; wake our own waiters at once.
                    shared.wakers.wake(self.name());
                }
                Ok(())
            }
        }
    }
}
