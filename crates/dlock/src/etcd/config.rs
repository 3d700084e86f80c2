//! Options of the etcd backend and how they are read from a URL.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};

/// How long a waiter's place in a lock's queue lasts without a keep-alive, in seconds: the
/// longest a crashed waiter can hold up the queue (plus etcd's expiry check, ½ s). Two seconds
/// is also the smallest lease etcd grants with its default election timeout (1 s).
pub const WAITER_LEASE_SECS: i64 = 2;

/// Options of the etcd backend; every field but the endpoints has a default.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use dlock::etcd::EtcdConfig;
/// let config = EtcdConfig::from_url("etcd://app:secret@10.0.0.1:2379,10.0.0.2:2379?prefix=billing/&timeout=500ms").unwrap();
/// assert_eq!(config.endpoints, ["10.0.0.1:2379", "10.0.0.2:2379"]);
/// assert_eq!(config.prefix, "billing/");
/// assert_eq!(config.timeout, Duration::from_millis(500));
/// assert!(!format!("{config:?}").contains("secret"));
/// ```
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// The cluster's client endpoints, `host:port` each; the client balances over them and
    /// moves to another when one fails.
    pub endpoints: Vec<String>,
    /// User name for etcd's authentication, if it is enabled.
    pub user: Option<String>,
    /// The user's password (never shown by `Debug`).
    #[serde(skip_serializing)]
    pub password: Option<String>,
    /// Namespace of every key dlock writes (URL `prefix`). Default: `dlock/`.
    pub prefix: String,
    /// Speak TLS to the endpoints (URL `tls=true`, implied by `ca`). Default: off.
    pub tls: bool,
    /// A PEM file of the certificate authority that signed the servers' certificates (URL
    /// `ca`). Default: the Mozilla roots.
    pub ca_file: Option<PathBuf>,
    /// How long one request may take before it fails as unavailable (URL `timeout`), so a
    /// stalled member cannot stall a lock call. Default: 2 s (an election takes about 1 s).
    pub timeout: Duration,
    /// How long connecting to one endpoint may take (URL `connect_timeout`). Default: 1 s.
    pub connect_timeout: Duration,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        EtcdConfig {
            endpoints: vec!["127.0.0.1:2379".into()],
            user: None,
            password: None,
            prefix: "dlock/".into(),
            tls: false,
            ca_file: None,
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
        }
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("prefix", &self.prefix)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .finish()
    }
}

const OPTIONS: &str = "prefix, tls, ca, timeout, connect_timeout";

impl EtcdConfig {
    /// Reads `etcd://[user:password@]host:port[,host:port…][/][?option=value&…]`.
    /// Options: `prefix` (key namespace), `tls` (`true`/`false`), `ca` (PEM file, implies
    /// TLS), `timeout`, `connect_timeout` (durations such as `500ms`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for another scheme, no endpoint, an endpoint without a valid
    /// port, a path, an unknown option or a bad value.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = dlock::etcd::EtcdConfig::from_url("etcd://h:2379?ca=/etc/ssl/ca.pem").unwrap();
    /// assert!(config.tls);
    /// ```
    pub fn from_url(url: &str) -> Result<EtcdConfig> {
        let parsed = StoreUrl::parse(url, &["etcd"], "etcd://host:port[,host:port…]")?;
        if parsed.fragment.is_some() || !matches!(parsed.path(), "" | "/") {
            return Err(
                parsed.invalid("etcd URLs have no path or fragment; use ?prefix= for a namespace")
            );
        }
        let mut config = EtcdConfig::default();
        if let Some((user, password)) = parsed.credentials()? {
            config.user = Some(user);
            config.password = password;
        }
        config.endpoints = parsed
            .endpoints(true)?
            .iter()
            .map(ToString::to_string)
            .collect();
        for option in parsed.options() {
            match option.key {
                "prefix" => config.prefix = option.text()?,
                "tls" => config.tls = option.flag()?,
                "ca" => {
                    config.ca_file = Some(PathBuf::from(option.text()?));
                    config.tls = true;
                }
                "timeout" => config.timeout = option.duration("500ms or 2s")?,
                "connect_timeout" => config.connect_timeout = option.duration("500ms or 2s")?,
                _ => return Err(option.unknown(OPTIONS)),
            }
        }
        parsed.validated(config, EtcdConfig::validate)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::invalid_argument("endpoints", "none given"));
        }
        for endpoint in &self.endpoints {
            // A config built in code is checked by the same rules as one read from a URL.
            StoreUrl::parse(&format!("etcd://{endpoint}"), &["etcd"], "host:port")
                .and_then(|url| url.endpoints(true))
                .ok()
                .filter(|parsed| parsed.len() == 1)
                .ok_or_else(|| {
                    Error::invalid_argument("endpoints", format!("{endpoint:?} is not host:port"))
                })?;
        }
        for (what, timeout) in [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if timeout.is_zero() || timeout > Duration::from_secs(3600) {
                return Err(Error::invalid_argument(what, "must be between 1ms and 1h"));
            }
        }
        if self.prefix.len() > 256 {
            return Err(Error::invalid_argument("prefix", "longer than 256 bytes"));
        }
        if self.prefix.contains('\0') {
            return Err(Error::invalid_argument("prefix", "contains a NUL byte"));
        }
        Ok(())
    }

    /// The endpoints as URIs for the client (`http://` or `https://`).
    pub(crate) fn endpoint_uris(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::url::assert_each_url_refused;

    #[test]
    fn parses_endpoints_credentials_and_options() {
        let c = EtcdConfig::from_url(
            "etcd://u:p%40ss@a:1,b:2,[::1]:3/?prefix=x%2Fy/&timeout=50ms&connect_timeout=2s",
        )
        .unwrap();
        assert_eq!(c.endpoints, ["a:1", "b:2", "[::1]:3"]);
        assert_eq!(c.user.as_deref(), Some("u"));
        assert_eq!(c.password.as_deref(), Some("p@ss"));
        assert_eq!(c.prefix, "x/y/");
        assert_eq!(c.timeout, Duration::from_millis(50));
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        assert!(!c.tls);
        assert_eq!(c.endpoint_uris()[0], "http://a:1");
        let tls = EtcdConfig::from_url("ETCD://h:2379?ca=%2Ftmp%2Fca.pem").unwrap();
        assert!(tls.tls);
        assert_eq!(tls.ca_file, Some(PathBuf::from("/tmp/ca.pem")));
        assert_eq!(tls.endpoint_uris(), ["https://h:2379"]);
    }

    #[test]
    fn rejects_bad_urls() {
        assert_each_url_refused(
            EtcdConfig::from_url,
            &[
                "etcd://",
                "etcd://h",
                "etcd://:2379",
                "etcd://h:notaport",
                "etcd://h:0",
                "etcd://h:2379,",
                "etcd://h:2379/path",
                "etcd://@h:2379",
                "etcd://h:2379?bogus=1",
                "etcd://h:2379?timeout=soon",
                "etcd://h:2379?timeout=0ms",
                "etcd://h:2379?tls=maybe",
                "etcd://h:2379?prefix=%zz",
                "redis://h:2379",
                "no scheme",
            ],
        );
        let err = EtcdConfig::from_url("etcd://u:secret@h:2379?bogus=1").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }
}
