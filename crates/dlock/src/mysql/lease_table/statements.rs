//! The lease table's statements in MySQL's (and MariaDB's) dialect, with the table name
//! spliced in once.

use std::sync::Arc;

use crate::sql_common::{STARVATION_US, WAITER_STALE_MS};

/// The database's clock in microseconds since the Unix epoch, in UTC whatever the session's
/// time zone. `UTC_TIMESTAMP(6)` is fixed for the whole statement.
pub(in crate::mysql) const NOW: &str =
    "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))";

/// The statements, with the table name spliced in once.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) take: Arc<str>,
    pub(super) insert: Arc<str>,
    pub(super) busy: Arc<str>,
    pub(super) queue: Arc<str>,
    pub(super) dequeue: Arc<str>,
    pub(super) leave: Arc<str>,
    pub(super) release: Arc<str>,
    pub(super) ring_on_release: Arc<str>,
    pub(super) extend: Arc<str>,
    pub(super) owned_of: Arc<str>,
    pub(super) renew_names: Arc<str>,
    pub(super) force_release: Arc<str>,
    pub(super) inspect: Arc<str>,
    pub(super) list: Arc<str>,
    pub(super) sweep_locks: Arc<str>,
    pub(super) sweep_waiters: Arc<str>,
}

/// `(?, ?, …)`: `count` placeholders, for a list of names.
pub(super) fn placeholders(count: usize) -> String {
    let mut list = "?, ".repeat(count);
    list.truncate(list.len().saturating_sub(2));
    format!("({list})")
}

impl Statements {
    pub(super) fn new(t: &str) -> Statements {
        let w = super::super::schema::waiters_table(t);
        let stale = WAITER_STALE_MS * 1000;
        let (take, insert, busy) = grant(t, &w, stale);
        let queue = format!(
            "INSERT INTO {w} (name, token, since, seen, bell) VALUES (?, ?, {NOW}, {NOW}, ?)
             ON DUPLICATE KEY UPDATE seen = {NOW}, bell = VALUES(bell)"
        );
        let dequeue =
            format!("DELETE FROM {w} WHERE name = ? AND (token = ? OR seen <= {NOW} - {stale})");
        let leave = format!("DELETE FROM {w} WHERE name = ? AND token = ?");
        // Token and expiry first (reading the old hold count), the count last. The reply's
        // LAST_INSERT_ID is the holds left times two, plus one when the lock is now free and
        // waiters with a doorbell may be queued for it (read from the row, so an uncontended
        // release looks at no other table).
        let release = format!(
            "UPDATE {t} SET
                token = IF(holds > 1, token, NULL),
                expires_at = IF(holds > 1, expires_at, {NOW}),
                holds = LAST_INSERT_ID((holds - 1) * 2 + IF(holds > 1, 0, ring_on_release)) DIV 2
             WHERE name = ? AND token = ? AND hold_fence = ? AND expires_at > {NOW}"
        );
        // A waiter with a doorbell asks the holder's release to ring, after writing its entry.
        let ring_on_release =
            format!("UPDATE {t} SET ring_on_release = 1 WHERE name = ? AND ring_on_release = 0");
        let extend = format!(
            "UPDATE {t} SET expires_at = GREATEST(expires_at, {NOW} + ?)
             WHERE name = ? AND token = ? AND hold_fence = ? AND expires_at > {NOW}"
        );
        // The renewals of one keeper pass: which of the names are still held (locked until
        // the transaction ends), then one expiry update per TTL; `renew_all_names(n)` ends
        // each with its list of names.
        let owned_of = format!(
            "SELECT name, token, hold_fence FROM {t}
             WHERE token IS NOT NULL AND expires_at > {NOW} AND name IN "
        );
        let renew_names =
            format!("UPDATE {t} SET expires_at = GREATEST(expires_at, {NOW} + ?) WHERE name IN ");
        let force_release = format!(
            "UPDATE {t} SET token = NULL, holds = 0, expires_at = {NOW}
             WHERE name = ? AND token IS NOT NULL AND expires_at > {NOW}"
        );
        let (inspect, list) = reads(t, &w, stale);
        // Rows whose lease is over (released, broken or expired alike), oldest first by the
        // expiry index. Nothing is lost: fences come from the sequence, and the holder of an
        // ended lease is refused with or without its row.
        let sweep_locks =
            format!("DELETE FROM {t} WHERE expires_at <= {NOW} ORDER BY expires_at LIMIT ?");
        let sweep_waiters =
            format!("DELETE FROM {w} WHERE seen <= {NOW} - {stale} ORDER BY seen LIMIT ?");
        Statements {
            sweep_locks: sweep_locks.into(),
            sweep_waiters: sweep_waiters.into(),
            take: take.into(),
            insert: insert.into(),
            busy: busy.into(),
            queue: queue.into(),
            dequeue: dequeue.into(),
            leave: leave.into(),
            release: release.into(),
            ring_on_release: ring_on_release.into(),
            extend: extend.into(),
            owned_of: owned_of.into(),
            renew_names: renew_names.into(),
            force_release: force_release.into(),
            inspect: inspect.into(),
            list: list.into(),
        }
    }
}

