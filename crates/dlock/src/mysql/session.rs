//! Session mode: `GET_LOCK`, each lock held by a dedicated connection. Lock names on the
//! server are limited to 64 characters and compared case-insensitively, so the server-side
//! name is `dlock:` and the first 58 hex digits of the name's SHA-256. Waits happen inside the
//! server (`GET_LOCK(name, timeout)`); the lock is gone when its connection is, which the
//! holder's task notices at a cadence.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Connection, MySql, MySqlConnection, MySqlPool};
use tokio::time::Instant;

use crate::backend::wait::{Attempt, acquire_loop};
use crate::backend::{AcquireRequest, Lease, Wait};
use crate::error::{Error, Result};
use crate::name::LockName;
use crate::sql_common::{
    ModeStore, SESSION_FENCE_LIMIT, SessionAlarm, SessionConn, SessionLease, SessionWatch,
    counter_missing, detached_attempt, fence_timed_out,
};

use super::error::from_sqlx;

/// The server-side lock name: short, and free of case (hex digits), whatever the name is.
pub(super) const KEY: &str = "CONCAT('dlock:', LEFT(SHA2(?, 256), 58))";

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
    pool: MySqlPool,
    fence_sql: Arc<str>,
    /// The table of the fence counter, for errors.
    table: Arc<str>,
    check_interval: Duration,
    /// The values table, for fenced writes on a holder's connection.
    values: Arc<super::values::MysqlValues>,
    /// Wakes the holders when the watcher's connection drops.
    alarm: SessionAlarm,
    watch: Arc<Watch>,
}

impl SessionStore {
    pub(super) fn new(
        pool: MySqlPool,
        table: &str,
        check_interval: Duration,
        values: super::values::MysqlValues,
    ) -> SessionStore {
        // One counter for every name: the table stays one row however many names are used.
        let fence_sql = super::schema::next_fence_sql(table);
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
        Wait::Forever => WAIT_SLICE,
        Wait::Until(at) => at.saturating_duration_since(Instant::now()).min(WAIT_SLICE),
        _ => Duration::ZERO,
    };
    let lock =
        sqlx::query_scalar::<_, Option<i64>>(AssertSqlSafe(format!("SELECT GET_LOCK({KEY}, ?)")))
            .bind(req.name.as_str())
            .bind(slice.as_secs_f64())
            .fetch_one(&mut *conn);
    let got = match tokio::time::timeout(slice + Duration::from_secs(2), lock).await {
        Ok(Ok(got)) => got == Some(1),
        Ok(Err(e)) => {
            conn.close_on_drop();
            return Err(from_sqlx(e));
        }
        // No answer in time: the server may be paused or the connection dead. Closing the
        // connection also frees a grant that arrives late.
        Err(_) => {
            conn.close_on_drop();
            return Err(Error::Unavailable {
                backend: "mysql",
                source: "no answer to a lock wait".into(),
            });
        }
    };
    if !got {
        return Ok(Attempt::Busy { free_in: None });
    }
    // The hold starts at the grant, not before the request: the wait happened inside the
    // server, and a session lock has no expiry there, so its client-kept TTL counts from here
    // (counting from before a long wait made a lock granted after a wait longer than its TTL
    // lost on arrival).
    let start = Instant::now();
    let fence = sqlx::query(AssertSqlSafe(shared.fence_sql.clone())).execute(&mut *conn);
    let fence = match tokio::time::timeout(SESSION_FENCE_LIMIT, fence).await {
        Ok(Ok(done)) if done.rows_affected() == 0 => {
            conn.close_on_drop();
            return Err(counter_missing("mysql", &shared.table));
        }
        Ok(Ok(done)) => i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX),
        // Closing the connection frees the lock.
        Ok(Err(e)) => {
            conn.close_on_drop();
            return Err(from_sqlx(e));
        }
        Err(_) => {
            conn.close_on_drop();
            return Err(fence_timed_out("mysql", &shared.table));
        }
    };
    let name = req.name.as_str().to_owned();
    Ok(Attempt::Acquired(Arc::new(SessionLease::start(
        Held {
            conn,
            name: name.clone(),
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

/// The connection holding one `GET_LOCK` lock.
struct Held {
    conn: PoolConnection<MySql>,
    name: String,
    values: Arc<super::values::MysqlValues>,
}

#[async_trait]
impl SessionConn for Held {
    const BACKEND: &'static str = "mysql";

    async fn ping(&mut self) -> Result<()> {
        self.conn.ping().await.map_err(from_sqlx)
    }

    async fn unlock(&mut self) -> Result<bool> {
        let released = sqlx::query_scalar::<_, Option<i64>>(AssertSqlSafe(format!(
            "SELECT RELEASE_LOCK({KEY})"
        )))
        .bind(&self.name)
        .fetch_one(&mut *self.conn)
        .await
        .map_err(from_sqlx)?;
        Ok(released == Some(1))
    }

    /// A `GET_LOCK` lives as long as its connection, so a write on the live connection is the
    /// holder's: a ping first (a connection that ended writes nothing), then the write on it.
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
/// place there), asleep in `SLEEP()`.
#[derive(Debug)]
struct Watch {
    pool: MySqlPool,
}

#[async_trait]
impl SessionWatch for Watch {
    type Conn = MySqlConnection;

    async fn connect(&self) -> Result<MySqlConnection> {
        MySqlConnection::connect_with(&self.pool.connect_options())
            .await
            .map_err(from_sqlx)
    }

    async fn sleep(&self, conn: &mut MySqlConnection, length: Duration) -> Result<()> {
        sqlx::query("SELECT SLEEP(?)")
            .bind(length.as_secs_f64())
            .execute(conn)
            .await
            .map(drop)
            .map_err(from_sqlx)
    }
}
