//! Acquiring an etcd lock: a queue key on the client's session lease (a watchdog hold) or on a
//! fresh lease (a fixed TTL), the wait for the turn (watching the predecessor), and the
//! clean-up of an abandoned attempt.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use crate::backend::wait::Backoff;
use crate::backend::{AcquireRequest, Wait};
use crate::error::{Error, Result};

use super::config::WAITER_LEASE_SECS;
use super::encode_value;
use super::error::{BACKEND, bad_reply, lease_gone, map};
use super::first_by_create;
use super::lease::{Attached, EtcdLease};
use super::lease_secs;
use super::queue_rules::{Wanted, key_base, queue_key};
use super::revision;
use super::session::Session;
use super::{EtcdBackend, Inner, RETRY_MAX, RETRY_MIN};
use crate::backend::LockKind;
use turn::{Confirmed, Turn};

mod turn;

/// Leases an acquire call has granted and keys it put on the session lease, not handed over
/// yet; revoked (which deletes their keys) and deleted if the call ends without the lock,
/// including when its future is dropped (the call keeps it in an
/// [`Abandon`](crate::backend::abandon::Abandon) that revokes them all). A key on the session
/// would otherwise live as long as the session.
pub(super) struct Pending {
    pub(super) inner: Arc<Inner>,
    pub(super) leases: Mutex<Vec<i64>>,
    pub(super) keys: Mutex<Vec<Vec<u8>>>,
}

impl Pending {
    fn leases(&self) -> std::sync::MutexGuard<'_, Vec<i64>> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn track(&self, id: i64) {
        self.leases().push(id);
    }

    /// The lease is handed to a hold: no longer ours to clean up.
    fn keep(&self, id: i64) {
        self.leases().retain(|l| *l != id);
    }

    fn revoke(&self, id: i64) {
        self.keep(id);
        self.inner.revoke_later(vec![id]);
    }

    fn keys(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.keys.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A key about to be put on the session lease: deleted if the call ends without it.
    fn track_key(&self, key: &[u8]) {
        self.keys().push(key.to_vec());
    }

    fn keep_key(&self, key: &[u8]) {
        self.keys().retain(|k| k != key);
    }

    /// `hold`'s lease and `key` go to a hold: no longer ours to clean up.
    fn hand_over(&self, hold: &Granted, key: &[u8]) {
        match hold.session {
            Some(_) => self.keep_key(key),
            None => self.keep(hold.id),
        }
    }

    pub(super) fn revoke_all(&self) {
        let ids = std::mem::take(&mut *self.leases());
        self.inner.revoke_later(ids);
        let keys = std::mem::take(&mut *self.keys());
        self.inner.delete_later(keys);
    }

    /// Revokes every lease before returning, so the call's keys are gone when it reports:
    /// a refused call must not linger in the queue where the next caller would see it.
    pub(super) async fn revoke_now(&self) {
        let keys = std::mem::take(&mut *self.keys());
        for key in keys {
            let key = &key;
            let deleted = self
                .inner
                .resend(|mut c| async move { c.delete(key.as_slice(), None).await })
                .await;
            if let Err(error) = deleted {
                tracing::debug!(%error, "deleting a queued key failed; its session's end deletes it");
            }
        }
        let ids = std::mem::take(&mut *self.leases());
        for id in ids {
            let revoked = self
                .inner
                .resend(|mut c| async move { c.lease_revoke(id).await })
                .await;
            match revoked {
                Err(error) if !lease_gone(&error) => {
                    tracing::debug!(%error, lease = id, "revoking a lease failed; it expires instead");
                }
                _ => {}
            }
        }
    }
}

/// The waiter's place in the queue was lost (its lease ran out while it waited, for example
/// because the process was paused): retryable, the waiter queues again.
fn place_lost() -> Error {
    Error::Unavailable {
        backend: BACKEND,
        source: "the lease of this waiter's place in the queue ran out; queueing again".into(),
    }
}

/// The pause after each failure in a row while waiting, doubling from twice
/// [`RETRY_MIN`] to [`RETRY_MAX`].
pub(super) fn retry_backoff() -> Backoff {
    Backoff::steady(RETRY_MIN.saturating_mul(2), RETRY_MAX)
}

/// Whether a lease of `secs` asked for at `since` has, at `now`, at least `margin` left in
/// etcd (which started it after `since`).
fn lasts(secs: i64, since: Instant, now: Instant, margin: Duration) -> bool {
    let granted = Duration::from_secs(u64::try_from(secs).unwrap_or(0));
    since + granted > now + margin
}

/// The lease a key goes on: its id, its granted length in seconds, and an instant before it
/// was asked for or last kept alive (etcd keeps it at least until `since + secs` unless it is
/// kept alive again); for a session lease, the session and this hold's number on it.
#[derive(Clone, Debug)]
struct Granted {
    id: i64,
    secs: i64,
    since: Instant,
    session: Option<(Arc<Session>, u64)>,
}

