//! Tables created on first use, and the check that an existing table is dlock's.

use sqlx::{AssertSqlSafe, PgConnection, PgPool};

use crate::error::Result;
use crate::sql_common::check_shape;
pub(super) use crate::sql_common::{Shape, waiters_table};

use super::error::{BACKEND, from_sqlx};

/// The lease table: a row per lock name while its lease lasts (the sweeper deletes it some
/// seconds after). `hold_fence` is the fence of the row's hold, drawn from the table's
/// sequence ([`fence_sequence`]); tables of dlock 0.x before that kept a per-name counter in
/// `fence` and never deleted rows, and are migrated on connect ([`ensure_lease`]).
pub(super) const LEASE_SHAPE: Shape = &[
    ("name", "text"),
    ("hold_fence", "bigint"),
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
    hold_fence  bigint NOT NULL,               -- from the sequence <table>_fence
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

/// The sequence every fence of lease table `table` comes from: one for the table, so a
/// name's row can be deleted once its lease is over and its next fence is still higher.
/// Sequences never hand out a value twice, also across crashes (they may skip some).
pub(super) fn fence_sequence(table: &str) -> String {
    format!("{table}_fence")
}

/// Creates the lease table, its fence sequence and its expiry index if missing, migrates a
/// table of the per-name-counter layout, and checks the shape.
///
/// The migration runs in one transaction under an exclusive lock on the table: the sequence
/// starts above every fence in the table, and the column `fence` is renamed `hold_fence`, so
/// an older dlock still running against the table fails on its next statement (no column
/// `fence`) instead of counting fences from 1 for a name whose row was swept, and an older
/// dlock connecting afterwards is refused by its shape check. Its holders learn of the loss
/// at their local deadline, no later than their leases end.
pub(super) async fn ensure_lease(pool: &PgPool, table: &str) -> Result<()> {
    if has_older_fence(pool, table, "hold_fence").await? {
        migrate_counter_layout(pool, table)
            .await
            .map_err(from_sqlx)?;
    }
    ensure(pool, table, &lease_ddl(table), LEASE_SHAPE).await?;
    ensure_sequence(pool, table).await.map_err(from_sqlx)?;
    ensure_index(pool, table, "expires_at").await
}

/// See [`ensure_lease`].
async fn migrate_counter_layout(pool: &PgPool, table: &str) -> sqlx::Result<()> {
    let seq = fence_sequence(table);
    let mut tx = pool.begin().await?;
    run(
        &mut tx,
        format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"),
    )
    .await?;
    // Another client may have migrated while this one waited for the lock.
    let still_old: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM information_schema.columns
         WHERE table_schema = current_schema() AND table_name = $1 AND column_name = 'fence')",
    )
    .bind(table)
    .fetch_one(&mut *tx)
    .await?;
    if !still_old {
        return tx.commit().await;
    }
    run(&mut tx, format!("CREATE SEQUENCE IF NOT EXISTS {seq}")).await?;
    run(
        &mut tx,
        format!(
            "SELECT setval('{seq}', GREATEST((SELECT COALESCE(MAX(fence), 0) FROM {table}),
                                         (SELECT last_value FROM {seq})) + 1, false)"
        ),
    )
    .await?;
    run(
        &mut tx,
        format!("ALTER TABLE {table} RENAME COLUMN fence TO hold_fence"),
    )
    .await?;
    tx.commit().await
}

