#![doc = include_str!("docs.md")]

mod config;
mod error;
mod queue_rules;
mod values;

pub use config::{EtcdConfig, WAITER_LEASE_SECS};

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue,
    PutOptions, SortOrder, SortTarget, TlsOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
    WatchFilterType, WatchOptions,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, ListPage, LockInfo, MonitorStore,
    ValueStore, Wait,
};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::name::{LockName, Owner};

use error::{BACKEND, bad_reply, lease_gone, map};
use queue_rules::{Shape, Wanted};

/// URL schemes served by this backend.
pub const ETCD_SCHEMES: &[&str] = &["etcd"];

const INFO: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
        reentrant: false,
        // Every waiter queues by create revision: FIFO whether asked for or not.
        fair: true,
        native_wait: true,
        native_loss_signal: false,
        cross_process: true,
        monitor: true,
        values: true,
        permits: true,
        rwlock: true,
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
        let client = Client::connect(config.endpoint_uris(), Some(options))
            .await
            .map_err(map)?;
        let backend = EtcdBackend {
            inner: Arc::new(Inner { client, config }),
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

/// Locks in an etcd cluster: one lease per hold, a key per waiter ordered by create revision,
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

struct Inner {
    client: Client,
    config: EtcdConfig,
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
        let mut reply = self
            .resend(|mut c| async move { c.get(prefix, Some(first_by_create())).await })
            .await
            .map_err(map)?;
        Ok(reply.take_kvs().into_iter().next())
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

/// Leases an acquire call has granted and not handed over yet; revoked (which deletes their
/// keys) if the call ends without the lock, including when its future is dropped.
struct Pending {
    inner: Arc<Inner>,
    leases: Mutex<Vec<i64>>,
}

impl Pending {
    fn leases(&self) -> std::sync::MutexGuard<'_, Vec<i64>> {
        self.leases.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn track(&self, id: i64) {
        self.leases().push(id);
    }

    /// The lease is handed to a hold: no longer ours to clean up.
    fn keep(&self, id: i64) {
        self.leases().retain(|l| *l != id);
    }

    fn revoke(&self, id: i64) {
        self.keep(id);
        self.inner.revoke_later(vec![id]);
    }

    fn revoke_all(&self) {
        let ids = std::mem::take(&mut *self.leases());
        self.inner.revoke_later(ids);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.revoke_all();
    }
}

/// The waiter's place in the queue was lost (its lease ran out while it waited, for example
/// because the process was paused): retryable, the waiter queues again.
fn place_lost() -> Error {
    Error::Unavailable {
        backend: BACKEND,
        source: "the lease of this waiter's place in the queue ran out; queueing again".into(),
    }
}

fn pause_after(failures: u32) -> Duration {
    RETRY_MIN
        .saturating_mul(1 << failures.min(6))
        .min(RETRY_MAX)
}

/// Sleeps until `deadline`, or forever without one.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// How the wait for the predecessor ended.
enum Turn {
    /// No key with a lower create revision is left: the lock is ours.
    First,
    /// The wait ran out.
    TimedOut,
}

impl EtcdBackend {
    /// One pass: queue, wait for our turn, confirm. A retryable error means "start over".
    async fn attempt(&self, req: &AcquireRequest, pending: &Pending) -> Result<Option<EtcdLease>> {
        let inner = &self.inner;
        let shape = Shape::of(req.kind);
        let prefix = shape.base(&inner.config.prefix, req.name.as_str());
        let secs = lease_secs(req.ttl);
        let start = Instant::now();
        let (hold, granted) = inner.grant(secs).await?;
        pending.track(hold);
        let key = shape.key(&prefix, hold);
        let put = || PutOptions::new().with_lease(hold);

        if req.wait == Wait::No && matches!(shape, Shape::Exclusive) {
            // Create the key only if the lock has no key at all: a busy try leaves nothing.
            let reply = inner
                .raw_txn(
                    Txn::new()
                        .when([
                            Compare::create_revision(prefix.clone(), CompareOp::Equal, 0)
                                .with_prefix(),
                        ])
                        .and_then([TxnOp::put(key.clone(), encode_value(req), Some(put()))]),
                )
                .await
                .map_err(|e| lease_lost_is_retryable(e, false))?;
            if !reply.succeeded() {
                pending.revoke(hold);
                return Ok(None);
            }
            let fence = revision(reply.header(), "acquire")?;
            pending.keep(hold);
            return Ok(Some(EtcdLease::new(
                inner.clone(),
                req,
                key,
                fence,
                (hold, granted),
                start,
            )));
        }

        // Queue: create our key and read the holder in the same transaction.
        let reply = inner
            .raw_txn(
                Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([
                        TxnOp::put(key.clone(), encode_value(req), Some(put())),
                        TxnOp::get(prefix.clone(), Some(first_by_create())),
                    ]),
            )
            .await
            .map_err(|e| lease_lost_is_retryable(e, true))?;
        if !reply.succeeded() {
            return Err(bad_reply("queue (the key of a fresh lease exists)"));
        }
        let my_rev = revision(reply.header(), "queue")?;
        let holder_rev = reply
            .op_responses()
            .into_iter()
            .find_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().map(KeyValue::create_revision),
                _ => None,
            })
            .ok_or_else(|| bad_reply("queue"))?;
        let ours = if shape.first_in_line_wins() {
            holder_rev == my_rev
        } else {
            matches!(
                inner.wanted(shape, &prefix, my_rev).await?.0,
                Wanted::Nothing
            )
        };
        if !ours && req.wait == Wait::No {
            // A busy try leaves nothing: the key goes now (it would count as a place ahead of
            // others until its lease's revocation lands), the lease in the background.
            let key = &key;
            inner
                .resend(|mut c| async move { c.delete(key.as_slice(), None).await })
                .await
                .map_err(map)?;
            pending.revoke_all();
            return Ok(None);
        }
        if ours {
            pending.keep(hold);
            return Ok(Some(EtcdLease::new(
                inner.clone(),
                req,
                key,
                my_rev,
                (hold, granted),
                start,
            )));
        }

        // Wait with a short lease on the queue key, so a waiter that dies (or is paused) holds
        // up the queue for seconds, not for its TTL.
        let mut queue_lease = (hold, granted);
        if granted > WAITER_LEASE_SECS {
            let waiter = inner.grant(WAITER_LEASE_SECS).await?;
            pending.track(waiter.0);
            let moved = inner
                .raw_txn(
                    Txn::new()
                        .when([Compare::create_revision(
                            key.clone(),
                            CompareOp::Equal,
                            my_rev,
                        )])
                        .and_then([TxnOp::put(
                            key.clone(),
                            Vec::new(),
                            Some(PutOptions::new().with_lease(waiter.0).with_ignore_value()),
                        )]),
                )
                .await
                .map_err(|e| lease_lost_is_retryable(e, true))?;
            if !moved.succeeded() {
                return Err(place_lost());
            }
            pending.revoke(hold);
            queue_lease = waiter;
        }

        match self
            .wait_turn(
                shape,
                &prefix,
                my_rev,
                queue_lease.0,
                queue_lease.1,
                req.wait,
            )
            .await?
        {
            Turn::TimedOut => {
                pending.revoke_all();
                return Ok(None);
            }
            Turn::First => {}
        }

        // Our turn. Confirm that our key still exists under a live lease before returning
        // (etcd issue 11456: a lock granted on a lease that expired during the wait), and start
        // the hold's TTL afresh.
        let start = Instant::now();
        let confirm = |lease: i64| {
            Txn::new()
                .when([Compare::create_revision(
                    key.clone(),
                    CompareOp::Equal,
                    my_rev,
                )])
                .and_then([TxnOp::put(
                    key.clone(),
                    encode_value(req),
                    Some(PutOptions::new().with_lease(lease)),
                )])
        };
        let lease = if queue_lease.0 == hold {
            let (alive, confirmed) =
                tokio::join!(inner.keep_alive(hold), inner.raw_txn(confirm(hold)));
            match alive {
                Err(error) if lease_gone(&error) => return Err(place_lost()),
                Err(error) => return Err(map(error)),
                Ok(()) => {}
            }
            if !confirmed
                .map_err(|e| lease_lost_is_retryable(e, true))?
                .succeeded()
            {
                return Err(place_lost());
            }
            (hold, granted)
        } else {
            let lease = inner.grant(secs).await?;
            pending.track(lease.0);
            if !inner
                .raw_txn(confirm(lease.0))
                .await
                .map_err(|e| lease_lost_is_retryable(e, true))?
                .succeeded()
            {
                return Err(place_lost());
            }
            pending.revoke(queue_lease.0);
            lease
        };
        pending.keep(lease.0);
        Ok(Some(EtcdLease::new(
            inner.clone(),
            req,
            key,
            my_rev,
            lease,
            start,
        )))
    }

    /// Waits until the key created at `my_rev` has its turn by the rules of `shape`
    /// (`queue_rules`), watching only the key that must go where there is one (no herd), and
    /// keeping our queue lease alive meanwhile.
    async fn wait_turn(
        &self,
        shape: Shape,
        prefix: &[u8],
        my_rev: i64,
        queue_lease: i64,
        queue_secs: i64,
        wait: Wait,
    ) -> Result<Turn> {
        let inner = &self.inner;
        let deadline = wait.deadline();
        let every = Duration::from_secs(u64::try_from(queue_secs).unwrap_or(1)) / 4;
        let mut keep_alive = tokio::time::interval_at(Instant::now() + every, every);
        keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failures = 0u32;
        loop {
            let step = async {
                let (wanted, _) = inner.wanted(shape, prefix, my_rev).await?;
                let (watched, whole_base) = match &wanted {
                    Wanted::Nothing => return Ok(None),
                    Wanted::Key(key) => (key.clone(), false),
                    Wanted::AnyDeletion => (prefix.to_vec(), true),
                };
                // A watch from the current revision, not from the one we read at: etcd serves
                // a watch that starts in the past from its unsynced group, caught up only every
                // 100 ms, so a hand-off could wait that long. A deletion between the read and
                // the watch is caught by reading again once the watch is live.
                let watched = &watched;
                let mut stream = inner
                    .resend(|mut c| async move {
                        let mut options =
                            WatchOptions::new().with_filters([WatchFilterType::NoPut]);
                        if whole_base {
                            options = options.with_prefix();
                        }
                        c.watch(watched.as_slice(), Some(options)).await
                    })
                    .await
                    .map_err(map)?;
                match stream.message().await.map_err(map)? {
                    Some(reply) if reply.created() && !reply.canceled() => {}
                    // Not created: look at the queue again.
                    _ => return Ok(Some(None)),
                }
                let (now_wanted, _) = inner.wanted(shape, prefix, my_rev).await?;
                if now_wanted == Wanted::Nothing {
                    return Ok(None);
                }
                Ok(Some((now_wanted == wanted).then_some(stream)))
            };
            let found: Result<Option<Option<etcd_client::WatchStream>>> = tokio::select! {
                found = step => found,
                () = until(deadline) => return Ok(Turn::TimedOut),
            };
            let mut stream = match found {
                Ok(None) => return Ok(Turn::First),
                // What we wait for changed while the watch was being set up: start over.
                Ok(Some(None)) => continue,
                Ok(Some(Some(stream))) => stream,
                Err(error) if error.is_retryable() => {
                    failures = failures.saturating_add(1);
                    tracing::debug!(%error, failures, "etcd wait step failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(pause_after(failures)) => continue,
                        () = until(deadline) => return Ok(Turn::TimedOut),
                    }
                }
                Err(error) => return Err(error),
            };
            failures = 0;
            loop {
                tokio::select! {
                    message = stream.message() => match message {
                        Ok(Some(reply)) if reply.canceled() => break,
                        Ok(Some(reply)) => {
                            if reply.events().iter().any(|e| e.event_type() == EventType::Delete) {
                                break;
                            }
                        }
                        // The stream ended or broke: look at the queue again.
                        Ok(None) | Err(_) => break,
                    },
                    _ = keep_alive.tick() => match inner.keep_alive(queue_lease).await {
                        Ok(()) => {}
                        Err(error) if lease_gone(&error) => return Err(place_lost()),
                        // Unreachable for now: the lease has seconds left; try at the next tick.
                        Err(error) => tracing::debug!(%error, "keep-alive of a waiter failed"),
                    },
                    () = until(deadline) => return Ok(Turn::TimedOut),
                }
            }
        }
    }
}

