//! Tables created on first use, and the check that an existing table is dlock's.

use sqlx::{AssertSqlSafe, MySqlPool};

use crate::error::Result;
use crate::sql_common::check_shape;
pub(super) use crate::sql_common::{Shape, waiters_table};

use super::error::{BACKEND, from_sqlx};

/// The lease table: a row per lock name while its lease lasts (the sweeper deletes it some
/// seconds after). `hold_fence` is the fence of the row's hold, drawn from the table's
/// sequence ([`fence_sequence`]); tables of dlock 0.x before that kept a per-name counter in
/// `fence` and never deleted rows, and are migrated on connect ([`ensure_lease`]). Names are
/// `VARBINARY`: byte-wise, so case-sensitive and without PAD SPACE (a `_bin` collation would
/// still treat trailing spaces as equal). Times are microseconds since the Unix epoch by the
/// database's clock, computed in UTC so session time zones do not matter. `ring_on_release`
/// is 1 while waiters with a doorbell may be queued for the name (`super::bell`): set by
/// such a waiter when it writes its entry, recomputed by every grant.
pub(super) const LEASE_SHAPE: Shape = &[
    ("name", "varbinary"),
    ("hold_fence", "bigint"),
    ("token", "varchar"),
    ("holds", "int"),
    ("expires_at", "bigint"),
    ("acquired_at", "bigint"),
    ("owner_label", "varchar"),
    ("host", "varchar"),
    ("pid", "bigint"),
    ("ring_on_release", "tinyint"),
];

pub(super) fn lease_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    name        VARBINARY(512) NOT NULL PRIMARY KEY,
    hold_fence  BIGINT NOT NULL,
    token       VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NULL,
    holds       INT NOT NULL DEFAULT 0,
    expires_at  BIGINT NOT NULL DEFAULT 0,
    acquired_at BIGINT NOT NULL DEFAULT 0,
    owner_label VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    host        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    pid         BIGINT NULL,
    ring_on_release TINYINT NOT NULL DEFAULT 0,
    KEY {table}_expires_at (expires_at)
) ENGINE=InnoDB"
    )
}

/// The waiter queue beside a lease table: one row per waiting acquire call, refreshed while
/// it waits; the oldest live entry is the head. Times as in the lease table. `bell` is the
/// connection id of the waiting client's doorbell (`super::bell`), NULL when it has none.
pub(super) const WAITERS_SHAPE: Shape = &[
    ("name", "varbinary"),
    ("token", "varchar"),
    ("since", "bigint"),
    ("seen", "bigint"),
    ("bell", "bigint"),
];

pub(super) fn waiters_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    name  VARBINARY(512) NOT NULL,
    token VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    since BIGINT NOT NULL,
    seen  BIGINT NOT NULL,
    bell  BIGINT NULL,
    PRIMARY KEY (name, token),
    KEY {table}_seen (seen)
) ENGINE=InnoDB"
    )
}

/// Creates the waiter queue if missing, adds the doorbell column to a queue made before it
/// (an older dlock's inserts leave it NULL, and its waiters poll as before), and checks the
/// shape.
pub(super) async fn ensure_waiters(pool: &MySqlPool, waiters: &str) -> Result<()> {
    add_if_missing(pool, waiters, "bell BIGINT NULL").await?;
    ensure(pool, waiters, &waiters_ddl(waiters), WAITERS_SHAPE).await?;
    ensure_index(pool, waiters, "seen").await
}

/// Adds `column` (its definition, name first) to `table` made by a dlock before it, if the
/// table exists without it. Older clients never name the column, so its default serves them.
async fn add_if_missing(pool: &MySqlPool, table: &str, column: &str) -> Result<()> {
    let found = columns(pool, table).await?;
    let name = column.split_whitespace().next().unwrap_or(column);
    if found.is_empty() || has(&found, name) {
        return Ok(());
    }
    run(
        pool,
        &format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column}"),
    )
    .await
}

