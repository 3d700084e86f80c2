//! [`NatsBuilder`]: connects to the servers and opens (or makes) the bucket.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use async_nats::{ConnectOptions, ServerAddr};

use crate::error::{Error, Result};

use super::error::{BACKEND, map};
use super::{Inner, NatsBackend, NatsConfig};

/// How long the marker of an expired or released key stays in the bucket (the bucket's
/// `limit_markers`): long enough for a watch to deliver it, short enough that a name that is
/// no longer used leaves nothing behind. The server's smallest is one second.
pub(super) const MARKER_TTL: Duration = Duration::from_secs(1);

/// Builds a [`NatsBackend`] from options.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// use dlock::nats::NatsBuilder;
/// let backend = NatsBuilder::new("nats://10.0.0.1:4222,10.0.0.2:4222/locks")?
///     .timeout(Duration::from_millis(500))
///     .build()
///     .await?;
/// let locks = dlock::Locks::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct NatsBuilder {
    config: NatsConfig,
}

impl NatsBuilder {
    /// A builder for the servers and bucket of a `nats://` URL (see [`NatsConfig::from_url`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] as for [`NatsConfig::from_url`].
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::nats::NatsBuilder::new("nats://127.0.0.1:4222/locks").unwrap();
    /// assert!(dlock::nats::NatsBuilder::new("nats://h:4222/no.dots").is_err());
    /// ```
    pub fn new(url: &str) -> Result<NatsBuilder> {
        Ok(NatsBuilder {
            config: NatsConfig::from_url(url)?,
        })
    }

    /// A builder from a full config.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::nats::NatsBuilder::from_config(dlock::nats::NatsConfig::default());
    /// ```
    pub fn from_config(config: NatsConfig) -> NatsBuilder {
        NatsBuilder { config }
    }

    /// See [`NatsConfig::bucket`].
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::nats::NatsBuilder::default().bucket("billing_locks");
    /// ```
    pub fn bucket(mut self, bucket: impl Into<String>) -> Self {
        self.config.bucket = bucket.into();
        self
    }

    /// See [`NatsConfig::timeout`].
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::nats::NatsBuilder::default().timeout(std::time::Duration::from_secs(1));
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// Logs in with a user and password (see [`NatsConfig::user`]); never shown by `Debug`.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::nats::NatsBuilder::default().user_and_password("app", "secret");
    /// assert!(!format!("{builder:?}").contains("secret"));
    /// ```
    pub fn user_and_password(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.config.user = Some(user.into());
        self.config.password = Some(password.into());
        self
    }

    /// Logs in with a token (see [`NatsConfig::token`]); never shown by `Debug`.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::nats::NatsBuilder::default().token("s3cr3t");
    /// assert!(!format!("{builder:?}").contains("s3cr3t"));
    /// ```
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.config.token = Some(token.into());
        self
    }

    /// Logs in with a credentials file (see [`NatsConfig::creds_file`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::nats::NatsBuilder::default().creds_file("/etc/nats/app.creds");
    /// ```
    pub fn creds_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.creds_file = Some(path.into());
        self
    }

    /// Speaks TLS to the servers, trusting the CA in this PEM file (see
    /// [`NatsConfig::ca_file`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::nats::NatsBuilder::default().ca_file("/etc/nats/ca.pem");
    /// ```
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.ca_file = Some(path.into());
        self.config.tls = true;
        self
    }

    /// Speaks TLS to the servers and shows them this PEM client certificate and key (see
    /// [`NatsConfig::client_cert`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::nats::NatsBuilder::default()
    ///     .client_cert("/etc/nats/app.pem", "/etc/nats/app.key");
    /// ```
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.config.client_cert = Some((cert.into(), key.into()));
        self.config.tls = true;
        self
    }

    /// Connects, and opens the bucket, making it (with per-key TTLs on) when it does not
    /// exist.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`]: a bad option, a TLS or credentials file that cannot be
    ///   read, or a bucket without per-key TTLs (made by another program, or a server older
    ///   than 2.11);
    /// - [`Error::Unauthenticated`]: wrong user or password;
    /// - [`Error::Unavailable`]: no server can be reached, or JetStream does not answer.
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
    /// let backend = dlock::nats::NatsBuilder::new("nats://127.0.0.1:4222")?.build().await?;
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<NatsBackend> {
        let config = self.config;
        config.validate()?;
        let client = connect_client(&config).await?;
        let mut js = jetstream::new(client);
        js.set_timeout(config.timeout);
        let kv = open_bucket(&js, &config).await?;
        Ok(NatsBackend {
            inner: Arc::new(Inner {
                js,
                leader_reads: super::read::leader_reads(&kv),
                kv,
                config,
                bell: Default::default(),
                markers: Default::default(),
            }),
        })
    }
}

