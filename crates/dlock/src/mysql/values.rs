//! Versioned values in the `<table>_values` table: each write is one conditional statement.
//! MySQL has no `RETURNING`, so a blind write reports its new version through
//! `LAST_INSERT_ID(expr)`, which is per connection and set by the same statement.

use sqlx::{AssertSqlSafe, MySqlConnection, MySqlPool};

use async_trait::async_trait;

use crate::backend::{Expect, Versioned};
use crate::error::Result;
use crate::sql_common::{Shape, SqlValues};

use super::error::from_sqlx;

pub(super) const SHAPE: Shape = &[
    ("name", "varbinary"),
    ("version", "bigint"),
    ("value", "longblob"),
];

pub(super) fn ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    name    VARBINARY(512) NOT NULL PRIMARY KEY,
    version BIGINT NOT NULL,
    value   LONGBLOB NOT NULL
) ENGINE=InnoDB"
    )
}

/// MySQL's duplicate-key error.
const ER_DUP_ENTRY: &str = "23000";

/// The statements of one values table, formatted once.
#[derive(Clone, Debug)]
pub(crate) struct MysqlValues {
    pool: MySqlPool,
    table: String,
    /// Created on first use, so a deployment that never uses values needs no extra table.
    created: tokio::sync::OnceCell<()>,
    get: String,
    put_any: String,
    put_absent: String,
    put_version: String,
    /// The hold's row in the lock table, read with a shared lock kept until the transaction
    /// ends: a takeover, release or break waits for the fenced write, or is seen by it.
    held: String,
}

impl MysqlValues {
    /// The values table of lock table `locks`.
    pub(super) fn new(pool: MySqlPool, locks: &str) -> MysqlValues {
        let table = &crate::sql_common::values_table(locks);
        let now = super::lease_table::NOW;
        MysqlValues {
            pool,
            table: table.to_owned(),
            created: tokio::sync::OnceCell::new(),
            get: format!("SELECT value, version FROM {table} WHERE name = ?"),
            put_any: format!(
                "INSERT INTO {table} (name, version, value) VALUES (?, LAST_INSERT_ID(1), ?)
                 ON DUPLICATE KEY UPDATE version = LAST_INSERT_ID(version + 1), value = VALUES(value)"
            ),
            put_absent: format!("INSERT INTO {table} (name, version, value) VALUES (?, 1, ?)"),
            put_version: format!(
                "UPDATE {table} SET version = version + 1, value = ? WHERE name = ? AND version = ?"
            ),
            held: format!(
                "SELECT 1 FROM {locks}
                 WHERE name = ? AND token = ? AND hold_fence = ? AND expires_at > {now}
                 LOCK IN SHARE MODE"
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

impl MysqlValues {
    /// A blind write on `conn`, the connection that holds a `GET_LOCK` (its fenced write: the
    /// lock lives as long as the connection).
    pub(super) async fn put_on(
        &self,
        conn: &mut MySqlConnection,
        name: &str,
        value: &[u8],
    ) -> Result<u64> {
        self.ensure_table().await?;
        let done = sqlx::query(AssertSqlSafe(self.put_any.as_str()))
            .bind(name.as_bytes())
            .bind(value)
            .execute(conn)
            .await
            .map_err(from_sqlx)?;
        Ok(done.last_insert_id())
    }

    /// A fenced write: one transaction that reads the hold's row in the lock table (token,
    /// fence, lease not over by the server's clock) under a shared lock and writes the value.
    /// `None` when the hold is not current: rolled back, nothing written.
    pub(super) async fn put_fenced(
        &self,
        hold: (&str, &str, i64),
        name: &str,
        value: &[u8],
    ) -> Result<Option<u64>> {
        self.ensure_table().await?;
        let (lock, token, fence) = hold;
        let mut tx = self.pool.begin().await.map_err(from_sqlx)?;
        let held: Option<i32> = sqlx::query_scalar(AssertSqlSafe(self.held.as_str()))
            .bind(lock)
            .bind(token)
            .bind(fence)
            .fetch_optional(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        if held.is_none() {
            // Dropping `tx` rolls back; nothing was written.
            return Ok(None);
        }
        let done = sqlx::query(AssertSqlSafe(self.put_any.as_str()))
            .bind(name.as_bytes())
            .bind(value)
            .execute(&mut *tx)
            .await
            .map_err(from_sqlx)?;
        tx.commit().await.map_err(from_sqlx)?;
        Ok(Some(done.last_insert_id()))
    }
}

#[async_trait]
impl SqlValues for MysqlValues {
    async fn get(&self, name: &str) -> Result<Option<Versioned>> {
        self.ensure_table().await?;
        let row: Option<(Vec<u8>, i64)> = sqlx::query_as(AssertSqlSafe(self.get.as_str()))
            .bind(name.as_bytes())
            .fetch_optional(&self.pool)
            .await
            .map_err(from_sqlx)?;
        Ok(row.map(|(value, version)| Versioned::new(value, u64::try_from(version).unwrap_or(0))))
    }

    async fn put(&self, name: &str, expect: Expect, value: &[u8]) -> Result<Option<u64>> {
        self.ensure_table().await?;
        match expect {
            Expect::Any => {
                let done = sqlx::query(AssertSqlSafe(self.put_any.as_str()))
                    .bind(name.as_bytes())
                    .bind(value)
                    .execute(&self.pool)
                    .await
                    .map_err(from_sqlx)?;
                Ok(Some(done.last_insert_id()))
            }
            Expect::Absent => {
                let done = sqlx::query(AssertSqlSafe(self.put_absent.as_str()))
                    .bind(name.as_bytes())
                    .bind(value)
                    .execute(&self.pool)
                    .await;
                match done {
                    Ok(_) => Ok(Some(1)),
                    Err(sqlx::Error::Database(db))
                        if db.code().as_deref() == Some(ER_DUP_ENTRY) =>
                    {
                        Ok(None)
                    }
                    Err(error) => Err(from_sqlx(error)),
                }
            }
            Expect::Version(version) => {
                let done = sqlx::query(AssertSqlSafe(self.put_version.as_str()))
                    .bind(value)
                    .bind(name.as_bytes())
                    .bind(i64::try_from(version).unwrap_or(i64::MAX))
                    .execute(&self.pool)
                    .await
                    .map_err(from_sqlx)?;
                Ok((done.rows_affected() == 1).then(|| version + 1))
            }
        }
    }
}
