#![doc = include_str!("docs.md")]

mod builder;
mod config;
pub(crate) mod driver;
mod error;
mod keys;
mod lease;
mod monitor;
mod read;
mod values;
mod wake;
mod write;

pub use builder::NatsBuilder;
pub use config::NatsConfig;

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use async_nats::jetstream::{self, kv};
use async_trait::async_trait;
use tokio::time::Instant;

use crate::backend::abandon::{Abandon, spawn_cleanup};
use crate::backend::wait::{Attempt, Backoff, acquire_loop};
use crate::backend::{
    AcquireRequest, Backend, BackendInfo, Capabilities, Lease, LockKind, MonitorStore, ValueStore,
    Wait,
};
use crate::error::{Error, Result};

use error::{BACKEND, bad_reply};
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
        ..Capabilities::SHARED_STORE
    },
);

/// The most release markers a client remembers (see `Inner::markers`).
const MARKER_HINTS: usize = 4096;

/// How many times an abandoned call's clean-up looks for its grant (about 1.3 s in all).
const GIVE_BACK_READS: usize = 6;

/// How often an attempt reads the key again when it changed between the write that was
/// refused and the read: a few rounds, then the lock counts as busy (the watch wakes the
/// waiter at the next change).
pub(super) const ROUNDS: usize = 3;

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
    /// Whether reads go to the stream's leader (the bucket has replicas; see `read.rs`).
    leader_reads: bool,
    config: NatsConfig,
    /// The waiters' wake-up: one watch of the bucket's lock keys.
    bell: wake::Bell,
    /// The revision of the marker this client's last releases left, by key: what the next
    /// grant of the key expects first (a hint; a wrong one costs a read).
    markers: std::sync::Mutex<HashMap<String, u64>>,
}

impl Inner {
    /// Remembers the marker revision a release left under `key`.
    fn remember_marker(&self, key: &str, revision: u64) {
        let mut markers = self.markers.lock().unwrap_or_else(PoisonError::into_inner);
        // Only hints: forgotten all at once rather than kept for every name ever released.
        if markers.len() >= MARKER_HINTS {
            markers.clear();
        }
        markers.insert(key.to_owned(), revision);
    }

    fn take_marker(&self, key: &str) -> Option<u64> {
        let mut markers = self.markers.lock().unwrap_or_else(PoisonError::into_inner);
        markers.remove(key)
    }

    /// Purges `key` if its holder is `token`: the grant of a call that ended without its
    /// hold. Read a few times: the call's write may still be on its way to the stream (a
    /// dropped publish is still sent, and the stream may apply it after answering a read).
    async fn give_back(&self, key: &str, token: &str) {
        let mut pause = Backoff::steady(Duration::from_millis(25), Duration::from_millis(400));
        for _ in 0..GIVE_BACK_READS {
            if let Ok(Some(entry)) = self.entry(key).await
                && entry.operation == kv::Operation::Put
                && Holder::decode(&entry.value, entry.revision).is_some_and(|h| h.token == token)
            {
                let purged = self
                    .write(key, Head::Purge, entry.revision, bytes::Bytes::new())
                    .await;
                match purged {
                    Ok(Written::At(_)) => return,
                    Ok(Written::Refused) => {}
                    Err(error) => tracing::debug!(%error, "giving back an abandoned grant failed"),
                }
            }
            tokio::time::sleep(pause.next()).await;
        }
    }
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
        let mut expect = inner.take_marker(key).unwrap_or(0);
        for _ in 0..ROUNDS {
            let start = Instant::now();
            let record = Holder::of(req, 0).encode(req.ttl);
            if let Written::At(revision) = inner.write(key, head, expect, record).await? {
                return Ok(self.granted(req, key, revision, revision, start));
            }
            let Some(entry) = inner.entry(key).await? else {
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
            let record = holder.encode(req.ttl);
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

#[async_trait]
impl Backend for NatsBackend {
    fn info(&self) -> &BackendInfo {
        &INFO
    }

    async fn acquire(&self, req: &AcquireRequest) -> Result<Option<Arc<dyn Lease>>> {
        NatsBackend::check(req)?;
        let key = lock_key(req.name.as_str());
        let inner = &self.inner;
        if req.wait != Wait::No {
            // The client's watch in place before the first attempt.
            inner.bell.start(&inner.kv).await?;
        }
        // A call dropped while a write is on its way may leave a grant nobody holds: given
        // back by token once the call is gone.
        let abandoned = Abandon::on_drop(|| {
            let (inner, key, token) = (inner.clone(), key.clone(), req.token.clone());
            spawn_cleanup(move || async move { inner.give_back(&key, &token).await });
        });
        let acquired = acquire_loop(
            req.wait,
            None,
            || self.attempt(req, &key),
            || {
                let woken = (req.wait != Wait::No).then(|| inner.bell.subscribe(&key));
                async move {
                    match woken {
                        Some(mut woken) => {
                            // An error means the bell is gone with the client: try again.
                            let _ = woken.changed().await;
                        }
                        None => std::future::pending().await,
                    }
                }
            },
        )
        .await;
        abandoned.disarm();
        acquired
    }

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        Some(self)
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        Some(self)
    }
}
