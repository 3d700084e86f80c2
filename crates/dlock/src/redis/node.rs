//! One Redis server as dlock talks to it: a multiplexed command connection that reconnects by
//! itself, and the pub/sub side for waiters. The Redis backend has one; Redlock has one per
//! node. Behind Sentinel the server is whichever one the sentinels name as primary: a
//! follower task ([`super::sentinel`]) moves both sides to the new primary after a failover.
//! A Redis Cluster is one node too: its connection routes commands ([`super::cluster`]), and
//! its pub/sub side listens on shard channels where the servers have them (Redis 7), else on
//! any one node (a cluster passes every classic message to all nodes).

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::{Notify, watch};

use super::config::RedisConfig;
use super::conn::{Conn, Direct};
use super::error::{map, map_timed};
use super::sentinel;
use super::wake::Wakeups;
use crate::error::{Error, Result, redact_url};

/// The server commands go to now.
pub(crate) struct Primary {
    /// Its `host:port`, as the sentinels name it (the URL's for a fixed server, the seed
    /// nodes for a cluster).
    pub(crate) addr: String,
    /// The server the pub/sub side subscribes on.
    pub(crate) client: ::redis::Client,
    /// Other servers to subscribe on when `client`'s does not answer (a cluster's other seed
    /// nodes).
    pub(crate) others: Vec<::redis::Client>,
    pub(crate) conn: Conn,
}

impl std::fmt::Debug for Primary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Primary")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// A connected server.
pub(crate) struct Node {
    primary: watch::Receiver<Arc<Primary>>,
    pub(crate) wakeups: Wakeups,
    /// Releases go out on shard channels (`SPUBLISH`): a cluster whose servers have sharded
    /// pub/sub.
    sharded: bool,
    /// Behind Sentinel: asks the follower to check the primary now.
    suspect: Option<Arc<Notify>>,
    /// Keeps the channel open for a fixed server (nothing ever changes it), and tells a
    /// sentinel follower that the node is gone when dropped.
    _keep: Keep,
}

enum Keep {
    Fixed(#[allow(dead_code)] watch::Sender<Arc<Primary>>),
    Followed(#[allow(dead_code)] Arc<()>),
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").finish_non_exhaustive()
    }
}

impl Node {
    /// Connects to `config.server` (behind Sentinel: to the primary the sentinels name, found
    /// now). With `check`, connects now and sends a `PING`, so bad credentials and
    /// unreachable servers fail here rather than on the first lock, and commands sent from
    /// the blocking facade's threads go over blocking connections there (see
    /// [`super::conn::Direct`]); without it (a Redlock node, which may be down), the connection
    /// is made on the first command, and every command goes through the runtime, so a
    /// Redlock round reaches its nodes at once.
    pub(crate) async fn connect(config: &RedisConfig, check: bool) -> Result<Node> {
        config.validate()?;
        if !config.cluster.is_empty() {
            let (primary, sharded) = super::cluster::connect(config).await?;
            let (sender, receiver) = watch::channel(Arc::new(primary));
            let wakeups = if sharded {
                Wakeups::sharded(receiver.clone(), config.clone())
            } else {
                Wakeups::new(receiver.clone())
            };
            return Ok(Node {
                wakeups,
                sharded,
                primary: receiver,
                suspect: None,
                _keep: Keep::Fixed(sender),
            });
        }
        if let Some(sentinels) = &config.sentinel {
            let primary = sentinel::find_primary(config, sentinels).await?;
            let (sender, receiver) = watch::channel(Arc::new(primary));
            let suspect = Arc::new(Notify::new());
            let alive = Arc::new(());
            sentinel::follow(
                config.clone(),
                sentinels.clone(),
                sender,
                suspect.clone(),
                Arc::downgrade(&alive),
            );
            return Ok(Node {
                wakeups: Wakeups::new(receiver.clone()),
                sharded: false,
                primary: receiver,
                suspect: Some(suspect),
                _keep: Keep::Followed(alive),
            });
        }
        let primary = Primary::connect(config, &config.server, check, check).await?;
        let (sender, receiver) = watch::channel(Arc::new(primary));
        Ok(Node {
            wakeups: Wakeups::new(receiver.clone()),
            sharded: false,
            primary: receiver,
            suspect: None,
            _keep: Keep::Fixed(sender),
        })
    }

    /// The command connection to the current primary (or the cluster).
    pub(crate) fn conn(&self) -> Conn {
        self.primary.borrow().conn.clone()
    }

    /// Whether releases are published on shard channels (`SPUBLISH`).
    pub(crate) fn sharded(&self) -> bool {
        self.sharded
    }

    /// After a failure that may mean the primary moved: behind Sentinel, the follower asks
    /// the sentinels at once instead of at its next check.
    pub(crate) fn suspect(&self) {
        if let Some(suspect) = &self.suspect {
            suspect.notify_one();
        }
    }

    /// Sends a `PING`.
    pub(crate) async fn ping(&self) -> Result<()> {
        let mut conn = self.conn();
        ::redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| map(e, ""))
    }
}

impl Primary {
    /// A command connection to the server of `url` (`config.server`, or it with the address
    /// the sentinels named). With `check`, connected and `PING`ed now; with `blocking_side`,
    /// with blocking connections for the blocking facade's threads.
    pub(crate) async fn connect(
        config: &RedisConfig,
        url: &str,
        check: bool,
        blocking_side: bool,
    ) -> Result<Primary> {
        let client = open_client(config, url)?;
        let manager = ConnectionManagerConfig::new()
            .set_response_timeout(Some(config.response_timeout))
            .set_connection_timeout(Some(config.connect_timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = if check {
            let mut conn = ConnectionManager::new_with_config(client.clone(), manager)
                .await
                .map_err(|e| map_timed(e, "", config.response_timeout))?;
            // Credentials are only checked by a command: fail here, not on the first lock.
            ::redis::cmd("PING")
                .query_async::<()>(&mut conn)
                .await
                .map_err(|e| map_timed(e, "", config.response_timeout))?;
            conn
        } else {
            ConnectionManager::new_lazy_with_config(client.clone(), manager)
                .map_err(|e| map(e, ""))?
        };
        let addr = client.get_connection_info().addr().to_string();
        // `WAIT` (min_replicas) counts the writes of the connection it is sent on: a grant and
        // its `WAIT` must share one, which only the multiplexed connection guarantees.
        let direct = (blocking_side && config.min_replicas == 0).then(|| {
            Arc::new(Direct::new(
                client.clone(),
                config.connect_timeout,
                config.response_timeout,
            ))
        });
        Ok(Primary {
            addr,
            client,
            others: Vec::new(),
            conn: Conn::Server(conn, direct),
        })
    }
}

/// A redis-rs client of `url`, trusting `config.ca_file` for TLS when it is set.
pub(crate) fn open_client(config: &RedisConfig, url: &str) -> Result<::redis::Client> {
    let invalid = |reason: String| Error::InvalidUrl {
        url: redact_url(url),
        reason,
    };
    match &config.ca_file {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| Error::invalid_argument("ca", format!("{}: {e}", path.display())))?;
            ::redis::Client::build_with_tls(
                url,
                ::redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                },
            )
        }
        None => ::redis::Client::open(url),
    }
    .map_err(|e| invalid(e.to_string()))
}
