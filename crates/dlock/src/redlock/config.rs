//! Options of the Redlock backend and how they are read from a URL.

use std::time::Duration;

use crate::error::{Error, Result, redact_url};
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
        let invalid = |reason: String| Error::InvalidUrl {
            url: redact_url(url),
            reason,
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("expected redlock://host:port,host:port,…".into()))?;
        let node_scheme = match scheme.to_ascii_lowercase().as_str() {
            "redlock" => "redis",
            "redlocks" => "rediss",
            _ => return Err(invalid("expected redlock:// or redlocks://".into())),
        };
        let (rest, fragment) = match rest.split_once('#') {
            Some((rest, fragment)) => (rest, Some(fragment)),
            None => (rest, None),
        };
        let (address, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, db) = match address.split_once('/') {
            Some((authority, db)) => (authority, Some(db)),
            None => (address, None),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let mut config = RedlockConfig::default();
        let mut passed = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("node_timeout", value)) => {
                    config.node_timeout = humantime::parse_duration(value).map_err(|e| {
                        invalid(format!("option node_timeout={value:?}: {e} (try 50ms)"))
                    })?;
                }
                _ => passed.push(pair),
            }
        }
        let mut seen = std::collections::HashSet::new();
        for host in hosts.split(',') {
            if host.is_empty() {
                return Err(invalid("an empty node in the list".into()));
            }
            if !seen.insert(host.to_ascii_lowercase()) {
                return Err(invalid(format!("node {host} is listed twice")));
            }
            let mut node = format!("{node_scheme}://");
            if let Some(userinfo) = userinfo {
                node.push_str(userinfo);
                node.push('@');
            }
            node.push_str(host);
            if let Some(db) = db {
                node.push('/');
                node.push_str(db);
            }
            if !passed.is_empty() {
                node.push('?');
                node.push_str(&passed.join("&"));
            }
            if let Some(fragment) = fragment {
                node.push('#');
                node.push_str(fragment);
            }
            let node = RedisConfig::from_url(&node).map_err(|e| match e {
                Error::InvalidUrl { reason, .. } => invalid(format!("node {host}: {reason}")),
                other => other,
            })?;
            config.nodes.push(node);
        }
        config.validate().map_err(|e| invalid(e.to_string()))?;
        Ok(config)
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
        for url in [
            "redlock://",
            "redlock://a:1,,b:2",
            "redlock://a:1,a:1",
            "redlock://a:1,b:x",
            "redlock://a:1?node_timeout=0ms",
            "redlock://a:1?node_timeout=soon",
            "redlock://a:1?bogus=1",
            "redis://a:1",
        ] {
            assert!(
                matches!(RedlockConfig::from_url(url), Err(Error::InvalidUrl { .. })),
                "{url}"
            );
        }
    }
}
