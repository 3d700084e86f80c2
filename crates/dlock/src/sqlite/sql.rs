//! The statements of the SQLite backend, run synchronously on a connection (inline or on the
//! worker thread). Each takes and gives plain values, so it can run on either.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::clock::{self, boot, now_ms};
use super::holders::HolderFile;
use crate::backend::LockInfo;
use crate::fence::FencingToken;
use crate::name::Owner;

pub(super) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn from_ms(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A waiter that has not refreshed its place in the queue for this long is gone (crashed,
/// paused, cancelled without cleanup) and no longer holds anyone back.
pub(super) const WAITER_STALE_MS: i64 = 1000;

/// [`STARVATION_THRESHOLD`](crate::backend::wait::STARVATION_THRESHOLD) in the table's unit.
const STARVATION_MS: i64 = crate::backend::wait::STARVATION_THRESHOLD.as_millis() as i64;

/// The outcome of one attempt.
pub(super) enum Tried {
    /// `at`: read just before the clock the row's lease counts from (see
    /// [`clock::lease_start`]).
    Acquired { fence: i64, at: std::time::Instant },
    /// `free_in_ms` is the holder's remaining lease, or `None` when the lock is free but a
    /// queued waiter comes first.
    Busy { free_in_ms: Option<i64> },
}

/// The holder's token and when its lease ends (0 when it was counted in another boot).
type LockRow = Option<(Option<String>, i64)>;

enum Check {
    Grant(LockRow),
    Busy(Option<i64>),
}

/// Whether `req` may take the lock now: it is free (or re-entered), and no queued waiter
/// comes first.
fn check(conn: &Connection, req: &Request, now: i64) -> rusqlite::Result<Check> {
    let found: Option<(Option<String>, i64, Option<String>)> = conn
        .prepare_cached(
            "SELECT token, CASE WHEN boot = ?2 THEN expires_mono ELSE 0 END, holder
             FROM dlock_locks WHERE name = ?1",
        )?
        .query_row(params![req.name, boot()], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    let mut row: LockRow = found
        .as_ref()
        .map(|(token, expires, _)| (token.clone(), *expires));
    if let Some((Some(token), expires_at, holder)) = found
        && expires_at > now
    {
        // Our own token: a re-entry, or a retry of an attempt that was granted (grant() then
        // counts a hold only for a re-entry).
        if token == req.token {
            return Ok(Check::Grant(row));
        }
        // A lease of this boot whose holder's file is no longer locked: the holder died.
        let dead = holder
            .is_some_and(|holder| req.holder.as_ref().is_some_and(|own| own.is_dead(&holder)));
        if !dead {
            return Ok(Check::Busy(Some(expires_at - now)));
        }
        row = Some((Some(token), 0));
    }
    let head: Option<(String, i64)> = conn
        .prepare_cached(
            "SELECT token, since_mono FROM dlock_waiters
             WHERE name = ?1 AND seen_mono > ?2 AND boot = ?3
             ORDER BY since_mono, token LIMIT 1",
        )?
        .query_row(params![req.name, now - WAITER_STALE_MS, boot()], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()?;
    if let Some((token, since)) = head
        && token != req.token
        && (req.fair || now - since >= STARVATION_MS)
    {
        return Ok(Check::Busy(None));
    }
    Ok(Check::Grant(row))
}

/// Takes (or refreshes) this request's place in the queue, then reports busy.
fn queue(
    conn: &Connection,
    req: &Request,
    now: i64,
    free_in_ms: Option<i64>,
) -> rusqlite::Result<Tried> {
    if req.waits {
        req.queued.store(true, Ordering::Relaxed);
        let seen: Option<i64> = conn
            .prepare_cached("SELECT seen_mono FROM dlock_waiters WHERE name = ?1 AND token = ?2")?
            .query_row(params![req.name, req.token], |r| r.get(0))
            .optional()?;
        // Refresh only now and then: a poll should stay a read.
        if seen.is_none_or(|seen| now - seen > WAITER_STALE_MS / 4) {
            conn.prepare_cached(
                "INSERT INTO dlock_waiters (name, token, since_mono, seen_mono, boot)
                 VALUES (?1, ?2, ?3, ?3, ?4)
                 ON CONFLICT (name, token) DO UPDATE SET seen_mono = excluded.seen_mono",
            )?
            .execute(params![req.name, req.token, now, boot()])?;
        }
    }
    Ok(Tried::Busy { free_in_ms })
}

/// Writes the grant of `req` (checked free or re-entered as `row` says); returns the fence.
fn grant(conn: &Connection, req: &Request, row: LockRow, now: i64) -> rusqlite::Result<i64> {
    let expires_at = now.saturating_add(req.ttl_ms);
    let fence: i64 = match row {
        Some((Some(token), live_until)) if live_until > now && token == req.token => conn
            .prepare_cached(
                "UPDATE dlock_locks SET holds = holds + ?3, expires_mono = MAX(expires_mono, ?2)
                 WHERE name = ?1 RETURNING hold_fence",
            )?
            .query_row(
                params![req.name, expires_at, i64::from(req.reentrant)],
                |r| r.get(0),
            )?,
        // A fresh hold: the file's one fence counter (the transaction is the only writer),
        // so a name's next fence is higher than its last even after its row was deleted.
        _ => {
            let fence: i64 = conn
                .prepare_cached(
                    "UPDATE dlock_fence SET last = last + 1 WHERE id = 1 RETURNING last",
                )?
                .query_row([], |r| r.get(0))?;
            conn.prepare_cached(
                "INSERT INTO dlock_locks (name, hold_fence, token, holds, expires_mono, boot, holder, acquired_at, owner_label, host, pid)
                 VALUES (?1, ?10, ?2, 1, ?3, ?4, ?9, ?5, ?6, ?7, ?8)
                 ON CONFLICT (name) DO UPDATE SET
                     hold_fence = excluded.hold_fence, token = excluded.token, holds = 1,
                     expires_mono = excluded.expires_mono, boot = excluded.boot,
                     holder = excluded.holder,
                     acquired_at = excluded.acquired_at, owner_label = excluded.owner_label,
                     host = excluded.host, pid = excluded.pid",
            )?
            .execute(params![
                req.name,
                req.token,
                expires_at,
                boot(),
                clock::wall_ms(),
                req.owner.label,
                req.owner.host,
                req.owner.pid,
                req.holder.as_ref().map(|h| h.id()),
                fence
            ])?;
            fence
        }
    };
    Ok(fence)
}

/// Every lock of `reqs` in one IMMEDIATE transaction, or none: the attempt of a multi-lock.
/// Returns the fences in order, or `None` when any lock is busy.
pub(super) fn try_acquire_all(
    conn: &mut Connection,
    reqs: &[Request],
) -> rusqlite::Result<Option<(std::time::Instant, Vec<i64>)>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let at = std::time::Instant::now();
    let now = now_ms();
    let mut rows = Vec::with_capacity(reqs.len());
    for req in reqs {
        match check(&tx, req, now)? {
            Check::Grant(row) => rows.push(row),
            Check::Busy(_) => return Ok(None), // dropping `tx` rolls back: nothing was written
        }
    }
    let mut fences = Vec::with_capacity(reqs.len());
    for (req, row) in reqs.iter().zip(rows) {
        fences.push(grant(&tx, req, row, now)?);
    }
    tx.commit()?;
    Ok(Some((at, fences)))
}

/// One acquisition attempt: an IMMEDIATE transaction that checks and writes (after a plain
/// read on retries).
pub(super) fn try_acquire(conn: &mut Connection, req: &Request) -> rusqlite::Result<Tried> {
    // A retry reads first, so polling a held lock never takes the write lock; the first try
    // goes straight to the write, as most locks are free.
    if req.attempts.fetch_add(1, Ordering::Relaxed) > 0 {
        let now = now_ms();
        if let Check::Busy(free_in_ms) = check(conn, req, now)? {
            return queue(conn, req, now, free_in_ms);
        }
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let at = std::time::Instant::now();
    let now = now_ms();
    let row = match check(&tx, req, now)? {
        Check::Grant(row) => row,
        Check::Busy(free_in_ms) => {
            drop(tx);
            return queue(conn, req, now, free_in_ms);
        }
    };
    let fence = grant(&tx, req, row, now)?;
    if req.queued.load(Ordering::Relaxed) {
        // Leave the queue, and sweep out waiters that are gone.
        tx.prepare_cached(
            "DELETE FROM dlock_waiters
             WHERE name = ?1 AND (token = ?2 OR seen_mono <= ?3 OR boot != ?4)",
        )?
        .execute(params![req.name, req.token, now - WAITER_STALE_MS, boot()])?;
    }
    tx.commit()?;
    Ok(Tried::Acquired { fence, at })
}

/// Frees every lease of this boot held by the dead holder `id` (its file found unlocked), so
/// its file can go: the rows go, the fence counter stays. Returns how many were freed.
pub(super) fn reap(conn: &Connection, id: &str) -> rusqlite::Result<usize> {
    conn.prepare_cached(
        "DELETE FROM dlock_locks WHERE holder = ?1 AND boot = ?2 AND token IS NOT NULL",
    )?
    .execute(params![id, boot()])
}

/// Removes a waiter that gave up (timed out, cancelled, failed).
/// Returns whether it was queued.
pub(super) fn leave_queue(conn: &Connection, name: &str, token: &str) -> rusqlite::Result<bool> {
    let removed = conn
        .prepare_cached("DELETE FROM dlock_waiters WHERE name = ?1 AND token = ?2")?
        .execute(params![name, token])?;
    Ok(removed > 0)
}

/// Decrements the hold count; deletes the row at zero (the next fence comes from the file's
/// counter). `Ok(None)` = not owned.
///
/// Two releases of one re-entered hold may run at once on two connections (the client's
/// inline one and its worker's): each statement is atomic, but a check of the count and a
/// change of it in two statements are not, so each statement carries its own condition (the
/// delete at a count of one, the decrement above it), and when neither matched because the
/// other release came in between, the pair runs again.
pub(super) fn release(
    conn: &Connection,
    name: &str,
    token: &str,
    fence: i64,
) -> rusqlite::Result<Option<i64>> {
    let owned = "name = ?1 AND token = ?2 AND hold_fence = ?3 AND expires_mono > ?4 AND boot = ?5";
    loop {
        let args = params![name, token, fence, now_ms(), boot()];
        let deleted = conn
            .prepare_cached(&format!(
                "DELETE FROM dlock_locks WHERE {owned} AND holds <= 1 RETURNING 0"
            ))?
            .query_row(args, |r| r.get(0))
            .optional()?;
        if deleted.is_some() {
            return Ok(deleted);
        }
        let decremented = conn
            .prepare_cached(&format!(
                "UPDATE dlock_locks SET holds = holds - 1 WHERE {owned} AND holds > 1 RETURNING holds"
            ))?
            .query_row(args, |r| r.get(0))
            .optional()?;
        if decremented.is_some() {
            return Ok(decremented);
        }
        let still_owned = conn
            .prepare_cached(&format!("SELECT 1 FROM dlock_locks WHERE {owned}"))?
            .exists(args)?;
        if !still_owned {
            return Ok(None);
        }
    }
}

/// How many rows one sweep statement deletes at most, so a sweep never holds the write lock
/// for long.
pub(super) const SWEEP_BATCH: i64 = 1000;

/// Deletes lock rows whose lease is over and waiter rows gone stale (of this boot by the
/// clock, of another boot all of them), at most [`SWEEP_BATCH`] of each; returns the larger
/// count, so a full batch says there may be more.
pub(super) fn sweep(conn: &Connection) -> rusqlite::Result<usize> {
    let now = now_ms();
    let locks = conn
        .prepare_cached(
            "DELETE FROM dlock_locks WHERE name IN (
                 SELECT name FROM dlock_locks WHERE boot = ?1 AND expires_mono <= ?2
                 UNION ALL SELECT name FROM dlock_locks WHERE boot < ?1 OR boot > ?1 OR boot IS NULL
                 LIMIT ?3)",
        )?
        .execute(params![boot(), now, SWEEP_BATCH])?;
    let waiters = conn
        .prepare_cached(
            "DELETE FROM dlock_waiters WHERE (name, token) IN (
                 SELECT name, token FROM dlock_waiters WHERE boot = ?1 AND seen_mono <= ?2
                 UNION ALL SELECT name, token FROM dlock_waiters WHERE boot < ?1 OR boot > ?1
                 LIMIT ?3)",
        )?
        .execute(params![boot(), now - WAITER_STALE_MS, SWEEP_BATCH])?;
    Ok(locks.max(waiters))
}

/// What the worker needs of an [`AcquireRequest`], owned so it can cross to the thread.
#[derive(Debug)]
pub(super) struct Request {
    pub(super) name: String,
    pub(super) token: String,
    pub(super) owner: Owner,
    pub(super) ttl_ms: i64,
    pub(super) reentrant: bool,
    /// Strict FIFO among waiters.
    pub(super) fair: bool,
    /// Willing to wait, so it queues when busy (`no_wait` attempts never queue).
    pub(super) waits: bool,
    /// Attempts so far.
    pub(super) attempts: AtomicU32,
    /// Whether it has taken a place in the waiter queue.
    pub(super) queued: AtomicBool,
    /// The client's holder file, recorded with its holds and used to probe other holders.
    pub(super) holder: Option<Arc<HolderFile>>,
}

impl Request {
    pub(super) fn new(
        req: &crate::backend::AcquireRequest,
        holder: Option<Arc<HolderFile>>,
    ) -> Request {
        Request {
            name: req.name.as_str().to_owned(),
            token: req.token.clone(),
            owner: req.owner.clone(),
            ttl_ms: ms(req.ttl),
            reentrant: req.reentrant,
            fair: req.fair,
            waits: req.wait != crate::backend::Wait::No,
            attempts: AtomicU32::new(0),
            queued: AtomicBool::new(false),
            holder,
        }
    }
}

/// A held row as shown, and its holder file's id.
type InfoRow = (
    (
        String,
        i64,
        i64,
        i64,
        i64,
        Option<String>,
        Option<String>,
        Option<i64>,
    ),
    Option<String>,
    i64,
);

/// The columns of a held row, then how many live waiters its name has: `now` is the
/// statement's placeholder for the current time (a waiter unseen for
/// [`WAITER_STALE_MS`] is gone).
fn info_columns(now: &str) -> String {
    format!(
        "name, hold_fence, holds, expires_mono, acquired_at, owner_label, host, pid, holder,
         (SELECT COUNT(*) FROM dlock_waiters w WHERE w.name = dlock_locks.name
             AND w.boot = dlock_locks.boot AND w.seen_mono > {now} - {WAITER_STALE_MS})"
    )
}

fn info_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<InfoRow> {
    Ok((
        (
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
            r.get(7)?,
        ),
        r.get(8)?,
        r.get(9)?,
    ))
}

/// Whether a held row's holder is still alive, as far as `own` can tell (see `holders.rs`): a
/// dead holder's lock is shown as free, since the next acquire takes it at once.
fn alive(row: &InfoRow, own: Option<&HolderFile>) -> bool {
    match (&row.1, own) {
        (Some(holder), Some(own)) => !own.is_dead(holder),
        _ => true,
    }
}

fn to_info(row: InfoRow, now: i64) -> LockInfo {
    let ((name, fence, holds, expires_at, acquired_at, label, host, pid), _, waiters) = row;
    LockInfo::new(
        name,
        FencingToken::from_signed(fence),
        Owner::from_columns(label, host, pid),
        from_ms(acquired_at),
        Some(Duration::from_millis(
            u64::try_from(expires_at - now).unwrap_or(0),
        )),
        u32::try_from(holds).unwrap_or(0),
    )
    .with_waiters(u32::try_from(waiters).unwrap_or(u32::MAX))
}

/// Makes the lease last at least `ttl_ms` from now if still owned; `false` = not owned.
pub(super) fn extend(
    conn: &Connection,
    name: &str,
    token: &str,
    fence: i64,
    ttl_ms: i64,
) -> rusqlite::Result<bool> {
    let now = now_ms();
    let changed = conn
        .prepare_cached(
            "UPDATE dlock_locks SET expires_mono = MAX(expires_mono, ?4 + ?5)
             WHERE name = ?1 AND token = ?2 AND hold_fence = ?3 AND expires_mono > ?4 AND boot = ?6",
        )?
        .execute(params![name, token, fence, now, ttl_ms, boot()])?;
    Ok(changed > 0)
}

/// Frees a held lock whoever holds it; `true` when it was held.
pub(super) fn force_release(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    let changed = conn
        .prepare_cached(
            "DELETE FROM dlock_locks
             WHERE name = ?1 AND token IS NOT NULL AND expires_mono > ?2 AND boot = ?3",
        )?
        .execute(params![name, now_ms(), boot()])?;
    Ok(changed > 0)
}

/// The holder of `name`, if it is held.
pub(super) fn inspect(
    conn: &Connection,
    name: &str,
    own: Option<&HolderFile>,
) -> rusqlite::Result<Option<LockInfo>> {
    let now = now_ms();
    conn.prepare_cached(&format!(
        "SELECT {} FROM dlock_locks
         WHERE name = ?1 AND token IS NOT NULL AND expires_mono > ?2 AND boot = ?3",
        info_columns("?2")
    ))?
    .query_row(params![name, now, boot()], info_row)
    .optional()
    .map(|row| {
        row.filter(|row| alive(row, own))
            .map(|row| to_info(row, now))
    })
}

/// Held locks under `prefix` after `cursor`, in name order: the primary key makes each page a
/// range scan from the cursor. Also returns the cursor of the next page: the last row read
/// when the page was full (rows of dead holders are read but not listed).
pub(super) fn list_page(
    conn: &Connection,
    prefix: &str,
    cursor: &str,
    limit: i64,
    own: Option<&HolderFile>,
) -> rusqlite::Result<(Vec<LockInfo>, Option<String>)> {
    let now = now_ms();
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {} FROM dlock_locks
         WHERE name >= ?1 AND name > ?2 AND substr(name, 1, length(?1)) = ?1
           AND token IS NOT NULL AND expires_mono > ?3 AND boot = ?5
         ORDER BY name LIMIT ?4",
        info_columns("?3")
    ))?;
    let rows: Vec<InfoRow> = stmt
        .query_map(params![prefix, cursor, now, limit, boot()], info_row)?
        .collect::<rusqlite::Result<_>>()?;
    let full = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= limit;
    let next = rows.last().filter(|_| full).map(|row| row.0.0.clone());
    let locks = rows
        .into_iter()
        .filter(|row| alive(row, own))
        .map(|row| to_info(row, now))
        .collect();
    Ok((locks, next))
}
