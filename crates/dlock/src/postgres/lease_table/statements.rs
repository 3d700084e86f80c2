//! The lease table's statements in PostgreSQL's dialect, with the table name spliced in once.

use std::sync::Arc;

use crate::sql_common::{STARVATION_US, WAITER_STALE_MS};

/// The statements, with the table name spliced in once.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) acquire: Arc<str>,
    pub(super) leave: Arc<str>,
    pub(super) release: Arc<str>,
    pub(super) extend: Arc<str>,
    pub(super) extend_all: Arc<str>,
    pub(super) force_release: Arc<str>,
    pub(super) inspect: Arc<str>,
    pub(super) list: Arc<str>,
    pub(super) sweep_locks: Arc<str>,
    pub(super) sweep_waiters: Arc<str>,
}

impl Statements {
    pub(super) fn new(t: &str) -> Statements {
        let w = super::super::schema::waiters_table(t);
        let acquire = grant(t, &w);
        // A waiter giving up: if the lock is free, whoever is next may be waiting for it.
        let leave = format!(
            "WITH gone AS (
                DELETE FROM {w} WHERE name = $1 AND token = $2 RETURNING name
            )
            SELECT (SELECT 1 FROM pg_notify($3, $1)) FROM gone
            WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE name = $1 AND token IS NOT NULL
                                                  AND expires_at > now())"
        );
        // NOTIFY is sent at commit, so a woken waiter finds the row already free.
        let release = format!(
            "WITH released AS (
                UPDATE {t} SET holds = holds - 1,
                    token = CASE WHEN holds > 1 THEN token END,
                    expires_at = CASE WHEN holds > 1 THEN expires_at ELSE now() END
                WHERE name = $1 AND token = $2 AND hold_fence = $3 AND expires_at > now()
                RETURNING holds
            )
            SELECT holds, CASE WHEN holds = 0 THEN (SELECT 1 FROM pg_notify($4, $1)) END
            FROM released"
        );
        let extend = format!(
            "UPDATE {t} SET expires_at = GREATEST(expires_at, now() + $4 * interval '1 millisecond')
             WHERE name = $1 AND token = $2 AND hold_fence = $3 AND expires_at > now()"
        );
        // The renewals of one keeper pass in one statement: the arrays are the leases' names,
        // tokens, fences and TTLs; a lease twice in a batch (its largest TTL) is one row, and
        // the rows returned are the leases still owned.
        let extend_all = format!(
            "UPDATE {t} AS l
             SET expires_at = GREATEST(l.expires_at, now() + r.ttl_ms * interval '1 millisecond')
             FROM (SELECT DISTINCT ON (name, token, fence) name, token, fence, ttl_ms
                   FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[])
                        AS u(name, token, fence, ttl_ms)
                   ORDER BY name, token, fence, ttl_ms DESC) AS r
             WHERE l.name = r.name AND l.token = r.token AND l.hold_fence = r.fence
               AND l.expires_at > now()
             RETURNING l.name, l.token, l.hold_fence"
        );
        let force_release = format!(
            "WITH broken AS (
                UPDATE {t} SET token = NULL, holds = 0, expires_at = now()
                WHERE name = $1 AND token IS NOT NULL AND expires_at > now()
                RETURNING name
            )
            SELECT (SELECT 1 FROM pg_notify($2, $1)) FROM broken"
        );
        let (inspect, list) = reads(t, &w);
        let (sweep_locks, sweep_waiters) = sweeps(t, &w);
        Statements {
            sweep_locks: sweep_locks.into(),
            sweep_waiters: sweep_waiters.into(),
            acquire: acquire.into(),
            leave: leave.into(),
            release: release.into(),
            extend: extend.into(),
            extend_all: extend_all.into(),
            force_release: force_release.into(),
            inspect: inspect.into(),
            list: list.into(),
        }
    }
}

