//! One ZooKeeper session and what is known about its state (connected, suspended, expired),
//! with the watchdog holds that ride it ([`SessionHolds`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, SessionState};

use crate::error::{Error, Result};
use crate::lease::keeper::LostReason;

use super::config::ZookeeperConfig;
use super::error::{BACKEND, map, session_lost, suspended};
use super::session_holds::{Liveness, SessionHolds, delete_all, watch_holds};

/// A client in a new session of `config`'s ensemble, on the current runtime.
pub(super) async fn connect_client(config: &ZookeeperConfig) -> Result<Client> {
    let mut connector = Client::connector().with_session_timeout(config.session_timeout);
    if let Some(digest) = &config.digest {
        connector = connector.with_auth("digest", digest.as_bytes());
    }
    tokio::time::timeout(config.connect_timeout, connector.connect(&config.servers))
        .await
        .map_err(|_| Error::Unavailable {
            backend: BACKEND,
            source: format!(
                "no ZooKeeper server of {} answered within {:?}",
                config.servers, config.connect_timeout
            )
            .into(),
        })?
        .map_err(|e| map(e, &config.servers))
}

/// One ZooKeeper session and what is known about its state.
pub(super) struct Session {
    pub(super) client: Client,
    pub(super) id: i64,
    /// Cancelled when the session is over: expired, closed, or suspended for so long that the
    /// server may have expired it. Every lock held in it is then lost.
    pub(super) gone: CancellationToken,
    /// Whether the connection is up (false while suspended).
    connected: watch::Receiver<bool>,
    /// When the last request the server answered was sent, and the shortest watchdog lease.
    liveness: watch::Receiver<Liveness>,
    /// The watchdog holds riding the session.
    pub(super) holds: Arc<SessionHolds>,
    /// What the session was opened with, for a release from another runtime.
    pub(super) config: ZookeeperConfig,
}

impl Session {
    /// Brings this client's server up to date with the leader, before a read that must see
    /// every write answered to any client. A server answers reads from its own copy, which on a
    /// follower may lack a write the leader already answered through another server: a lock
    /// just taken elsewhere read as free (`zookeeper_store::on_an_ensemble_…`).
    pub(super) async fn catch_up(&self) -> Result<()> {
        self.client.sync("/").await.map_err(|e| map(e, "/"))
    }

    pub(super) async fn connect(config: &ZookeeperConfig) -> Result<Arc<Session>> {
        let client = connect_client(config).await?;
        let gone = CancellationToken::new();
        let (connected_tx, connected) = watch::channel(true);
        let timeout = client.session_timeout();
        let (holds, asks) = SessionHolds::new();
        let liveness = holds.liveness();
        tokio::spawn(exchange_regularly(
            client.clone(),
            timeout,
            holds.clone(),
            gone.clone(),
        ));
        tokio::spawn(watch_state(
            client.clone(),
            client.state_watcher(),
            timeout,
            holds.liveness(),
            connected_tx,
            holds.clone(),
            gone.clone(),
        ));
        tokio::spawn(watch_holds(
            client.clone(),
            holds.clone(),
            asks,
            gone.clone(),
        ));
        Ok(Arc::new(Session {
            id: client.session_id().0,
            client,
            gone,
            connected,
            liveness,
            holds,
            config: config.clone(),
        }))
    }

    /// Ends the session for `reason`, as the server told us (every hold on it is told).
    pub(super) fn end(&self, reason: LostReason) {
        self.holds.end(reason);
        self.gone.cancel();
    }

    /// Why the session ended, for a hold that finds it over.
    pub(super) fn end_reason(&self) -> LostReason {
        self.holds.ended().unwrap_or(LostReason::SessionEnded)
    }

    /// Why the session is over, if it is: the server ended it, or no request was answered
    /// within the session's safe window ([`answer_budget`]), which ends it here and now.
    /// Read from local state only: this is a watchdog hold's renewal.
    pub(super) fn over(&self) -> Option<LostReason> {
        if let Some(reason) = self.holds.ended() {
            return Some(reason);
        }
        let live = *self.liveness.borrow();
        if self.gone.is_cancelled() {
            return Some(LostReason::SessionEnded);
        }
        if live.answered + answer_budget(self.client.session_timeout(), live.lease)
            <= Instant::now()
        {
            // The state task's timer may not have run yet: the same end, from here.
            give_up(&self.client, &self.holds, &self.gone);
            return self.holds.ended();
        }
        None
    }

