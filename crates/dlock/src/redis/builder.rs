//! [`RedisBuilder`]: the options of a client, and connecting it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::node::Node;
use super::{Inner, RedisBackend, RedisConfig, renewals, scripts};
use crate::error::Result;

/// Builds a [`RedisBackend`] from options.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// use dlock::redis::RedisBuilder;
/// let backend = RedisBuilder::new("redis://app:secret@cache:6379/0")?
///     .prefix("billing:")
///     .response_timeout(Duration::from_millis(500))
///     .build()
///     .await?;
/// let locks = dlock::Locks::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct RedisBuilder {
    config: RedisConfig,
}

impl RedisBuilder {
    /// A builder for the server of a `redis://` or `rediss://` URL (options in the URL are
    /// read too; see [`RedisConfig::from_url`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`](crate::Error::InvalidUrl) as for [`RedisConfig::from_url`].
    pub fn new(url: &str) -> Result<RedisBuilder> {
        Ok(RedisBuilder {
            config: RedisConfig::from_url(url)?,
        })
    }

    /// A builder from a full config.
    pub fn from_config(config: RedisConfig) -> RedisBuilder {
        RedisBuilder { config }
    }

    /// See [`RedisConfig::prefix`].
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// See [`RedisConfig::ca_file`].
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.ca_file = Some(path.into());
        self
    }

    /// See [`RedisConfig::response_timeout`].
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.config.response_timeout = timeout;
        self
    }

    /// See [`RedisConfig::connect_timeout`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// See [`RedisConfig::layout`]: [`RedisLayout::RedisPy`](super::RedisLayout::RedisPy)
    /// keeps mutexes as redis-py's `Lock` does, so both exclude each other.
    pub fn layout(mut self, layout: super::RedisLayout) -> Self {
        self.config.layout = layout;
        self
    }

    /// See [`RedisConfig::poll_min`] and [`RedisConfig::poll_max`].
    pub fn poll(mut self, min: Duration, max: Duration) -> Self {
        self.config.poll_min = min;
        self.config.poll_max = max;
        self
    }

    /// Connects (one multiplexed connection for commands; the pub/sub connection opens on
    /// the first wait) and checks the server answers.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`](crate::Error::InvalidArgument): a bad option, or a CA file that cannot be read;
    /// - [`Error::Unauthenticated`](crate::Error::Unauthenticated): wrong user or password;
    /// - [`Error::Unavailable`](crate::Error::Unavailable): the server cannot be reached or the TLS handshake fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call only drops its connection.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::redis::RedisBuilder::new("redis://127.0.0.1:6379")?.build().await?;
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<RedisBackend> {
        let node = Node::connect(&self.config, true).await?;
        // Built now, on the connecting thread, not by the first acquire on some other thread: a
        // process forked while that thread builds them would find them half-built for good.
        scripts::Scripts::get(node.sharded());
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                node,
                config: self.config,
                renewals: renewals::Renewals::default(),
            }),
        })
    }
}
