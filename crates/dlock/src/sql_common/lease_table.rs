//! What the lease tables of PostgreSQL and MySQL drive the same way: an acquire call (its
//! queue spot, each attempt in a task of its own, leaving the queue however the call ends),
//! the sweeper, and the lock columns read as a [`LockInfo`]. The statements, and how an
//! attempt runs them, stay each dialect's.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use sqlx::{ColumnIndex, Decode, Row, Type};
use tokio_util::sync::CancellationToken;

use super::{LeaveQueue, QueueSpot, Sweeper, Wakers, detached_attempt};
use crate::backend::wait::{Attempt, Backoff, acquire_loop};
use crate::backend::{AcquireRequest, Lease, LockInfo};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::Owner;

/// One extension of a gathered renewal: the lock's name, the hold's token, its fence and the
/// TTL in the dialect's unit.
pub(crate) type Extension = (String, String, i64, i64);

/// Asks for the extension of the hold of `name` by `token` (`fence`, `ttl` in the dialect's
/// unit) with the others of the keeper's pass (`send` runs the batch as one statement or
/// transaction, answering whether each is still owned). `None` when the batch failed: the
/// caller then extends alone, so that this lease gets its own error.
pub(crate) async fn extend_gathered<F, Fut>(
    renewals: &crate::backend::gather::Gather<Extension, bool>,
    (name, token, fence, ttl): (&str, &str, i64, i64),
    send: F,
) -> Option<Result<()>>
where
    F: FnOnce(Vec<Extension>) -> Fut,
    Fut: Future<Output = Option<Vec<bool>>>,
{
    let extension = (name.to_owned(), token.to_owned(), fence, ttl);
    match renewals.request(extension, send).await? {
        true => Some(Ok(())),
        false => Some(Err(Error::not_owned(name))),
    }
}

/// One client's lease table in one dialect: what [`acquire`] and [`ensure_sweeper`] need.
pub(crate) trait TableDialect: Send + Sync + Sized + 'static {
    /// One attempt: take the lock, or queue (or refresh) this waiter.
    fn try_acquire(
        self: Arc<Self>,
        req: AcquireRequest,
        spot: Arc<QueueSpot>,
    ) -> impl Future<Output = Result<Attempt>> + Send + 'static;

    /// Removes a waiter that gave up, and wakes whoever may be next.
    fn leave_queue(
        self: Arc<Self>,
        name: String,
        token: String,
    ) -> impl Future<Output = ()> + Send + 'static;

    /// One sweep pass over both tables: how many rows the fuller batch deleted.
    fn sweep(self: Arc<Self>) -> impl Future<Output = Result<u64>> + Send;

    /// This client's in-process wake-ups.
    fn wakers(&self) -> &Wakers;

    /// This client's sweeper, and what stops it.
    fn sweeper(&self) -> (&Sweeper, &CancellationToken);

    /// Polling behind the wake-ups, where they can miss a release.
    fn poll(&self) -> Option<Backoff>;

    /// Before each wait: PostgreSQL starts its LISTEN task with the first waiter.
    fn before_wait(self: &Arc<Self>) {}
}

/// An acquire call on a lease table: attempts until the lock is ours or the wait is over,
/// woken by this client's releases and the dialect's own wake-ups; leaves the queue before
/// answering without the lock (and, if the call is dropped, in a task of its own).
pub(crate) async fn acquire<T: TableDialect>(
    shared: &Arc<T>,
    req: &AcquireRequest,
) -> Result<Option<Arc<dyn Lease>>> {
    ensure_sweeper(shared);
    let spot = Arc::new(QueueSpot::default());
    let leave = LeaveQueue::new(
        spot.clone(),
        shared
            .clone()
            .leave_queue(req.name.as_str().to_owned(), req.token.clone()),
    );
    let acquired = acquire_loop(
        req.wait,
        shared.poll(),
        || detached_attempt(shared.clone().try_acquire(req.clone(), spot.clone())),
        || {
            shared.before_wait();
            let mut changed = shared.wakers().subscribe(req.name.as_str());
            async move {
                let _ = changed.changed().await;
            }
        },
    )
    .await;
    leave.after(matches!(acquired, Ok(Some(_)))).await;
    acquired
}

/// Starts this client's sweeper (see [`Sweeper`]); it holds the shared state weakly, so it
/// never keeps a dropped client alive.
pub(crate) fn ensure_sweeper<T: TableDialect>(shared: &Arc<T>) {
    let weak = Arc::downgrade(shared);
    let (sweeper, stop) = shared.sweeper();
    sweeper.ensure(stop, move || {
        let weak = weak.clone();
        async move {
            match weak.upgrade() {
                Some(shared) => shared.sweep().await,
                None => Ok(0),
            }
        }
    });
}

/// A row of the lock columns both dialects select (name, fence, holds, acquired in µs, ms
/// left, owner label, host, pid, live waiters), with the name already read: PostgreSQL keeps
/// it as text, MySQL as bytes.
pub(crate) fn lock_info<R>(row: &R, name: String, map: fn(sqlx::Error) -> Error) -> Result<LockInfo>
where
    R: Row,
    usize: ColumnIndex<R>,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> i32: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> String: Decode<'r, R::Database> + Type<R::Database>,
{
    let fence_value: i64 = row.try_get(1).map_err(map)?;
    let holds: i32 = row.try_get(2).map_err(map)?;
    let acquired_us: i64 = row.try_get(3).map_err(map)?;
    let left_ms: i64 = row.try_get(4).map_err(map)?;
    let label: Option<String> = row.try_get(5).map_err(map)?;
    let host: Option<String> = row.try_get(6).map_err(map)?;
    let pid: Option<i64> = row.try_get(7).map_err(map)?;
    let waiters: i64 = row.try_get(8).map_err(map)?;
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

/// The cursor after a page of `locks`: its last name when the page is full (`limit`), since
/// more may follow.
pub(crate) fn next_cursor(locks: &[LockInfo], limit: i64) -> Option<String> {
    let full = i64::try_from(locks.len()).unwrap_or(i64::MAX) >= limit;
    full.then(|| locks.last().map(|l| l.name.clone())).flatten()
}