/// A client of `config`'s servers, on the current runtime.
pub(super) async fn connect_client(config: &NatsConfig) -> Result<async_nats::Client> {
    let mut addrs = Vec::with_capacity(config.servers.len());
    for server in &config.servers {
        let addr: ServerAddr = format!("nats://{server}").parse().map_err(|_| {
            Error::invalid_argument("servers", format!("{server:?} is not host:port"))
        })?;
        addrs.push(addr);
    }
    let options = ConnectOptions::new()
        .connection_timeout(config.timeout)
        .request_timeout(Some(config.timeout));
    let options = with_tls(with_login(options, config).await?, config)?;
    options.connect(addrs).await.map_err(map)
}

/// `options` with `config`'s user and password, token or credentials file.
async fn with_login(options: ConnectOptions, config: &NatsConfig) -> Result<ConnectOptions> {
    if let Some(user) = &config.user {
        return Ok(
            options.user_and_password(user.clone(), config.password.clone().unwrap_or_default())
        );
    }
    if let Some(token) = &config.token {
        return Ok(options.token(token.clone()));
    }
    match &config.creds_file {
        Some(path) => {
            readable("creds", path)?;
            // The error names the file, never its contents (a seed).
            options.credentials_file(path).await.map_err(|_| {
                Error::invalid_argument(
                    "creds",
                    format!("{} is not a NATS credentials file", path.display()),
                )
            })
        }
        None => Ok(options),
    }
}

/// `options` with `config`'s TLS settings; every file must be readable now (async-nats would
/// read them only once connected).
fn with_tls(mut options: ConnectOptions, config: &NatsConfig) -> Result<ConnectOptions> {
    if !config.tls {
        return Ok(options);
    }
    options = options.require_tls(true);
    if let Some(ca) = &config.ca_file {
        readable("ca", ca)?;
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &config.client_cert {
        readable("cert", cert)?;
        readable("key", key)?;
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options)
}

/// A typed error naming the option and the file when `path` cannot be read.
fn readable(option: &'static str, path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .map(drop)
        .map_err(|e| Error::invalid_argument(option, format!("{}: {e}", path.display())))
}

/// Whether the server said the bucket's stream does not exist.
fn stream_missing(kind: &jetstream::context::GetStreamErrorKind) -> bool {
    matches!(kind, jetstream::context::GetStreamErrorKind::JetStream(error)
        if error.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

/// The bucket, made when missing; one that lacks per-key TTLs is refused (every grant
/// would be).
async fn open_bucket(js: &jetstream::Context, config: &NatsConfig) -> Result<kv::Store> {
    let stream = match js.get_stream(format!("KV_{}", config.bucket)).await {
        Ok(stream) => stream,
        Err(error) if stream_missing(&error.kind()) => {
            let made = js
                .create_key_value(kv::Config {
                    bucket: config.bucket.clone(),
                    history: 1,
                    num_replicas: config.replicas,
                    limit_markers: Some(MARKER_TTL),
                    ..Default::default()
                })
                .await;
            match made {
                Ok(store) => return Ok(store),
                // Another client made it first.
                Err(error) if error.to_string().contains("already in use") => js
                    .get_stream(format!("KV_{}", config.bucket))
                    .await
                    .map_err(map)?,
                Err(error) => return Err(map(error)),
            }
        }
        Err(error) => return Err(map(error)),
    };
    if !stream.cached_info().config.allow_message_ttl {
        return Err(Error::invalid_argument(
            "bucket",
            format!(
                "{:?} has no per-key TTLs ({BACKEND} needs a bucket made with limit markers, on nats-server 2.11 or later)",
                config.bucket
            ),
        ));
    }
    js.get_key_value(config.bucket.clone()).await.map_err(map)
}
