//! Session mode: PostgreSQL advisory locks, each held by a dedicated connection. The key is a
//! 64-bit hash of the name (`hashtextextended(name, seed)`), so two names can collide (then
//! they exclude each other: safe, but one waits for the other). Waits happen inside the server
//! (`lock_timeout` + `pg_advisory_lock`); the lock is gone when its connection is, which the
//! holder's task notices at a cadence.
//!
//! Inspection: while it holds a lock, the holder's connection carries a tag in its
//! `application_name` (fence, grant time, pid, host, label), set in the statement that takes
//! the fence. `inspect` finds the holder's connection in `pg_locks` by the name's key and
//! reads its tag from `pg_stat_activity`; the waiters are the ungranted entries of the same
//! key. `force_release` ends the holder's connection (`pg_terminate_backend`). Listing is not
//! possible: the server keeps only each name's hash.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, Postgres};
use tokio::time::Instant;

use crate::backend::wait::{Attempt, acquire_loop};
use crate::backend::{AcquireRequest, Lease, ListPage, ListQuery, LockInfo, MonitorStore, Wait};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};
use crate::sql_common::{
    ModeStore, SESSION_FENCE_LIMIT, SessionAlarm, SessionConn, SessionLease, SessionWatch,
    counter_missing, detached_attempt, fence_timed_out,
};

use super::error::{from_sqlx, is_lock_timeout};

/// The seed of the key hash: `'dlock'` in ASCII, so dlock's keys differ from
/// `hashtextextended(name, 0)` that other tools may use.
pub(super) const KEY_SEED: i64 = 0x64_6c_6f_63_6b;

/// Longest single wait inside the server; longer waits are cut into slices so a dead server
/// or connection is noticed (each slice also has a client-side timeout).
const WAIT_SLICE: Duration = Duration::from_secs(5);

/// The session-lock store of one client.
#[derive(Debug)]
pub(crate) struct SessionStore {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    pool: PgPool,
    /// Takes the next fence and tags the holder's connection with it (returning the
    /// connection's `application_name` before, restored at release).
    fence_sql: Arc<str>,
    /// The table of the fence counter, for errors.
    table: Arc<str>,
    check_interval: Duration,
    /// The values table, for fenced writes on a holder's connection.
    values: Arc<super::values::PgValues>,
    /// Wakes the holders when the watcher's connection drops.
    alarm: SessionAlarm,
    watch: Arc<Watch>,
}

impl SessionStore {
    pub(super) fn new(
        pool: PgPool,
        table: &str,
        check_interval: Duration,
        values: super::values::PgValues,
    ) -> SessionStore {
        // One counter for every name: the table stays one row however many names are used.
        let fence_sql = format!(
            "WITH f AS ({}) SELECT counter, current_setting('application_name'), \
             set_config('application_name', left($1 || counter || $2, {TAG_LEN}), false) FROM f",
            super::schema::next_fence_sql(table)
        );
        SessionStore {
            shared: Arc::new(Shared {
                watch: Arc::new(Watch { pool: pool.clone() }),
                pool,
                fence_sql: fence_sql.into(),
                table: table.into(),
                check_interval,
                values: Arc::new(values),
                alarm: SessionAlarm::default(),
            }),
        }
    }
}

#[async_trait]
impl ModeStore for SessionStore {
    fn session_monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        let shared = &self.shared;
        shared.alarm.ensure_watcher(&shared.watch);
        acquire_loop(
            req.wait,
            None,
            || detached_attempt(try_acquire(shared.clone(), req.clone())),
            // The wait happened inside the server: try again at once.
            || std::future::ready(()),
        )
        .await
    }
}

