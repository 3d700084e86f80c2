#![doc = include_str!("docs.md")]

mod acquire;
mod config;
pub(crate) mod driver;
mod error;
mod lease;
mod monitor;
mod queue_rules;
mod session;
mod spare;
mod values;

pub use config::{EtcdConfig, WAITER_LEASE_SECS};

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, KeyValue, SortOrder, SortTarget, TlsOptions,
    Txn, TxnResponse,
};

use crate::backend::abandon::Abandon;
use crate::backend::wait::retry_until;
use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, MonitorStore, ValueStore,
};
use crate::error::{Error, Result};

use acquire::Pending;
use acquire::retry_backoff;
use error::{BACKEND, bad_reply, lease_gone, map};

/// URL schemes served by this backend.
pub const ETCD_SCHEMES: &[&str] = &["etcd"];

const INFO: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
        reentrant: false,
        // Every waiter queues by create revision: FIFO whether asked for or not.
        fair: true,
        permits: true,
        rwlock: true,
        fenced_writes: true,
        ..Capabilities::SHARED_STORE
    },
);

/// First and largest pause after a failed step (store unreachable, election running).
const RETRY_MIN: Duration = Duration::from_millis(20);
const RETRY_MAX: Duration = Duration::from_millis(500);

/// Version tag of the values dlock writes, so a foreign value is recognised.
const VALUE_TAG: &str = "dlock1";

/// Builds an [`EtcdBackend`] from options.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// use dlock::etcd::EtcdBuilder;
/// let backend = EtcdBuilder::new("etcd://app:secret@10.0.0.1:2379,10.0.0.2:2379")?
///     .prefix("billing/")
///     .timeout(Duration::from_millis(500))
///     .build()
///     .await?;
/// let locks = dlock::Locks::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct EtcdBuilder {
    config: EtcdConfig,
}

impl EtcdBuilder {
    /// A builder for the cluster of an `etcd://` URL (options in the URL are read too; see
    /// [`EtcdConfig::from_url`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUrl`] as for [`EtcdConfig::from_url`].
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::etcd::EtcdBuilder::new("etcd://127.0.0.1:2379").unwrap();
    /// assert!(dlock::etcd::EtcdBuilder::new("etcd://nohost").is_err());
    /// ```
    pub fn new(url: &str) -> Result<EtcdBuilder> {
        Ok(EtcdBuilder {
            config: EtcdConfig::from_url(url)?,
        })
    }

    /// A builder from a full config.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::etcd::EtcdBuilder::from_config(dlock::etcd::EtcdConfig::default());
    /// ```
    pub fn from_config(config: EtcdConfig) -> EtcdBuilder {
        EtcdBuilder { config }
    }