    /// `Ok` while the session is alive and connected; the state is uncertain while suspended.
    pub(super) fn check(&self) -> Result<()> {
        if self.gone.is_cancelled() {
            return Err(session_lost());
        }
        if !*self.connected.borrow() {
            return Err(suspended());
        }
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Stops the state task; the client closes the session when its last handle drops.
        self.gone.cancel();
    }
}

/// How often the session's own exchange with the server runs: a healthy session's last
/// answered request is never older than this. A fifth of the timeout, or of the shortest
/// watchdog lease riding the session: one read per client, whatever it holds.
fn exchange_interval(timeout: Duration, lease: Duration) -> Duration {
    timeout.min(lease) / 5
}

/// How long after the last request the server answered (counted from when it was sent) the
/// session's locks are reported lost. The server expires a session a timeout after it last
/// heard from the client, which is no earlier than that request's arrival; the last third of
/// the timeout is the holders' time to hear of it and stop. Counting from the disconnect event
/// instead would depend on when the client library notices a silent connection.
///
/// Never longer than nine tenths of the shortest watchdog lease on the session either: a
/// holder is told within one lease of losing touch, as on every store (the session may live
/// longer, but nobody can rely on that from outside).
fn answer_budget(timeout: Duration, lease: Duration) -> Duration {
    (timeout * 2 / 3).min(lease - lease / 10)
}

/// Sends a cheap read every [`exchange_interval`] and records when each answered one was
/// sent, until the session is over.
async fn exchange_regularly(
    client: Client,
    timeout: Duration,
    holds: Arc<SessionHolds>,
    gone: CancellationToken,
) {
    let mut liveness = holds.liveness();
    loop {
        let lease = liveness.borrow_and_update().lease;
        let pause = tokio::time::sleep(exchange_interval(timeout, lease));
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = &mut pause => break,
                changed = liveness.changed() => {
                    // A shorter lease joined: the next exchange comes sooner.
                    if changed.is_err() || liveness.borrow_and_update().lease < lease {
                        break;
                    }
                }
                () = gone.cancelled() => return,
            }
        }
        let sent = Instant::now();
        let budget = answer_budget(timeout, lease);
        let reply = tokio::select! {
            reply = tokio::time::timeout(budget, client.check_stat("/")) => reply,
            () = gone.cancelled() => return,
        };
        // A missing node is an answer too; only silence or a failed request is not.
        if let Ok(Ok(_)) = reply {
            holds.answered(sent);
        }
    }
}

/// Gives up on a session no request of which was answered within [`answer_budget`]: every
/// hold on it is lost, and their nodes are deleted should the session come back.
fn give_up(client: &Client, holds: &SessionHolds, gone: &CancellationToken) {
    if holds.ended().is_some() {
        return;
    }
    let paths = holds.end(LostReason::StoreUnreachable);
    gone.cancel();
    if !paths.is_empty() {
        tokio::spawn(delete_all(client.clone(), paths));
    }
}

/// Follows the session's state; ends it (`gone`) when the server says so, or when no request
/// was answered within [`answer_budget`].
async fn watch_state(
    client: Client,
    mut states: zookeeper_client::StateWatcher,
    timeout: Duration,
    mut liveness: watch::Receiver<Liveness>,
    connected: watch::Sender<bool>,
    holds: Arc<SessionHolds>,
    gone: CancellationToken,
) {
    loop {
        let live = *liveness.borrow_and_update();
        let budget = answer_budget(timeout, live.lease);
        let unanswered_until = live.answered + budget;
        tokio::select! {
            state = states.changed() => match state {
                SessionState::Disconnected => {
                    let _ = connected.send(false);
                }
                SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                    let _ = connected.send(true);
                }
                SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                    tracing::debug!(?state, "ZooKeeper session over");
                    holds.end(LostReason::SessionEnded);
                    gone.cancel();
                    return;
                }
            },
            changed = liveness.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep_until(unanswered_until) => {
                tracing::debug!(?budget, "no ZooKeeper request answered within the session's safe window");
                give_up(&client, &holds, &gone);
                return;
            }
            () = gone.cancelled() => return,
        }
    }
}