async fn try_acquire(shared: Arc<Shared>, req: AcquireRequest) -> Result<Attempt> {
    let mut conn = shared.pool.acquire().await.map_err(from_sqlx)?;
    let slice = match req.wait {
        Wait::No => None,
        Wait::Forever => Some(WAIT_SLICE),
        Wait::Until(at) => Some(at.saturating_duration_since(Instant::now()).min(WAIT_SLICE)),
    }
    .filter(|slice| *slice >= Duration::from_millis(1));
    let got = match slice {
        None => {
            sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock(hashtextextended($1, $2))")
                .bind(req.name.as_str())
                .bind(KEY_SEED)
                .fetch_one(&mut *conn)
                .await
                .map_err(from_sqlx)?
        }
        Some(slice) => wait_for_lock(&mut conn, &req, slice).await?,
    };
    if !got {
        return Ok(Attempt::Busy { free_in: None });
    }
    // The hold starts at the grant, not before the request: the wait happened inside the
    // server, and a session lock has no expiry there, so its client-kept TTL counts from here
    // (counting from before a long wait made a lock granted after a wait longer than its TTL
    // lost on arrival).
    let start = Instant::now();
    let (head, tail) = holder_tag(&req.owner);
    let fence = sqlx::query_as::<_, (i64, String, String)>(AssertSqlSafe(shared.fence_sql.clone()))
        .bind(head)
        .bind(tail)
        .fetch_optional(&mut *conn);
    let (fence, app_name) = match tokio::time::timeout(SESSION_FENCE_LIMIT, fence).await {
        Ok(Ok(Some((fence, before, _)))) => (fence, before),
        Ok(Ok(None)) => {
            conn.close_on_drop();
            return Err(counter_missing("postgres", &shared.table));
        }
        // Closing the connection frees the lock.
        Ok(Err(e)) => {
            conn.close_on_drop();
            return Err(from_sqlx(e));
        }
        Err(_) => {
            conn.close_on_drop();
            return Err(fence_timed_out("postgres", &shared.table));
        }
    };
    let name = req.name.as_str().to_owned();
    Ok(Attempt::Acquired(Arc::new(SessionLease::start(
        Held {
            conn,
            name: name.clone(),
            app_name,
            values: shared.values.clone(),
        },
        name,
        fence,
        start,
        req.ttl,
        shared.check_interval,
        shared.alarm.subscribe(),
    ))))
}

/// Waits up to `slice` inside the server for the advisory lock: whether it was granted.
async fn wait_for_lock(
    conn: &mut PoolConnection<Postgres>,
    req: &AcquireRequest,
    slice: Duration,
) -> Result<bool> {
    // One statement, its own transaction: the timeout is set local to it (the CTE
    // runs before the lock is asked for), so it ends with the statement, granted or
    // timed out, and the connection goes back to the pool without it.
    let wait = sqlx::query(
        "WITH timeout AS MATERIALIZED (SELECT set_config('lock_timeout', $3, true)) \
         SELECT pg_advisory_lock(hashtextextended($1, $2)) FROM timeout",
    )
    .bind(req.name.as_str())
    .bind(KEY_SEED)
    .bind(format!("{}ms", slice.as_millis()))
    .execute(&mut **conn);
    match tokio::time::timeout(slice + Duration::from_secs(2), wait).await {
        Ok(Ok(_)) => Ok(true),
        Ok(Err(e)) if is_lock_timeout(&e) => granted_despite_timeout(conn, req).await,
        Ok(Err(e)) => {
            conn.close_on_drop();
            Err(from_sqlx(e))
        }
        // The server did not answer in time: the connection may be dead or the
        // server paused; this connection is not reused (and frees any late grant).
        Err(_) => {
            conn.close_on_drop();
            Err(Error::Unavailable {
                backend: "postgres",
                source: "no answer to a lock wait".into(),
            })
        }
    }
}