    /// See [`EtcdConfig::prefix`].
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::etcd::EtcdBuilder::default().prefix("app/");
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.prefix = prefix.into();
        self
    }

    /// User and password for etcd's authentication.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::etcd::EtcdBuilder::default().user("app", "secret");
    /// ```
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.config.user = Some(user.into());
        self.config.password = Some(password.into());
        self
    }

    /// See [`EtcdConfig::ca_file`]; turns TLS on.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::etcd::EtcdBuilder::default().ca_file("/etc/etcd/ca.pem");
    /// ```
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.config.ca_file = Some(path.into());
        self.config.tls = true;
        self
    }

    /// See [`EtcdConfig::timeout`].
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = dlock::etcd::EtcdBuilder::default().timeout(std::time::Duration::from_secs(1));
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.config.timeout = timeout;
        self
    }

    /// Connects and checks that the cluster answers (and that the credentials and the
    /// permissions on the prefix are good).
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`]: a bad option, or a CA file that cannot be read;
    /// - [`Error::Unauthenticated`]: wrong user or password;
    /// - [`Error::PermissionDenied`]: the user may not read the prefix;
    /// - [`Error::Unavailable`]: no endpoint can be reached.
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
    /// let backend = dlock::etcd::EtcdBuilder::new("etcd://127.0.0.1:2379")?.build().await?;
    /// # Ok(()) }
    /// ```
    pub async fn build(self) -> Result<EtcdBackend> {
        let config = self.config;
        config.validate()?;
        let client = connect_client(&config).await?;
        let backend = EtcdBackend {
            inner: Arc::new(Inner {
                client,
                config,
                sessions: session::Sessions::default(),
                spares: spare::SpareLeases::default(),
            }),
        };
        // The connection is lazy: fail here (unreachable, no right to read) rather than on the
        // first lock. A request can land on a member that is down before the balancer has
        // noticed, so an unreachable answer is tried once more per endpoint.
        let mut tries = backend.inner.config.endpoints.len() + 1;
        loop {
            let prefix = backend.inner.config.prefix.as_bytes();
            let checked = backend
                .inner
                .resend(|mut c| async move {
                    c.get(
                        prefix,
                        Some(GetOptions::new().with_prefix().with_count_only()),
                    )
                    .await
                })
                .await
                .map_err(map);
            match checked {
                Ok(_) => return Ok(backend),
                Err(error) if error.is_retryable() && tries > 1 => {
                    tries -= 1;
                    tokio::time::sleep(RETRY_MIN).await;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// Locks in an etcd cluster: watchdog holds on one session lease per client, a lease of its own
/// for a fixed-TTL hold, a key per waiter ordered by create revision,
/// each waiter watching only the key just before its own, fences from create revisions.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("etcd://127.0.0.1:2379?prefix=app/").await?;
/// let guard = locks.mutex("nightly-report").acquire().await?;
/// println!("fence {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

/// A client of `config`'s cluster, on the current runtime.
async fn connect_client(config: &EtcdConfig) -> Result<Client> {
    let mut options = ConnectOptions::new()
        .with_timeout(config.timeout)
        .with_connect_timeout(config.connect_timeout)
        // A partitioned member answers "no leader" at once instead of serving stale reads or
        // hanging, so the client moves on to another member.
        .with_require_leader(true)
        .with_keep_alive(Duration::from_secs(10), config.timeout);
    if let Some(user) = &config.user {
        options = options.with_user(user, config.password.clone().unwrap_or_default());
    }
    if config.tls {
        let mut tls = TlsOptions::new();
        tls = match &config.ca_file {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| {
                    Error::invalid_argument("ca", format!("{}: {e}", path.display()))
                })?;
                tls.ca_certificate(Certificate::from_pem(pem))
            }
            None => tls.with_webpki_roots(),
        };
        options = options.with_tls(tls);
    }
    Client::connect(config.endpoint_uris(), Some(options))
        .await
        .map_err(map)
}

struct Inner {
    client: Client,
    config: EtcdConfig,
    /// The session leases the client's watchdog holds ride on.
    sessions: session::Sessions,
    /// Leases of released fixed-TTL holds, for the next ones.
    spares: spare::SpareLeases,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connects to the cluster of an `etcd://` URL; see [`EtcdConfig::from_url`].
    ///
    /// # Errors
    ///
    /// As [`EtcdConfig::from_url`] and [`EtcdBuilder::build`].
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
    /// let backend = dlock::etcd::EtcdBackend::connect_url("etcd://127.0.0.1:2379").await?;
    /// let locks = dlock::Locks::new(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect_url(url: &str) -> Result<EtcdBackend> {
        EtcdBuilder::new(url)?.build().await
    }

    /// The options this client runs with.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::etcd::EtcdBackend::connect_url("etcd://127.0.0.1:2379").await?;
    /// assert_eq!(backend.config().prefix, "dlock/");
    /// # Ok(()) }
    /// ```
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }
}

/// The etcd lease length for a TTL: whole seconds, rounded up (etcd counts in seconds).
fn lease_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

/// This machine's clock in ms since the Unix epoch: when a hold began, for inspection.
fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn revision(header: Option<&etcd_client::ResponseHeader>, what: &str) -> Result<i64> {
    header.map(|h| h.revision()).ok_or_else(|| bad_reply(what))
}

impl Inner {
    /// Runs `op`, again when its request never reached a member (connection refused): the
    /// balancer may still pick a member that is down, and a request that was never sent is
    /// safe to send again, whatever it does.
    async fn resend<T, F, Fut>(&self, mut op: F) -> std::result::Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let mut tries = 2 * self.config.endpoints.len();
        loop {
            match op(self.client.clone()).await {
                Err(error) if tries > 0 && error::never_sent(&error) => {
                    tries -= 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                other => return other,
            }
        }
    }

