//! [`RedlockBuilder`]: the nodes and options of a client, and connecting to them.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures::future::join_all;

use super::error::{on_node, too_few_answered, unavailable};
use super::scripts::{ACQUIRE, EXTEND, RELEASE, SYNC};
use super::{Inner, RedlockBackend, RedlockConfig};
use crate::error::{Error, Result};
use crate::redis::node::Node;

/// Builds a [`RedlockBackend`].
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// let backend = dlock::redlock::RedlockBuilder::new("redlock://a:6379,b:6379,c:6379")?
///     .node_timeout(Duration::from_millis(20))
///     .build()
///     .await?;
/// let locks = dlock::Locks::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct RedlockBuilder {
    config: RedlockConfig,
}

impl RedlockBuilder {
    /// A builder for the nodes of a `redlock://` URL; see [`RedlockConfig::from_url`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](crate::Error::InvalidUrl) as for [`RedlockConfig::from_url`].
    pub fn new(url: &str) -> Result<RedlockBuilder> {
        Ok(RedlockBuilder {
            config: RedlockConfig::from_url(url)?,
        })
    }

    /// A builder from a full config (nodes built with [`RedisConfig`](crate::redis::RedisConfig)).
    pub fn from_config(config: RedlockConfig) -> RedlockBuilder {
        RedlockBuilder { config }
    }

    /// See [`RedlockConfig::node_timeout`].
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = timeout;
        self
    }

    /// Connects to every node and checks that a quorum answers. Nodes that are down are
    /// connected to when they come back.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) / [`Error::InvalidUrl`](crate::Error::InvalidUrl) for bad options;
    /// [`Error::Unauthenticated`](crate::Error::Unauthenticated) when a node refuses the credentials; [`Error::Unavailable`](crate::Error::Unavailable)
    /// when fewer than a quorum of nodes answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::redlock::RedlockBuilder::new("redlock://a:6379,b:6379,c:6379")?.build().await?;
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<RedlockBackend> {
        let config = self.config;
        config.validate()?;
        // Built now, on the connecting thread: a process forked while another thread builds
        // them (a first acquire) would find them half-built for good.
        for script in [&ACQUIRE, &SYNC, &EXTEND, &RELEASE] {
            LazyLock::force(script);
        }
        let nodes = connect_nodes(&config).await?;
        let answers = join_all(nodes.iter().zip(&config.nodes).map(|(node, options)| {
            tokio::time::timeout(
                options.connect_timeout + options.response_timeout,
                node.ping(),
            )
        }))
        .await;
        let mut up = 0;
        let mut errors = Vec::new();
        for (index, answer) in answers.into_iter().enumerate() {
            let node = config.node_label(index);
            match answer {
                Ok(Ok(())) => up += 1,
                Ok(Err(
                    error @ (Error::Unauthenticated { .. } | Error::PermissionDenied { .. }),
                )) => {
                    return Err(on_node(&node, error));
                }
                Ok(Err(error)) => errors.push(on_node(&node, error)),
                Err(_) => {
                    let limit =
                        config.nodes[index].connect_timeout + config.nodes[index].response_timeout;
                    errors.push(on_node(
                        &node,
                        unavailable(&format!("no answer to PING within {limit:?}")),
                    ));
                }
            }
        }
        if up < config.quorum() {
            return Err(too_few_answered(
                up,
                config.nodes.len(),
                config.quorum(),
                &errors,
            ));
        }
        Ok(RedlockBackend {
            inner: Arc::new(Inner { nodes, config }),
        })
    }
}

/// A lazy connection to every node of `config` (made on the first command: a node may be
/// down).
pub(super) async fn connect_nodes(config: &RedlockConfig) -> Result<Vec<Node>> {
    let mut nodes = Vec::with_capacity(config.nodes.len());
    for (index, node) in config.nodes.iter().enumerate() {
        let connected = Node::connect(node, false).await;
        nodes.push(connected.map_err(|error| on_node(&config.node_label(index), error))?);
    }
    Ok(nodes)
}
