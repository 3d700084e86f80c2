//! Lease-table mode: a row per held lock with an owner token, a fence and an expiry computed
//! by the database's clock; every change is one atomic statement, so it works through
//! transaction-mode poolers. Waiters are woken by NOTIFY on release, heard by one LISTEN
//! connection per client. Fences come from one sequence for the whole table, so a row whose
//! lease is over carries nothing worth keeping: each client's sweeper deletes such rows, and
//! stale waiter rows.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgListener;
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgExecutor, PgPool, Row};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::backend::gather::Gather;
use crate::backend::wait::{Attempt, Backoff};
use crate::backend::{
    AcquireRequest, Lease, LeaseCore, ListPage, ListQuery, LockInfo, MonitorStore, StoreLease,
};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::LockName;
use crate::sql_common::lease_table::{self, Extension, TableDialect, lock_info, next_cursor};
use crate::sql_common::{ModeStore, QueueSpot, SWEEP_BATCH, Sweeper, Wakers, ms, queued_hint};

use super::error::from_sqlx;
use statements::Statements;

mod statements;

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
    /// The values table beside the lock table, for fenced writes.
    values: super::values::PgValues,
    /// The NOTIFY channel: the table's name.
    channel: String,
    wakers: Arc<Wakers>,
    listener: Mutex<Option<JoinHandle<()>>>,
    sweeper: Sweeper,
    /// The keeper's renewals of one pass, sent as one statement.
    renewals: Gather<Extension, bool>,
    /// Stops the listener and the sweeper when the client is dropped.
    _stop: DropGuard,
    stop: CancellationToken,
}

impl LeaseStore {
    pub(super) fn new(pool: PgPool, table: &str, values: super::values::PgValues) -> LeaseStore {
        let stop = CancellationToken::new();
        LeaseStore {
            shared: Arc::new(Shared {
                pool,
                sql: Statements::new(table),
                values,
                channel: table.to_owned(),
                wakers: Arc::default(),
                listener: Mutex::new(None),
                sweeper: Sweeper::default(),
                renewals: Gather::default(),
                _stop: stop.clone().drop_guard(),
                stop,
            }),
        }
    }
}

#[async_trait]
impl ModeStore for LeaseStore {
    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        lease_table::acquire(&self.shared, req).await
    }
}

impl TableDialect for Shared {
    fn try_acquire(
        self: Arc<Self>,
        req: AcquireRequest,
        spot: Arc<QueueSpot>,
    ) -> impl Future<Output = Result<Attempt>> + Send + 'static {
        try_acquire(self, req, spot)
    }

    fn leave_queue(
        self: Arc<Self>,
        name: String,
        token: String,
    ) -> impl Future<Output = ()> + Send + 'static {
        leave_queue(self, name, token)
    }

    async fn sweep(self: Arc<Self>) -> Result<u64> {
        let mut deleted = 0;
        for sql in [&self.sql.sweep_locks, &self.sql.sweep_waiters] {
            let done = sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(SWEEP_BATCH)
                .execute(&self.pool)
                .await
                .map_err(from_sqlx)?;
            deleted = deleted.max(done.rows_affected());
        }
        Ok(deleted)
    }

    fn wakers(&self) -> &Wakers {
        &self.wakers
    }

    fn sweeper(&self) -> (&Sweeper, &CancellationToken) {
        (&self.sweeper, &self.stop)
    }

    /// NOTIFY covers every release: no polling.
    fn poll(&self) -> Option<Backoff> {
        None
    }

    fn before_wait(self: &Arc<Self>) {
        self.ensure_listener();
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
        let next = next_cursor(&locks, limit);
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
    /// Extends every lease of `batch` in one statement; for each, whether it is still owned.
    /// `None` when the statement failed: each lease then asks alone.
    async fn extend_all(&self, batch: Vec<Extension>) -> Option<Vec<bool>> {
        let mut columns = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (name, token, fence, ttl_ms) in &batch {
            columns.0.push(name.as_str());
            columns.1.push(token.as_str());
            columns.2.push(*fence);
            columns.3.push(*ttl_ms);
        }
        let rows = sqlx::query(AssertSqlSafe(self.sql.extend_all.clone()))
            .bind(&columns.0)
            .bind(&columns.1)
            .bind(&columns.2)
            .bind(&columns.3)
            .fetch_all(&self.pool)
            .await
            .map_err(
                |error| tracing::debug!(%error, "a gathered renewal failed; each lease asks alone"),
            )
            .ok()?;
        // A row that cannot be read fails the batch: no lease is taken for lost by mistake.
        let owned = rows
            .iter()
            .map(|row| {
                Some((
                    row.try_get(0).ok()?,
                    row.try_get(1).ok()?,
                    row.try_get(2).ok()?,
                ))
            })
            .collect::<Option<std::collections::HashSet<(String, String, i64)>>>()?;
        Some(
            batch
                .into_iter()
                .map(|(name, token, fence, _)| owned.contains(&(name, token, fence)))
                .collect(),
        )
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
    let name: String = row.try_get(0).map_err(from_sqlx)?;
    lock_info(row, name, from_sqlx)
}

#[async_trait]
impl Lease for TableLease {
    fn core(&self) -> &LeaseCore {
        self.lease_core()
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let shared = self.store();
        let extension = (self.name(), self.token(), self.fence().signed(), ms(ttl));
        if let Some(answer) = lease_table::extend_gathered(&shared.renewals, extension, |batch| {
            shared.extend_all(batch)
        })
        .await
        {
            return answer;
        }
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

    async fn put_fenced(&self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        let hold = (self.name(), self.token(), self.fence().signed());
        self.store()
            .values
            .put_fenced(hold, value.as_str(), bytes)
            .await
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
