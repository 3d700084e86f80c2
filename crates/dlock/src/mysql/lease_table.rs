//! Lease-table mode: a row per lock with an owner token, a fence and an expiry computed by
//! the database's clock. Taking a free or expired row is one `UPDATE … WHERE` statement (a new
//! name is one `INSERT`); nothing relies on session state, so it works through poolers.
//! Waiters in this client are woken by its releases; others poll with jittered backoff.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::mysql::MySqlRow;
use sqlx::{AssertSqlSafe, MySqlPool, Row};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{AcquireRequest, Lease, ListPage, LockInfo};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};
use crate::sql_common::{Wakers, detached_attempt, fence, ms};
use crate::wait::{Attempt, Backoff, acquire_loop};

use super::error::{from_sqlx, number};

/// The database's clock in microseconds since the Unix epoch, in UTC whatever the session's
/// time zone. `UTC_TIMESTAMP(6)` is fixed for the whole statement.
const NOW: &str = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

#[derive(Debug)]
struct Statements {
    take: Arc<str>,
    insert: Arc<str>,
    busy: Arc<str>,
    release: Arc<str>,
    extend: Arc<str>,
    force_release: Arc<str>,
    inspect: Arc<str>,
    list: Arc<str>,
}

impl Statements {
    fn new(t: &str) -> Statements {
        // `held_by_me`: re-entry of a live hold by the same token. MySQL evaluates SET from
        // left to right with the new values (MariaDB's SIMULTANEOUS_ASSIGNMENT with the old
        // ones): every condition reads only `token` and `expires_at`, which are assigned last,
        // so both orders give the same result. LAST_INSERT_ID(x) returns the fence in the OK
        // packet, so no second statement is needed.
        let held_by_me = format!("(token <=> ? AND expires_at > {NOW})");
        let take = format!(
            "UPDATE {t} SET
                fence = LAST_INSERT_ID(IF({held_by_me}, fence, fence + 1)),
                holds = IF({held_by_me}, holds + 1, 1),
                acquired_at = IF({held_by_me}, acquired_at, {NOW}),
                owner_label = IF({held_by_me}, owner_label, ?),
                host = IF({held_by_me}, host, ?),
                pid = IF({held_by_me}, pid, ?),
                expires_at = IF({held_by_me}, GREATEST(expires_at, {NOW} + ?), {NOW} + ?),
                token = ?
             WHERE name = ? AND (token IS NULL OR expires_at <= {NOW} OR (? AND token <=> ?))"
        );
        let insert = format!(
            "INSERT INTO {t} (name, fence, token, holds, expires_at, acquired_at, owner_label, host, pid)
             VALUES (?, 1, ?, 1, {NOW} + ?, {NOW}, ?, ?, ?)"
        );
        let busy = format!(
            "SELECT GREATEST(0, IF(token IS NULL, 0, expires_at - {NOW})) FROM {t} WHERE name = ?"
        );
        // Token and expiry first (reading the old hold count), the count last.
        let release = format!(
            "UPDATE {t} SET
                token = IF(holds > 1, token, NULL),
                expires_at = IF(holds > 1, expires_at, {NOW}),
                holds = LAST_INSERT_ID(holds - 1)
             WHERE name = ? AND token = ? AND fence = ? AND expires_at > {NOW}"
        );
        let extend = format!(
            "UPDATE {t} SET expires_at = GREATEST(expires_at, {NOW} + ?)
             WHERE name = ? AND token = ? AND fence = ? AND expires_at > {NOW}"
        );
        let force_release = format!(
            "UPDATE {t} SET token = NULL, holds = 0, expires_at = {NOW}
             WHERE name = ? AND token IS NOT NULL AND expires_at > {NOW}"
        );
        let columns = format!(
            "name, fence, holds, acquired_at, GREATEST(0, expires_at - {NOW}) DIV 1000, owner_label, host, pid"
        );
        let inspect = format!(
            "SELECT {columns} FROM {t} WHERE name = ? AND token IS NOT NULL AND expires_at > {NOW}"
        );
        let list = format!(
            "SELECT {columns} FROM {t}
             WHERE name >= ? AND name > ? AND LEFT(name, LENGTH(?)) = ?
               AND token IS NOT NULL AND expires_at > {NOW}
             ORDER BY name LIMIT ?"
        );
        Statements {
            take: take.into(),
            insert: insert.into(),
            busy: busy.into(),
            release: release.into(),
            extend: extend.into(),
            force_release: force_release.into(),
            inspect: inspect.into(),
            list: list.into(),
        }
    }
}