/// The sequence every fence of lease table `table` comes from: one for the table, so a
/// name's row can be deleted once its lease is over and its next fence is still higher.
/// A sequence never hands out a value twice, also across restarts (it may skip some).
/// Sequences need MariaDB 10.3 or later.
pub(super) fn fence_sequence(table: &str) -> String {
    format!("{table}_fence")
}

/// Creates the lease table and its fence sequence if missing, migrates a table of the
/// per-name-counter layout, and checks the shape.
///
/// The migration renames `fence` to `hold_fence` (one atomic DDL statement), so an older
/// dlock still running against the table fails on its next statement instead of counting
/// fences from 1 for a name whose row was swept, and an older dlock connecting afterwards is
/// refused by its shape check; its holders learn of the loss at their local deadline. The
/// sequence is moved above every fence in the table before the rename and again after it
/// (a sequence never goes back); meanwhile a fresh hold of an existing row still takes at
/// least its row's fence + 1, and nothing is swept until the sweeper's first round, seconds
/// later.
pub(super) async fn ensure_lease(pool: &MySqlPool, table: &str) -> Result<()> {
    let seq = fence_sequence(table);
    if has_older_fence(pool, table, "hold_fence").await? {
        ensure_sequence(pool, &seq).await?;
        run(pool, &catch_up(pool, &seq, table, "fence").await?).await?;
        rename_fence(pool, table, "hold_fence").await?;
        run(pool, &catch_up(pool, &seq, table, "hold_fence").await?).await?;
    }
    add_if_missing(pool, table, "ring_on_release TINYINT NOT NULL DEFAULT 0").await?;
    ensure(pool, table, &lease_ddl(table), LEASE_SHAPE).await?;
    ensure_sequence(pool, &seq).await?;
    ensure_index(pool, table, "expires_at").await
}

/// The statement that moves sequence `seq` to the highest `column` of `table` (never back:
/// `SETVAL` ignores a lower value). MariaDB's `SETVAL` takes a literal, not a subquery, so
/// the highest value is read first.
async fn catch_up(pool: &MySqlPool, seq: &str, table: &str, column: &str) -> Result<String> {
    let highest = highest(pool, table, column).await?;
    Ok(format!("SELECT SETVAL({seq}, {highest})"))
}

/// The highest value of `column` in `table`, 0 when it is empty.
async fn highest(pool: &MySqlPool, table: &str, column: &str) -> Result<i64> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT CAST(COALESCE(MAX({column}), 0) AS SIGNED) FROM {table}"
    )))
    .fetch_one(pool)
    .await
    .map_err(from_sqlx)
}

/// Adds the index on `column` the sweeper's statement uses, to a table made before it had
/// one.
pub(super) async fn ensure_index(pool: &MySqlPool, table: &str, column: &str) -> Result<()> {
    let indexed = "SELECT EXISTS (SELECT 1 FROM information_schema.STATISTICS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?
           AND SEQ_IN_INDEX = 1)";
    if catalog_has(pool, indexed, &[table, column]).await? {
        return Ok(());
    }
    run(
        pool,
        &format!("CREATE INDEX IF NOT EXISTS {table}_{column} ON {table} ({column})"),
    )
    .await
}

/// Creates the fence sequence if missing; on a server without sequences (MySQL, MariaDB
/// before 10.3) says that the lease table needs them.
async fn ensure_sequence(pool: &MySqlPool, seq: &str) -> Result<()> {
    // Checked first, so a user that may only use the table is not asked to create anything.
    let sequence = "SELECT EXISTS (SELECT 1 FROM information_schema.TABLES
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND TABLE_TYPE = 'SEQUENCE')";
    if catalog_has(pool, sequence, &[seq]).await? {
        return Ok(());
    }
    let created = sqlx::query(AssertSqlSafe(format!(
        "CREATE SEQUENCE IF NOT EXISTS {seq} START WITH 1 INCREMENT BY 1"
    )))
    .execute(pool)
    .await;
    match created {
        Ok(_) => Ok(()),
        // ER_PARSE_ERROR: no CREATE SEQUENCE in this server's grammar.
        Err(e) if super::error::number(&e) == Some(1064) => Err(crate::Error::Unsupported {
            operation: "the lease table without sequences (it needs MariaDB 10.3 or later; \
                        use ?mode=session on MySQL)",
            backend: BACKEND,
        }),
        Err(e) => Err(from_sqlx(e)),
    }
}

