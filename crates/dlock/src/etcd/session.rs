//! The client's session: one etcd lease (per watchdog lease length) that every watchdog hold of
//! the client puts its key on, as etcd's own `concurrency.Session` does. One long-lived
//! keep-alive stream renews it, one message per keeper pass however many holds ride on it
//! (the keeper renews them in the same pass, and their renewals are gathered into one
//! keep-alive); one watch stream carries a watch per hold on its own key, so a break (the key
//! deleted by `force_release`) is told to exactly that holder at once.
//!
//! What ends a session: etcd answering a keep-alive with TTL 0 or "lease not found" (it
//! expired, or was revoked), or its lease running out by our clock before a keep-alive was
//! confirmed (the cluster unreachable, the process paused). Every hold on it is then lost, and
//! the next watchdog hold is granted a new session lease.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use etcd_client::{
    Client, EventType, LeaseKeepAliveStream, LeaseKeeper, WatchFilterType, WatchOptions,
    WatchResponse, WatchStream,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::LostReason;
use crate::backend::LossSignal;
use crate::backend::gather::Gather;
use crate::error::{Error, Result};

use super::Inner;
use super::acquire::retry_backoff;
use super::error::{BACKEND, lease_gone};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The client's live sessions, one per lease length in seconds (normally one: the client's
/// watchdog lease).
#[derive(Debug, Default)]
pub(super) struct Sessions {
    live: Mutex<HashMap<i64, Arc<Session>>>,
    /// One grant at a time, so that the holds of a first burst share one lease.
    granting: tokio::sync::Mutex<()>,
    /// Numbers the holds of every session: their keys' tails and their watch ids.
    next_hold: std::sync::atomic::AtomicU64,
}

impl Drop for Sessions {
    fn drop(&mut self) {
        // No hold is left (each keeps the client alive): the sessions' tasks end, their
        // leases expire in etcd.
        for session in lock(&self.live).values() {
            session.ended.cancel();
        }
    }
}

impl Sessions {
    /// A fresh number for a session hold.
    pub(super) fn next_hold(&self) -> u64 {
        // From 1: etcd gives the stream's first watch, which it numbers itself, id 0.
        1 + self
            .next_hold
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// The live session of `secs`, granted now if there is none. A session whose last
    /// keep-alive is older than a third of its lease (no hold renewed it meanwhile) is renewed
    /// first, so that a new hold never starts on a lease about to run out.
    pub(super) async fn get(&self, inner: &Arc<Inner>, secs: i64) -> Result<Arc<Session>> {
        if let Some(session) = self.fresh(inner, secs).await? {
            return Ok(session);
        }
        let _one = self.granting.lock().await;
        if let Some(session) = self.fresh(inner, secs).await? {
            return Ok(session);
        }
        let since = Instant::now();
        let (id, granted) = inner.grant(secs).await?;
        let session = Session::start(inner, id, granted, since);
        lock(&self.live).insert(secs, session.clone());
        tracing::debug!(lease = id, secs = granted, "etcd session granted");
        Ok(session)
    }

    async fn fresh(&self, inner: &Inner, secs: i64) -> Result<Option<Arc<Session>>> {
        let Some(session) = lock(&self.live)
            .get(&secs)
            .filter(|s| !s.ended.is_cancelled())
            .cloned()
        else {
            return Ok(None);
        };
        if session.alive_since().elapsed() < session.length() / 3 {
            return Ok(Some(session));
        }
        match session.renew(&inner.client).await {
            Renewed::Alive => Ok(Some(session)),
            Renewed::Gone => Ok(None),
            Renewed::Failed => Err(keep_alive_failed()),
        }
    }
}

fn keep_alive_failed() -> Error {
    Error::Unavailable {
        backend: BACKEND,
        source: "the keep-alive of the client's session lease failed".into(),
    }
}

/// How one keep-alive of a session went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Renewed {
    /// etcd restarted the lease at its granted length.
    Alive,
    /// The lease is gone (expired or revoked): the session ended.
    Gone,
    /// No answer (unreachable, too slow, the stream broke): try again.
    Failed,
}

