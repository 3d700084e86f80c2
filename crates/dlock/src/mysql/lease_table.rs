//! Lease-table mode: a row per held lock with an owner token, a fence and an expiry computed
//! by the database's clock. Taking a free or expired row is one `UPDATE … WHERE` statement (a
//! new name first gets a free row); nothing relies on session state, so it works through
//! poolers. Waiters in this client are woken by its releases; a release that leaves waiters
//! of other clients rings the head's doorbell ([`super::bell`]), and polls back the rings
//! up. Fences come from one sequence for the whole table, so a row whose lease is over
//! carries nothing worth keeping: each client's sweeper deletes such rows, and stale waiter
//! rows.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, MySqlPool, Row};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::backend::gather::Gather;
use crate::backend::wait::{Attempt, Backoff};
use crate::backend::{
    AcquireRequest, Lease, LeaseCore, ListPage, ListQuery, LockInfo, MonitorStore, StoreLease,
};
use crate::error::Result;
use crate::fence::FencingToken;
use crate::name::LockName;
use crate::sql_common::lease_table::{self, Extension, TableDialect, lock_info, next_cursor};
use crate::sql_common::{
    ModeStore, QueueSpot, STARVATION_US, SWEEP_BATCH, Sweeper, WAITER_STALE_MS, Wakers, ms,
    queued_hint,
};

use super::bell::Bell;
use super::error::{from_sqlx, number};
pub(super) use statements::NOW;
use statements::Statements;

/// How often a statement chosen as a deadlock victim runs again before the error is the
/// attempt's.
const DEADLOCK_RETRIES: u32 = 5;

/// Runs a statement (an expression giving a `sqlx::Result`) again while InnoDB picks it as a
/// deadlock victim (1213) against the sweeper's range delete, another new name's row insert
/// or a grant: a victim was rolled back whole, so running it again is safe. Any other outcome
/// is returned as it is (with dlock's error).
macro_rules! unless_deadlocked {
    ($statement:expr) => {{
        let mut victim = 0;
        loop {
            match $statement {
                Err(e) if number(&e) == Some(1213) && victim < DEADLOCK_RETRIES => victim += 1,
                done => break done.map_err(from_sqlx),
            }
        }
    }};
}

mod hold;
mod renewals;
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
    pool: MySqlPool,
    sql: Statements,
    /// The values table beside the lock table, for fenced writes.
    values: super::values::MysqlValues,
    wakers: Arc<Wakers>,
    /// This client's doorbell, up while it has waiters.
    bell: Arc<Bell>,
    poll: Backoff,
    sweeper: Sweeper,
    /// The keeper's renewals of one pass, sent as one transaction.
    renewals: Gather<Extension, bool>,
    /// Stops the sweeper when the client is dropped.
    _stop: DropGuard,
    stop: CancellationToken,
}

fn us(d: Duration) -> i64 {
    ms(d).saturating_mul(1000)
}

