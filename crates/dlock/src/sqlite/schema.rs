//! The lock table, created on first use, and the checks that a file is dlock's.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use super::clock;
use super::error::Error;

/// Bumped when the table layout changes; a file of an older version is migrated when this
/// dlock knows how ([`migrate_1_to_2`], [`migrate_2_to_3`]), any other version is refused.
pub(crate) const SCHEMA_VERSION: &str = "3";

const CREATE: &str = "
CREATE TABLE dlock_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE dlock_locks (
    name         TEXT PRIMARY KEY NOT NULL,  -- case-sensitive (BINARY collation)
    hold_fence   INTEGER NOT NULL,           -- from dlock_fence: the row goes once its lease is over
    token        TEXT,                       -- holder's token; NULL when free
    holds        INTEGER NOT NULL DEFAULT 0, -- reentrant hold count
    expires_mono INTEGER NOT NULL DEFAULT 0, -- ms on the machine's monotonic clock of `boot`
    boot         TEXT,                       -- the boot that clock counts from: another boot's lease is over
    holder       TEXT,                       -- the holder's file in <db>-holders (see holders.rs), if any
    acquired_at  INTEGER NOT NULL DEFAULT 0, -- unix ms, shown only
    owner_label  TEXT,
    host         TEXT,
    pid          INTEGER
) WITHOUT ROWID;
CREATE INDEX dlock_locks_expiry ON dlock_locks (boot, expires_mono);
CREATE TABLE dlock_fence (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    last INTEGER NOT NULL                    -- the last fence given out, by any name
);
INSERT INTO dlock_fence (id, last) VALUES (1, 0);
";

/// Waiters in arrival order, times on the same clock as `expires_mono`.
const WAITERS: &str = "
CREATE TABLE dlock_waiters (
    name       TEXT NOT NULL,
    token      TEXT NOT NULL,
    since_mono INTEGER NOT NULL,  -- when it started waiting: the queue order
    seen_mono  INTEGER NOT NULL,  -- refreshed while it waits; stale ones are skipped and swept
    boot       TEXT NOT NULL,     -- a waiter of another boot is gone
    PRIMARY KEY (name, token)
) WITHOUT ROWID;
CREATE INDEX dlock_waiters_order ON dlock_waiters (name, since_mono, token);
CREATE INDEX IF NOT EXISTS dlock_waiters_seen ON dlock_waiters (boot, seen_mono);
";

/// Every column the backend reads or writes, probed on open so a foreign table of the same
/// name is reported instead of failing later.
const PROBE: &str = "SELECT last FROM dlock_fence LIMIT 0;
SELECT name, hold_fence, token, holds, expires_mono, boot, holder, acquired_at, owner_label, host, pid FROM dlock_locks LIMIT 0;
SELECT name, token, since_mono, seen_mono, boot FROM dlock_waiters LIMIT 0";

/// Schema 1 kept leases on the wall clock (`expires_at`, unix ms). A hold still running is
/// carried over with the time it has left, counted on the monotonic clock from now. The
/// renamed columns make every statement of a dlock that still reads schema 1 fail (no such
/// column) instead of writing wall-clock leases next to monotonic ones, and such a dlock
/// refuses to open the file; its holders stop renewing and learn of the loss at their local
/// deadline, no later than the carried-over lease ends.
fn migrate_1_to_2(tx: &Connection) -> rusqlite::Result<()> {
    tx.execute_batch(
        "ALTER TABLE dlock_locks RENAME COLUMN expires_at TO expires_mono;
         ALTER TABLE dlock_locks ADD COLUMN boot TEXT;
         ALTER TABLE dlock_locks ADD COLUMN holder TEXT;
         DROP TABLE dlock_waiters;",
    )?;
    tx.execute(
        "UPDATE dlock_locks SET boot = ?1,
             expires_mono = CASE WHEN token IS NOT NULL AND expires_mono > ?2
                 THEN ?3 + (expires_mono - ?2) ELSE 0 END",
        rusqlite::params![clock::boot(), clock::wall_ms(), clock::now_ms()],
    )?;
    // Waiters re-queue on their next attempt; the old ones would sort by wall-clock times.
    tx.execute_batch(WAITERS)?;
    tx.execute("UPDATE dlock_meta SET value = '2' WHERE key = 'schema'", [])?;
    Ok(())
}