impl Granted {
    /// The lease as a hold keeps it.
    fn attached(&self) -> Attached {
        match &self.session {
            Some((session, seq)) => Attached::Session {
                session: session.clone(),
                seq: *seq,
            },
            None => Attached::Own {
                id: self.id,
                secs: self.secs,
            },
        }
    }

    /// When the hold's lease started: a session's last confirmed keep-alive, or `fallback`.
    fn start(&self, fallback: Instant) -> Instant {
        self.session
            .as_ref()
            .map_or(fallback, |(session, _)| session.alive_since())
    }

    /// What ends the hold's key: the lease id, and on a session the hold's number too (many
    /// holds of the client share the lease).
    fn tag(&self) -> String {
        match &self.session {
            Some((session, seq)) => format!("{:016x}.{seq:x}", session.id),
            None => format!("{:016x}", self.id),
        }
    }

    /// A put on this lease failed with `error`: a session lease gone ended the session (every
    /// hold on it is lost) and the call starts over on a new one.
    fn put_failed(&self, error: etcd_client::Error, waiting: bool) -> Error {
        match &self.session {
            Some((session, _)) if lease_gone(&error) => {
                session.end(crate::LostReason::SessionEnded);
                place_lost()
            }
            _ => lease_lost_is_retryable(error, waiting),
        }
    }
}

/// Our key in the lock's queue (`prefix` is the lock's key base), created at revision `rev`.
struct Place {
    shape: LockKind,
    prefix: Vec<u8>,
    key: Vec<u8>,
    rev: i64,
}

/// How many leases a no-wait try takes before a lease that runs out before its put is an
/// error.
const TRY_CREATE_LEASES: usize = 3;

/// How a no-wait try ended.
enum TryCreated {
    /// The lock, or `None` when it was busy.
    Done(Option<EtcdLease>),
    /// The hold's lease was gone when its key was put (nothing was put): etcd's error, and
    /// the hold.
    LeaseRanOut(etcd_client::Error, Granted),
}

/// How queueing our key ended.
enum Queued {
    /// The lock was ours at once.
    Ours(EtcdLease),
    /// Busy, and the call does not wait: its key is gone again.
    Busy,
    /// Our key waits for its turn.
    Waiting(Place),
}

impl EtcdBackend {
    /// One pass: queue, wait for our turn, confirm. A retryable error means "start over".
    pub(super) async fn attempt(
        &self,
        req: &AcquireRequest,
        pending: &Pending,
    ) -> Result<Option<EtcdLease>> {
        let shape = req.kind;
        let prefix = key_base(shape, &self.inner.config.prefix, req.name.as_str());
        let secs = lease_secs(req.ttl);
        let (hold, key) = self.hold_and_key(req, &prefix, secs, pending).await?;
        if req.wait == Wait::No && matches!(shape, LockKind::Exclusive) {
            return self
                .try_create_anew(req, &prefix, secs, (hold, key), pending)
                .await;
        }
        let place = match self
            .enqueue(req, shape, prefix, key, &hold, pending)
            .await?
        {
            Queued::Ours(lease) => return Ok(Some(lease)),
            Queued::Busy => return Ok(None),
            Queued::Waiting(place) => place,
        };
        let queue_lease = self.waiter_lease(&place, &hold, pending).await?;
        self.take_turn(req, place, hold, queue_lease, pending).await
    }

    /// A lease of `secs` for this call, tracked by `pending` until a hold takes it.
    async fn grant_tracked(&self, secs: i64, pending: &Pending) -> Result<Granted> {
        let since = Instant::now();
        let (id, secs) = self.inner.grant_or_reuse(secs).await?;
        pending.track(id);
        Ok(Granted {
            id,
            secs,
            since,
            session: None,
        })
    }

    /// A place on the client's session lease of `secs` (granted on first use).
    async fn session_hold(&self, secs: i64) -> Result<Granted> {
        let sessions = &self.inner.sessions;
        let session = sessions.get(&self.inner, secs).await?;
        Ok(Granted {
            id: session.id,
            secs: session.secs,
            since: session.alive_since(),
            session: Some((session, sessions.next_hold())),
        })
    }

    /// A lease for this call's hold (the session's for a watchdog hold) and the hold's key in
    /// the queue of `prefix`, tracked by `pending` until a hold takes them.
    async fn hold_and_key(
        &self,
        req: &AcquireRequest,
        prefix: &[u8],
        secs: i64,
        pending: &Pending,
    ) -> Result<(Granted, Vec<u8>)> {
        let hold = if req.watchdog {
            self.session_hold(secs).await?
        } else {
            self.grant_tracked(secs, pending).await?
        };
        let key = queue_key(req.kind, prefix, &hold.tag());
        if hold.session.is_some() {
            pending.track_key(&key);
        }
        Ok((hold, key))
    }