impl LeaseStore {
    pub(super) fn new(
        pool: MySqlPool,
        table: &str,
        poll: Backoff,
        values: super::values::MysqlValues,
    ) -> LeaseStore {
        let stop = CancellationToken::new();
        let wakers = Arc::<Wakers>::default();
        let live_since = format!("{NOW} - {}", WAITER_STALE_MS * 1000);
        let waiters = super::schema::waiters_table(table);
        let bell = Bell::new(
            pool.clone(),
            wakers.clone(),
            stop.clone(),
            (table, &waiters, NOW, &live_since),
        );
        LeaseStore {
            shared: Arc::new(Shared {
                pool,
                sql: Statements::new(table),
                values,
                wakers,
                bell: Arc::new(bell),
                poll,
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

    /// The doorbell can miss a ring: polls back it up.
    fn poll(&self) -> Option<Backoff> {
        Some(self.poll)
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
            .bind(prefix)
            .bind(prefix)
            .bind(limit)
            .fetch_all(&self.shared.pool)
            .await
            .map_err(from_sqlx)?;
        let locks = rows.iter().map(to_info).collect::<Result<Vec<_>>>()?;
        let next = next_cursor(&locks, limit);
        Ok(ListPage::new(locks, next))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let done = unless_deadlocked!(
            sqlx::query(AssertSqlSafe(self.shared.sql.force_release.clone()))
                .bind(name.as_str())
                .execute(&self.shared.pool)
                .await
        )?;
        let broken = done.rows_affected() > 0;
        if broken {
            self.shared.wakers.wake(name.as_str());
            self.shared.bell.ring(name.as_str()).await;
        }
        Ok(broken)
    }
}

/// Removes a waiter that gave up, and wakes this client's other waiters of the name (the one
/// leaving may have been the head they defer to; other clients notice at their next poll).
async fn leave_queue(shared: Arc<Shared>, name: String, token: String) {
    let left = unless_deadlocked!(
        sqlx::query(AssertSqlSafe(shared.sql.leave.clone()))
            .bind(&name)
            .bind(&token)
            .execute(&shared.pool)
            .await
    );
    match left {
        Ok(done) if done.rows_affected() > 0 => shared.wakers.wake(&name),
        Ok(_) => {}
        Err(error) => {
            tracing::debug!(%error, %name, "leaving the waiter queue failed; the entry goes stale");
        }
    }
}

/// How often the head of the queue polls when its client has no doorbell (it could not be
/// set up): nothing else wakes it when another client releases, so it looks often. The
/// waiter `n` places behind polls `n + 1` times less often, and none less often than
/// `WAITER_REFRESH` (which keeps its entry alive). Waiters with a doorbell poll every
/// `poll_max`, a net under the rings.
const HEAD_POLL: Duration = Duration::from_millis(20);

/// How often a queued waiter rewrites its entry; its polls in between are reads.
const QUEUE_REWRITE: Duration = Duration::from_millis(250);

/// One attempt: take a free or expired row (or re-enter) unless a queued waiter comes first,
/// in one `UPDATE`; create the row for a new name; otherwise read the holder's time left and
/// the queue's head, and queue (or refresh) this waiter.
///
/// The grant is that single statement. A waiter granted after queueing deletes its entry
/// with a second one rather than in a transaction around both: until then the entry only
/// names the holder itself at the head, which defers nobody while it holds (and goes stale
/// if it crashes in between). So a free lock is still one round trip.
async fn try_acquire(
    shared: Arc<Shared>,
    req: AcquireRequest,
    spot: Arc<QueueSpot>,
) -> Result<Attempt> {
    let _gate = spot.gate.lock().await;
    let mut conn = shared.pool.acquire().await.map_err(from_sqlx)?;
    for _ in 1..LOOKS_PER_ATTEMPT {
        match look(&shared, &req, &spot, &mut conn).await? {
            Attempt::Busy {
                free_in: Some(again),
            } if again.is_zero() => {}
            outcome => return Ok(outcome),
        }
    }
    look(&shared, &req, &spot, &mut conn).await
}

/// How often one attempt looks again at once when its statements raced another client's (a
/// holder gone between the grant and the read, a new name taken by another client first).
/// The attempt of a request that does not wait is its only one: answering "busy" for a lock
/// that was free by then would be false.
const LOOKS_PER_ATTEMPT: u32 = 4;

/// One look of [`try_acquire`]; `Busy` in no time (`Some(ZERO)`) when it should look again.
async fn look(
    shared: &Arc<Shared>,
    req: &AcquireRequest,
    spot: &Arc<QueueSpot>,
    conn: &mut sqlx::MySqlConnection,
) -> Result<Attempt> {
    let start = Instant::now();
    let name = req.name.as_str();
    let waits = req.wait != crate::backend::Wait::No;
    let taken = take(shared, req, conn).await?;
    if taken.rows_affected() > 0 {
        let fence = i64::try_from(taken.last_insert_id()).unwrap_or(i64::MAX);
        return Ok(granted(shared, spot, conn, req, fence, start).await);
    }
    type BusyRow = (Option<i64>, Option<String>, Option<i64>, i64);
    let busy: Option<BusyRow> = sqlx::query_as(AssertSqlSafe(shared.sql.busy.clone()))
        .bind(&req.token)
        .bind(name)
        .bind(&req.token)
        .bind(name)
        .bind(name)
        .fetch_optional(&mut *conn)
        .await
        .map_err(from_sqlx)?;
    let Some((held_us, head, head_waited_us, ahead)) = busy else {
        // A new name (or one whose row was swept): create its free row and take it, in one
        // transaction only when the two statements alone lost the row to another client (or
        // the sweeper) in between: the common case stays two statements.
        insert_free_row(shared, req.name.as_str(), conn).await?;
        let mut taken = take(shared, req, conn).await?;
        if taken.rows_affected() == 0 {
            taken = create_and_take(shared, req, conn).await?;
        }
        if taken.rows_affected() > 0 {
            let fence = i64::try_from(taken.last_insert_id()).unwrap_or(i64::MAX);
            return Ok(granted(shared, spot, conn, req, fence, start).await);
        }
        // Another client created and took it first: look again at once.
        return Ok(Attempt::Busy {
            free_in: Some(Duration::ZERO),
        });
    };
    let held = held_us.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)));
    let head_is_other = head.as_ref().is_some_and(|h| *h != req.token);
    let starving =
        head_waited_us.is_some_and(|us| u128::try_from(us).is_ok_and(|us| us >= STARVATION_US));
    if held.is_none() && !(head_is_other && (req.fair || starving)) {
        // Freed between the two statements: look again at once.
        return Ok(Attempt::Busy {
            free_in: Some(Duration::ZERO),
        });
    }
    if !waits {
        return Ok(Attempt::Busy { free_in: held });
    }
    queue_up(shared, spot, conn, req, held, ahead).await
}

/// The grant: a waiter that had queued leaves the queue (a second statement, see
/// [`try_acquire`]), and the hold is handed out.
async fn granted(
    shared: &Arc<Shared>,
    spot: &QueueSpot,
    conn: &mut sqlx::MySqlConnection,
    req: &AcquireRequest,
    fence: i64,
    start: Instant,
) -> Attempt {
    let name = req.name.as_str();
    if spot.is_queued() {
        let dequeued = sqlx::query(AssertSqlSafe(shared.sql.dequeue.clone()))
            .bind(name)
            .bind(&req.token)
            .execute(&mut *conn)
            .await;
        if let Err(error) = dequeued {
            tracing::debug!(%error, %name, "leaving the waiter queue failed; the entry goes stale");
        }
        spot.set_queued(false);
    }
    Attempt::Acquired(Arc::new(TableLease::new(
        shared.clone(),
        name.to_owned(),
        req.token.clone(),
        LeaseCore::new(FencingToken::from_signed(fence), start),
    )))
}

/// A waiter of a busy lock: queues (or refreshes its entry), asks for a ring when it has a
/// doorbell, and says how long to sleep. `held` is the holder's time left, `ahead` how many
/// live waiters come first.
async fn queue_up(
    shared: &Shared,
    spot: &QueueSpot,
    conn: &mut sqlx::MySqlConnection,
    req: &AcquireRequest,
    held: Option<Duration>,
    ahead: i64,
) -> Result<Attempt> {
    let bell = shared.bell.id().await;
    if spot.refresh_due(QUEUE_REWRITE, bell) {
        sqlx::query(AssertSqlSafe(shared.sql.queue.clone()))
            .bind(req.name.as_str())
            .bind(&req.token)
            .bind(bell)
            .execute(&mut *conn)
            .await
            .map_err(from_sqlx)?;
        spot.set_queued(true);
        if bell.is_some() {
            sqlx::query(AssertSqlSafe(shared.sql.ring_on_release.clone()))
                .bind(req.name.as_str())
                .execute(&mut *conn)
                .await
                .map_err(from_sqlx)?;
            // A release between our look and these writes found nothing to ring: look again
            // at once, now that the entry is in and the row asks for a ring.
            return Ok(Attempt::Busy {
                free_in: Some(Duration::ZERO),
            });
        }
    }
    // With a doorbell, the release rings whoever heads the queue by then. Without one, the
    // head polls every HEAD_POLL, the next in line half as often, and so on: whoever will be
    // next soon learns soon that it is, without every waiter polling hot.
    let rank = u32::try_from(ahead).unwrap_or(u32::MAX).saturating_add(1);
    let poll = match bell {
        Some(_) => shared.poll.max,
        None => HEAD_POLL.saturating_mul(rank).min(shared.poll.max),
    };
    Ok(Attempt::Busy {
        free_in: Some(queued_hint(held, Some(poll))),
    })
}

/// The grant statement (see `Statements::new`): takes a free or expired row, or re-enters
/// this token's own live hold, unless a queued waiter comes first.
async fn take(
    shared: &Shared,
    req: &AcquireRequest,
    conn: &mut sqlx::MySqlConnection,
) -> Result<sqlx::mysql::MySqlQueryResult> {
    unless_deadlocked!(take_once(shared, req, &mut *conn).await)
}

/// Creates the free row of a new name (see `Statements::new`), again if it was a deadlock
/// victim.
async fn insert_free_row(
    shared: &Shared,
    name: &str,
    conn: &mut sqlx::MySqlConnection,
) -> Result<()> {
    let insert = &shared.sql.insert;
    unless_deadlocked!(
        sqlx::query(AssertSqlSafe(insert.clone()))
            .bind(name)
            .execute(&mut *conn)
            .await
    )
    .map(|_| ())
}

/// Creates the free row of a new name (see `Statements::new`) and takes it, in one
/// transaction: nothing comes between the two (the sweeper deleting a row whose grant a
/// loaded machine delayed; another client taking and releasing it), so a free name is never
/// answered "busy". Run again whole if InnoDB picks it as a deadlock victim.
async fn create_and_take(
    shared: &Shared,
    req: &AcquireRequest,
    conn: &mut sqlx::MySqlConnection,
) -> Result<sqlx::mysql::MySqlQueryResult> {
    unless_deadlocked!(create_and_take_once(shared, req, &mut *conn).await)
}

async fn create_and_take_once(
    shared: &Shared,
    req: &AcquireRequest,
    conn: &mut sqlx::MySqlConnection,
) -> sqlx::Result<sqlx::mysql::MySqlQueryResult> {
    use sqlx::Connection as _;
    let mut tx = conn.begin().await?;
    sqlx::query(AssertSqlSafe(shared.sql.insert.clone()))
        .bind(req.name.as_str())
        .execute(&mut *tx)
        .await?;
    let taken = take_once(shared, req, &mut tx).await?;
    tx.commit().await?;
    Ok(taken)
}

async fn take_once(
    shared: &Shared,
    req: &AcquireRequest,
    conn: &mut sqlx::MySqlConnection,
) -> sqlx::Result<sqlx::mysql::MySqlQueryResult> {
    let name = req.name.as_str();
    let ttl = us(req.ttl);
    let mut take = sqlx::query(AssertSqlSafe(shared.sql.take.clone()));
    // One binding per `?`, in order: the six `held_by_me` tests interleave with the values.
    take = take.bind(&req.token); // fence
    // holds: a re-entry counts one more; a retry whose granting reply was lost, none.
    take = take.bind(&req.token).bind(i64::from(req.reentrant));
    take = take.bind(&req.token); // acquired_at
    take = take.bind(&req.token).bind(req.owner.label.as_deref());
    take = take.bind(&req.token).bind(&req.owner.host);
    take = take.bind(&req.token).bind(i64::from(req.owner.pid));
    take = take.bind(&req.token).bind(name).bind(&req.token); // ring_on_release
    take = take.bind(&req.token).bind(ttl).bind(ttl);
    take = take.bind(&req.token).bind(name);
    take = take.bind(&req.token).bind(req.fair).bind(name); // blocked
    take = take.bind(&req.token); // our own live grant (re-entry or retry)
    take.execute(conn).await
}

fn to_info(row: &MySqlRow) -> Result<LockInfo> {
    let name: Vec<u8> = row.try_get(0).map_err(from_sqlx)?;
    lock_info(row, String::from_utf8_lossy(&name).into_owned(), from_sqlx)
}
