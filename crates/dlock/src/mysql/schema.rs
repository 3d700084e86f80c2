//! Tables created on first use, and the check that an existing table is dlock's.

use sqlx::{AssertSqlSafe, MySqlPool};

use crate::error::Result;
use crate::sql_common::check_shape;
pub(super) use crate::sql_common::{Shape, waiters_table};

use super::error::{BACKEND, from_sqlx};

/// The lease table: a row per lock name, never deleted, so the fence only grows. Names are
/// `VARBINARY`: byte-wise, so case-sensitive and without PAD SPACE (a `_bin` collation would
/// still treat trailing spaces as equal). Times are microseconds since the Unix epoch by the
/// database's clock, computed in UTC so session time zones do not matter.
pub(super) const LEASE_SHAPE: Shape = &[
    ("name", "varbinary"),
    ("fence", "bigint"),
    ("token", "varchar"),
    ("holds", "int"),
    ("expires_at", "bigint"),
    ("acquired_at", "bigint"),
    ("owner_label", "varchar"),
    ("host", "varchar"),
    ("pid", "bigint"),
];

pub(super) fn lease_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    name        VARBINARY(512) NOT NULL PRIMARY KEY,
    fence       BIGINT NOT NULL,
    token       VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NULL,
    holds       INT NOT NULL DEFAULT 0,
    expires_at  BIGINT NOT NULL DEFAULT 0,
    acquired_at BIGINT NOT NULL DEFAULT 0,
    owner_label VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    host        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    pid         BIGINT NULL
) ENGINE=InnoDB"
    )
}

/// The waiter queue beside a lease table: one row per waiting acquire call, refreshed while
/// it waits; the oldest live entry is the head. Times as in the lease table.
pub(super) const WAITERS_SHAPE: Shape = &[
    ("name", "varbinary"),
    ("token", "varchar"),
    ("since", "bigint"),
    ("seen", "bigint"),
];

pub(super) fn waiters_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    name  VARBINARY(512) NOT NULL,
    token VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    since BIGINT NOT NULL,
    seen  BIGINT NOT NULL,
    PRIMARY KEY (name, token)
) ENGINE=InnoDB"
    )
}

/// Session mode's fence counters.
pub(super) const FENCE_SHAPE: Shape = &[("name", "varbinary"), ("fence", "bigint")];

pub(super) fn fence_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    name  VARBINARY(512) NOT NULL PRIMARY KEY,
    fence BIGINT NOT NULL
) ENGINE=InnoDB"
    )
}

async fn columns(pool: &MySqlPool, table: &str) -> Result<Vec<(String, String)>> {
    sqlx::query_as(
        "SELECT CAST(COLUMN_NAME AS CHAR), CAST(DATA_TYPE AS CHAR) FROM information_schema.COLUMNS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
    )
    .bind(table)
    .fetch_all(pool)
    .await
    .map_err(from_sqlx)
}

/// Creates `table` if it is missing, then checks that every column dlock uses is there with
/// its type.
pub(super) async fn ensure(pool: &MySqlPool, table: &str, ddl: &str, shape: Shape) -> Result<()> {
    let mut found = columns(pool, table).await?;
    if found.is_empty() {
        sqlx::query(AssertSqlSafe(ddl.to_owned()))
            .execute(pool)
            .await
            .map_err(from_sqlx)?;
        found = columns(pool, table).await?;
    }
    check_shape(BACKEND, table, &found, shape, str::eq_ignore_ascii_case)
}
