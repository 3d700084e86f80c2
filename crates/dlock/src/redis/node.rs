//! One Redis server as dlock talks to it: a multiplexed command connection that reconnects by
//! itself, and the pub/sub side for waiters. The Redis backend has one; Redlock has one per
//! node.

use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::config::RedisConfig;
use super::error::{map, map_timed};
use super::wake::Wakeups;
use crate::error::{Error, Result, redact_url};

/// A connected server.
pub(crate) struct Node {
    pub(crate) conn: ConnectionManager,
    pub(crate) wakeups: Wakeups,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").finish_non_exhaustive()
    }
}

impl Node {
    /// Connects to `config.server`. With `check`, connects now and sends a `PING`, so bad
    /// credentials and unreachable servers fail here rather than on the first lock; without
    /// it, the connection is made on the first command (a Redlock node may be down).
    pub(crate) async fn connect(config: &RedisConfig, check: bool) -> Result<Node> {
        config.validate()?;
        let invalid = |reason: String| Error::InvalidUrl {
            url: redact_url(&config.server),
            reason,
        };
        let client = match &config.ca_file {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| {
                    Error::invalid_argument("ca", format!("{}: {e}", path.display()))
                })?;
                ::redis::Client::build_with_tls(
                    config.server.as_str(),
                    ::redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(pem),
                    },
                )
            }
            None => ::redis::Client::open(config.server.as_str()),
        }
        .map_err(|e| invalid(e.to_string()))?;
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
        Ok(Node {
            conn,
            wakeups: Wakeups::new(client),
        })
    }

    /// Sends a `PING`.
    pub(crate) async fn ping(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        ::redis::cmd("PING")
            .query_async::<()>(&mut conn)
            .await
            .map_err(|e| map(e, ""))
    }
}
