//! Options of the Redis backend and how they are read from a URL.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::{CLUSTER_SCHEMES, REDIS_SCHEMES, RedisLayout, SENTINEL_SCHEMES};
use crate::backend::url::StoreUrl;
use crate::error::{Error, Result, redact_url};

/// Options of the Redis backend; every field but the server address has a default.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use dlock::redis::RedisConfig;
/// let config = RedisConfig::from_url("redis://app:secret@cache:6380/2?prefix=billing:&timeout=250ms").unwrap();
/// assert_eq!(config.prefix, "billing:");
/// assert_eq!(config.response_timeout, Duration::from_millis(250));
/// assert!(!format!("{config:?}").contains("secret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The server, as redis-rs reads it: `redis://[user[:password]@]host[:port][/db]`, or
    /// `rediss://…` for TLS (`#insecure` skips certificate checks). dlock's own options are
    /// not part of it.
    pub server: String,
    /// Namespace of every key and channel dlock writes (URL `prefix`), without `{` or `}`
    /// (Redis Cluster's hash tags). Default: `dlock:`.
    pub prefix: String,
    /// A PEM file of the certificate authority that signed the server's certificate, for
    /// `rediss://` with a private CA (URL `ca`). Default: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// How long one command may take before it fails as unavailable (URL `timeout`), so a
    /// stalled server cannot stall a lock call. Default: 1 s.
    pub response_timeout: Duration,
    /// How long connecting may take (URL `connect_timeout`). Default: 1 s.
    pub connect_timeout: Duration,
    /// First delay of the fallback polling while waiting (URL `poll_min`). Waiters are woken
    /// by pub/sub; polling only covers a lost subscription. Default: 20 ms.
    pub poll_min: Duration,
    /// Largest fallback polling delay (URL `poll_max`, at most 250 ms, so a queued waiter
    /// keeps its place). Default: 250 ms.
    pub poll_max: Duration,
    /// The sentinels that name the primary (a `redis+sentinel://` URL); `None` for one fixed
    /// server. With sentinels, the host of [`server`](RedisConfig::server) is the master's
    /// name and stands for whichever server the sentinels name as its primary; the rest of
    /// `server` (credentials, database, options) is used as written.
    pub sentinel: Option<SentinelConfig>,
    /// The nodes of a Redis Cluster to start from (a `redis+cluster://` URL), each
    /// `host:port`; empty for one server. With them, [`server`](RedisConfig::server) is the
    /// first node's URL and gives the credentials and options of every node.
    pub cluster: Vec<String>,
    /// How many replicas must have a grant or an extension before it returns (URL
    /// `min_replicas`; Redis `WAIT`). 0 (the default) returns once the primary has it.
    pub min_replicas: u32,
    /// How long a grant or an extension waits for [`min_replicas`](RedisConfig::min_replicas)
    /// replicas (URL `replica_timeout`); shorter than the response timeout. Default: 500 ms.
    pub replica_timeout: Duration,
    /// How mutexes are kept (URL `layout`: `dlock`, the default, or `redis-py`).
    pub layout: RedisLayout,
}

/// Where the sentinels of a Redis primary are, and what to ask them (`redis+sentinel://`).
///
/// # Examples
///
/// ```
/// use dlock::redis::RedisConfig;
/// let config = RedisConfig::from_url(
///     "redis+sentinel://app:secret@s1:26379,s2,s3:26380/orders/2?sentinel_password=guard",
/// )
/// .unwrap();
/// let sentinel = config.sentinel.as_ref().unwrap();
/// assert_eq!(sentinel.master, "orders");
/// assert_eq!(sentinel.sentinels, ["s1:26379", "s2:26379", "s3:26380"]);
/// assert_eq!(sentinel.password.as_deref(), Some("guard"));
/// assert!(!format!("{config:?}").contains("guard"));
/// ```
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SentinelConfig {
    /// Each sentinel's `host:port` (port 26379 when the URL gives none), asked in this order.
    pub sentinels: Vec<String>,
    /// The name the sentinels monitor the primary under.
    pub master: String,
    /// The user name the sentinels want (URL `sentinel_user`); the URL's own user name and
    /// password are the primary's. Default: none.
    pub username: Option<String>,
    /// The sentinels' password (URL `sentinel_password`). Default: none.
    pub password: Option<String>,
}

/// The port of a sentinel address without one.
pub const SENTINEL_PORT: u16 = 26379;

