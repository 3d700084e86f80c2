//! Session locks: the task that keeps a lock held by a connection or an open file (a SQL
//! session lock, a file lock) and serves its client-kept lease, and the watcher that wakes
//! those tasks when a SQL client's connections drop.

// Shared by the SQL session modes and the file backend; a build without some of them leaves
// parts unused (the full build, which CI lints, uses all of it).
#![cfg_attr(not(dlock_all_backends), allow(dead_code))]

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::backend::wait::Backoff;
use crate::backend::{Lease, LeaseCore, LossSignal};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::lease::keeper::LostReason;
use crate::name::LockName;

/// The connection that holds one session lock.
#[async_trait]
pub(crate) trait SessionConn: Send + 'static {
    /// The backend's scheme name, for errors.
    const BACKEND: &'static str;
    /// Why the hold is lost when a check fails: a dead connection ends a session; a lock
    /// file replaced under its holder was broken.
    const CHECK_FAILED: LostReason = LostReason::SessionEnded;
    /// A cheap round trip: fails when the connection (and so the lock) is gone.
    async fn ping(&mut self) -> Result<()>;
    /// Releases the server-side lock; `Ok(false)` when the server says it was not held.
    async fn unlock(&mut self) -> Result<bool>;
    /// A fenced write of value `value` on the hold's own connection (or file), while it holds
    /// the lock; `Ok(None)` when it no longer does. Stores that cannot answer `Unsupported`.
    async fn put_fenced(&mut self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        let _ = (value, bytes);
        Err(Error::Unsupported {
            operation: super::FENCED_WRITES,
            backend: Self::BACKEND,
        })
    }
    /// Gives the connection back for reuse (only after a clean unlock).
    fn recycle(self);
    /// Closes the connection without reuse; the server frees whatever it held.
    fn discard(self);
}

/// One extra connection per client, kept in a long server-side sleep so that its failure
/// shows at once that the server or the path to it dropped the client's connections.
#[async_trait]
pub(crate) trait SessionWatch: Send + Sync + 'static {
    /// The backend's connection (a connection of its own, outside the pool).
    type Conn: Send + 'static;
    /// Opens the watcher's connection.
    async fn connect(&self) -> Result<Self::Conn>;
    /// Sleeps on the server for `length`; fails as soon as the connection does.
    async fn sleep(&self, conn: &mut Self::Conn, length: Duration) -> Result<()>;
}

/// How long one watcher sleep lasts on the server before the next begins.
const WATCH_SLEEP: Duration = Duration::from_secs(30);
/// The first pause before the watcher connects again after a failure; it doubles, up to
/// [`WATCH_RETRY_MAX`], until a sleep completes.
const WATCH_RETRY_MIN: Duration = Duration::from_millis(50);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(2);
/// After a wake-up whose check found the connection alive, one more check this soon: the
/// watcher's connection may fail a moment before the holder's (a server ends its sessions
/// one by one).
const ALARM_RECHECK: Duration = Duration::from_millis(20);

/// Wakes every session lock of one client to check its connection now.
///
/// The server frees a session lock the moment the session's connection drops, and may grant
/// it to a waiter at once; the holder's task alone would learn of it at its next check (up to
/// a third of the TTL later). sqlx cannot watch an idle connection, so a watcher task keeps
/// one more connection in a long server-side sleep: when a restart or a reset of the
/// connections on the way ends it, the holders' connections most likely ended with it, and
/// every holder checks its own at once (a wake-up, not a verdict: a lock whose connection
/// answers is kept). A single session killed on the server is still noticed at the next check.
#[derive(Debug)]
pub(crate) struct SessionAlarm {
    bell: Arc<watch::Sender<u64>>,
    watcher: Mutex<Option<JoinHandle<()>>>,
    stop: CancellationToken,
    /// Stops the watcher when the client is dropped.
    _stop: DropGuard,
}

