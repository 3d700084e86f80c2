//! Options of the NATS backend and how they are read from a URL.

use std::fmt;
use std::path::PathBuf;
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
    /// User name, if the servers ask for one (the URL's `user:password@`).
    pub user: Option<String>,
    /// The user's password (never shown by `Debug`).
    #[serde(skip_serializing)]
    pub password: Option<String>,
    /// A token, if the servers ask for one (the URL's `token@`, with no `:`; never shown by
    /// `Debug`).
    #[serde(skip_serializing)]
    pub token: Option<String>,
    /// A credentials file (a user JWT and its NKey seed, as `nsc` writes it; URL `creds`).
    pub creds_file: Option<PathBuf>,
    /// Speak TLS to the servers (URL `tls=true`, implied by `ca`, `cert` and `key`); a
    /// server that asks for TLS gets it anyway. Default: off.
    pub tls: bool,
    /// A PEM file of the certificate authority that signed the servers' certificates (URL
    /// `ca`). Default: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// A PEM client certificate and its key, for servers that verify clients (URL `cert` and
    /// `key`, both or neither).
    pub client_cert: Option<(PathBuf, PathBuf)>,
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
            token: None,
            creds_file: None,
            tls: false,
            ca_file: None,
            client_cert: None,
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
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("creds_file", &self.creds_file)
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("timeout", &self.timeout)
            .field("replicas", &self.replicas)
            .finish()
    }
}

const OPTIONS: &str = "timeout, replicas, tls, ca, cert, key, creds";

/// The port of a server given without one.
const DEFAULT_PORT: u16 = 4222;

impl NatsConfig {
    /// Reads `nats://[user:password@|token@]host[:port][,host[:port]…][/BUCKET][?option=value&…]`.
    /// Options: `timeout` (a duration such as `500ms`), `replicas` (of a bucket dlock
    /// creates), `tls` (`true`/`false`), `ca` (a PEM file, implies TLS), `cert` and `key` (a
    /// PEM client certificate and its key, imply TLS), `creds` (a credentials file).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] for another scheme, no server, a bad port, a bucket name other
    /// than letters, digits, `-` and `_`, an unknown option or a bad value, `cert` without
    /// `key` or the reverse, `creds` beside a user or token. A file is only read when the
    /// client connects.
    ///
    /// # Examples
    ///
    /// ```
    /// let config = dlock::nats::NatsConfig::from_url("nats://h").unwrap();
    /// assert_eq!(config.servers, ["h:4222"]);
    /// assert_eq!(config.bucket, "dlock");
    ///
    /// let tls = dlock::nats::NatsConfig::from_url("nats://s3cr3t@h/locks?ca=/etc/nats/ca.pem").unwrap();
    /// assert!(tls.tls);
    /// assert_eq!(tls.token.as_deref(), Some("s3cr3t"));
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
        let (mut cert, mut key) = (None, None);
        // As NATS's own clients read it: `user:password@`, or `token@` alone.
        match parsed.credentials()? {
            Some((token, None)) => config.token = Some(token),
            Some((user, password)) => {
                config.user = Some(user);
                config.password = password;
            }
            None => {}
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
                "tls" => config.tls = option.flag()?,
                "ca" => config.ca_file = Some(PathBuf::from(option.text()?)),
                "cert" => cert = Some(PathBuf::from(option.text()?)),
                "key" => key = Some(PathBuf::from(option.text()?)),
                "creds" => config.creds_file = Some(PathBuf::from(option.text()?)),
                _ => return Err(option.unknown(OPTIONS)),
            }
        }
        config.client_cert = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => return Err(parsed.invalid("options cert and key go together")),
        };
        config.tls |= config.ca_file.is_some() || config.client_cert.is_some();
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
        let logins = [
            self.user.is_some(),
            self.token.is_some(),
            self.creds_file.is_some(),
        ];
        if logins.into_iter().filter(|given| *given).count() > 1 {
            return Err(Error::invalid_argument(
                "credentials",
                "one of a user and password, a token or a creds file",
            ));
        }
        if self.password.is_some() && self.user.is_none() {
            return Err(Error::invalid_argument("password", "given without a user"));
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
    fn reads_tls_token_and_creds_options_and_hides_the_secrets() {
        let c = NatsConfig::from_url("nats://t%40ken@h/b?ca=%2Fca.pem&cert=%2Fc.pem&key=%2Fc.key")
            .unwrap();
        assert_eq!(c.token.as_deref(), Some("t@ken"));
        assert_eq!(c.user, None);
        assert!(c.tls);
        assert_eq!(c.ca_file, Some(PathBuf::from("/ca.pem")));
        assert_eq!(
            c.client_cert,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/c.key")))
        );
        let shown = format!("{c:?}");
        assert!(!shown.contains("t@ken"), "{shown}");
        let c = NatsConfig::from_url("nats://h?tls=true&creds=%2Fapp.creds").unwrap();
        assert!(c.tls);
        assert_eq!(c.creds_file, Some(PathBuf::from("/app.creds")));
        assert!(!NatsConfig::from_url("nats://h?tls=false").unwrap().tls);
        let c = NatsConfig::from_url("nats://u:@h").unwrap();
        assert_eq!(
            (c.user.as_deref(), c.password.as_deref()),
            (Some("u"), Some(""))
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
                "nats://h:4222?tls=maybe",
                "nats://h:4222?cert=%2Fc.pem",
                "nats://h:4222?key=%2Fc.key",
                "nats://u:p@h:4222?creds=%2Fa.creds",
                "nats://tok@h:4222?creds=%2Fa.creds",
                "nats://h:4222?ca=%zz",
                "redis://h:4222",
                "no scheme",
            ],
        );
        for url in [
            "nats://u:secret@h:4222?bogus=1",
            "nats://secret@h:4222?creds=%2Fa.creds",
            "nats://u:secret@h:4222?cert=%2Fc.pem",
        ] {
            let err = NatsConfig::from_url(url).unwrap_err();
            assert!(!err.to_string().contains("secret"), "{err}");
            assert!(!format!("{err:?}").contains("secret"), "{err:?}");
        }
    }
}