impl SentinelConfig {
    /// Sentinels at `sentinels` (`host:port` each) monitoring the primary named `master`,
    /// without credentials of their own.
    ///
    /// # Examples
    ///
    /// ```
    /// use dlock::redis::{RedisBuilder, RedisConfig, SentinelConfig};
    /// let mut config = RedisConfig::default();
    /// config.server = "redis://app:secret@orders/0".into(); // the master's name as host
    /// config.sentinel = Some(SentinelConfig::new(["10.0.0.1:26379", "10.0.0.2:26379"], "orders"));
    /// let builder = RedisBuilder::from_config(config);
    /// ```
    pub fn new(
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        master: impl Into<String>,
    ) -> SentinelConfig {
        SentinelConfig {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            master: master.into(),
            username: None,
            password: None,
        }
    }
}

impl fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConfig")
            .field("sentinels", &self.sentinels)
            .field("master", &self.master)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// The slowest fallback polling allowed: a waiter refreshes its place in the queue when it
/// polls, and a place not refreshed for [`WAITER_TTL`] is given up.
pub const MAX_POLL: Duration = Duration::from_millis(250);

/// How long a waiter's place in a lock's queue lasts without a refresh: the longest a crashed
/// waiter can hold up the queue.
pub const WAITER_TTL: Duration = Duration::from_millis(1000);

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            server: "redis://127.0.0.1:6379".into(),
            prefix: "dlock:".into(),
            ca_file: None,
            response_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            poll_min: Duration::from_millis(20),
            poll_max: MAX_POLL,
            sentinel: None,
            cluster: Vec::new(),
            min_replicas: 0,
            replica_timeout: Duration::from_millis(500),
            layout: RedisLayout::Dlock,
        }
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("server", &redact_url(&self.server))
            .field("prefix", &self.prefix)
            .field("ca_file", &self.ca_file)
            .field("response_timeout", &self.response_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("poll_min", &self.poll_min)
            .field("poll_max", &self.poll_max)
            .field("sentinel", &self.sentinel)
            .field("cluster", &self.cluster)
            .field("min_replicas", &self.min_replicas)
            .field("replica_timeout", &self.replica_timeout)
            .field("layout", &self.layout)
            .finish()
    }
}

const OPTIONS: &str = "prefix, ca, timeout, connect_timeout, poll_min, poll_max, protocol, \
                       min_replicas, replica_timeout, layout";
const SENTINEL_OPTIONS: &str = "prefix, ca, timeout, connect_timeout, poll_min, poll_max, \
                                protocol, min_replicas, replica_timeout, layout, \
                                sentinel_user, sentinel_password";
/// The shape of a cluster URL, for errors.
const CLUSTER_FORM: &str = "redis+cluster://[user:password@]host:port[,host:port…]";
/// The shape of a sentinel URL, for errors.
const SENTINEL_FORM: &str =
    "redis+sentinel://[user:password@]host[:port][,host[:port]…]/MASTER[/DB]";

impl RedisConfig {
    /// Reads `redis://[user[:password]@]host[:port][/db][?option=value&…]` or `rediss://…`.
    /// Options: `prefix` (key namespace), `ca` (PEM file), `timeout`, `connect_timeout`,
    /// `poll_min`, `poll_max` (durations such as `250ms`), and redis-rs's `protocol`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for another scheme, a missing host, a bad database number, an
    /// unknown option or a bad value.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = dlock::redis::RedisConfig::from_url("rediss://cache:6380?ca=/etc/ssl/ca.pem").unwrap();
    /// assert_eq!(config.ca_file.as_deref(), Some(std::path::Path::new("/etc/ssl/ca.pem")));
    /// ```
    pub fn from_url(url: &str) -> Result<RedisConfig> {
        if SENTINEL_SCHEMES.iter().any(|scheme| {
            url.get(..scheme.len() + 3)
                .is_some_and(|head| head.eq_ignore_ascii_case(&format!("{scheme}://")))
        }) {
            return RedisConfig::from_sentinel_url(url);
        }
        if CLUSTER_SCHEMES.iter().any(|scheme| {
            url.get(..scheme.len() + 3)
                .is_some_and(|head| head.eq_ignore_ascii_case(&format!("{scheme}://")))
        }) {
            return RedisConfig::from_cluster_url(url);
        }
        let parsed = StoreUrl::parse(url, REDIS_SCHEMES, "redis://host[:port][/db]")?;
        let hosts = parsed.hosts();
        if hosts.len() > 1 {
            return Err(parsed.invalid(
                "one server per redis:// URL (several nodes: redlock://a:6379,b:6379,…)",
            ));
        }
        parsed.endpoint(hosts[0], false)?;
        let mut config = RedisConfig::default();
        let passed = config.read_options(&parsed, |option| Err(option.unknown(OPTIONS)))?;
        config.finish(&parsed, &parsed.scheme, parsed.address, &passed)?;
        Ok(config)
    }