/// The lease-table store of one client.
#[derive(Debug)]
pub(super) struct LeaseStore {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    pool: MySqlPool,
    sql: Statements,
    wakers: Wakers,
    poll: Backoff,
}

fn us(d: Duration) -> i64 {
    ms(d).saturating_mul(1000)
}

impl LeaseStore {
    pub(super) fn new(pool: MySqlPool, table: &str, poll: Backoff) -> LeaseStore {
        LeaseStore {
            shared: Arc::new(Shared {
                pool,
                sql: Statements::new(table),
                wakers: Wakers::default(),
                poll,
            }),
        }
    }

    pub(super) async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        let shared = &self.shared;
        acquire_loop(
            req.wait,
            Some(shared.poll),
            || detached_attempt(try_acquire(shared.clone(), req.clone())),
            || {
                let mut changed = shared.wakers.subscribe(req.name.as_str());
                async move {
                    let _ = changed.changed().await;
                }
            },
        )
        .await
    }

    pub(super) async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let row = sqlx::query(AssertSqlSafe(self.shared.sql.inspect.clone()))
            .bind(name.as_str())
            .fetch_optional(&self.shared.pool)
            .await
            .map_err(from_sqlx)?;
        row.map(|r| to_info(&r)).transpose()
    }

    pub(super) async fn list_page(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ListPage> {
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
        let full = i64::try_from(locks.len()).unwrap_or(i64::MAX) >= limit;
        let next = full.then(|| locks.last().map(|l| l.name.clone())).flatten();
        Ok(ListPage::new(locks, next))
    }

    pub(super) async fn force_release(&self, name: &LockName) -> Result<bool> {
        let done = sqlx::query(AssertSqlSafe(self.shared.sql.force_release.clone()))
            .bind(name.as_str())
            .execute(&self.shared.pool)
            .await
            .map_err(from_sqlx)?;
        let broken = done.rows_affected() > 0;
        if broken {
            self.shared.wakers.wake(name.as_str());
        }
        Ok(broken)
    }
}

/// One attempt: take a free or expired row (or re-enter); create the row for a new name;
/// otherwise report how long the holder's lease has left.
async fn try_acquire(shared: Arc<Shared>, req: AcquireRequest) -> Result<Attempt> {
    let start = Instant::now();
    let name = req.name.as_str();
    let ttl = us(req.ttl);
    let mut conn = shared.pool.acquire().await.map_err(from_sqlx)?;
    let mut take = sqlx::query(AssertSqlSafe(shared.sql.take.clone()));
    // One binding per `?`, in order: the six `held_by_me` tests interleave with the values.
    take = take.bind(&req.token); // fence
    take = take.bind(&req.token); // holds
    take = take.bind(&req.token); // acquired_at
    take = take.bind(&req.token).bind(req.owner.label.as_deref());
    take = take.bind(&req.token).bind(&req.owner.host);
    take = take.bind(&req.token).bind(i64::from(req.owner.pid));
    take = take.bind(&req.token).bind(ttl).bind(ttl);
    take = take
        .bind(&req.token)
        .bind(name)
        .bind(req.reentrant)
        .bind(&req.token);
    let taken = take.execute(&mut *conn).await.map_err(from_sqlx)?;
    let granted = |fence: i64| {
        Attempt::Acquired(Arc::new(TableLease {
            shared: shared.clone(),
            name: name.to_owned(),
            token: req.token.clone(),
            fence,
            lost: CancellationToken::new(),
            start,
        }))
    };
    if taken.rows_affected() > 0 {
        let fence = i64::try_from(taken.last_insert_id()).unwrap_or(i64::MAX);
        return Ok(granted(fence));
    }
    let left: Option<i64> = sqlx::query_scalar(AssertSqlSafe(shared.sql.busy.clone()))
        .bind(name)
        .fetch_optional(&mut *conn)
        .await
        .map_err(from_sqlx)?;
    if let Some(left_us) = left {
        return Ok(Attempt::Busy {
            free_in: Some(Duration::from_micros(u64::try_from(left_us).unwrap_or(0))),
        });
    }
    let inserted = sqlx::query(AssertSqlSafe(shared.sql.insert.clone()))
        .bind(name)
        .bind(&req.token)
        .bind(ttl)
        .bind(req.owner.label.as_deref())
        .bind(&req.owner.host)
        .bind(i64::from(req.owner.pid))
        .execute(&mut *conn)
        .await;
    match inserted {
        Ok(_) => Ok(granted(1)),
        // Another client created the row first: look again at once.
        Err(e) if number(&e) == Some(1062) => Ok(Attempt::Busy {
            free_in: Some(Duration::ZERO),
        }),
        Err(e) => Err(from_sqlx(e)),
    }
}

