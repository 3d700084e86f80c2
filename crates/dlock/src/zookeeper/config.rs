//! Options of the ZooKeeper backend and how they are read from a URL.

use std::fmt;
use std::time::Duration;

use super::ZOOKEEPER_SCHEMES;
use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};

/// ZooKeeper's client port, used for a host given without one.
const DEFAULT_PORT: u16 = 2181;

/// Options of the ZooKeeper backend; every field but the servers has a default.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use dlock::zookeeper::ZookeeperConfig;
/// let config = ZookeeperConfig::from_url(
///     "zk://app:secret@zk1:2181,zk2:2181/billing/locks?session_timeout=6s",
/// ).unwrap();
/// assert_eq!(config.servers, "zk1:2181,zk2:2181");
/// assert_eq!(config.chroot, "/billing/locks");
/// assert_eq!(config.session_timeout, Duration::from_secs(6));
/// assert!(!format!("{config:?}").contains("secret"));
/// ```
#[derive(Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct ZookeeperConfig {
    /// The ensemble, as ZooKeeper's connect string without a chroot: `host:port[,host:port…]`.
    pub servers: String,
    /// The node under which dlock keeps one child per lock name (URL path). Created (with
    /// its ancestors) on first use. Default: `/dlock`.
    pub chroot: String,
    /// The session timeout asked of the server (URL `session_timeout`); the server clamps it
    /// to its `[minSessionTimeout, maxSessionTimeout]` (by default 2 to 20 ticks). A crashed
    /// holder's lock is freed when its session expires. Default: 10 s.
    pub session_timeout: Duration,
    /// How long connecting may take before it fails as unavailable (URL `connect_timeout`).
    /// Default: 5 s.
    pub connect_timeout: Duration,
    /// Digest credentials `user:password` (URL userinfo), sent with `addauth digest`.
    #[serde(skip)]
    pub digest: Option<String>,
    /// Who may touch the nodes dlock creates (URL `acl`): [`Acl::Creator`] (only the same
    /// digest identity; the default when credentials are given) or [`Acl::Open`] (anyone; the
    /// default without credentials).
    pub acl: Acl,
}

/// The ACL of the nodes dlock creates.
///
/// # Examples
///
/// ```
/// use dlock::zookeeper::{Acl, ZookeeperConfig};
/// let config = ZookeeperConfig::from_url("zk://u:p@zk1:2181?acl=open").unwrap();
/// assert_eq!(config.acl, Acl::Open);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub enum Acl {
    /// `world:anyone` has every permission (ZooKeeper's `OPEN_ACL_UNSAFE`).
    Open,
    /// Only the authenticated creator (ZooKeeper's `CREATOR_ALL_ACL`); needs credentials.
    Creator,
}

impl Default for ZookeeperConfig {
    fn default() -> Self {
        ZookeeperConfig {
            servers: "127.0.0.1:2181".into(),
            chroot: "/dlock".into(),
            session_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(5),
            digest: None,
            acl: Acl::Open,
        }
    }
}

impl fmt::Debug for ZookeeperConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZookeeperConfig")
            .field("servers", &self.servers)
            .field("chroot", &self.chroot)
            .field("session_timeout", &self.session_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field(
                "digest",
                &self
                    .digest
                    .as_deref()
                    .map(|d| format!("{}:***", d.split_once(':').map_or(d, |(u, _)| u))),
            )
            .field("acl", &self.acl)
            .finish()
    }
}

const OPTIONS: &str = "session_timeout, connect_timeout, acl";

