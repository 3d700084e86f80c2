//! Session mode: PostgreSQL advisory locks, each held by a dedicated connection. The key is a
//! 64-bit hash of the name (`hashtextextended(name, seed)`), so two names can collide (then
//! they exclude each other: safe, but one waits for the other). Waits happen inside the server
//! (`lock_timeout` + `pg_advisory_lock`); the lock is gone when its connection is, which the
//! holder's task notices at a cadence.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, Postgres};
use tokio::time::Instant;

use crate::backend::wait::{Attempt, acquire_loop};
use crate::backend::{AcquireRequest, Lease, Wait};
use crate::error::{Error, Result};
use crate::sql_common::{
    ModeStore, SessionAlarm, SessionConn, SessionLease, SessionWatch, counter_missing,
    detached_attempt,
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
    fence_sql: Arc<str>,
    /// The table of the fence counter, for errors.
    table: Arc<str>,
    check_interval: Duration,
    /// Wakes the holders when the watcher's connection drops.
    alarm: SessionAlarm,
    watch: Arc<Watch>,
}

impl SessionStore {
    pub(super) fn new(pool: PgPool, table: &str, check_interval: Duration) -> SessionStore {
        // One counter for every name: the table stays one row however many names are used.
        let fence_sql = super::schema::next_fence_sql(table);
        SessionStore {
            shared: Arc::new(Shared {
                watch: Arc::new(Watch { pool: pool.clone() }),
                pool,
                fence_sql: fence_sql.into(),
                table: table.into(),
                check_interval,
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
        Some(slice) => {
            let wait = async {
                sqlx::query("SELECT set_config('lock_timeout', $1, false)")
                    .bind(format!("{}ms", slice.as_millis()))
                    .execute(&mut *conn)
                    .await?;
                sqlx::query("SELECT pg_advisory_lock(hashtextextended($1, $2))")
                    .bind(req.name.as_str())
                    .bind(KEY_SEED)
                    .execute(&mut *conn)
                    .await
            };
            match tokio::time::timeout(slice + Duration::from_secs(2), wait).await {
                Ok(Ok(_)) => true,
                Ok(Err(e)) if is_lock_timeout(&e) => false,
                Ok(Err(e)) => {
                    conn.close_on_drop();
                    return Err(from_sqlx(e));
                }
                // The server did not answer in time: the connection may be dead or the
                // server paused; this connection is not reused (and frees any late grant).
                Err(_) => {
                    conn.close_on_drop();
                    return Err(Error::Unavailable {
                        backend: "postgres",
                        source: "no answer to a lock wait".into(),
                    });
                }
            }
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
    let fence = sqlx::query_scalar::<_, i64>(AssertSqlSafe(shared.fence_sql.clone()))
        .fetch_optional(&mut *conn)
        .await;
    let fence = match fence {
        Ok(Some(fence)) => fence,
        Ok(None) => {
            conn.close_on_drop();
            return Err(counter_missing("postgres", &shared.table));
        }
        Err(e) => {
            // Closing the connection frees the lock.
            conn.close_on_drop();
            return Err(from_sqlx(e));
        }
    };
    let name = req.name.as_str().to_owned();
    Ok(Attempt::Acquired(Arc::new(SessionLease::start(
        Held {
            conn,
            name: name.clone(),
        },
        name,
        fence,
        start,
        req.ttl,
        shared.check_interval,
        shared.alarm.subscribe(),
    ))))
}

/// The connection holding one advisory lock.
struct Held {
    conn: PoolConnection<Postgres>,
    name: String,
}

#[async_trait]
impl SessionConn for Held {
    const BACKEND: &'static str = "postgres";

    async fn ping(&mut self) -> Result<()> {
        self.conn.ping().await.map_err(from_sqlx)
    }

    async fn unlock(&mut self) -> Result<bool> {
        sqlx::query_scalar::<_, bool>("SELECT pg_advisory_unlock(hashtextextended($1, $2))")
            .bind(&self.name)
            .bind(KEY_SEED)
            .fetch_one(&mut *self.conn)
            .await
            .map_err(from_sqlx)
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
