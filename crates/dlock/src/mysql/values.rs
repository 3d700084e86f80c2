//! Versioned values in the `<table>_values` table: each write is one conditional statement.
//! MySQL has no `RETURNING`, so a blind write reports its new version through
//! `LAST_INSERT_ID(expr)`, which is per connection and set by the same statement.

use sqlx::{AssertSqlSafe, MySqlPool};

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
#[derive(Debug)]
pub(crate) struct MysqlValues {
    pool: MySqlPool,
    table: String,
    /// Created on first use, so a deployment that never uses values needs no extra table.
    created: tokio::sync::OnceCell<()>,
    get: String,
    put_any: String,
    put_absent: String,
    put_version: String,
}

impl MysqlValues {
    pub(super) fn new(pool: MySqlPool, table: &str) -> MysqlValues {
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