    /// Reads a `redis+sentinel://` or `rediss+sentinel://` URL (see [`SENTINEL_FORM`]).
    fn from_sentinel_url(url: &str) -> Result<RedisConfig> {
        let parsed = StoreUrl::parse(url, SENTINEL_SCHEMES, SENTINEL_FORM)?;
        if parsed.path().contains('@') {
            return Err(parsed.invalid("a `/` in the user name or password must be written as %2F"));
        }
        let sentinels = parsed
            .endpoints(false)?
            .iter()
            .map(|endpoint| endpoint.with_port(SENTINEL_PORT))
            .collect();
        let mut path = parsed.path().strip_prefix('/').unwrap_or("").splitn(2, '/');
        let master = path.next().unwrap_or("");
        if master.is_empty() {
            return Err(parsed.invalid(format!(
                "no master name: the sentinels are asked for a primary by name ({SENTINEL_FORM})"
            )));
        }
        if !master
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(parsed.invalid(format!(
                "master name {master:?}: use letters, digits, '.', '_' and '-'"
            )));
        }
        let db = path.next().unwrap_or("");
        let mut sentinel = SentinelConfig {
            sentinels,
            master: master.to_owned(),
            username: None,
            password: None,
        };
        let mut config = RedisConfig::default();
        let passed = config.read_options(&parsed, |option| {
            match option.key {
                "sentinel_user" => sentinel.username = Some(option.text()?),
                "sentinel_password" => sentinel.password = Some(option.text()?),
                _ => return Err(option.unknown(SENTINEL_OPTIONS)),
            }
            Ok(())
        })?;
        let userinfo = parsed
            .userinfo()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        let slash_db = if db.is_empty() {
            String::new()
        } else {
            format!("/{db}")
        };
        // The primary's URL with the master's name for a host, replaced by an address when
        // the sentinels name one.
        let scheme = parsed.scheme.trim_end_matches("+sentinel");
        config.finish(
            &parsed,
            scheme,
            &format!("{userinfo}{master}{slash_db}"),
            &passed,
        )?;
        config.sentinel = Some(sentinel);
        Ok(config)
    }

    /// Reads a `redis+cluster://` or `rediss+cluster://` URL (see [`CLUSTER_FORM`]).
    fn from_cluster_url(url: &str) -> Result<RedisConfig> {
        let parsed = StoreUrl::parse(url, CLUSTER_SCHEMES, CLUSTER_FORM)?;
        let nodes: Vec<String> = parsed
            .endpoints(true)?
            .iter()
            .map(ToString::to_string)
            .collect();
        let path = parsed.path();
        if path.contains('@') {
            return Err(parsed.invalid("a `/` in the user name or password must be written as %2F"));
        }
        if !matches!(path, "" | "/" | "/0") {
            return Err(parsed.invalid(format!(
                "a cluster has only database 0; drop the path ({CLUSTER_FORM})"
            )));
        }
        let mut config = RedisConfig::default();
        let passed = config.read_options(&parsed, |option| Err(option.unknown(OPTIONS)))?;
        let userinfo = parsed
            .userinfo()
            .map(|u| format!("{u}@"))
            .unwrap_or_default();
        let scheme = parsed.scheme.trim_end_matches("+cluster");
        let first = format!("{userinfo}{}", nodes[0]);
        // Set before `finish` validates: what a cluster refuses is checked there.
        config.cluster = nodes;
        config.finish(&parsed, scheme, &first, &passed)?;
        Ok(config)
    }

    /// The URL of one cluster node: `server` (the first node's) with `node` for its address.
    pub(crate) fn node_url(&self, node: &str) -> String {
        let Some((scheme, rest)) = self.server.split_once("://") else {
            return self.server.clone();
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..end];
        let userinfo = authority.rfind('@').map_or("", |at| &authority[..=at]);
        format!("{scheme}://{userinfo}{node}{}", &rest[end..])
    }

    /// Reads the options every Redis URL has; `own` handles the others. Returns the options
    /// that go to redis-rs as written.
    fn read_options<'a>(
        &mut self,
        parsed: &'a StoreUrl<'_>,
        mut own: impl FnMut(&crate::backend::url::UrlOption<'_, '_>) -> Result<()>,
    ) -> Result<Vec<&'a str>> {
        let mut passed = Vec::new();
        for option in parsed.options() {
            match option.key {
                "prefix" => self.prefix = option.text()?,
                "ca" => self.ca_file = Some(PathBuf::from(option.text()?)),
                "timeout" => self.response_timeout = option.duration("250ms or 2s")?,
                "connect_timeout" => self.connect_timeout = option.duration("250ms or 2s")?,
                "poll_min" => self.poll_min = option.duration("250ms or 2s")?,
                "poll_max" => self.poll_max = option.duration("250ms or 2s")?,
                "min_replicas" => self.min_replicas = option.number()?,
                "replica_timeout" => self.replica_timeout = option.duration("250ms or 2s")?,
                "layout" => {
                    self.layout = RedisLayout::parse(option.raw)
                        .ok_or_else(|| parsed.invalid("option layout: dlock or redis-py"))?;
                }
                "protocol" => passed.push(option.pair),
                _ => own(&option)?,
            }
        }
        Ok(passed)
    }

    /// Sets `server` from the parts of the URL and checks the whole config, and that redis-rs
    /// can read the server's URL.
    fn finish(
        &mut self,
        parsed: &StoreUrl<'_>,
        scheme: &str,
        address: &str,
        passed: &[&str],
    ) -> Result<()> {
        let db = address.find('/').map_or("", |at| &address[at + 1..]);
        if db.contains('@') {
            return Err(parsed.invalid("a `/` in the user name or password must be written as %2F"));
        }
        if !db.is_empty() && db.parse::<u16>().is_err() {
            return Err(parsed.invalid(format!(
                "database {db:?} is not a number (redis://host:port/DB)"
            )));
        }
        self.server = format!("{scheme}://{address}");
        if !passed.is_empty() {
            self.server = format!("{}?{}", self.server, passed.join("&"));
        }
        if let Some(fragment) = parsed.fragment {
            self.server = format!("{}#{fragment}", self.server);
        }
        parsed.checked(self.validate())?;
        // Let redis-rs reject what it cannot read (IPv6 forms, protocol values) now.
        ::redis::parse_redis_url(&self.server)
            .ok_or_else(|| parsed.invalid("not a valid redis URL"))?;
        ::redis::IntoConnectionInfo::into_connection_info(self.server.as_str())
            .map_err(|e| parsed.invalid(e.to_string()))?;
        Ok(())
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.sentinel.is_some() && !self.cluster.is_empty() {
            return Err(Error::invalid_argument(
                "cluster",
                "a Redis Cluster is not found through sentinels: set one of the two",
            ));
        }
        if let Some(sentinel) = &self.sentinel {
            if sentinel.sentinels.is_empty() {
                return Err(Error::invalid_argument("sentinels", "none given"));
            }
            if sentinel.master.is_empty() {
                return Err(Error::invalid_argument(
                    "master",
                    "the master's name is empty",
                ));
            }
        }
        if self.poll_min.is_zero() || self.poll_min > self.poll_max {
            return Err(Error::invalid_argument(
                "poll_min/poll_max",
                "need 0 < poll_min <= poll_max",
            ));
        }
        if self.poll_max > MAX_POLL {
            return Err(Error::invalid_argument("poll_max", "above 250ms"));
        }
        for (what, timeout) in [
            ("timeout", self.response_timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if timeout.is_zero() || timeout > Duration::from_secs(3600) {
                return Err(Error::invalid_argument(what, "must be between 1ms and 1h"));
            }
        }
        if self.min_replicas > 0
            && (self.replica_timeout.is_zero() || self.replica_timeout >= self.response_timeout)
        {
            return Err(Error::invalid_argument(
                "replica_timeout",
                "must be above 0 and below the response timeout (`timeout`), which bounds the \
                 WAIT that asks the replicas",
            ));
        }
        self.layout.validate(!self.cluster.is_empty())?;
        if self.prefix.len() > 256 {
            return Err(Error::invalid_argument("prefix", "longer than 256 bytes"));
        }
        // Redis Cluster hashes a key by its first `{…}`: braces in the prefix would make that
        // tag the prefix's, not the lock's, and split or pile up the keys of locks by slot.
        if self.prefix.contains(['{', '}']) {
            return Err(Error::invalid_argument(
                "prefix",
                format!(
                    "{:?} contains `{{` or `}}`, which Redis Cluster reads as a hash tag: dlock \
                     tags each lock's keys itself, so a prefix may not",
                    self.prefix
                ),
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
    fn parses_server_and_options() {
        let c = RedisConfig::from_url(
            "redis://u:p@h:7/3?prefix=a%3Ab:&timeout=50ms&poll_min=1ms&poll_max=10ms&protocol=resp3",
        )
        .unwrap();
        assert_eq!(c.server, "redis://u:p@h:7/3?protocol=resp3");
        assert_eq!(c.prefix, "a:b:");
        assert_eq!(c.response_timeout, Duration::from_millis(50));
        assert_eq!(c.poll_max, Duration::from_millis(10));
        let tls = RedisConfig::from_url("rediss://h:7?ca=%2Ftmp%2Fca.pem#insecure").unwrap();
        assert_eq!(tls.server, "rediss://h:7#insecure");
        assert_eq!(tls.ca_file, Some(PathBuf::from("/tmp/ca.pem")));
    }

    #[test]
    fn rejects_bad_urls() {
        assert_each_url_refused(
            RedisConfig::from_url,
            &[
                "redis://",
                "redis://:6379",
                "redis://h:notaport",
                "redis://h/x",
                "redis://h?bogus=1",
                "redis://h?timeout=soon",
                "redis://h?timeout=0ms",
                "redis://h?poll_max=1s",
                "redis://h?prefix=%zz",
                "redis://h?prefix=a{b}:",
                "redis://h?prefix=%7D",
                "memory://x",
            ],
        );
    }

    #[test]
    fn a_node_url_keeps_all_but_the_host() {
        let mut config = RedisConfig {
            server: "redis://u:p%2F@orders/2?protocol=resp3".into(),
            ..RedisConfig::default()
        };
        assert_eq!(
            config.node_url("10.0.0.5:6380"),
            "redis://u:p%2F@10.0.0.5:6380/2?protocol=resp3"
        );
        config.server = "rediss://orders#insecure".into();
        assert_eq!(config.node_url("h:1"), "rediss://h:1#insecure");
    }

    #[test]
    fn reads_cluster_urls() {
        let c = RedisConfig::from_url("rediss+cluster://u:p@a:1,b:2?prefix=q:#insecure").unwrap();
        assert_eq!(c.server, "rediss://u:p@a:1#insecure");
        assert_eq!(c.cluster, ["a:1", "b:2"]);
        assert_eq!(c.node_url("b:2"), "rediss://u:p@b:2#insecure");
        assert_each_url_refused(
            RedisConfig::from_url,
            &[
                "redis+cluster://",
                "redis+cluster://a",
                "redis+cluster://a:1/2",
                "redis+cluster://a:1?bogus=1",
                "redis+cluster://a:1,b",
            ],
        );
    }

    #[test]
    fn reads_sentinel_urls() {
        let c = RedisConfig::from_url(
            "rediss+sentinel://u:p@a,b:1/orders/3?sentinel_user=s&sentinel_password=x&prefix=q:#insecure",
        )
        .unwrap();
        assert_eq!(c.server, "rediss://u:p@orders/3#insecure");
        assert_eq!(c.prefix, "q:");
        let s = c.sentinel.unwrap();
        assert_eq!(s.sentinels, ["a:26379", "b:1"]);
        assert_eq!(
            (s.username.as_deref(), s.password.as_deref()),
            (Some("s"), Some("x"))
        );
        assert_eq!(RedisConfig::from_url("redis://h").unwrap().sentinel, None);
        assert_each_url_refused(
            RedisConfig::from_url,
            &[
                "redis+sentinel://h",
                "redis+sentinel://h/",
                "redis+sentinel://h/m/x",
                "redis+sentinel://h/bad%20name",
                "redis+sentinel://h/m?bogus=1",
                "redis+sentinel://h:x/m",
                "redis+sentinel://u:p/w@h/m",
            ],
        );
        // A password with a raw `/` is not quoted in the error.
        let message = RedisConfig::from_url("redis+sentinel://u:se/cret@h/m")
            .unwrap_err()
            .to_string();
        assert!(
            !message.contains("se/cret") && !message.contains("cret@"),
            "{message}"
        );
    }

    #[test]
    fn a_bad_port_is_named_in_the_message() {
        for url in [
            "redis://h:notaport",
            "redis://u:p@h:99999/2",
            "redis://[::1]:x",
        ] {
            let message = RedisConfig::from_url(url).unwrap_err().to_string();
            assert!(
                message.contains("port") && message.contains("not a number"),
                "{url}: {message}"
            );
        }
        for url in [
            "redis://[::1]:6379",
            "redis://[::1]",
            "redis://u:p%3A@h:6379",
        ] {
            assert!(RedisConfig::from_url(url).is_ok(), "{url}");
        }
    }
}