/// Schema 2 kept a fence counter in each name's row and never deleted rows. Schema 3 draws
/// every fence from one counter for the file (`dlock_fence`), starting above every fence in
/// the table, so a row can be deleted once its lease is over. The renamed column makes every
/// grant, release and extension of a dlock that still reads schema 2 fail (no such column)
/// instead of counting a deleted name's fences from 1 again, and such a dlock refuses to open
/// the file; its holders stop renewing and learn of the loss at their local deadline, no
/// later than their leases end.
fn migrate_2_to_3(tx: &Connection) -> rusqlite::Result<()> {
    tx.execute_batch(
        "ALTER TABLE dlock_locks RENAME COLUMN fence TO hold_fence;
         CREATE INDEX dlock_locks_expiry ON dlock_locks (boot, expires_mono);
         CREATE INDEX IF NOT EXISTS dlock_waiters_seen ON dlock_waiters (boot, seen_mono);
         CREATE TABLE dlock_fence (id INTEGER PRIMARY KEY CHECK (id = 1), last INTEGER NOT NULL);
         INSERT INTO dlock_fence (id, last) SELECT 1, COALESCE(MAX(hold_fence), 0) FROM dlock_locks;",
    )?;
    tx.execute(
        "UPDATE dlock_meta SET value = ?1 WHERE key = 'schema'",
        [SCHEMA_VERSION],
    )?;
    Ok(())
}

/// What a database holds, as far as dlock is concerned.
pub(crate) enum Found {
    /// No tables at all: dlock may create its own.
    Empty,
    /// dlock's tables at this schema version.
    Current,
    /// dlock's tables at schema 1, which [`ensure`] migrates.
    Version1,
    /// dlock's tables at schema 2, which [`ensure`] migrates.
    Version2,
}

/// Reads what `conn` holds without changing anything: an empty database, dlock's own, or
/// an error naming why it is not dlock's (another application's tables, another schema
/// version). Run first on a read-only connection, so a foreign file is never written to, and
/// again inside the transaction that creates the tables.
pub(crate) fn classify(conn: &Connection, path: &Path) -> Result<Found, Error> {
    let sqlite = Error::sqlite;
    let not_dlock = |detail: String| Error::NotDlock {
        path: path.to_owned(),
        detail,
    };
    let tables: Vec<String> = {
        let mut stmt = conn
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .map_err(sqlite(path))?;
        let rows = stmt.query_map([], |row| row.get(0)).map_err(sqlite(path))?;
        rows.collect::<Result<_, _>>().map_err(sqlite(path))?
    };
    if tables.is_empty() {
        return Ok(Found::Empty);
    }
    if !tables.iter().any(|t| t == "dlock_meta") {
        return Err(not_dlock(format!(
            "the database belongs to another application (tables: {})",
            tables.join(", ")
        )));
    }
    let version: Option<String> = conn
        .query_row(
            "SELECT value FROM dlock_meta WHERE key = 'schema'",
            [],
            |row| row.get(0),
        )
        .optional()
        .map_err(|_| not_dlock("dlock_meta table has an unexpected shape".into()))?;
    match version.as_deref() {
        Some(SCHEMA_VERSION) => {}
        Some("1") => return Ok(Found::Version1),
        Some("2") => return Ok(Found::Version2),
        Some(other) => {
            return Err(not_dlock(format!(
                "schema version {other}, this dlock reads {SCHEMA_VERSION}"
            )));
        }
        None => return Err(not_dlock("dlock_meta has no schema version".into())),
    }
    conn.execute_batch(PROBE)
        .map_err(|e| not_dlock(format!("a dlock table has the wrong shape: {e}")))?;
    Ok(Found::Current)
}

/// Creates the tables in an empty database, or checks that an existing one is dlock's.
pub(crate) fn ensure(conn: &mut Connection, path: &Path) -> Result<(), Error> {
    let sqlite = Error::sqlite;
    let not_dlock = |detail: String| Error::NotDlock {
        path: path.to_owned(),
        detail,
    };
    // IMMEDIATE: processes opening a new file at once create the tables exactly once.
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sqlite(path))?;
    let mut found = classify(&tx, path)?;
    if let Found::Version1 = found {
        migrate_1_to_2(&tx)
            .map_err(|e| not_dlock(format!("schema version 1 could not be migrated to 2: {e}")))?;
        found = classify(&tx, path)?;
    }
    if let Found::Version2 = found {
        migrate_2_to_3(&tx).map_err(|e| {
            not_dlock(format!(
                "schema version 2 could not be migrated to {SCHEMA_VERSION}: {e}"
            ))
        })?;
        found = classify(&tx, path)?;
    }
    match found {
        Found::Version1 | Found::Version2 => {
            return Err(not_dlock(
                "an old schema version after its migration".into(),
            ));
        }
        Found::Current => {
            // Files made before versioned values existed gain the table; the layout of the
            // others is unchanged, so the schema version stays.
            tx.execute_batch(super::values::CREATE)
                .map_err(sqlite(path))?;
            tx.execute_batch(super::values::PROBE)
                .map_err(|e| not_dlock(format!("dlock_values table has the wrong shape: {e}")))?;
        }
        Found::Empty => {
            tx.execute_batch(CREATE).map_err(sqlite(path))?;
            tx.execute_batch(WAITERS).map_err(sqlite(path))?;
            tx.execute_batch(super::values::CREATE)
                .map_err(sqlite(path))?;
            tx.execute(
                "INSERT INTO dlock_meta (key, value) VALUES ('schema', ?1)",
                [SCHEMA_VERSION],
            )
            .map_err(sqlite(path))?;
        }
    }
    tx.commit().map_err(sqlite(path))
}