    /// [`Self::try_create`], again on a new lease when the lease ran out before the put (a put
    /// slower than the lease, on a loaded machine or store: nothing was put), a few times
    /// before it is an error, as a waiting call starts over (CI: a no-wait try on a 2 s lease
    /// failed with etcd's "lease not found").
    async fn try_create_anew(
        &self,
        req: &AcquireRequest,
        prefix: &[u8],
        secs: i64,
        (mut hold, mut key): (Granted, Vec<u8>),
        pending: &Pending,
    ) -> Result<Option<EtcdLease>> {
        let mut leases = 1;
        loop {
            match self.try_create(req, prefix, key, hold, pending).await? {
                TryCreated::Done(lease) => return Ok(lease),
                TryCreated::LeaseRanOut(error, gone) if leases == TRY_CREATE_LEASES => {
                    return Err(gone.put_failed(error, false));
                }
                TryCreated::LeaseRanOut(error, gone) => {
                    tracing::debug!(%error, "the lease ran out before the put; another");
                    match gone.session {
                        // The session is over: every hold on it is told, the next is new.
                        Some(_) => drop(gone.put_failed(error, false)),
                        None => pending.keep(gone.id),
                    }
                    leases += 1;
                    (hold, key) = self.hold_and_key(req, prefix, secs, pending).await?;
                }
            }
        }
    }