/// The grant's statements: take a free row, create a new name's free row, and read why a
/// name is busy.
fn grant(t: &str, w: &str, stale: u128) -> (String, String, String) {
    // The oldest live waiter; entries not refreshed for WAITER_STALE are ignored (and
    // swept by the next grant).
    let head = format!(
        "SELECT token, since FROM {w}
         WHERE name = ? AND seen > {NOW} - {stale} ORDER BY since, token LIMIT 1"
    );
    // Whether someone queued comes first: another waiter heads the queue and the lock is
    // fair, or (unfair) that head has waited past the starvation threshold. Binds: the
    // token, fair, the name.
    let blocked = format!(
        "COALESCE((SELECT h.token <> ? AND (? OR h.since <= {NOW} - {STARVATION_US})
                   FROM ({head}) h), FALSE)"
    );
    // `held_by_me`: re-entry of a live hold by the same token. MySQL evaluates SET from
    // left to right with the new values (MariaDB's SIMULTANEOUS_ASSIGNMENT with the old
    // ones): every condition reads only `token` and `expires_at`, which are assigned last,
    // so both orders give the same result. LAST_INSERT_ID(x) returns the fence in the OK
    // packet, so no second statement is needed.
    //
    // A fresh hold's fence is the table's sequence's next value, drawn while this
    // statement holds the row's lock: after every earlier grant of the name committed
    // (a deleted row's grants too: its delete committed before the row came back), so it
    // is higher than all of them. Never below the row's own fence + 1 either, which keeps
    // rows of a table migrated from per-name counters rising.
    let held_by_me = format!("(token <=> ? AND expires_at > {NOW})");
    let seq = super::super::schema::fence_sequence(t);
    // Whether waiters other than the new holder are queued (for a name that had some):
    // its release will ring. Binds: the name, the token.
    let others_queued = format!(
        "SELECT 1 FROM {w} q WHERE q.name = ? AND q.token <> ? AND q.seen > {NOW} - {stale}"
    );
    let take = format!(
        "UPDATE {t} SET
            hold_fence = LAST_INSERT_ID(IF({held_by_me}, hold_fence,
                                           GREATEST(hold_fence + 1, NEXTVAL({seq})))),
            holds = IF({held_by_me}, holds + ?, 1),
            acquired_at = IF({held_by_me}, acquired_at, {NOW}),
            owner_label = IF({held_by_me}, owner_label, ?),
            host = IF({held_by_me}, host, ?),
            pid = IF({held_by_me}, pid, ?),
            ring_on_release = IF({held_by_me}, ring_on_release,
                                 IF(ring_on_release, EXISTS({others_queued}), 0)),
            expires_at = IF({held_by_me}, GREATEST(expires_at, {NOW} + ?), {NOW} + ?),
            token = ?
         WHERE name = ? AND (((token IS NULL OR expires_at <= {NOW}) AND NOT {blocked})
                             OR (token <=> ? AND expires_at > {NOW}))"
    );
    // A new name gets a free row, which `take` then grants (again in one transaction,
    // `create_and_take`, if the row was lost in between): a fence is only ever drawn under
    // the row's lock (see `take`).
    let insert = format!(
        "INSERT INTO {t} (name, hold_fence, token, holds, expires_at, acquired_at)
         VALUES (?, 0, NULL, 0, {NOW} + 1000000, 0) ON DUPLICATE KEY UPDATE name = name"
    );
    // The holder's time left (NULL when free), and the queue's head and how long it has
    // waited, both in µs; then how many live waiters are ahead of this one (all of them
    // if it has no entry yet). Binds: the name, the token, the name, the token, the name.
    let busy = format!(
        "SELECT IF(l.token IS NOT NULL AND l.expires_at > {NOW}, l.expires_at - {NOW}, NULL),
                h.token, {NOW} - h.since,
                (SELECT COUNT(*) FROM {w} a LEFT JOIN {w} me ON me.name = a.name AND me.token = ?
                 WHERE a.name = ? AND a.seen > {NOW} - {stale} AND a.token <> ?
                   AND (me.since IS NULL OR a.since < me.since
                        OR (a.since = me.since AND a.token < me.token)))
         FROM {t} l LEFT JOIN ({head}) h ON TRUE
         WHERE l.name = ?"
    );
    (take, insert, busy)
}

/// The statements that read holds: one name, and a page of names.
fn reads(t: &str, w: &str, stale: u128) -> (String, String) {
    // The last column counts the name's live waiters (the holder left the queue when
    // it was granted).
    let columns = format!(
        "name, hold_fence, holds, acquired_at, GREATEST(0, expires_at - {NOW}) DIV 1000, owner_label, host, pid,
         (SELECT COUNT(*) FROM {w} q WHERE q.name = l.name AND q.seen > {NOW} - {stale})"
    );
    let inspect = format!(
        "SELECT {columns} FROM {t} l WHERE name = ? AND token IS NOT NULL AND expires_at > {NOW}"
    );
    let list = format!(
        "SELECT {columns} FROM {t} l
         WHERE name >= ? AND name > ? AND LEFT(name, LENGTH(?)) = ?
           AND token IS NOT NULL AND expires_at > {NOW}
         ORDER BY name LIMIT ?"
    );
    (inspect, list)
}
