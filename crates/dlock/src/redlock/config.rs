//! Options of the Redlock backend and how they are read from a URL.

use std::time::Duration;

use super::REDLOCK_SCHEMES;
use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};
use crate::redis::RedisConfig;

/// Options of the Redlock backend: the nodes, and how long one node may take.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use dlock::redlock::RedlockConfig;
/// let config = RedlockConfig::from_url("redlock://:secret@h1:6379,h2:6379,h3:6379/0?node_timeout=20ms&prefix=app:").unwrap();
/// assert_eq!(config.nodes.len(), 3);
/// assert_eq!(config.quorum(), 2);
/// assert_eq!(config.nodes[1].server, "redis://:secret@h2:6379/0");
/// assert_eq!(config.nodes[1].prefix, "app:");
/// assert_eq!(config.node_timeout, Duration::from_millis(20));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedlockConfig {
    /// The independent Redis servers (not replicas of each other), each with the same
    /// options. Use an odd number: 3 tolerate one failure, 5 tolerate two.
    pub nodes: Vec<RedisConfig>,
    /// How long one node may take to answer a lock request before it counts as failed for
    /// that request (URL `node_timeout`), so a slow or paused node cannot hold up a lock;
    /// also capped at a third of the lock's TTL. Default: 50 ms.
    pub node_timeout: Duration,
}

impl Default for RedlockConfig {
    fn default() -> Self {
        RedlockConfig {
            nodes: Vec::new(),
            node_timeout: Duration::from_millis(50),
        }
    }
}

/// The most nodes one lock may span.
pub const MAX_NODES: usize = 64;

impl RedlockConfig {
    /// How errors name node `index`: its place and its server, without the password.
    pub(crate) fn node_label(&self, index: usize) -> String {
        let server = self
            .nodes
            .get(index)
            .map_or_else(String::new, |node| crate::error::redact_url(&node.server));
        format!("node {} ({server})", index + 1)
    }

    /// Reads `redlock://[user[:password]@]host:port,host:port,…[/db][?option=value&…]`, or
    /// `redlocks://…` for TLS. The credentials, database and options apply to every node.
    /// Options: those of `redis://` (see [`RedisConfig::from_url`]) and `node_timeout`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for another scheme, no node, a node listed twice, or anything
    /// `redis://` would refuse.
    pub fn from_url(url: &str) -> Result<RedlockConfig> {
        let parsed = StoreUrl::parse(url, REDLOCK_SCHEMES, "redlock://host:port,host:port,…")?;
        let node_scheme = if parsed.scheme == "redlocks" {
            "rediss"
        } else {
            "redis"
        };
        let mut config = RedlockConfig::default();
        let mut passed = Vec::new();
        for option in parsed.options() {
            match option.key {
                "node_timeout" => config.node_timeout = option.duration("50ms")?,
                _ => passed.push(option.pair),
            }
        }
        // Every node gets the URL's credentials, database, options and fragment.
        let userinfo = parsed.userinfo().map(|userinfo| format!("{userinfo}@"));
        let query = if passed.is_empty() {
            String::new()
        } else {
            format!("?{}", passed.join("&"))
        };
        let fragment = parsed.fragment.map(|f| format!("#{f}"));
        let mut seen = std::collections::HashSet::new();
        for host in parsed.hosts() {
            if host.is_empty() {
                return Err(parsed.invalid("an empty node in the list"));
            }
            if !seen.insert(host.to_ascii_lowercase()) {
                return Err(parsed.invalid(format!("node {host} is listed twice")));
            }
            let node = format!(
                "{node_scheme}://{}{host}{}{query}{}",
                userinfo.as_deref().unwrap_or(""),
                parsed.path(),
                fragment.as_deref().unwrap_or(""),
            );
            let node = RedisConfig::from_url(&node).map_err(|e| match e {
                Error::InvalidUrl { reason, .. } => {
                    parsed.invalid(format!("node {host}: {reason}"))
                }
                other => other,
            })?;
            config.nodes.push(node);
        }
        parsed.validated(config, RedlockConfig::validate)
    }

    /// How many nodes must agree: a majority.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.nodes.is_empty() {
            return Err(Error::invalid_argument("nodes", "no node"));
        }
        if self.nodes.len() > MAX_NODES {
            return Err(Error::invalid_argument("nodes", "more than 64"));
        }
        if self.node_timeout.is_zero() || self.node_timeout > Duration::from_secs(60) {
            return Err(Error::invalid_argument(
                "node_timeout",
                "must be between 1ms and 60s",
            ));
        }
        if self.nodes.windows(2).any(|w| w[0].prefix != w[1].prefix) {
            return Err(Error::invalid_argument(
                "prefix",
                "every node must use the same prefix",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::url::assert_each_url_refused;

    #[test]
    fn parses_nodes_and_options() {
        let c =
            RedlockConfig::from_url("redlocks://u:p@a:1,b:2,c:3/4?timeout=20ms#insecure").unwrap();
        assert_eq!(c.nodes.len(), 3);
        assert_eq!(c.nodes[2].server, "rediss://u:p@c:3/4#insecure");
        assert_eq!(c.nodes[0].response_timeout, Duration::from_millis(20));
        assert_eq!(c.quorum(), 2);
        assert_eq!(
            RedlockConfig::from_url("redlock://a:1").unwrap().quorum(),
            1
        );
    }

    #[test]
    fn rejects_bad_urls() {
        assert_each_url_refused(
            RedlockConfig::from_url,
            &[
                "redlock://",
                "redlock://a:1,,b:2",
                "redlock://a:1,a:1",
                "redlock://a:1,b:x",
                "redlock://a:1?node_timeout=0ms",
                "redlock://a:1?node_timeout=soon",
                "redlock://a:1?bogus=1",
                "redis://a:1",
            ],
        );
    }
}