fn to_info(row: &MySqlRow) -> Result<LockInfo> {
    let get = |e: sqlx::Error| from_sqlx(e);
    let name: Vec<u8> = row.try_get(0).map_err(get)?;
    let fence_value: i64 = row.try_get(1).map_err(get)?;
    let holds: i32 = row.try_get(2).map_err(get)?;
    let acquired_us: i64 = row.try_get(3).map_err(get)?;
    let left_ms: i64 = row.try_get(4).map_err(get)?;
    let label: Option<String> = row.try_get(5).map_err(get)?;
    let host: Option<String> = row.try_get(6).map_err(get)?;
    let pid: Option<i64> = row.try_get(7).map_err(get)?;
    Ok(LockInfo::new(
        String::from_utf8_lossy(&name).into_owned(),
        fence(fence_value),
        Owner::new(
            label,
            host.unwrap_or_default(),
            pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
        ),
        UNIX_EPOCH + Duration::from_micros(u64::try_from(acquired_us).unwrap_or(0)),
        Some(Duration::from_millis(u64::try_from(left_ms).unwrap_or(0))),
        u32::try_from(holds).unwrap_or(0),
    ))
}

/// One hold of a row in the lease table.
#[derive(Debug)]
struct TableLease {
    shared: Arc<Shared>,
    name: String,
    token: String,
    fence: i64,
    lost: CancellationToken,
    start: Instant,
}

#[async_trait]
impl Lease for TableLease {
    fn fence(&self) -> FencingToken {
        fence(self.fence)
    }

    fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    fn lease_start(&self) -> Instant {
        self.start
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        // The driver reports matched rows (CLIENT_FOUND_ROWS), so an extension that does
        // not move the expiry still counts as owned.
        let done = sqlx::query(AssertSqlSafe(self.shared.sql.extend.clone()))
            .bind(us(ttl))
            .bind(&self.name)
            .bind(&self.token)
            .bind(self.fence)
            .execute(&self.shared.pool)
            .await
            .map_err(from_sqlx)?;
        if done.rows_affected() == 0 {
            return Err(Error::not_owned(&self.name));
        }
        Ok(())
    }

    async fn release(&self) -> Result<()> {
        let done = sqlx::query(AssertSqlSafe(self.shared.sql.release.clone()))
            .bind(&self.name)
            .bind(&self.token)
            .bind(self.fence)
            .execute(&self.shared.pool)
            .await
            .map_err(from_sqlx)?;
        if done.rows_affected() == 0 {
            return Err(Error::not_owned(&self.name));
        }
        if done.last_insert_id() == 0 {
            self.shared.wakers.wake(&self.name);
        }
        Ok(())
    }
}