impl Default for SessionAlarm {
    fn default() -> Self {
        let stop = CancellationToken::new();
        SessionAlarm {
            bell: Arc::new(watch::Sender::new(0)),
            watcher: Mutex::new(None),
            _stop: stop.clone().drop_guard(),
            stop,
        }
    }
}

impl SessionAlarm {
    /// Starts the watcher with the client's first acquire, and again if it ended (its runtime
    /// shut down under it).
    pub(crate) fn ensure_watcher<W: SessionWatch>(&self, watch: &Arc<W>) {
        let mut slot = self.watcher.lock().unwrap_or_else(PoisonError::into_inner);
        if slot.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        *slot = Some(runtime.spawn(watch_connections(
            watch.clone(),
            self.bell.clone(),
            self.stop.clone(),
        )));
    }

    /// What a new lock's task listens to.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.bell.subscribe()
    }
}

/// The watcher: sleeps on its own connection, and rings when that connection fails, and
/// again when it has one after a gap (connections may have failed while it had none).
async fn watch_connections<W: SessionWatch>(
    watch: Arc<W>,
    bell: Arc<watch::Sender<u64>>,
    stop: CancellationToken,
) {
    let ring = || bell.send_modify(|rung| *rung = rung.wrapping_add(1));
    let mut backoff = Backoff::steady(WATCH_RETRY_MIN, WATCH_RETRY_MAX);
    // Whether the watcher was without a connection (a connect failed, or its connection did);
    // every connection ends in a failure, so it is set again before the next connect.
    let mut gap = false;
    loop {
        let connected = tokio::select! {
            () = stop.cancelled() => return,
            connected = tokio::time::timeout(ROUND_TRIP_LIMIT, watch.connect()) => connected,
        };
        let Ok(Ok(mut conn)) = connected else {
            gap = true;
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(backoff.next()) => {}
            }
            continue;
        };
        // Connections may have failed while the watcher had none.
        if gap {
            ring();
        }
        loop {
            let slept = tokio::select! {
                () = stop.cancelled() => return,
                slept = tokio::time::timeout(
                    WATCH_SLEEP + ROUND_TRIP_LIMIT,
                    watch.sleep(&mut conn, WATCH_SLEEP),
                ) => slept,
            };
            match slept {
                Ok(Ok(())) => backoff.reset(),
                failed => {
                    let error = match failed {
                        Ok(Err(error)) => error.to_string(),
                        _ => "no answer".to_owned(),
                    };
                    tracing::debug!(%error, "session watcher's connection failed; checking every session lock");
                    ring();
                    gap = true;
                    break;
                }
            }
        }
        drop(conn);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff.next()) => {}
        }
    }
}

enum Command {
    Extend(Duration, Instant, oneshot::Sender<Result<()>>),
    Release(oneshot::Sender<Result<()>>),
    PutFenced(LockName, Vec<u8>, oneshot::Sender<Result<Option<u64>>>),
}

/// One session lock: a task owns the connection, checks it at a cadence (the lost signal
/// fires when it dies), lets go when the lease's TTL runs out, and serves extend and release.
#[derive(Debug)]
pub(crate) struct SessionLease {
    core: LeaseCore,
    name: String,
    commands: mpsc::Sender<Command>,
}

impl SessionLease {
    /// Starts the keeper task of a lock just taken on `conn`. `start` is the instant the grant
    /// arrived (the server holds a session lock until the session ends, so nothing expires
    /// before it); the lease lasts `ttl` from there unless extended.
    pub(crate) fn start<C: SessionConn>(
        conn: C,
        name: String,
        fence: i64,
        start: Instant,
        ttl: Duration,
        check_interval: Duration,
        alarm: watch::Receiver<u64>,
    ) -> SessionLease {
        let (commands, inbox) = mpsc::channel(4);
        let lost = LossSignal::new();
        tokio::spawn(keep_session(
            conn,
            name.clone(),
            inbox,
            lost.clone(),
            start + ttl,
            ttl,
            Checks {
                interval: check_interval,
                alarm,
            },
        ));
        SessionLease {
            name,
            core: LeaseCore::with_signal(FencingToken::from_signed(fence), lost, start),
            commands,
        }
    }