    /// A try of a mutex that does not wait: creates the key only if the lock has no key at
    /// all, so a busy try leaves nothing.
    async fn try_create(
        &self,
        req: &AcquireRequest,
        prefix: &[u8],
        key: Vec<u8>,
        hold: Granted,
        pending: &Pending,
    ) -> Result<TryCreated> {
        let inner = &self.inner;
        let reply = inner
            .raw_txn(
                Txn::new()
                    .when([
                        Compare::create_revision(prefix.to_vec(), CompareOp::Equal, 0)
                            .with_prefix(),
                    ])
                    .and_then([TxnOp::put(
                        key.clone(),
                        encode_value(req),
                        Some(PutOptions::new().with_lease(hold.id)),
                    )]),
            )
            .await;
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) if lease_gone(&error) => return Ok(TryCreated::LeaseRanOut(error, hold)),
            Err(error) => return Err(hold.put_failed(error, false)),
        };
        if !reply.succeeded() {
            // Nothing was put: no key to delete, an own lease to revoke.
            match hold.session {
                Some(_) => pending.keep_key(&key),
                None => pending.revoke(hold.id),
            }
            return Ok(TryCreated::Done(None));
        }
        let fence = revision(reply.header(), "acquire")?;
        pending.hand_over(&hold, &key);
        let start = hold.start(hold.since);
        Ok(TryCreated::Done(Some(EtcdLease::new(
            inner.clone(),
            req,
            key,
            fence,
            hold.attached(),
            start,
        ))))
    }

    /// Queues: creates our key and reads the holder in the same transaction; the lock is ours
    /// at once if nobody is ahead by the rules of `shape`.
    async fn enqueue(
        &self,
        req: &AcquireRequest,
        shape: LockKind,
        prefix: Vec<u8>,
        key: Vec<u8>,
        hold: &Granted,
        pending: &Pending,
    ) -> Result<Queued> {
        let inner = &self.inner;
        let reply = inner
            .raw_txn(
                Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([
                        TxnOp::put(
                            key.clone(),
                            encode_value(req),
                            Some(PutOptions::new().with_lease(hold.id)),
                        ),
                        TxnOp::get(prefix.clone(), Some(first_by_create())),
                    ]),
            )
            .await
            .map_err(|e| hold.put_failed(e, true))?;
        if !reply.succeeded() {
            return Err(bad_reply("queue (the key of a fresh lease exists)"));
        }
        let rev = revision(reply.header(), "queue")?;
        let holder_rev = reply
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().map(KeyValue::create_revision),
                _ => None,
            })
            .ok_or_else(|| bad_reply("queue"))?;
        let ours = if shape.first_in_line_wins() {
            holder_rev == rev
        } else {
            matches!(inner.wanted(shape, &prefix, rev).await?.0, Wanted::Nothing)
        };
        if !ours && req.wait == Wait::No {
            // A busy try leaves nothing: the key goes now (it would count as a place ahead of
            // others until its lease's revocation lands), the lease in the background.
            let key = &key;
            inner
                .resend(|mut c| async move { c.delete(key.as_slice(), None).await })
                .await
                .map_err(map)?;
            pending.keep_key(key);
            pending.revoke_all();
            return Ok(Queued::Busy);
        }
        if ours {
            pending.hand_over(hold, &key);
            return Ok(Queued::Ours(EtcdLease::new(
                inner.clone(),
                req,
                key,
                rev,
                hold.attached(),
                hold.start(hold.since),
            )));
        }
        Ok(Queued::Waiting(Place {
            shape,
            prefix,
            key,
            rev,
        }))
    }

    /// The lease our key waits on. A short one, so a waiter that dies (or is paused) holds up
    /// the queue for seconds, not for its TTL. The hold's own lease stays granted, with no key
    /// on it, so that the turn needs no LeaseGrant (a Raft write) on the hand-off path: a
    /// keep-alive restarts it at its full length then. A waiter that dies leaves a lease with
    /// no key, which etcd expires. A waiter for the session always waits on a waiter lease:
    /// the session is renewed only while the client holds locks.
    async fn waiter_lease(
        &self,
        place: &Place,
        hold: &Granted,
        pending: &Pending,
    ) -> Result<Granted> {
        if hold.session.is_none() && hold.secs <= WAITER_LEASE_SECS {
            return Ok(hold.clone());
        }
        let waiter = self.grant_tracked(WAITER_LEASE_SECS, pending).await?;
        let moved = self
            .inner
            .raw_txn(
                Txn::new()
                    .when([Compare::create_revision(
                        place.key.clone(),
                        CompareOp::Equal,
                        place.rev,
                    )])
                    .and_then([TxnOp::put(
                        place.key.clone(),
                        Vec::new(),
                        Some(PutOptions::new().with_lease(waiter.id).with_ignore_value()),
                    )]),
            )
            .await
            .map_err(|e| lease_lost_is_retryable(e, true))?;
        if !moved.succeeded() {
            return Err(place_lost());
        }
        Ok(waiter)
    }

    /// Waits for our turn and confirms it, until the lock is ours or the wait runs out.
    async fn take_turn(
        &self,
        req: &AcquireRequest,
        place: Place,
        mut hold: Granted,
        queue_lease: Granted,
        pending: &Pending,
    ) -> Result<Option<EtcdLease>> {
        loop {
            match self
                .wait_turn(&place, queue_lease.clone(), req.wait)
                .await?
            {
                Turn::TimedOut => {
                    pending.revoke_all();
                    return Ok(None);
                }
                Turn::First => {}
            }
            let start = Instant::now();
            let keep_alive_first = match &hold.session {
                // The session may have ended while we waited: the one live now.
                Some((_, seq)) => {
                    let seq = *seq;
                    hold = self.session_hold(lease_secs(req.ttl)).await?;
                    if let Some((_, fresh_seq)) = &mut hold.session {
                        *fresh_seq = seq;
                    }
                    false
                }
                None => {
                    self.lease_for_turn(req, &mut hold, &queue_lease, start, pending)
                        .await?
                }
            };
            match self.confirm(&place, req, hold.id, keep_alive_first).await? {
                Confirmed::Ours => {}
                // A key ahead is still there (the one we watched was a waiter that left):
                // wait again.
                Confirmed::NotFirst => continue,
            }
            if queue_lease.id != hold.id {
                pending.revoke(queue_lease.id);
            }
            pending.hand_over(&hold, &place.key);
            let start = hold.start(start);
            return Ok(Some(EtcdLease::new(
                self.inner.clone(),
                req,
                place.key,
                place.rev,
                hold.attached(),
                start,
            )));
        }
    }

    /// The own lease to hold with once the turn came (at `start`), and whether it needs a
    /// keep-alive first (it was granted before the wait).
    async fn lease_for_turn(
        &self,
        req: &AcquireRequest,
        hold: &mut Granted,
        queue_lease: &Granted,
        start: Instant,
        pending: &Pending,
    ) -> Result<bool> {
        let inner = &self.inner;
        let fresh =
            hold.id != queue_lease.id && !lasts(hold.secs, hold.since, start, inner.config.timeout);
        if fresh {
            // Waited about as long as the hold's lease: a keep-alive could land on a lease
            // that has just expired (and etcd would then delete our key with it). A fresh
            // one instead.
            let (id, secs) = inner.grant(lease_secs(req.ttl)).await?;
            pending.track(id);
            pending.revoke(hold.id);
            *hold = Granted {
                id,
                secs,
                since: start,
                session: None,
            };
        }
        Ok(!fresh)
    }
}

/// A put that names a lease which no longer exists fails with "lease not found": for a
/// waiter, its place is gone (retry); elsewhere a plain store error.
fn lease_lost_is_retryable(error: etcd_client::Error, waiting: bool) -> Error {
    if waiting && lease_gone(&error) {
        place_lost()
    } else {
        map(error)
    }
}