/// A put that names a lease which no longer exists fails with "lease not found": for a
/// waiter, its place is gone (retry); elsewhere a plain store error.
fn lease_lost_is_retryable(error: etcd_client::Error, waiting: bool) -> Error {
    if waiting && lease_gone(&error) {
        place_lost()
    } else {
        map(error)
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        if req.reentrant {
            return Err(Error::Unsupported {
                operation: "reentrant locks",
                backend: BACKEND,
            });
        }
        let pending = Pending {
            inner: self.inner.clone(),
            leases: Mutex::new(Vec::new()),
        };
        let deadline = req.wait.deadline();
        let mut failures = 0u32;
        loop {
            match self.attempt(req, &pending).await {
                Ok(Some(lease)) => return Ok(Some(Arc::new(lease))),
                Ok(None) => return Ok(None),
                // A waiter rides out an election or a lost place by starting over (at the
                // back of the queue), until its deadline.
                Err(error) if error.is_retryable() && req.wait != Wait::No => {
                    pending.revoke_all();
                    let now = Instant::now();
                    if deadline.is_some_and(|at| at <= now) {
                        return Err(error);
                    }
                    failures = failures.saturating_add(1);
                    tracing::debug!(%error, failures, "etcd acquire failed; retrying");
                    let mut pause = pause_after(failures);
                    if let Some(at) = deadline {
                        pause = pause.min(at - now);
                    }
                    tokio::time::sleep(pause).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        Some(self)
    }
}

/// One hold of an etcd lock: its key (create revision = fence) under its own lease.
#[derive(Debug)]
struct EtcdLease {
    inner: Arc<Inner>,
    name: String,
    key: Vec<u8>,
    fence: i64,
    /// The lease the key is attached to now, and its granted length in seconds; replaced
    /// when an extension needs a longer lease.
    lease: Arc<Mutex<(i64, i64)>>,
    lost: CancellationToken,
    start: Instant,
    /// Ends the task that revokes the lease on loss (see [`EtcdLease::new`]).
    _stop: tokio_util::sync::DropGuard,
}

impl EtcdLease {
    fn new(
        inner: Arc<Inner>,
        req: &AcquireRequest,
        key: Vec<u8>,
        fence: i64,
        lease: (i64, i64),
        start: Instant,
    ) -> EtcdLease {
        let lease = Arc::new(Mutex::new(lease));
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        // etcd counts leases in whole seconds, so the store would keep a 100 ms lock for a
        // second or two. When the hold is lost (the keeper's local deadline, a refused renewal,
        // a release), the holder revokes its lease at once, so others get the lock at its TTL
        // and not at etcd's; etcd's own expiry remains the backstop for a holder that cannot.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (inner, lease, lost, stop) =
                (inner.clone(), lease.clone(), lost.clone(), stop.clone());
            runtime.spawn(async move {
                tokio::select! {
                    () = lost.cancelled() => {
                        let (id, _) = *lease.lock().unwrap_or_else(PoisonError::into_inner);
                        inner.revoke_later(vec![id]);
                    }
                    () = stop.cancelled() => {}
                }
            });
        }
        EtcdLease {
            inner,
            name: req.name.as_str().to_owned(),
            key,
            fence,
            lease,
            lost,
            start,
            _stop: stop.drop_guard(),
        }
    }

    fn current(&self) -> (i64, i64) {
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Our key still exists, from our acquisition, under our lease.
    fn owned_when(&self, lease: i64) -> [Compare; 2] {
        [
            Compare::create_revision(self.key.clone(), CompareOp::Equal, self.fence),
            Compare::lease(self.key.clone(), CompareOp::Equal, lease),
        ]
    }

    async fn check_owned(&self, lease: i64) -> Result<()> {
        let key = &self.key;
        let reply = self
            .inner
            .resend(|mut c| async move { c.get(key.as_slice(), None).await })
            .await
            .map_err(map)?;
        match reply.kvs().first() {
            Some(kv) if kv.create_revision() == self.fence && kv.lease() == lease => Ok(()),
            _ => Err(Error::not_owned(&self.name)),
        }
    }
}

#[async_trait]
impl Lease for EtcdLease {
    fn fence(&self) -> FencingToken {
        FencingToken::new(u64::try_from(self.fence).unwrap_or(0))
    }

    fn lost(&self) -> &CancellationToken {
        &self.lost
    }

    fn lease_start(&self) -> Instant {
        self.start
    }

    async fn extend(&self, ttl: Duration) -> Result<()> {
        let (lease, granted) = self.current();
        if ttl.is_zero() {
            return self.check_owned(lease).await;
        }
        let secs = lease_secs(ttl);
        if secs <= granted {
            // A keep-alive restarts the lease at its granted length (never shorter than now).
            let (alive, owned) =
                tokio::join!(self.inner.keep_alive(lease), self.check_owned(lease));
            match alive {
                Err(error) if lease_gone(&error) => return Err(Error::not_owned(&self.name)),
                Err(error) => return Err(map(error)),
                Ok(()) => {}
            }
            return owned;
        }
        // A longer TTL needs a longer lease: move the key to a new one, if it is still ours.
        let (longer, longer_secs) = self.inner.grant(secs).await?;
        let moved = self
            .inner
            .txn(
                Txn::new()
                    .when(self.owned_when(lease))
                    .and_then([TxnOp::put(
                        self.key.clone(),
                        Vec::new(),
                        Some(PutOptions::new().with_lease(longer).with_ignore_value()),
                    )]),
            )
            .await;
        match moved {
            Ok(reply) if reply.succeeded() => {
                *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = (longer, longer_secs);
                self.inner.revoke_later(vec![lease]);
                Ok(())
            }
            Ok(_) => {
                self.inner.revoke_later(vec![longer]);
                Err(Error::not_owned(&self.name))
            }
            Err(error) => {
                self.inner.revoke_later(vec![longer]);
                Err(error)
            }
        }
    }

    async fn release(&self) -> Result<()> {
        let (lease, _) = self.current();
        let reply = self
            .inner
            .txn(
                Txn::new()
                    .when(self.owned_when(lease))
                    .and_then([TxnOp::delete(self.key.clone(), None)]),
            )
            .await?;
        // The key is gone either way; the lease has nothing left to keep.
        self.inner.revoke_later(vec![lease]);
        if reply.succeeded() {
            Ok(())
        } else {
            Err(Error::not_owned(&self.name))
        }
    }
}

/// Reads a holder's key into a [`LockInfo`]; `None` for a value that is not dlock's.
fn lock_info(name: String, kv: &KeyValue, ttl_left: Option<Duration>) -> Option<LockInfo> {
    let value = std::str::from_utf8(kv.value()).ok()?;
    let mut parts = value.splitn(6, '\0');
    if parts.next()? != VALUE_TAG {
        return None;
    }
    let (_token, at, host, pid, label) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next().unwrap_or_default(),
    );
    let owner = Owner::new(
        (!label.is_empty()).then(|| label.to_owned()),
        host,
        pid.parse().unwrap_or(0),
    );
    Some(LockInfo::new(
        name,
        FencingToken::new(u64::try_from(kv.create_revision()).unwrap_or(0)),
        owner,
        UNIX_EPOCH + Duration::from_millis(at.parse().unwrap_or(0)),
        ttl_left,
        1,
    ))
}

impl EtcdBackend {
    async fn ttl_left(&self, lease: i64) -> Result<Option<Duration>> {
        if lease == 0 {
            return Ok(None);
        }
        let reply = self
            .inner
            .resend(|mut c| async move { c.lease_time_to_live(lease, None).await })
            .await
            .map_err(map)?;
        Ok(u64::try_from(reply.ttl()).ok().map(Duration::from_secs))
    }

    async fn describe(&self, name: String, kv: &KeyValue) -> Result<Option<LockInfo>> {
        let ttl_left = self.ttl_left(kv.lease()).await?;
        Ok(lock_info(name, kv, ttl_left))
    }
}

#[async_trait]
impl MonitorStore for EtcdBackend {
    async fn inspect(&self, name: &LockName) -> Result<Option<LockInfo>> {
        let prefix = self.inner.lock_prefix(name.as_str());
        match self.inner.holder(&prefix).await? {
            Some(kv) => self.describe(name.as_str().to_owned(), &kv).await,
            None => Ok(None),
        }
    }

    async fn list_page(
        &self,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ListPage> {
        let root = self.inner.config.prefix.as_bytes();
        let mut scan_from = root.to_vec();
        scan_from.extend_from_slice(prefix.as_bytes());
        let scan_end = etcd_prefix_end(&scan_from);
        if let Some(after) = cursor {
            // Strictly after every key of the lock named `after`: its keys continue with NUL,
            // any other name with a byte of at least 1.
            let mut from = root.to_vec();
            from.extend_from_slice(after.as_bytes());
            from.push(1);
            scan_from = scan_from.max(from);
        }
        let limit = i64::try_from(limit.clamp(1, 10_000)).unwrap_or(256);
        let (scan_from, scan_end) = (&scan_from, &scan_end);
        let reply = self
            .inner
            .resend(|mut c| async move {
                c.get(
                    scan_from.as_slice(),
                    Some(
                        GetOptions::new()
                            .with_range(scan_end.as_slice())
                            .with_limit(limit)
                            .with_keys_only(),
                    ),
                )
                .await
            })
            .await
            .map_err(map)?;
        // Names in key order (a lock's keys are adjacent); each lock's holder is read on its
        // own (the lowest create revision), since a page may cut a lock's keys in two.
        let mut names: Vec<String> = Vec::new();
        for kv in reply.kvs() {
            let Some(rest) = kv.key().strip_prefix(root) else {
                continue;
            };
            let Some(nul) = rest.iter().position(|b| *b == 0) else {
                continue; // not one of our keys
            };
            if nul == 0 {
                continue; // a versioned value (see values.rs), not a lock
            }
            let Ok(name) = std::str::from_utf8(&rest[..nul]) else {
                continue;
            };
            if names.last().map(String::as_str) != Some(name) {
                names.push(name.to_owned());
            }
        }
        let infos = futures::future::join_all(names.iter().map(|name| async move {
            let prefix = self.inner.lock_prefix(name);
            match self.inner.holder(&prefix).await? {
                Some(kv) => self.describe(name.clone(), &kv).await,
                None => Ok(None),
            }
        }))
        .await;
        let mut locks = Vec::with_capacity(infos.len());
        for info in infos {
            if let Some(info) = info? {
                locks.push(info);
            }
        }
        let cursor = if reply.more() {
            names.last().cloned()
        } else {
            None
        };
        Ok(ListPage::new(locks, cursor))
    }

    async fn force_release(&self, name: &LockName) -> Result<bool> {
        let prefix = self.inner.lock_prefix(name.as_str());
        let Some(holder) = self.inner.holder(&prefix).await? else {
            return Ok(false);
        };
        let reply = self
            .inner
            .txn(
                Txn::new()
                    .when([Compare::create_revision(
                        holder.key(),
                        CompareOp::Equal,
                        holder.create_revision(),
                    )])
                    .and_then([TxnOp::delete(holder.key(), None)]),
            )
            .await?;
        if reply.succeeded() && holder.lease() != 0 {
            // The holder's keep-alive now fails, so it learns at its next renewal.
            let lease = holder.lease();
            match self
                .inner
                .resend(|mut c| async move { c.lease_revoke(lease).await })
                .await
            {
                Ok(_) => {}
                Err(error) if lease_gone(&error) => {}
                Err(error) => return Err(map(error)),
            }
        }
        Ok(reply.succeeded())
    }
}

/// The end of the range of keys starting with `prefix` (etcd's prefix rule).
fn etcd_prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key from `prefix` on
}
