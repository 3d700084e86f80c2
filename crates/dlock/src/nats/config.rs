//! Options of the NATS backend and how they are read from a URL.

use std::fmt;
use std::time::Duration;

use crate::backend::url::StoreUrl;
use crate::error::{Error, Result};

/// Options of the NATS backend; every field but the servers has a default.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use dlock::nats::NatsConfig;
/// let config = NatsConfig::from_url("nats://app:secret@10.0.0.1:4222,10.0.0.2:4222/locks?timeout=500ms").unwrap();
/// assert_eq!(config.servers, ["10.0.0.1:4222", "10.0.0.2:4222"]);
/// assert_eq!(config.bucket, "locks");
/// assert_eq!(config.timeout, Duration::from_millis(500));
/// assert!(!format!("{config:?}").contains("secret"));
/// ```
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct NatsConfig {
    /// The servers, `host:port` each (default port 4222); the client moves to another when
    /// one fails.
    pub servers: Vec<String>,
    /// The JetStream key-value bucket of the locks and values (the URL's path), made on first
    /// use with per-key TTLs on. Default: `dlock`.
    pub bucket: String,
    /// User name, if the servers ask for one.
    pub user: Option<String>,
    /// The user's password (never shown by `Debug`).
    #[serde(skip_serializing)]
    pub password: Option<String>,
    /// How long one request may take before it fails as unavailable (URL `timeout`).
    /// Default: 2 s.
    pub timeout: Duration,
    /// The bucket's replicas when dlock creates it (URL `replicas`, 1 to 5). Default: 1.
    pub replicas: usize,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            servers: vec!["127.0.0.1:4222".into()],
            bucket: "dlock".into(),
            user: None,
            password: None,
            timeout: Duration::from_secs(2),
            replicas: 1,
        }
    }
}

impl fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsConfig")
            .field("servers", &self.servers)
            .field("bucket", &self.bucket)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("timeout", &self.timeout)
            .field("replicas", &self.replicas)
            .finish()
    }
}

const OPTIONS: &str = "timeout, replicas";

/// The port of a server given without one.
const DEFAULT_PORT: u16 = 4222;

impl NatsConfig {
    /// Reads `nats://[user:password@]host[:port][,host[:port]…][/BUCKET][?option=value&…]`.
    /// Options: `timeout` (a duration such as `500ms`), `replicas` (of a bucket dlock
    /// creates).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for another scheme, no server, a bad port, a bucket name other
    /// than letters, digits, `-` and `_`, an unknown option or a bad value.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = dlock::nats::NatsConfig::from_url("nats://h").unwrap();
    /// assert_eq!(config.servers, ["h:4222"]);
    /// assert_eq!(config.bucket, "dlock");
    /// ```
    pub fn from_url(url: &str) -> Result<NatsConfig> {
        let parsed = StoreUrl::parse(
            url,
            super::NATS_SCHEMES,
            "nats://host:port[,host:port…]/BUCKET",
        )?;
        if parsed.fragment.is_some() {
            return Err(parsed.invalid("NATS URLs have no fragment"));
        }
        let mut config = NatsConfig::default();
        if let Some((user, password)) = parsed.credentials()? {
            config.user = Some(user);
            config.password = password;
        }
        config.servers = parsed
            .endpoints(false)?
            .iter()
            .map(|e| e.with_port(DEFAULT_PORT))
            .collect();
        let bucket = parsed.path().trim_start_matches('/');
        if !bucket.is_empty() {
            config.bucket = parsed.decode("bucket", bucket)?;
        }
        for option in parsed.options() {
            match option.key {
                "timeout" => config.timeout = option.duration("500ms or 2s")?,
                "replicas" => config.replicas = option.number()?,
                _ => return Err(option.unknown(OPTIONS)),
            }
        }
        parsed.validated(config, NatsConfig::validate)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.servers.is_empty() {
            return Err(Error::invalid_argument("servers", "none given"));
        }
        for server in &self.servers {
            // A config built in code is checked by the same rules as one read from a URL.
            StoreUrl::parse(
                &format!("nats://{server}"),
                super::NATS_SCHEMES,
                "host:port",
            )
            .and_then(|url| url.endpoints(true))
            .ok()
            .filter(|parsed| parsed.len() == 1)
            .ok_or_else(|| {
                Error::invalid_argument("servers", format!("{server:?} is not host:port"))
            })?;
        }
        let bucket_ok = !self.bucket.is_empty()
            && self.bucket.len() <= 64
            && self
                .bucket
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !bucket_ok {
            return Err(Error::invalid_argument(
                "bucket",
                "1 to 64 letters, digits, `-` or `_`",
            ));
        }
        if self.timeout.is_zero() || self.timeout > Duration::from_secs(3600) {
            return Err(Error::invalid_argument(
                "timeout",
                "must be between 1ms and 1h",
            ));
        }
        if !(1..=5).contains(&self.replicas) {
            return Err(Error::invalid_argument("replicas", "must be from 1 to 5"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::url::assert_each_url_refused;

    #[test]
    fn parses_servers_bucket_credentials_and_options() {
        let c =
            NatsConfig::from_url("nats://u:p%40ss@a:1,b,[::1]:3/my_locks?timeout=50ms&replicas=3")
                .unwrap();
        assert_eq!(c.servers, ["a:1", "b:4222", "[::1]:3"]);
        assert_eq!(c.bucket, "my_locks");
        assert_eq!(c.user.as_deref(), Some("u"));
        assert_eq!(c.password.as_deref(), Some("p@ss"));
        assert_eq!(c.timeout, Duration::from_millis(50));
        assert_eq!(c.replicas, 3);
        assert_eq!(
            NatsConfig::from_url("NATS://h:4222/").unwrap().bucket,
            "dlock"
        );
    }

    #[test]
    fn rejects_bad_urls() {
        assert_each_url_refused(
            NatsConfig::from_url,
            &[
                "nats://",
                "nats://:4222",
                "nats://h:notaport",
                "nats://h:0",
                "nats://h:4222,",
                "nats://h:4222/a/b",
                "nats://h:4222/a.b",
                "nats://h:4222/a#b",
                "nats://@h:4222",
                "nats://h:4222?bogus=1",
                "nats://h:4222?timeout=soon",
                "nats://h:4222?timeout=0ms",
                "nats://h:4222?replicas=0",
                "nats://h:4222?replicas=6",
                "redis://h:4222",
                "no scheme",
            ],
        );
        let err = NatsConfig::from_url("nats://u:secret@h:4222?bogus=1").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }
}