/// A hold on the session: its key, the create revision it must still have, its loss signal.
#[derive(Debug)]
struct Riding {
    key: Vec<u8>,
    fence: i64,
    signal: LossSignal,
}

/// What the holds ask of the watch task.
#[derive(Debug)]
enum WatchAsk {
    Watch(u64),
    Forget(u64),
}

/// One session lease and the holds on it.
#[derive(Debug)]
pub(super) struct Session {
    /// The etcd lease id.
    pub(super) id: i64,
    /// Its granted length in seconds.
    pub(super) secs: i64,
    /// An instant before the last keep-alive etcd confirmed (or the grant) was sent: etcd keeps
    /// the lease at least `secs` from it.
    alive_since: Mutex<Instant>,
    /// The one keep-alive stream, opened on first use and again after it breaks.
    stream: tokio::sync::Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>,
    /// The renewals of one keeper pass, sent as one keep-alive.
    renewals: Gather<(), Renewed>,
    holds: Mutex<HashMap<u64, Riding>>,
    watch: mpsc::UnboundedSender<WatchAsk>,
    /// Cancelled when the session ends.
    ended: CancellationToken,
    timeout: Duration,
}

impl Session {
    /// A session on the lease `id` of `secs` granted by a request sent at `since`; its watch
    /// task starts on the current runtime.
    fn start(inner: &Inner, id: i64, secs: i64, since: Instant) -> Arc<Session> {
        let (watch, asks) = mpsc::unbounded_channel();
        let session = Arc::new(Session {
            id,
            secs,
            alive_since: Mutex::new(since),
            stream: tokio::sync::Mutex::new(None),
            renewals: Gather::default(),
            holds: Mutex::new(HashMap::new()),
            watch,
            ended: CancellationToken::new(),
            timeout: inner.config.timeout,
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(watch_holds(session.clone(), inner.client.clone(), asks));
        }
        session
    }

    /// The lease's granted length.
    pub(super) fn length(&self) -> Duration {
        Duration::from_secs(u64::try_from(self.secs).unwrap_or(1))
    }

    /// Since when etcd keeps the lease for [`length`](Self::length) at least.
    pub(super) fn alive_since(&self) -> Instant {
        *lock(&self.alive_since)
    }

    pub(super) fn has_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    /// Adds a hold (its key created at `fence`) and watches its key for a deletion from then
    /// on, so a break even before the watch is set up is seen.
    pub(super) fn join(&self, seq: u64, key: Vec<u8>, fence: i64, signal: LossSignal) {
        if self.ended.is_cancelled() {
            signal.fire(LostReason::SessionEnded);
            return;
        }
        lock(&self.holds).insert(seq, Riding { key, fence, signal });
        let _ = self.watch.send(WatchAsk::Watch(seq));
    }

    /// Removes a hold (released, lost, or moved to a lease of its own): its key's deletion is
    /// no longer a break.
    pub(super) fn leave(&self, seq: u64) {
        if lock(&self.holds).remove(&seq).is_some() {
            let _ = self.watch.send(WatchAsk::Forget(seq));
        }
    }

    /// Renews the lease with the keep-alives of every renewal of this poll in one.
    pub(super) async fn renew(&self, client: &Client) -> Renewed {
        let send = |batch: Vec<()>| async move {
            let renewed = self.keep_alive(client).await;
            Some(vec![renewed; batch.len()])
        };
        match self.renewals.request((), send).await {
            Some(renewed) => renewed,
            None => self.keep_alive(client).await,
        }
    }

    /// One keep-alive on the session's stream, and its answer.
    async fn keep_alive(&self, client: &Client) -> Renewed {
        if self.ended.is_cancelled() {
            return Renewed::Gone;
        }
        let mut stream = self.stream.lock().await;
        let sent = Instant::now();
        let answer =
            tokio::time::timeout(self.timeout, send_keep_alive(&mut stream, client, self.id));
        match answer.await {
            Ok(Ok(ttl)) if ttl > 0 => {
                let mut since = lock(&self.alive_since);
                *since = (*since).max(sent);
                Renewed::Alive
            }
            Ok(Ok(_)) => {
                drop(stream);
                self.end(LostReason::SessionEnded);
                Renewed::Gone
            }
            Ok(Err(error)) if lease_gone(&error) => {
                drop(stream);
                self.end(LostReason::SessionEnded);
                Renewed::Gone
            }
            Ok(Err(error)) => {
                tracing::debug!(%error, lease = self.id, "session keep-alive failed");
                *stream = None;
                Renewed::Failed
            }
            Err(_) => {
                // An answer that comes later would be read as the next one's: a new stream.
                *stream = None;
                Renewed::Failed
            }
        }
    }

    /// Ends the session: every hold on it is lost for `reason`.
    pub(super) fn end(&self, reason: LostReason) {
        self.ended.cancel();
        let holds = std::mem::take(&mut *lock(&self.holds));
        if !holds.is_empty() {
            tracing::warn!(lease = self.id, holds = holds.len(), %reason, "etcd session ended: its locks are lost");
        }
        for riding in holds.into_values() {
            riding.signal.fire(reason);
        }
    }

    /// When etcd would expire the lease if no keep-alive is confirmed before.
    fn expiry(&self) -> Instant {
        self.alive_since() + self.length()
    }
}

/// Sends one keep-alive on `slot`'s stream (opening it if there is none, or it broke) and
/// returns the TTL etcd answered with.
async fn send_keep_alive(
    slot: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
    client: &Client,
    id: i64,
) -> std::result::Result<i64, etcd_client::Error> {
    if let Some((keeper, stream)) = slot.as_mut()
        && keeper.keep_alive().await.is_ok()
        && let Ok(Some(reply)) = stream.message().await
    {
        return Ok(reply.ttl());
    }
    // Opening the stream sends its first keep-alive, and etcd-client reads the answer itself:
    // a TTL of 0 is its "lease not found" error.
    *slot = None;
    let (keeper, stream) = client.clone().lease_keep_alive(id).await?;
    *slot = Some((keeper, stream));
    Ok(1)
}

/// The watch of hold `seq`'s key: deletions only, from just after its creation.
fn watch_options(seq: u64, fence: i64) -> WatchOptions {
    WatchOptions::new()
        .with_filters([WatchFilterType::NoPut])
        .with_start_revision(fence + 1)
        .with_watch_id(i64::try_from(seq).unwrap_or(i64::MAX))
}

/// The session's task: its holds' watches on one stream (opened again, with every watch,
/// when it breaks), and its end when the lease runs out by our clock before a keep-alive was
/// confirmed.
async fn watch_holds(
    session: Arc<Session>,
    client: Client,
    mut asks: mpsc::UnboundedReceiver<WatchAsk>,
) {
    let mut backoff = retry_backoff();
    loop {
        let opened = tokio::select! {
            opened = open_watch(&session, &client) => opened,
            () = session.ended.cancelled() => return,
            () = ran_out(&session) => return session_ran_out(&session, &client),
        };
        let Some((mut stream, mut watched)) = opened else {
            tokio::time::sleep(backoff.next()).await;
            continue;
        };
        backoff.reset();
        loop {
            tokio::select! {
                message = stream.message() => match message {
                    Ok(Some(reply)) => on_watch_reply(&session, &client, &mut stream, reply).await,
                    Ok(None) | Err(_) => break,
                },
                Some(ask) = asks.recv() => {
                    if ask_watch(&session, &mut stream, &mut watched, ask).await.is_err() {
                        break;
                    }
                }
                () = session.ended.cancelled() => return,
                () = ran_out(&session) => return session_ran_out(&session, &client),
            }
        }
    }
}

/// Opens a watch stream with a watch for every hold of the session.
async fn open_watch(session: &Session, client: &Client) -> Option<(WatchStream, HashSet<u64>)> {
    // A watch on a key no hold can have opens the stream; every hold's watch follows on it.
    let opening =
        WatchOptions::new().with_filters([WatchFilterType::NoPut, WatchFilterType::NoDelete]);
    let mut stream = client
        .clone()
        .watch(Vec::from("\0dlock-session-watch"), Some(opening))
        .await
        .ok()?;
    let holds: Vec<(u64, Vec<u8>, i64)> = lock(&session.holds)
        .iter()
        .map(|(&seq, r)| (seq, r.key.clone(), r.fence))
        .collect();
    let mut watched = HashSet::new();
    for (seq, key, fence) in holds {
        stream
            .watch(key, Some(watch_options(seq, fence)))
            .await
            .ok()?;
        watched.insert(seq);
    }
    Some((stream, watched))
}

async fn ask_watch(
    session: &Session,
    stream: &mut WatchStream,
    watched: &mut HashSet<u64>,
    ask: WatchAsk,
) -> std::result::Result<(), etcd_client::Error> {
    match ask {
        WatchAsk::Watch(seq) => {
            let hold = lock(&session.holds)
                .get(&seq)
                .map(|r| (r.key.clone(), r.fence));
            if let Some((key, fence)) = hold
                && watched.insert(seq)
            {
                stream.watch(key, Some(watch_options(seq, fence))).await?;
            }
        }
        WatchAsk::Forget(seq) => {
            if watched.remove(&seq) {
                stream
                    .cancel(i64::try_from(seq).unwrap_or(i64::MAX))
                    .await?;
            }
        }
    }
    Ok(())
}

/// A deletion of a hold's key is its break; a watch that etcd cancelled because its start
/// was compacted away is replaced after a read of the key.
async fn on_watch_reply(
    session: &Session,
    client: &Client,
    stream: &mut WatchStream,
    reply: WatchResponse,
) {
    let Ok(seq) = u64::try_from(reply.watch_id()) else {
        return;
    };
    if reply
        .events()
        .iter()
        .any(|e| e.event_type() == EventType::Delete)
    {
        // A revoked or expired session deletes every key on it: that is the session's end
        // (which the keep-alive tells, and which signals every hold), not a break of each.
        if session.renew(client).await != Renewed::Gone {
            broken(session, seq);
        }
        return;
    }
    if !(reply.canceled() && reply.compact_revision() > 0) {
        return;
    }
    let Some((key, fence)) = lock(&session.holds)
        .get(&seq)
        .map(|r| (r.key.clone(), r.fence))
    else {
        return;
    };
    let read = client.clone().get(key.clone(), None).await;
    match read {
        Ok(reply) => {
            let ours = reply
                .kvs()
                .first()
                .is_some_and(|kv| kv.create_revision() == fence);
            let now = reply.header().map_or(fence, |h| h.revision());
            if !ours {
                broken(session, seq);
            } else if stream
                .watch(key, Some(watch_options(seq, now)))
                .await
                .is_err()
            {
                // The stream is broken: the next message says so and it is opened again.
            }
        }
        Err(error) => tracing::debug!(%error, "reading a session hold's key failed"),
    }
}

fn broken(session: &Session, seq: u64) {
    if let Some(riding) = lock(&session.holds).remove(&seq) {
        riding.signal.fire(LostReason::Broken);
    }
}

/// Resolves when the lease has run out by our clock: no keep-alive confirmed within its
/// length.
async fn ran_out(session: &Session) {
    loop {
        let at = session.expiry();
        tokio::time::sleep_until(at).await;
        if session.expiry() <= Instant::now() {
            return;
        }
    }
}

/// The lease ran out before a keep-alive was confirmed: every hold on it is lost, and the
/// lease is revoked if it still lives (a cluster that comes back restores leases with their
/// full TTL), which deletes the keys of those holds.
fn session_ran_out(session: &Session, client: &Client) {
    let had_holds = !lock(&session.holds).is_empty();
    session.end(LostReason::StoreUnreachable);
    if !had_holds {
        return;
    }
    let (mut client, id) = (client.clone(), session.id);
    tokio::spawn(async move {
        for _ in 0..10 {
            match client.lease_revoke(id).await {
                Ok(_) => return,
                Err(error) if lease_gone(&error) => return,
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    });
}
