//! One ZooKeeper session and what is known about its state (connected, suspended, expired).

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use zookeeper_client::{Client, SessionState};

use crate::backend::Wait;
use crate::error::{Error, Result};

use super::config::ZookeeperConfig;
use super::error::{BACKEND, map, session_lost, suspended};

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
    /// What the session was opened with, for a release from another runtime.
    pub(super) config: ZookeeperConfig,
}

impl Session {
    pub(super) async fn connect(config: &ZookeeperConfig) -> Result<Arc<Session>> {
        let client = connect_client(config).await?;
        let gone = CancellationToken::new();
        let (connected_tx, connected) = watch::channel(true);
        // The server expires a session `timeout` after it last heard from the client; the
        // client notices a silent connection after 2/5 of it (the client library's default).
        // Half the timeout after the suspension began is therefore still inside the session,
        // with a margin: past that, the locks are reported lost, as the server may have
        // expired them.
        let budget = client.session_timeout() / 2;
        let mut states = client.state_watcher();
        let watch_gone = gone.clone();
        tokio::spawn(async move {
            let mut suspended_since: Option<Instant> = None;
            loop {
                let give_up = suspended_since.map(|at| at + budget);
                tokio::select! {
                    state = states.changed() => match state {
                        SessionState::Disconnected => {
                            suspended_since.get_or_insert_with(Instant::now);
                            let _ = connected_tx.send(false);
                        }
                        SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                            suspended_since = None;
                            let _ = connected_tx.send(true);
                        }
                        SessionState::Expired | SessionState::Closed | SessionState::AuthFailed => {
                            tracing::debug!(?state, "ZooKeeper session over");
                            watch_gone.cancel();
                            return;
                        }
                    },
                    () = Wait::until(give_up).ended() => {
                        tracing::debug!(?budget, "ZooKeeper connection suspended past the session's safe window");
                        watch_gone.cancel();
                        return;
                    }
                    () = watch_gone.cancelled() => return,
                }
            }
        });
        Ok(Arc::new(Session {
            id: client.session_id().0,
            client,
            gone,
            connected,
            config: config.clone(),
        }))
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
