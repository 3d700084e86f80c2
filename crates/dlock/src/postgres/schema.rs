//! Tables created on first use, and the check that an existing table is dlock's.

use sqlx::{AssertSqlSafe, PgPool};

use crate::error::Result;
use crate::sql_common::check_shape;
pub(super) use crate::sql_common::{Shape, waiters_table};

use super::error::{BACKEND, from_sqlx};

/// The lease table: a row per lock name, never deleted, so the fence only grows.
pub(super) const LEASE_SHAPE: Shape = &[
    ("name", "text"),
    ("fence", "bigint"),
    ("token", "text"),
    ("holds", "integer"),
    ("expires_at", "timestamp with time zone"),
    ("acquired_at", "timestamp with time zone"),
    ("owner_label", "text"),
    ("host", "text"),
    ("pid", "bigint"),
];

pub(super) fn lease_ddl(table: &str) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {table} (
    name        text COLLATE "C" PRIMARY KEY,  -- byte-wise: case-sensitive, ordered for prefixes
    fence       bigint NOT NULL,               -- only ever incremented
    token       text,                          -- holder's token; NULL when free
    holds       integer NOT NULL DEFAULT 0,    -- reentrant hold count
    expires_at  timestamptz NOT NULL,          -- the database's clock
    acquired_at timestamptz NOT NULL,
    owner_label text,
    host        text,
    pid         bigint
)"#
    )
}

/// The waiter queue beside a lease table: one row per waiting acquire call, refreshed while
/// it waits; the oldest live entry is the head.
pub(super) const WAITERS_SHAPE: Shape = &[
    ("name", "text"),
    ("token", "text"),
    ("since", "timestamp with time zone"),
    ("seen", "timestamp with time zone"),
];

pub(super) fn waiters_ddl(table: &str) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {table} (
    name  text COLLATE "C" NOT NULL,
    token text NOT NULL,
    since timestamptz NOT NULL,                -- arrival: the queue's order
    seen  timestamptz NOT NULL,                -- last refresh: stale after a second
    PRIMARY KEY (name, token)
)"#
    )
}

/// Session mode's fence counters: one row per name, incremented by each holder.
pub(super) const FENCE_SHAPE: Shape = &[("name", "text"), ("fence", "bigint")];

pub(super) fn fence_ddl(table: &str) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {table} (
    name  text COLLATE "C" PRIMARY KEY,
    fence bigint NOT NULL
)"#
    )
}

async fn columns(pool: &PgPool, table: &str) -> Result<Vec<(String, String)>> {
    sqlx::query_as(
        "SELECT column_name::text, data_type::text FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
    )
    .bind(table)
    .fetch_all(pool)
    .await
    .map_err(from_sqlx)
}

/// Creates `table` if it is missing, then checks that every column dlock uses is there with
/// its type.
pub(super) async fn ensure(pool: &PgPool, table: &str, ddl: &str, shape: Shape) -> Result<()> {
    let mut found = columns(pool, table).await?;
    if found.is_empty() {
        match sqlx::query(AssertSqlSafe(ddl.to_owned()))
            .execute(pool)
            .await
        {
            Ok(_) => {}
            // Two clients creating the table at once: one of them loses on the catalog's
            // unique index, or on the table's row type ("type … already exists", 42710);
            // the table is there either way.
            Err(sqlx::Error::Database(db))
                if matches!(db.code().as_deref(), Some("23505" | "42P07" | "42710")) => {}
            Err(e) => return Err(from_sqlx(e)),
        }
        found = columns(pool, table).await?;
    }
    check_shape(BACKEND, table, &found, shape, |a, b| a == b)
}
