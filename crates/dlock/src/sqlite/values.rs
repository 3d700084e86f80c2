//! Versioned values in the `dlock_values` table: each write is one conditional statement.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::clock::{boot, now_ms};

use crate::backend::Expect;

/// Created on open when missing, so files made before values existed gain the table.
pub(super) const CREATE: &str = "
CREATE TABLE IF NOT EXISTS dlock_values (
    name    TEXT PRIMARY KEY NOT NULL,  -- case-sensitive, its own namespace beside dlock_locks
    version INTEGER NOT NULL,           -- only ever incremented: rows are never deleted
    value   BLOB NOT NULL
) WITHOUT ROWID;
";

/// Every column read or written, probed on open.
pub(super) const PROBE: &str = "SELECT name, version, value FROM dlock_values LIMIT 0";

pub(super) fn get(conn: &Connection, name: &str) -> rusqlite::Result<Option<(Vec<u8>, i64)>> {
    conn.prepare_cached("SELECT value, version FROM dlock_values WHERE name = ?1")?
        .query_row([name], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()
}

pub(super) fn put(
    conn: &Connection,
    name: &str,
    expect: Expect,
    value: &[u8],
) -> rusqlite::Result<Option<i64>> {
    let version = |row: &rusqlite::Row<'_>| row.get::<_, i64>(0);
    match expect {
        Expect::Any => conn
            .prepare_cached(
                "INSERT INTO dlock_values (name, version, value) VALUES (?1, 1, ?2)
                 ON CONFLICT (name) DO UPDATE SET version = version + 1, value = excluded.value
                 RETURNING version",
            )?
            .query_row(params![name, value], version)
            .optional(),
        Expect::Absent => conn
            .prepare_cached(
                "INSERT INTO dlock_values (name, version, value) VALUES (?1, 1, ?2)
                 ON CONFLICT (name) DO NOTHING RETURNING version",
            )?
            .query_row(params![name, value], version)
            .optional(),
        Expect::Version(expected) => conn
            .prepare_cached(
                "UPDATE dlock_values SET version = version + 1, value = ?2
                 WHERE name = ?1 AND version = ?3 RETURNING version",
            )?
            .query_row(
                params![name, value, i64::try_from(expected).unwrap_or(i64::MAX)],
                version,
            )
            .optional(),
    }
}

/// A fenced write: in one IMMEDIATE transaction, the hold's row is checked (its token and
/// fence, its lease not over by this machine's monotonic clock, this boot) and the value
/// written. `None` when the hold is no longer current: the transaction rolls back, nothing
/// written.
pub(super) fn put_fenced(
    conn: &mut Connection,
    hold: (&str, &str, i64),
    name: &str,
    value: &[u8],
) -> rusqlite::Result<Option<i64>> {
    let (lock, token, fence) = hold;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let current = tx
        .prepare_cached(
            "SELECT 1 FROM dlock_locks
             WHERE name = ?1 AND token = ?2 AND hold_fence = ?3 AND expires_mono > ?4 AND boot = ?5",
        )?
        .exists(params![lock, token, fence, now_ms(), boot()])?;
    if !current {
        return Ok(None);
    }
    let version = put(&tx, name, Expect::Any, value)?;
    tx.commit()?;
    Ok(version)
}