/// Creates the fence sequence of a lease table that has none (a new table, or one whose
/// sequence was dropped), starting above every fence in the table. Under a lock that keeps
/// writers out, so no fence is drawn from a sequence about to be moved.
async fn ensure_sequence(pool: &PgPool, table: &str) -> sqlx::Result<()> {
    let seq = fence_sequence(table);
    let exists = "SELECT to_regclass($1) IS NOT NULL";
    if sqlx::query_scalar(exists)
        .bind(&seq)
        .fetch_one(pool)
        .await?
    {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    run(
        &mut tx,
        format!("LOCK TABLE {table} IN SHARE ROW EXCLUSIVE MODE"),
    )
    .await?;
    if sqlx::query_scalar(exists)
        .bind(&seq)
        .fetch_one(&mut *tx)
        .await?
    {
        return tx.commit().await;
    }
    run(&mut tx, format!("CREATE SEQUENCE {seq}")).await?;
    run(
        &mut tx,
        format!(
            "SELECT setval('{seq}', (SELECT COALESCE(MAX(hold_fence), 0) FROM {table}) + 1, false)"
        ),
    )
    .await?;
    tx.commit().await
}

/// Adds the index on `column` the sweeper's statement uses, to a table made before it had
/// one. Checked first, so a user that may only use the table is not asked to create anything;
/// two clients creating it at once race on the catalog.
pub(super) async fn ensure_index(pool: &PgPool, table: &str, column: &str) -> Result<()> {
    let index = format!("{table}_{column}");
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&index)
        .fetch_one(pool)
        .await
        .map_err(from_sqlx)?;
    if exists {
        return Ok(());
    }
    let ddl = format!("CREATE INDEX IF NOT EXISTS {index} ON {table} ({column})");
    match sqlx::query(AssertSqlSafe(ddl)).execute(pool).await {
        Ok(_) => Ok(()),
        Err(sqlx::Error::Database(db))
            if matches!(db.code().as_deref(), Some("23505" | "42P07" | "42710")) =>
        {
            Ok(())
        }
        Err(e) => Err(from_sqlx(e)),
    }
}

/// Session mode's fence counter: one row for the whole table (the empty name, which no lock
/// has), incremented by every grant. Before it, tables kept a row per lock name in `fence`,
/// which grew with every name ever locked; they are migrated on connect
/// ([`ensure_session`]).
pub(super) const FENCE_SHAPE: Shape = &[("name", "text"), ("counter", "bigint")];

pub(super) fn fence_ddl(table: &str) -> String {
    format!(
        r#"CREATE TABLE IF NOT EXISTS {table} (
    name    text COLLATE "C" PRIMARY KEY,  -- '' for the table's one counter
    counter bigint NOT NULL
)"#
    )
}

/// The statement that draws session mode's next fence from `table`'s counter row.
pub(super) fn next_fence_sql(table: &str) -> String {
    format!("UPDATE {table} SET counter = counter + 1 WHERE name = '' RETURNING counter")
}

/// Creates the session table and its counter row if missing, migrating a table of the
/// per-name layout, and checks the shape.
///
/// The migration first renames `fence` to `counter` (one atomic statement), so an older dlock
/// still running against the table fails on its next grant instead of counting on its own
/// rows, and an older dlock connecting afterwards is refused by its shape check. Then the
/// counter row starts at the highest fence of any row (raised, never lowered, if it exists),
/// and the per-name rows go.
pub(super) async fn ensure_session(pool: &PgPool, table: &str) -> Result<()> {
    if has_older_fence(pool, table, "counter").await? {
        let renamed = sqlx::query(AssertSqlSafe(format!(
            "ALTER TABLE {table} RENAME COLUMN fence TO counter"
        )))
        .execute(pool)
        .await;
        match renamed {
            Ok(_) => {}
            // Another client renamed it first.
            Err(_) if has(&columns(pool, table).await?, "counter") => {}
            Err(e) => return Err(from_sqlx(e)),
        }
    }
    ensure(pool, table, &fence_ddl(table), FENCE_SHAPE).await?;
    // Idempotent: the counter row is at least the highest value in the table.
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} AS f (name, counter)
         SELECT '', COALESCE(MAX(counter), 0) FROM {table}
         ON CONFLICT (name) DO UPDATE SET counter = GREATEST(f.counter, EXCLUDED.counter)"
    )))
    .execute(pool)
    .await
    .map_err(from_sqlx)?;
    sqlx::query(AssertSqlSafe(format!(
        "DELETE FROM {table} WHERE name <> ''"
    )))
    .execute(pool)
    .await
    .map_err(from_sqlx)?;
    Ok(())
}

/// Runs one statement of a migration on `conn` (a transaction's).
async fn run(conn: &mut PgConnection, sql: String) -> sqlx::Result<()> {
    sqlx::query(AssertSqlSafe(sql))
        .execute(conn)
        .await
        .map(drop)
}

/// Whether `table` still has the older layouts' column `fence` where dlock now keeps
/// `column`: a table to migrate.
async fn has_older_fence(pool: &PgPool, table: &str, column: &str) -> Result<bool> {
    let found = columns(pool, table).await?;
    Ok(has(&found, "fence") && !has(&found, column))
}

/// Whether `found` (name, type) has `column`.
fn has(found: &[(String, String)], column: &str) -> bool {
    found.iter().any(|(n, _)| n == column)
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