    /// `prefix + name + NUL`: every key of one lock starts with it. Names cannot contain NUL,
    /// so the keys of `a` and `a/b` never share this prefix.
    fn lock_prefix(&self, name: &str) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.config.prefix.len() + name.len() + 1);
        key.extend_from_slice(self.config.prefix.as_bytes());
        key.extend_from_slice(name.as_bytes());
        key.push(0);
        key
    }

    /// A lease of `secs` for a new hold: a spare one restarted by a keep-alive (no Raft
    /// write), or a new grant.
    async fn grant_or_reuse(&self, secs: i64) -> Result<(i64, i64)> {
        while let Some(id) = self.spares.take(secs, self.config.timeout) {
            match self.keep_alive(id).await {
                Ok(()) => return Ok((id, secs)),
                // Gone after all (or unreachable, and then the grant says so): another.
                Err(error) => {
                    tracing::debug!(%error, lease = id, "a spare lease could not be kept alive")
                }
            }
        }
        self.grant(secs).await
    }

    async fn grant(&self, secs: i64) -> Result<(i64, i64)> {
        let granted = self
            .resend(|mut c| async move { c.lease_grant(secs, None).await })
            .await
            .map_err(map)?;
        Ok((granted.id(), granted.ttl()))
    }

    /// One keep-alive round trip: the lease's TTL starts again from its granted length.
    async fn keep_alive(&self, id: i64) -> std::result::Result<(), etcd_client::Error> {
        self.resend(|mut c| async move { c.lease_keep_alive(id).await.map(drop) })
            .await
    }

    /// Revokes leases in the background (deleting their keys): clean-up that nobody waits for.
    /// Without a runtime they simply expire.
    fn revoke_later(self: &Arc<Self>, ids: Vec<i64>) {
        if ids.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = self.clone();
        runtime.spawn(async move {
            for id in ids {
                match inner
                    .resend(|mut c| async move { c.lease_revoke(id).await })
                    .await
                {
                    Ok(_) => {}
                    Err(error) if lease_gone(&error) => {}
                    Err(error) => {
                        tracing::debug!(%error, lease = id, "revoking a lease failed; it expires instead");
                    }
                }
            }
        });
    }

    /// Deletes keys in the background: clean-up that nobody waits for (keys of an abandoned
    /// call on the session lease). Without a runtime they stay until the session ends.
    fn delete_later(self: &Arc<Self>, keys: Vec<Vec<u8>>) {
        if keys.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let inner = self.clone();
        runtime.spawn(async move {
            for key in keys {
                let key = &key;
                if let Err(error) = inner
                    .resend(|mut c| async move { c.delete(key.as_slice(), None).await })
                    .await
                {
                    tracing::debug!(%error, "deleting a queued key failed; its session's end deletes it");
                }
            }
        });
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.raw_txn(txn).await.map_err(map)
    }

    /// A transaction whose "lease not found" the caller interprets.
    async fn raw_txn(&self, txn: Txn) -> std::result::Result<TxnResponse, etcd_client::Error> {
        self.resend(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
    }

    /// The holder of a lock: its key with the lowest create revision.
    async fn holder(&self, prefix: &[u8]) -> Result<Option<KeyValue>> {
        Ok(self.queue_head(prefix).await?.map(|(holder, _)| holder))
    }

    /// The holder of a lock and how many keys queue behind it (etcd counts every key of the
    /// range in the same read).
    async fn queue_head(&self, prefix: &[u8]) -> Result<Option<(KeyValue, u32)>> {
        let mut reply = self
            .resend(|mut c| async move { c.get(prefix, Some(first_by_create())).await })
            .await
            .map_err(map)?;
        let behind = u32::try_from(reply.count().saturating_sub(1)).unwrap_or(u32::MAX);
        Ok(reply.take_kvs().into_iter().next().map(|kv| (kv, behind)))
    }
}

fn first_by_create() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// The value of a waiter's or holder's key: who it is, for inspection.
fn encode_value(req: &AcquireRequest) -> Vec<u8> {
    format!(
        "{VALUE_TAG}\0{}\0{}\0{}\0{}\0{}",
        req.token,
        unix_ms(),
        req.owner.host,
        req.owner.pid,
        req.owner.label.as_deref().unwrap_or_default()
    )
    .into_bytes()
}

#[async_trait]
impl Backend for EtcdBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        crate::ttl::check_store_ttl(req.ttl)?;
        if req.reentrant {
            return Err(Error::Unsupported {
                operation: "reentrant locks",
                backend: BACKEND,
            });
        }
        let pending = Abandon::new(
            Pending {
                inner: self.inner.clone(),
                leases: Mutex::new(Vec::new()),
                keys: Mutex::new(Vec::new()),
            },
            |pending| pending.revoke_all(),
        );
        // A waiter rides out an election or a lost place by starting over (at the back of
        // the queue), until its deadline.
        let acquired = retry_until(req.wait, retry_backoff(), || async {
            let tried = self.attempt(req, &pending).await;
            match &tried {
                // What this round queued goes before the next round queues again.
                Err(error) if error.is_retryable() => pending.revoke_all(),
                Err(Error::SizeMismatch { .. }) => pending.revoke_now().await,
                _ => {}
            }
            tried
        })
        .await?;
        Ok(acquired.map(|lease| Arc::new(lease) as Arc<dyn Lease>))
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        Some(self)
    }
}
