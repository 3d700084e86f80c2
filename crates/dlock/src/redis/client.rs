//! The client's state every hold shares: the server's (or cluster's) connections, the
//! options, the gathered renewals; and what it does for every kind of hold (replica
//! acknowledgements, keys, error mapping).

use std::sync::Arc;

use super::conn::Conn;
use super::error::{BACKEND, map_timed};
use super::node::Node;
use super::scripts::{self, Keys};
use super::{RedisConfig, cluster, ms, renewals};
use crate::backend::Lease;
use crate::error::{Error, Result};

pub(super) struct Inner {
    pub(super) node: Node,
    pub(super) config: RedisConfig,
    /// Extensions gathered into one script ([`renewals`]).
    pub(super) renewals: renewals::Renewals,
}

impl Inner {
    /// The command connection to the current primary (or the cluster).
    pub(super) fn conn(&self) -> Conn {
        self.node.conn()
    }

    /// With `min_replicas`, waits until that many replicas have every write this client sent
    /// so far (`WAIT`, on the shared command connection); `what` names the write for the
    /// error, `key` is a key of the lock it wrote.
    ///
    /// On a cluster the `WAIT` goes to the primary of `key`'s slot only: redis-rs would send
    /// it to every primary and answer the smallest count, so one shard's lagging replica
    /// would refuse the grants of every shard.
    pub(super) async fn replicated(&self, what: &str, key: &str) -> Result<()> {
        let wanted = self.config.min_replicas;
        if wanted == 0 {
            return Ok(());
        }
        let mut conn = self.conn();
        let mut wait = ::redis::cmd("WAIT");
        wait.arg(wanted).arg(ms(self.config.replica_timeout));
        let acked: ::redis::RedisResult<u32> = match conn.cluster() {
            Some(cluster) => cluster
                .route_command(wait, cluster::to_slot_primary(key))
                .await
                .and_then(|value| ::redis::from_redis_value(value).map_err(Into::into)),
            None => wait.query_async(&mut conn).await,
        };
        let acked = acked.map_err(|e| self.fail(e, key))?;
        if acked >= wanted {
            return Ok(());
        }
        Err(Error::Unavailable {
            backend: BACKEND,
            source: format!(
                "{what}: {acked} of the {wanted} replicas asked for (min_replicas) acknowledged it \
                 within {:?} (replica_timeout)",
                self.config.replica_timeout
            )
            .into(),
        })
    }

    /// A grant that must reach `min_replicas` replicas: when it does not, it is released
    /// again and the call fails, so no caller holds a lock the replicas do not know.
    /// `key` gives a key of one of them (on a cluster they share one slot), only built when
    /// replicas are asked for.
    pub(super) async fn confirm_grants(
        &self,
        leases: Option<Vec<Arc<dyn Lease>>>,
        key: impl FnOnce() -> String,
    ) -> Result<Option<Vec<Arc<dyn Lease>>>> {
        let Some(leases) = leases else {
            return Ok(None);
        };
        if self.config.min_replicas == 0 {
            return Ok(Some(leases));
        }
        if let Err(error) = self.replicated("the grant", &key()).await {
            for lease in &leases {
                if let Err(release) = lease.release().await {
                    tracing::debug!(%release, "releasing a grant the replicas did not confirm failed; it expires instead");
                }
            }
            return Err(error);
        }
        Ok(Some(leases))
    }

    /// A failed request as dlock's error; a timeout says the configured response timeout.
    /// A server that cannot be reached (or answers as a replica) may have been replaced by a
    /// failover: behind Sentinel, the sentinels are asked at once.
    pub(super) fn fail(&self, error: ::redis::RedisError, key: &str) -> Error {
        let error = map_timed(error, key, self.config.response_timeout);
        if matches!(error, Error::Unavailable { .. }) {
            self.node.suspect();
        }
        error
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// The scripts, publishing releases as this store's waiters listen.
    pub(super) fn scripts(&self) -> &'static scripts::Scripts {
        scripts::Scripts::get(self.node.sharded())
    }

    pub(super) fn keys(&self, name: &str) -> Keys {
        Keys::new(&self.config.prefix, &self.in_key(name))
    }

    /// Whether the store is a Redis Cluster.
    pub(super) fn is_cluster(&self) -> bool {
        !self.config.cluster.is_empty()
    }

    /// The name as the lock's keys hold it: inside a hash tag on a cluster, so every key of
    /// the lock lives in one slot ([`cluster::tagged`]).
    pub(super) fn in_key<'a>(&self, name: &'a str) -> std::borrow::Cow<'a, str> {
        if self.is_cluster() {
            std::borrow::Cow::Owned(cluster::tagged(name))
        } else {
            std::borrow::Cow::Borrowed(name)
        }
    }

    /// The lock name a key's name part holds ([`in_key`](Inner::in_key) reversed).
    pub(super) fn name_in<'a>(&self, in_key: &'a str) -> std::borrow::Cow<'a, str> {
        if self.is_cluster() {
            cluster::untagged(in_key)
        } else {
            std::borrow::Cow::Borrowed(in_key)
        }
    }
}
