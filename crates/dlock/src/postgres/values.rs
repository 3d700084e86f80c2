//! Versioned values in the `<table>_values` table: each write is one conditional statement.

use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use async_trait::async_trait;

use crate::backend::{Expect, Versioned};
use crate::error::Result;
use crate::sql_common::{Shape, SqlValues};

use super::error::from_sqlx;

pub(super) const SHAPE: Shape = &[("name", "text"), ("version", "bigint"), ("value", "bytea")];

pub(super) fn ddl(table: &str) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {table} (
    name    text COLLATE "C" PRIMARY KEY,
    version bigint NOT NULL,                   -- only ever incremented: rows are never deleted
    value   bytea NOT NULL
)"#
    )
}

/// The statements of one values table, formatted once.
#[derive(Clone, Debug)]
pub(crate) struct PgValues {
    pool: PgPool,
    table: String,
    /// Created on first use, so a deployment that never uses values needs no extra table.
    created: tokio::sync::OnceCell<()>,
    get: String,
    put_any: String,
    put_absent: String,
    put_version: String,
    put_fenced: String,
}

impl PgValues {
    /// The values table of lock table `locks`.
    pub(super) fn new(pool: PgPool, locks: &str) -> PgValues {
        let table = &crate::sql_common::values_table(locks);
        PgValues {
            pool,
            table: table.to_owned(),
            created: tokio::sync::OnceCell::new(),
            get: format!("SELECT value, version FROM {table} WHERE name = $1"),
            put_any: format!(
                "INSERT INTO {table} (name, version, value) VALUES ($1, 1, $2)
                 ON CONFLICT (name) DO UPDATE SET version = {table}.version + 1, value = EXCLUDED.value
                 RETURNING version"
            ),
            put_absent: format!(
                "INSERT INTO {table} (name, version, value) VALUES ($1, 1, $2)
                 ON CONFLICT (name) DO NOTHING RETURNING version"
            ),
            put_version: format!(
                "UPDATE {table} SET version = version + 1, value = $2
                 WHERE name = $1 AND version = $3 RETURNING version"
            ),
            // FOR SHARE holds the lock's row until the write commits: a takeover, release or
            // break waits for it, and one that committed first is seen (the row re-read).
            put_fenced: format!(
                "WITH held AS (
                     SELECT 1 FROM {locks}
                     WHERE name = $1 AND token = $2 AND hold_fence = $3 AND expires_at > now()
                     FOR SHARE
                 )
                 INSERT INTO {table} (name, version, value) SELECT $4, 1, $5 FROM held
                 ON CONFLICT (name) DO UPDATE SET version = {table}.version + 1, value = EXCLUDED.value
                 RETURNING version"
            ),
        }
    }

    async fn ensure_table(&self) -> Result<()> {
        self.created
            .get_or_try_init(|| async {
                super::schema::ensure(&self.pool, &self.table, &ddl(&self.table), SHAPE).await
            })
            .await
            .map(|_| ())
    }
}

impl PgValues {
    /// A fenced write: one statement that checks the hold's row in the lock table (token,
    /// fence, lease not over by the server's clock) and writes the value. `None` when the
    /// hold is not current: nothing written.
    pub(super) async fn put_fenced(
        &self,
        hold: (&str, &str, i64),
        name: &str,
        value: &[u8],
    ) -> Result<Option<u64>> {
        self.ensure_table().await?;
        let (lock, token, fence) = hold;
        let written: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.put_fenced.as_str()))
            .bind(lock)
            .bind(token)
            .bind(fence)
            .bind(name)
            .bind(value)
            .fetch_optional(&self.pool)
            .await
            .map_err(from_sqlx)?;
        Ok(written.map(|version| u64::try_from(version).unwrap_or(0)))
    }
}

impl PgValues {
    /// A blind write on `conn`, the connection that holds a session lock (its fenced write:
    /// the lock lives as long as the connection).
    pub(super) async fn put_on(
        &self,
        conn: &mut PgConnection,
        name: &str,
        value: &[u8],
    ) -> Result<u64> {
        self.ensure_table().await?;
        let written: i64 = sqlx::query_scalar(AssertSqlSafe(self.put_any.as_str()))
            .bind(name)
            .bind(value)
            .fetch_one(conn)
            .await
            .map_err(from_sqlx)?;
        Ok(u64::try_from(written).unwrap_or(0))
    }
}

#[async_trait]
impl SqlValues for PgValues {
    async fn get(&self, name: &str) -> Result<Option<Versioned>> {
        self.ensure_table().await?;
        let row: Option<(Vec<u8>, i64)> = sqlx::query_as(AssertSqlSafe(self.get.as_str()))
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(from_sqlx)?;
        Ok(row.map(|(value, version)| Versioned::new(value, u64::try_from(version).unwrap_or(0))))
    }

    async fn put(&self, name: &str, expect: Expect, value: &[u8]) -> Result<Option<u64>> {
        self.ensure_table().await?;
        let query = match expect {
            Expect::Any => sqlx::query_scalar(AssertSqlSafe(self.put_any.as_str())),
            Expect::Absent => sqlx::query_scalar(AssertSqlSafe(self.put_absent.as_str())),
            Expect::Version(_) => sqlx::query_scalar(AssertSqlSafe(self.put_version.as_str())),
        };
        let mut query = query.bind(name).bind(value);
        if let Expect::Version(version) = expect {
            query = query.bind(i64::try_from(version).unwrap_or(i64::MAX));
        }
        let written: Option<i64> = query.fetch_optional(&self.pool).await.map_err(from_sqlx)?;
        Ok(written.map(|version| u64::try_from(version).unwrap_or(0)))
    }
}
