//! Session locks: the task that keeps a session lock's connection and serves its lease.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::Lease;
use crate::error::{Error, Result};
use crate::fence::FencingToken;

use super::attempt::fence;

/// The connection that holds one session lock.
#[async_trait]
pub(crate) trait SessionConn: Send + 'static {
    /// The backend's scheme name, for errors.
    const BACKEND: &'static str;
    /// A cheap round trip: fails when the connection (and so the lock) is gone.
    async fn ping(&mut self) -> Result<()>;
    /// Releases the server-side lock; `Ok(false)` when the server says it was not held.
    async fn unlock(&mut self) -> Result<bool>;
    /// Gives the connection back for reuse (only after a clean unlock).
    fn recycle(self);
    /// Closes the connection without reuse; the server frees whatever it held.
    fn discard(self);
}

enum Command {
    Extend(Duration, Instant, oneshot::Sender<Result<()>>),
    Release(oneshot::Sender<Result<()>>),
}

/// One session lock: a task owns the connection, checks it at a cadence (the lost signal
/// fires when it dies), lets go when the lease's TTL runs out, and serves extend and release.
#[derive(Debug)]
pub(crate) struct SessionLease {
    name: String,
    fence: i64,
    lost: CancellationToken,
    start: Instant,
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
    ) -> SessionLease {
        let (commands, inbox) = mpsc::channel(4);
        let lost = CancellationToken::new();
        tokio::spawn(keep_session(
            conn,
            name.clone(),
            inbox,
            lost.clone(),
            start + ttl,
            check_interval,
            ttl,
        ));
        SessionLease {
            name,
            fence,
            lost,
            start,
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
    fn fence(&self) -> FencingToken {
        fence(self.fence)
    }

    fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    fn lease_start(&self) -> Instant {
        self.start
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        let started = Instant::now();
        self.ask(|reply| Command::Extend(ttl, started, reply)).await
    }

    async fn release(&self) -> Result<()> {
        self.ask(Command::Release).await
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

async fn keep_session<C: SessionConn>(
    mut conn: C,
    name: String,
    mut inbox: mpsc::Receiver<Command>,
    lost: CancellationToken,
    mut deadline: Instant,
    check_interval: Duration,
    mut ttl: Duration,
) {
    let cadence = |ttl: Duration| (ttl / 3).clamp(Duration::from_millis(5), check_interval);
    let mut next_check = Instant::now() + cadence(ttl);
    loop {
        tokio::select! {
            command = inbox.recv() => match command {
                Some(Command::Extend(more, started, reply)) => {
                    if Instant::now() >= deadline {
                        let _ = reply.send(Err(Error::not_owned(&name)));
                        break;
                    }
                    let limit = ROUND_TRIP_LIMIT.min(deadline.saturating_duration_since(Instant::now()));
                    match bounded::<_, C>("the session check", limit, conn.ping()).await {
                        Ok(()) => {
                            deadline = deadline.max(started + more);
                            ttl = ttl.max(more);
                            next_check = Instant::now() + cadence(ttl);
                            let _ = reply.send(Ok(()));
                        }
                        Err(error) => {
                            tracing::debug!(%name, %error, "session lock connection is gone");
                            let _ = reply.send(Err(Error::not_owned(&name)));
                            lost.cancel();
                            conn.discard();
                            return;
                        }
                    }
                }
                Some(Command::Release(reply)) => {
                    if Instant::now() >= deadline {
                        let _ = reply.send(Err(Error::not_owned(&name)));
                        break;
                    }
                    let result = tokio::time::timeout(ROUND_TRIP_LIMIT, conn.unlock()).await;
                    lost.cancel();
                    match result {
                        Ok(Ok(true)) => {
                            let _ = reply.send(Ok(()));
                            conn.recycle();
                        }
                        // No answer: closing the connection frees the lock once the server
                        // notices; the caller learns that the release is not confirmed.
                        Err(_) => {
                            let _ = reply.send(Err(timed_out::<C>("release", ROUND_TRIP_LIMIT)));
                            conn.discard();
                        }
                        // Not held by this connection any more, or the connection died (and
                        // with it the lock): either way the hold was lost before the release.
                        Ok(Ok(false) | Err(_)) => {
                            let _ = reply.send(Err(Error::not_owned(&name)));
                            conn.discard();
                        }
                    }
                    return;
                }
                // Every handle is gone without a release: let go now, not at the TTL.
                None => break,
            },
            () = tokio::time::sleep_until(deadline) => {
                tracing::debug!(%name, "session lock's lease ran out; letting go");
                break;
            }
            () = tokio::time::sleep_until(next_check) => {
                let limit = ROUND_TRIP_LIMIT.min(deadline.saturating_duration_since(Instant::now()));
                if let Err(error) = bounded::<_, C>("the session check", limit, conn.ping()).await {
                    tracing::warn!(%name, %error, "session lock lost: its connection is gone");
                    lost.cancel();
                    conn.discard();
                    return;
                }
                next_check = Instant::now() + cadence(ttl);
            }
        }
    }
    // Expired or abandoned: free the lock on the server, as a lease store would.
    lost.cancel();
    match bounded::<_, C>("release", ROUND_TRIP_LIMIT, conn.unlock()).await {
        Ok(true) => conn.recycle(),
        _ => conn.discard(),
    }
}