    async fn ask(&self, make: impl FnOnce(oneshot::Sender<Result<()>>) -> Command) -> Result<()> {
        let (reply, answer) = oneshot::channel();
        if self.commands.send(make(reply)).await.is_err() {
            return Err(Error::not_owned(&self.name));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(Error::not_owned(&self.name)))
    }
}

#[async_trait]
impl Lease for SessionLease {
    fn core(&self) -> &LeaseCore {
        &self.core
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::ttl::check_store_ttl(ttl)?;
        let started = Instant::now();
        self.ask(|reply| Command::Extend(ttl, started, reply)).await
    }

    async fn release(&self) -> Result<()> {
        self.ask(Command::Release).await
    }

    async fn put_fenced(&self, value: &LockName, bytes: &[u8]) -> Result<Option<u64>> {
        let (reply, answer) = oneshot::channel();
        let command = Command::PutFenced(value.clone(), bytes.to_vec(), reply);
        if self.commands.send(command).await.is_err() {
            return Ok(None); // the keeper task has let go: not the holder
        }
        answer.await.unwrap_or(Ok(None))
    }
}

/// The longest one round trip on a session lock's connection may take. A server or network
/// that hangs would otherwise hold a `release()` or a ping for as long as TCP takes to give up
/// (minutes); past this the connection counts as dead and is closed, which frees the lock on
/// the server.
const ROUND_TRIP_LIMIT: Duration = Duration::from_secs(5);

/// The error of a round trip that got no answer within `limit`, naming what timed out.
fn timed_out<C: SessionConn>(what: &str, limit: Duration) -> Error {
    Error::Unavailable {
        backend: C::BACKEND,
        source: format!(
            "{what} got no answer within {} (server or network hung); the connection was closed",
            humantime::format_duration(limit)
        )
        .into(),
    }
}

/// `call` bounded by `limit`; a call that overruns fails as unavailable, naming what timed out.
async fn bounded<T, C: SessionConn>(
    what: &'static str,
    limit: Duration,
    call: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| Err(timed_out::<C>(what, limit)))
}

/// When a lock's task checks its connection: at most every `interval`, and at once when the
/// client's watcher rings `alarm`.
struct Checks {
    interval: Duration,
    alarm: watch::Receiver<u64>,
}

/// Pings the connection, within the round-trip limit and the lease's time left.
async fn check<C: SessionConn>(conn: &mut C, deadline: Instant) -> Result<()> {
    let limit = ROUND_TRIP_LIMIT.min(deadline.saturating_duration_since(Instant::now()));
    bounded::<_, C>("the session check", limit, conn.ping()).await
}

/// The hold's release, asked for by its lease: unlocks on the connection and answers `reply`.
async fn release<C: SessionConn>(
    mut conn: C,
    name: &str,
    lost: &LossSignal,
    reply: oneshot::Sender<Result<()>>,
) {
    let result = tokio::time::timeout(ROUND_TRIP_LIMIT, conn.unlock()).await;
    lost.token().cancel();
    match result {
        Ok(Ok(true)) => {
            let _ = reply.send(Ok(()));
            conn.recycle();
        }
        // No answer: closing the connection frees the lock once the server notices; the
        // caller learns that the release is not confirmed.
        Err(_) => {
            let _ = reply.send(Err(timed_out::<C>("release", ROUND_TRIP_LIMIT)));
            conn.discard();
        }
        // Not held by this connection any more, or the connection died (and with it the
        // lock): either way the hold was lost before the release.
        Ok(Ok(false) | Err(_)) => {
            let _ = reply.send(Err(Error::not_owned(name)));
            conn.discard();
        }
    }
}

