#![doc = include_str!("docs.md")]

mod builder;
mod config;
pub(crate) mod driver;
mod error;
mod keys;
mod lease;
mod values;
mod write;

pub use builder::NatsBuilder;
pub use config::NatsConfig;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use async_trait::async_trait;
use futures::StreamExt;
use tokio::time::Instant;

use crate::backend::wait::{Attempt, acquire_loop};
use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, LockKind, ValueStore, Wait,
};
use crate::error::{Error, Result};

use error::{BACKEND, bad_reply, map};
use keys::{Holder, lock_key};
use lease::NatsLease;
use write::{Head, Written};

/// URL schemes served by this backend: `nats://host:port[,host:port…]/BUCKET`.
pub const NATS_SCHEMES: &[&str] = &["nats"];

const INFO: BackendInfo = BackendInfo::new(
    BACKEND,
    Capabilities {
        // A key holds one holder: no hold count, no queue (a release wakes every watcher).
        reentrant: false,
        fair: false,
        // Not yet: listing and breaking holds (the bucket's keys could serve them).
        monitor: false,
        list: false,
        ..Capabilities::SHARED_STORE
    },
);

/// How often an attempt reads the key again when it changed between the write that was
/// refused and the read: a few rounds, then the lock counts as busy (the watch wakes the
/// waiter at the next change).
const ROUNDS: usize = 3;

/// Pause before a waiter's watch is made again after it failed (the server restarting).
const REWATCH_PAUSE: Duration = Duration::from_millis(200);

/// Locks in a NATS JetStream key-value bucket: a grant is a `create` with a per-key TTL, a
/// renewal and a release are writes that expect the holder's revision, the fence is the
/// grant's revision, and waiters watch the key.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("nats://127.0.0.1:4222/locks").await?;
/// let guard = locks.mutex("nightly-report").acquire().await?;
/// println!("fence {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct NatsBackend {
    inner: Arc<Inner>,
}

struct Inner {
    js: jetstream::Context,
    kv: kv::Store,
    config: NatsConfig,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl NatsBackend {
    /// Connects to the servers and bucket of a `nats://` URL; see [`NatsConfig::from_url`].
    ///
    /// # Errors
    ///
    /// As [`NatsConfig::from_url`] and [`NatsBuilder::build`].
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
    /// let backend = dlock::nats::NatsBackend::connect_url("nats://127.0.0.1:4222/locks").await?;
    /// let locks = dlock::Locks::new(backend);
    /// # Ok(()) }
    /// ```
    pub async fn connect_url(url: &str) -> Result<NatsBackend> {
        NatsBuilder::new(url)?.build().await
    }

    /// The options this client runs with.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let backend = dlock::nats::NatsBackend::connect_url("nats://127.0.0.1:4222/locks").await?;
    /// assert_eq!(backend.config().bucket, "locks");
    /// # Ok(()) }
    /// ```
    pub fn config(&self) -> &NatsConfig {
        &self.inner.config
    }

    fn check(req: &AcquireRequest) -> Result<()> {
        crate::ttl::check_store_ttl(req.ttl)?;
        if req.kind != LockKind::Exclusive {
            return Err(Error::Unsupported {
                operation: "native semaphores and read-write locks",
                backend: BACKEND,
            });
        }
        if req.reentrant || req.fair {
            return Err(Error::Unsupported {
                operation: if req.fair {
                    "fair locks"
                } else {
                    "reentrant locks"
                },
                backend: BACKEND,
            });
        }
        Ok(())
    }

    /// One attempt: a `create` (a write expecting no live entry) with the lease's TTL; when
    /// the key is held, our own grant (a retry after a lost reply) is renewed and taken, any
    /// other holder's is busy.
    async fn attempt(&self, req: &AcquireRequest, key: &str) -> Result<Attempt> {
        let inner = &self.inner;
        let head = Head::Put { ttl: req.ttl };
        // Nothing under the key, or the marker of a release or an expiry: its revision.
        let mut expect = 0;
        for _ in 0..ROUNDS {
            let start = Instant::now();
            let record = Holder::encode(req, 0);
            if let Written::At(revision) = inner.write(key, head, expect, record).await? {
                return Ok(self.granted(req, key, revision, revision, start));
            }
            let Some(entry) = inner.kv.entry(key).await.map_err(map)? else {
                expect = 0;
                continue;
            };
            if entry.operation != kv::Operation::Put {
                expect = entry.revision;
                continue;
            }
            let holder = Holder::decode(&entry.value, entry.revision)
                .ok_or_else(|| bad_reply("lock record"))?;
            if holder.token != req.token {
                return Ok(Attempt::Busy { free_in: None });
            }
            // Our own grant, its reply lost: renewed to a full lease from now, and taken.
            let start = Instant::now();
            let record = Holder::encode(req, holder.fence);
            if let Written::At(revision) = inner.write(key, head, entry.revision, record).await? {
                return Ok(self.granted(req, key, holder.fence, revision, start));
            }
        }
        Ok(Attempt::Busy { free_in: None })
    }

    fn granted(
        &self,
        req: &AcquireRequest,
        key: &str,
        fence: u64,
        revision: u64,
        start: Instant,
    ) -> Attempt {
        let lease = NatsLease::new(
            self.inner.clone(),
            req,
            key.to_owned(),
            (fence, revision),
            start,
        );
        Attempt::Acquired(Arc::new(lease))
    }
}

/// A waiter's watch of one key: wakes on a release or an expiry (a delete or purge entry),
/// not on the holder's renewals.
struct KeyWatch<'a> {
    kv: &'a kv::Store,
    key: &'a str,
    watch: tokio::sync::Mutex<Option<kv::Watch>>,
}

impl<'a> KeyWatch<'a> {
    /// Made before the first attempt, so no release after it is missed: the watch starts
    /// with the key's last entry, then every change.
    async fn start(kv: &'a kv::Store, key: &'a str) -> Result<KeyWatch<'a>> {
        let watch = kv.watch(key).await.map_err(map)?;
        Ok(KeyWatch {
            kv,
            key,
            watch: tokio::sync::Mutex::new(Some(watch)),
        })
    }

    /// Returns when the key may be free.
    async fn changed(&self) {
        let mut slot = self.watch.lock().await;
        let Some(watch) = slot.as_mut() else {
            // The last watch failed: a new one, then an attempt (a release in between would
            // otherwise be missed).
            match self.kv.watch(self.key).await {
                Ok(watch) => *slot = Some(watch),
                Err(error) => {
                    tracing::debug!(%error, "a waiter's key watch could not be made");
                    tokio::time::sleep(REWATCH_PAUSE).await;
                }
            }
            return;
        };
        loop {
            match watch.next().await {
                Some(Ok(entry)) if entry.operation == kv::Operation::Put => {}
                Some(Ok(_)) => return,
                Some(Err(error)) => {
                    tracing::debug!(%error, "a waiter's key watch failed");
                    *slot = None;
                    return;
                }
                None => {
                    *slot = None;
                    return;
                }
            }
        }
    }
}

#[async_trait]
impl Backend for NatsBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        NatsBackend::check(req)?;
        let key = lock_key(req.name.as_str());
        let watch = match req.wait {
            Wait::No => None,
            _ => Some(KeyWatch::start(&self.inner.kv, &key).await?),
        };
        acquire_loop(
            req.wait,
            None,
            || self.attempt(req, &key),
            || {
                let watch = watch.as_ref();
                async move {
                    match watch {
                        Some(watch) => watch.changed().await,
                        None => std::future::pending().await,
                    }
                }
            },
        )
        .await
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        Some(self)
    }
}