/// The grant statement: takes the lock, or queues (or refreshes) the waiter.
fn grant(t: &str, w: &str) -> String {
    // `l.*` is the row before the change. The same token on a live row keeps the fence:
    // a re-entry ($7) counts a hold, a retry whose granting reply was lost takes its grant
    // as it is; anything else that passes the WHERE is a fresh hold of a free or expired
    // row (or of a new one): its fence is the table's sequence's next value.
    //
    // That value is drawn under a transaction-level advisory lock on the name, so the
    // acquire statements of one name run one after another: a later grant's fence is
    // drawn after an earlier grant committed, so it is higher, even when the sweeper
    // deleted the row in between (a fence drawn by a statement that then stalled before
    // inserting could otherwise be lower than one a quicker statement gave out meanwhile).
    // The two-key form keeps clear of session mode's one-key advisory locks.
    let seq = super::super::schema::fence_sequence(t);
    let name_lock = format!("pg_advisory_xact_lock(hashtext('{t}'), hashtext($1))");
    // The waiter queue: `head` is the oldest live waiter (entries not refreshed for
    // WAITER_STALE are ignored, and swept by the next grant). A free lock goes to anyone
    // only while nobody else heads the queue, or (unfair) while the head has waited
    // under the starvation threshold. The snapshot read of the queue is enough: a waiter
    // queueing concurrently arrived after this attempt.
    format!(
        "WITH head AS (
            SELECT token, since FROM {w}
            WHERE name = $1 AND seen > now() - interval '{WAITER_STALE_MS} milliseconds'
            ORDER BY since, token LIMIT 1
        ), granted AS (
            INSERT INTO {t} AS l (name, hold_fence, token, holds, expires_at, acquired_at, owner_label, host, pid)
            VALUES ($1, (SELECT nextval('{seq}') FROM (SELECT {name_lock}) AS locked),
                    $2, 1, now() + $3 * interval '1 millisecond', now(), $4, $5, $6)
            ON CONFLICT (name) DO UPDATE SET
                hold_fence = CASE WHEN l.token = EXCLUDED.token AND l.expires_at > now()
                             THEN l.hold_fence ELSE EXCLUDED.hold_fence END,
                holds = CASE WHEN l.token = EXCLUDED.token AND l.expires_at > now()
                             THEN l.holds + (CASE WHEN $7 THEN 1 ELSE 0 END) ELSE 1 END,
                expires_at = CASE WHEN l.token = EXCLUDED.token AND l.expires_at > now()
                             THEN GREATEST(l.expires_at, EXCLUDED.expires_at) ELSE EXCLUDED.expires_at END,
                acquired_at = CASE WHEN l.token = EXCLUDED.token AND l.expires_at > now()
                             THEN l.acquired_at ELSE EXCLUDED.acquired_at END,
                token = EXCLUDED.token, owner_label = EXCLUDED.owner_label,
                host = EXCLUDED.host, pid = EXCLUDED.pid
            WHERE ((l.token IS NULL OR l.expires_at <= now())
                   AND NOT EXISTS (SELECT 1 FROM head WHERE head.token <> $2
                       AND ($8 OR head.since <= now() - interval '{STARVATION_US} microseconds')))
               OR (l.token = EXCLUDED.token AND l.expires_at > now())
            RETURNING hold_fence
        ), queued AS (
            INSERT INTO {w} (name, token, since, seen)
            SELECT $1, $2, now(), now() WHERE $9 AND NOT EXISTS (SELECT 1 FROM granted)
            ON CONFLICT (name, token) DO UPDATE SET seen = EXCLUDED.seen
            RETURNING 1
        ), left_queue AS (
            DELETE FROM {w}
            WHERE name = $1 AND EXISTS (SELECT 1 FROM granted)
              AND (token = $2 OR seen <= now() - interval '{WAITER_STALE_MS} milliseconds')
        )
        SELECT (SELECT hold_fence FROM granted),
               (SELECT GREATEST(0, ceil(extract(epoch FROM expires_at - now()) * 1000))::bigint
                  FROM {t} WHERE name = $1 AND token IS NOT NULL AND expires_at > now()),
               EXISTS (SELECT 1 FROM queued)"
    )
}

/// The statements that read holds: one name, and a page of names.
fn reads(t: &str, w: &str) -> (String, String) {
    // The last column counts the name's live waiters (the holder left the queue when
    // it was granted).
    let columns = format!(
        "name, hold_fence, holds,
        (extract(epoch FROM acquired_at) * 1000000)::bigint,
        GREATEST(0, floor(extract(epoch FROM expires_at - now()) * 1000))::bigint,
        owner_label, host, pid,
        (SELECT count(*) FROM {w} q WHERE q.name = l.name
            AND q.seen > now() - interval '{WAITER_STALE_MS} milliseconds')"
    );
    let inspect = format!(
        "SELECT {columns} FROM {t} l
         WHERE name = $1 AND token IS NOT NULL AND expires_at > now()"
    );
    let list = format!(
        "SELECT {columns} FROM {t} l
         WHERE name >= $1 AND name > $2 AND starts_with(name, $1)
           AND token IS NOT NULL AND expires_at > now()
         ORDER BY name LIMIT $3"
    );
    (inspect, list)
}

/// The sweeper's statements: ended leases, and stale waiters.
fn sweeps(t: &str, w: &str) -> (String, String) {
    // Rows whose lease is over (released, broken or expired: `expires_at` is in the past
    // for all three), oldest first by the expiry index; rows another statement has locked
    // are skipped, not waited for. Nothing is lost: the fence comes from the sequence, and
    // the holder of an ended lease is refused with or without its row.
    let sweep_locks = format!(
        "WITH ended AS (
            SELECT name FROM {t} WHERE expires_at <= now()
            ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED
        )
        DELETE FROM {t} l USING ended WHERE l.name = ended.name AND l.expires_at <= now()"
    );
    let sweep_waiters = format!(
        "WITH gone AS (
            SELECT name, token FROM {w}
            WHERE seen <= now() - interval '{WAITER_STALE_MS} milliseconds'
            ORDER BY seen LIMIT $1 FOR UPDATE SKIP LOCKED
        )
        DELETE FROM {w} q USING gone WHERE q.name = gone.name AND q.token = gone.token"
    );
    (sweep_locks, sweep_waiters)
}