/// Keeps one session lock's connection: serves its extends and release, checks the
/// connection at a cadence (firing the lost signal when it dies), and lets go when the
/// lease runs out or every handle is gone.
async fn keep_session<C: SessionConn>(
    mut conn: C,
    name: String,
    mut inbox: mpsc::Receiver<Command>,
    lost: LossSignal,
    mut deadline: Instant,
    mut ttl: Duration,
    checks: Checks,
) {
    let Checks {
        interval: check_interval,
        mut alarm,
    } = checks;
    let cadence = |ttl: Duration| (ttl / 3).clamp(Duration::from_millis(5), check_interval);
    let mut next_check = Instant::now() + cadence(ttl);
    let mut rechecks = 0u8;
    loop {
        tokio::select! {
            command = inbox.recv() => match command {
                Some(Command::Extend(more, started, reply)) => {
                    if Instant::now() >= deadline {
                        let _ = reply.send(Err(Error::not_owned(&name)));
                        break;
                    }
                    match check(&mut conn, deadline).await {
                        Ok(()) => {
                            deadline = deadline.max(started + more);
                            ttl = ttl.max(more);
                            next_check = Instant::now() + cadence(ttl);
                            let _ = reply.send(Ok(()));
                        }
                        Err(error) => {
                            tracing::debug!(%name, %error, "session lock connection is gone");
                            let _ = reply.send(Err(Error::not_owned(&name)));
                            lost.fire(C::CHECK_FAILED);
                            conn.discard();
                            return;
                        }
                    }
                }
                Some(Command::PutFenced(value, bytes, reply)) => {
                    let _ = reply.send(put_fenced(&mut conn, deadline, &value, &bytes).await);
                }
                Some(Command::Release(reply)) => {
                    if Instant::now() >= deadline {
                        let _ = reply.send(Err(Error::not_owned(&name)));
                        break;
                    }
                    release(conn, &name, &lost, reply).await;
                    return;
                }
                // Every handle is gone without a release: let go now, not at the TTL.
                None => break,
            },
            () = tokio::time::sleep_until(deadline) => {
                tracing::debug!(%name, "session lock's lease ran out; letting go");
                break;
            }
            // Another connection of this client failed: check this one now (and once more
            // shortly after). A dropped sender (client gone) disables this branch.
            Ok(()) = alarm.changed() => {
                next_check = Instant::now();
                rechecks = 1;
            }
            () = tokio::time::sleep_until(next_check) => {
                if let Err(error) = check(&mut conn, deadline).await {
                    tracing::warn!(%name, %error, "session lock lost: its connection is gone");
                    lost.fire(C::CHECK_FAILED);
                    conn.discard();
                    return;
                }
                // After an alarm, once more shortly after; then at the cadence again.
                let gap = if rechecks > 0 { ALARM_RECHECK } else { cadence(ttl) };
                rechecks = rechecks.saturating_sub(1);
                next_check = Instant::now() + gap;
            }
        }
    }
    let_go(conn, &lost).await;
}

/// A fenced write on the hold's connection, refused once the lease's TTL has run out (the
/// task lets go at the deadline; a write that finds it passed writes nothing).
async fn put_fenced<C: SessionConn>(
    conn: &mut C,
    deadline: Instant,
    value: &LockName,
    bytes: &[u8],
) -> Result<Option<u64>> {
    if Instant::now() >= deadline {
        return Ok(None);
    }
    bounded::<_, C>(
        "fenced write",
        ROUND_TRIP_LIMIT,
        conn.put_fenced(value, bytes),
    )
    .await
}

/// Expired or abandoned: frees the lock on the server, as a lease store would.
async fn let_go<C: SessionConn>(mut conn: C, lost: &LossSignal) {
    lost.fire(LostReason::Expired);
    match bounded::<_, C>("release", ROUND_TRIP_LIMIT, conn.unlock()).await {
        Ok(true) => conn.recycle(),
        _ => conn.discard(),
    }
}