/// Whether the lock was granted after all to a wait that ended in a lock timeout. PostgreSQL
/// keeps a lock granted at the moment the timeout fires (its `LockErrorCleanup` keeps what the
/// releaser already handed over) and still reports the timeout: taken for busy, the
/// connection would go back to the pool holding the lock, and nobody could take it until
/// that connection closed. The grant is kept as this attempt's; a failed check closes the
/// connection, which frees whatever it held.
async fn granted_despite_timeout(
    conn: &mut PoolConnection<Postgres>,
    req: &AcquireRequest,
) -> Result<bool> {
    // An advisory lock on a bigint key is listed with its high half in `classid`, its low half
    // in `objid` and `objsubid` 1.
    let held = sqlx::query_scalar::<_, bool>(
        "WITH k AS (SELECT hashtextextended($1, $2) AS key) \
         SELECT EXISTS (SELECT 1 FROM pg_locks, k WHERE locktype = 'advisory' \
         AND pid = pg_backend_pid() AND granted AND objsubid = 1 \
         AND classid = ((key >> 32) & 4294967295)::oid AND objid = (key & 4294967295)::oid)",
    )
    .bind(req.name.as_str())
    .bind(KEY_SEED)
    .fetch_one(&mut **conn);
    match tokio::time::timeout(Duration::from_secs(2), held).await {
        Ok(Ok(held)) => Ok(held),
        Ok(Err(e)) => {
            conn.close_on_drop();
            Err(from_sqlx(e))
        }
        Err(_) => {
            conn.close_on_drop();
            Err(Error::Unavailable {
                backend: "postgres",
                source: "no answer to a check after a lock wait".into(),
            })
        }
    }
}

/// The connection holding one advisory lock.
struct Held {
    conn: PoolConnection<Postgres>,
    name: String,
    /// The connection's `application_name` before the holder's tag replaced it.
    app_name: String,
    values: Arc<super::values::PgValues>,
}

#[async_trait]
impl SessionConn for Held {
    const BACKEND: &'static str = "postgres";

    async fn ping(&mut self) -> Result<()> {
        self.conn.ping().await.map_err(from_sqlx)
    }

    async fn unlock(&mut self) -> Result<bool> {
        sqlx::query_as::<_, (bool, String)>(
            "SELECT pg_advisory_unlock(hashtextextended($1, $2)), \
             set_config('application_name', $3, false)",
        )
        .bind(&self.name)
        .bind(KEY_SEED)
        .bind(&self.app_name)
        .fetch_one(&mut *self.conn)
        .await
        .map(|(unlocked, _)| unlocked)
        .map_err(from_sqlx)
    }

    /// An advisory lock lives as long as its connection, so a write on the live connection is
    /// the holder's: a ping first (a connection ended by a break writes nothing), then the
    /// write on it.
    async fn put_fenced(&mut self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        if self.conn.ping().await.is_err() {
            return Ok(None);
        }
        let values = self.values.clone();
        values
            .put_on(&mut self.conn, value.as_str(), bytes)
            .await
            .map(Some)
    }

    fn recycle(self) {
        drop(self.conn);
    }

    fn discard(mut self) {
        self.conn.close_on_drop();
        drop(self.conn);
    }
}

/// The session watcher's connection: one of its own, outside the pool (so it takes no lock's
/// place there), asleep in `pg_sleep`.
#[derive(Debug)]
struct Watch {
    pool: PgPool,
}

#[async_trait]
impl SessionWatch for Watch {
    type Conn = PgConnection;

    async fn connect(&self) -> Result<PgConnection> {
        let mut conn = PgConnection::connect_with(&self.pool.connect_options())
            .await
            .map_err(from_sqlx)?;
        // A statement_timeout set for the user or database would cut every sleep short.
        sqlx::query("SET statement_timeout = 0")
            .execute(&mut conn)
            .await
            .map_err(from_sqlx)?;
        Ok(conn)
    }

    async fn sleep(&self, conn: &mut PgConnection, length: Duration) -> Result<()> {
        sqlx::query("SELECT pg_sleep($1)")
            .bind(length.as_secs_f64())
            .execute(conn)
            .await
            .map(drop)
            .map_err(from_sqlx)
    }
}

/// The longest `application_name` PostgreSQL keeps (`NAMEDATALEN - 1` bytes).
const TAG_LEN: usize = 63;
/// The start of a holder's tag.
const TAG_MARK: &str = "dlock:";

/// A holder's tag around its fence: `dlock:` FENCE `:` GRANT-MS `:` PID `:` HOST [`:` LABEL],
/// numbers in base 36 to leave room for the host and label. The server cuts it at
/// [`TAG_LEN`] bytes, so a long host or label is shown shortened.
fn holder_tag(owner: &Owner) -> (String, String) {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut tail = format!(":{}:{}:{}", base36(now_ms), owner.pid, owner.host);
    if let Some(label) = &owner.label {
        tail.push(':');
        tail.push_str(label);
    }
    (TAG_MARK.to_owned(), tail)
}