/// Whether `table` still has the older layouts' column `fence` where dlock now keeps
/// `column`: a table to migrate.
async fn has_older_fence(pool: &MySqlPool, table: &str, column: &str) -> Result<bool> {
    let found = columns(pool, table).await?;
    Ok(has(&found, "fence") && !has(&found, column))
}

/// Whether `found` (name, type) has `column`; MySQL's column names ignore case.
fn has(found: &[(String, String)], column: &str) -> bool {
    found.iter().any(|(n, _)| n.eq_ignore_ascii_case(column))
}

/// Renames the older layouts' column `fence` of `table` to `to` in one atomic statement, or
/// finds that another client did.
async fn rename_fence(pool: &MySqlPool, table: &str, to: &str) -> Result<()> {
    let renamed = run(
        pool,
        &format!("ALTER TABLE {table} CHANGE COLUMN fence {to} BIGINT NOT NULL"),
    )
    .await;
    match renamed {
        // Another client renamed it first ("unknown column").
        Err(_) if has(&columns(pool, table).await?, to) => Ok(()),
        other => other,
    }
}

/// The answer of a `SELECT EXISTS (…)` on the catalog, `binds` in order.
async fn catalog_has(pool: &MySqlPool, exists: &'static str, binds: &[&str]) -> Result<bool> {
    let mut query = sqlx::query_scalar(exists);
    for bind in binds {
        query = query.bind(*bind);
    }
    query.fetch_one(pool).await.map_err(from_sqlx)
}

async fn run(pool: &MySqlPool, sql: &str) -> Result<()> {
    sqlx::query(AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .map_err(from_sqlx)?;
    Ok(())
}

/// Session mode's fence counter: one row for the whole table (the empty name, which no lock
/// has), incremented by every grant. Before it, tables kept a row per lock name in `fence`,
/// which grew with every name ever locked; they are migrated on connect
/// ([`ensure_session`]).
pub(super) const FENCE_SHAPE: Shape = &[("name", "varbinary"), ("counter", "bigint")];

pub(super) fn fence_ddl(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (
    name    VARBINARY(512) NOT NULL PRIMARY KEY,
    counter BIGINT NOT NULL
) ENGINE=InnoDB"
    )
}

/// The statement that draws session mode's next fence from `table`'s counter row;
/// `LAST_INSERT_ID(expr)` carries the new value back in the reply.
pub(super) fn next_fence_sql(table: &str) -> String {
    format!("UPDATE {table} SET counter = LAST_INSERT_ID(counter + 1) WHERE name = ''")
}

/// Creates the session table and its counter row if missing, migrating a table of the
/// per-name layout, and checks the shape.
///
/// The migration first renames `fence` to `counter` (one atomic DDL statement), so an older
/// dlock still running against the table fails on its next grant instead of counting on its
/// own rows, and an older dlock connecting afterwards is refused by its shape check. Then the
/// counter row starts at the highest fence of any row (raised, never lowered, if it exists),
/// and the per-name rows go.
pub(super) async fn ensure_session(pool: &MySqlPool, table: &str) -> Result<()> {
    if has_older_fence(pool, table, "counter").await? {
        rename_fence(pool, table, "counter").await?;
    }
    ensure(pool, table, &fence_ddl(table), FENCE_SHAPE).await?;
    // Idempotent: the counter row is at least the highest value in the table. (The highest
    // is read first: MySQL cannot update a table it selects from in one statement.)
    let highest = highest(pool, table, "counter").await?;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (name, counter) VALUES ('', ?)
         ON DUPLICATE KEY UPDATE counter = GREATEST(counter, VALUES(counter))"
    )))
    .bind(highest)
    .execute(pool)
    .await
    .map_err(from_sqlx)?;
    run(pool, &format!("DELETE FROM {table} WHERE name <> ''")).await
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