impl ZookeeperConfig {
    /// Reads `zk://[user:password@]host[:port][,host[:port]…][/chroot][?option=value&…]`
    /// (`zookeeper://` too). A missing port is 2181. Options: `session_timeout`,
    /// `connect_timeout` (durations such as `6s`), `acl` (`open` or `creator`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for another scheme, a missing host, a bad port, a bad chroot, an
    /// unknown option or a bad value.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = dlock::zookeeper::ZookeeperConfig::from_url("zk://10.0.0.5").unwrap();
    /// assert_eq!(config.servers, "10.0.0.5:2181");
    /// assert_eq!(config.chroot, "/dlock");
    /// ```
    pub fn from_url(url: &str) -> Result<ZookeeperConfig> {
        let parsed = StoreUrl::parse(
            url,
            ZOOKEEPER_SCHEMES,
            "zk://host:port[,host:port…][/chroot]",
        )?;
        if parsed.fragment.is_some() {
            return Err(parsed.invalid("zk URLs have no fragment"));
        }
        let mut config = ZookeeperConfig::default();
        if let Some((user, password)) = parsed.credentials()? {
            let password = password
                .ok_or_else(|| parsed.invalid("credentials must be user:password (digest auth)"))?;
            config.digest = Some(format!("{user}:{password}"));
            config.acl = Acl::Creator;
        }
        let servers: Vec<String> = parsed
            .endpoints(false)?
            .iter()
            .map(|endpoint| endpoint.with_port(DEFAULT_PORT))
            .collect();
        config.servers = servers.join(",");
        let chroot = parsed.path();
        if !chroot.is_empty() && chroot != "/" {
            config.chroot = parsed.decode("the chroot", chroot.trim_end_matches('/'))?;
        }
        for option in parsed.options() {
            match option.key {
                "session_timeout" => config.session_timeout = option.duration("6s")?,
                "connect_timeout" => config.connect_timeout = option.duration("6s")?,
                "acl" => {
                    config.acl = option.choice(&[("open", Acl::Open), ("creator", Acl::Creator)])?
                }
                _ => return Err(option.unknown(OPTIONS)),
            }
        }
        parsed.validated(config, ZookeeperConfig::validate)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.servers.is_empty() {
            return Err(Error::invalid_argument("servers", "no server given"));
        }
        let chroot_ok = self.chroot.starts_with('/')
            && self.chroot.len() > 1
            && self
                .chroot
                .split('/')
                .skip(1)
                .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'));
        if !chroot_ok {
            return Err(Error::invalid_argument(
                "chroot",
                format!(
                    "{:?} is not an absolute ZooKeeper path such as /dlock",
                    self.chroot
                ),
            ));
        }
        if self.session_timeout < Duration::from_millis(100)
            || self.session_timeout > Duration::from_secs(3600)
        {
            return Err(Error::invalid_argument(
                "session_timeout",
                "must be between 100ms and 1h",
            ));
        }
        if self.connect_timeout.is_zero() || self.connect_timeout > Duration::from_secs(3600) {
            return Err(Error::invalid_argument(
                "connect_timeout",
                "must be between 1ms and 1h",
            ));
        }
        if self.acl == Acl::Creator && self.digest.is_none() {
            return Err(Error::invalid_argument(
                "acl",
                "acl=creator needs credentials (zk://user:password@…)",
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
    fn parses_servers_chroot_and_options() {
        let c = ZookeeperConfig::from_url(
            "zk://u:p%40ss@a:1,b,c:3/x/y/?session_timeout=2s&connect_timeout=50ms",
        )
        .unwrap();
        assert_eq!(c.servers, "a:1,b:2181,c:3");
        assert_eq!(c.chroot, "/x/y");
        assert_eq!(c.digest.as_deref(), Some("u:p@ss"));
        assert_eq!(c.acl, Acl::Creator);
        assert_eq!(c.session_timeout, Duration::from_secs(2));
        assert_eq!(c.connect_timeout, Duration::from_millis(50));
        let plain = ZookeeperConfig::from_url("zookeeper://h:9/").unwrap();
        assert_eq!(plain.chroot, "/dlock");
        assert_eq!(plain.acl, Acl::Open);
    }

    #[test]
    fn rejects_bad_urls() {
        assert_each_url_refused(
            ZookeeperConfig::from_url,
            &[
                "zk://",
                "zk://:2181",
                "zk://h:notaport",
                "zk://h:0",
                "zk://h:1,,i:2",
                "zk://h/a//b",
                "zk://h/a/../b",
                "zk://h?bogus=1",
                "zk://h?session_timeout=soon",
                "zk://h?session_timeout=1ms",
                "zk://h?acl=creator",
                "zk://h?acl=maybe",
                "zk://user@h",
                "zk://u:%zz@h",
                "redis://h",
            ],
        );
        let error = ZookeeperConfig::from_url("zk://u:secret@h?bogus=1").unwrap_err();
        assert!(!error.to_string().contains("secret"), "{error}");
    }
}