/// The fence the statement puts between the tag's two halves is written in decimal by
/// PostgreSQL; the grant time in base 36 by [`holder_tag`].
fn base36(mut n: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[usize::try_from(n % 36).unwrap_or(0)]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// What a holder's tag says: its fence, grant time and owner; `None` for another
/// `application_name` (a holder that is not dlock's, or an older dlock).
fn parse_holder_tag(tag: &str) -> Option<(i64, std::time::SystemTime, Owner)> {
    let rest = tag.strip_prefix(TAG_MARK)?;
    let mut parts = rest.splitn(5, ':');
    let fence = parts.next()?.parse().ok()?;
    let ms = u64::from_str_radix(parts.next()?, 36).ok()?;
    let pid = parts.next()?.parse().ok()?;
    let host = parts.next()?.to_owned();
    let label = parts.next().map(str::to_owned);
    let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    Some((fence, at, Owner::new(label, host, pid)))
}

/// The holder of the name's key in this database, its tag and how many wait for the key.
const INSPECT_SQL: &str = "\
    WITH k AS (SELECT hashtextextended($1, $2) AS key), \
    held AS (\
        SELECT l.pid, l.classid, l.objid FROM pg_locks l, k \
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
          AND l.classid = ((k.key >> 32) & 4294967295)::oid \
          AND l.objid = (k.key & 4294967295)::oid) \
    SELECT held.pid, coalesce(a.application_name, ''), \
        (SELECT count(*) FROM pg_locks w \
         WHERE w.locktype = 'advisory' AND NOT w.granted AND w.objsubid = 1 \
           AND w.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND w.classid = held.classid AND w.objid = held.objid) \
    FROM held LEFT JOIN pg_stat_activity a ON a.pid = held.pid";

#[async_trait]
impl MonitorStore for SessionStore {
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let row = sqlx::query_as::<_, (i32, String, i64)>(INSPECT_SQL)
            .bind(name.as_str())
            .bind(KEY_SEED)
            .fetch_optional(&self.shared.pool)
            .await
            .map_err(from_sqlx)?;
        let Some((pid, tag, waiting)) = row else {
            return Ok(None);
        };
        // Not a dlock holder (or its tag not set yet): the server's process is all there is.
        let (fence, at, owner) = parse_holder_tag(&tag).unwrap_or_else(|| {
            let owner = Owner::new(
                Some("not a dlock holder".into()),
                "postgres backend",
                pid.unsigned_abs(),
            );
            (0, std::time::UNIX_EPOCH, owner)
        });
        let info = LockInfo::new(
            name.as_str().to_owned(),
            FencingToken::from_signed(fence),
            owner,
            at,
            None,
            1,
        )
        .with_waiters(u32::try_from(waiting).unwrap_or(u32::MAX));
        Ok(Some(info))
    }

    async fn list_page(&self, _query: ListQuery<'_>) -> Result<ListPage> {
        Err(Error::Unsupported {
            operation: "listing session locks (the server keeps only a hash of each name)",
            backend: "postgres",
        })
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        // Ends the holder's connection, which frees its lock; waits up to 5 s for it to end.
        let ended = sqlx::query_scalar::<_, bool>(
            "WITH k AS (SELECT hashtextextended($1, $2) AS key) \
             SELECT pg_terminate_backend(l.pid, 5000) FROM pg_locks l, k \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND l.classid = ((k.key >> 32) & 4294967295)::oid \
               AND l.objid = (k.key & 4294967295)::oid",
        )
        .bind(name.as_str())
        .bind(KEY_SEED)
        .fetch_optional(&self.shared.pool)
        .await
        .map_err(from_sqlx)?;
        Ok(ended.unwrap_or(false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_tag_reads_back() {
        let owner = Owner::new(Some("job:7".into()), "web-1", 4242);
        let (head, tail) = holder_tag(&owner);
        let tag = format!("{head}123{tail}");
        let (fence, at, read) = parse_holder_tag(&tag).unwrap();
        assert_eq!((fence, read), (123, owner));
        assert!(at <= std::time::SystemTime::now());
        assert!(parse_holder_tag("psql").is_none());
    }
}
