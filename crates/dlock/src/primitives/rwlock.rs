//! [`RwLockBuilder`]: many readers or one writer, with waiting writers not starved.

use futures::future::join_all;

use crate::backend::LockKind;
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::hold::acquire;
use crate::hold::options::{HoldOptions, Terms};
use crate::locks::Locks;
use crate::mutex::MutexGuard;
use crate::name::LockName;
use crate::primitives::ComposedPart;
use crate::primitives::guard_set::{GuardSet, hold_methods, release_all, release_part, settle};
use crate::primitives::options::{base_name, hold_option_setters, part_name};
use crate::primitives::slots::{self, MAX_SLOTS};
use crate::ttl::WaitSpec;

/// Reader places when [`RwLockBuilder::max_readers`] is not set.
pub const DEFAULT_MAX_READERS: u32 = 32;

/// Options for taking a read-write lock; made by [`Locks::rwlock`].
///
/// Where the store has native read-write locks (Redis: readers in one sorted set, the writer
/// and a waiting writer's claim in a hash, one script per operation, releases published to
/// waiters), each hold is one request and a waiting writer keeps new readers out. Elsewhere
/// the lock `name` is made of exclusive locks of the store: a gate `<name>#rwgate` and
/// `max_readers` reader places `<name>#r<i>`.
/// - A reader takes the gate, then any free reader place, then lets the gate go: it holds one
///   place.
/// - A writer takes the gate and keeps it, then every reader place (waiting for the readers
///   inside to leave).
///
/// So readers share the lock, a writer excludes everyone, and a waiting writer is never starved:
/// it holds the gate, so readers arriving after it wait behind it (in FIFO order where the store
/// has fair locks). Every hold has a lease (watchdog or [`ttl`](Self::ttl)), a lost signal, and a
/// fence taken from the gate, so fences grow across readers and writers alike. Every client must
/// use the same `max_readers` for the same name. These locks live beside plain mutexes: a mutex
/// named `name` is a different lock.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://rwlock-doc").await?;
/// let r1 = locks.rwlock("catalog").read().await?;
/// let r2 = locks.rwlock("catalog").read().await?;        // readers share
/// assert!(locks.rwlock("catalog").try_write().await?.is_none());
/// drop((r1, r2));
/// let w = locks.rwlock("catalog").write().await?;
/// assert!(w.fence() > dlock::FencingToken::new(0));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a lock builder does nothing until a read or write method is awaited"]
pub struct RwLockBuilder {
    locks: Locks,
    name: String,
    max_readers: u32,
    options: HoldOptions,
}

impl RwLockBuilder {
    pub(crate) fn new(locks: Locks, name: String) -> RwLockBuilder {
        RwLockBuilder {
            locks,
            name,
            max_readers: DEFAULT_MAX_READERS,
            options: HoldOptions::default(),
        }
    }

    /// How many readers may hold the lock at once (default 32, at most 1024). A writer takes
    /// one store lock per place, so more places make writes dearer.
    pub fn max_readers(mut self, max: u32) -> Self {
        self.max_readers = max;
        self
    }

    hold_option_setters!("the lock");

    /// Checks the options and fixes the deadline, before any store call.
    fn start(&self, default_wait: WaitSpec) -> Result<(LockName, Terms)> {
        let base = base_name(&self.name)?;
        if self.max_readers == 0 || self.max_readers > MAX_SLOTS {
            return Err(Error::invalid_argument(
                "max_readers",
                format!("{}; must be 1..={MAX_SLOTS}", self.max_readers),
            ));
        }
        Ok((base, self.options.validate(&self.locks, default_wait)?))
    }

    /// The store's own read-write lock (Redis): one request for either kind of hold.
    async fn acquire_native(
        &self,
        base: LockName,
        terms: &Terms,
        kind: LockKind,
    ) -> Result<Option<MutexGuard>> {
        let request = terms.request(base, kind, terms.deadline);
        acquire::take(&self.locks, terms, request).await
    }

    fn native(&self) -> bool {
        self.locks.info().capabilities.rwlock
    }

    /// Takes the gate of the composed lock (FIFO where the store can).
    async fn enter(
        &self,
        base: &LockName,
        terms: &Terms,
    ) -> Result<Option<(MutexGuard, Vec<LockName>)>> {
        let places = (0..self.max_readers)
            .map(|index| part_name(base, ComposedPart::ReaderPlace { index }))
            .collect::<Result<Vec<_>>>()?;
        let gate = part_name(base, ComposedPart::RwGate)?;
        let mut request = terms.request(gate, LockKind::Exclusive, terms.deadline);
        request.fair = self.locks.info().capabilities.fair;
        let gate = acquire::take(&self.locks, terms, request).await?;
        Ok(gate.map(|gate| (gate, places)))
    }

    /// `run` (a read or a write) waiting as configured, forever by default: a wait that runs
    /// out is [`Error::Timeout`].
    async fn until_held<G, F>(self, run: impl FnOnce(Self, WaitSpec) -> F) -> Result<G>
    where
        F: Future<Output = Result<Option<G>>>,
    {
        let (name, waited) = (self.name.clone(), self.options.waited(WaitSpec::Forever));
        run(self, WaitSpec::Forever)
            .await?
            .ok_or(Error::Timeout { name, waited })
    }

    async fn run_read(self, default_wait: WaitSpec) -> Result<Option<ReadGuard>> {
        let (base, terms) = self.start(default_wait)?;
        if self.native() {
            let kind = LockKind::Read {
                max_readers: self.max_readers,
            };
            let held = self.acquire_native(base, &terms, kind).await?;
            return Ok(held.map(|place| ReadGuard {
                fence: place.fence(),
                place,
            }));
        }
        let terms = terms.collecting();
        loop {
            let Some((gate, places)) = self.enter(&base, &terms).await? else {
                return Ok(None);
            };
            let fence = gate.fence();
            let place = match slots::try_any(&self.locks, &terms, &places).await {
                Ok(Some(place)) => Ok(Some(place)),
                Ok(None) => slots::wait_any(&self.locks, &terms, &places, terms.deadline).await,
                Err(error) => Err(error),
            };
            match release_part(gate).await {
                // The gate was lost while this reader entered (its lease ran out, or the
                // store lost it): a writer may have taken it since with a higher fence, so
                // the gate's fence no longer orders this reader after it. Start again.
                Err(Error::NotOwned { .. }) => {
                    tracing::debug!(lock = %base, "the read-write gate was lost while entering");
                    if let Ok(Some(place)) = place {
                        let _ = release_part(place).await;
                    }
                    continue;
                }
                Err(error) => tracing::debug!(%error, "releasing a read-write gate failed"),
                Ok(()) => {}
            }
            let Some(place) = place? else {
                return Ok(None);
            };
            match settle(std::slice::from_ref(&place), &terms).await {
                Ok(true) => return Ok(Some(ReadGuard { place, fence })),
                // Lost since it was taken: start again.
                Ok(false) => {
                    let _ = release_part(place).await;
                }
                Err(error) => {
                    let _ = release_part(place).await;
                    return Err(error);
                }
            }
        }
    }

    async fn run_write(self, default_wait: WaitSpec) -> Result<Option<WriteGuard>> {
        let (base, terms) = self.start(default_wait)?;
        if self.native() {
            let held = self.acquire_native(base, &terms, LockKind::Write).await?;
            return Ok(held.map(|hold| WriteGuard {
                fence: hold.fence(),
                set: GuardSet::new(vec![hold]),
            }));
        }
        let terms = terms.collecting();
        loop {
            let Some((gate, places)) = self.enter(&base, &terms).await? else {
                return Ok(None);
            };
            let attempts = join_all(
                places
                    .iter()
                    .map(|place| acquire::exclusive(&self.locks, &terms, place, terms.deadline)),
            )
            .await;
            let mut held = vec![gate];
            let mut outcome = Ok(true);
            for attempt in attempts {
                match attempt {
                    Ok(Some(place)) => held.push(place),
                    Ok(None) => outcome = outcome.map(|_| false),
                    Err(error) => outcome = outcome.and(Err(error)),
                }
            }
            // Whole only if no part taken early was lost while the others were awaited.
            let outcome = match outcome {
                Ok(true) => settle(&held, &terms)
                    .await
                    .map(|whole| whole.then_some(true)),
                other => other.map(Some),
            };
            match outcome {
                Ok(Some(true)) => {
                    return Ok(Some(WriteGuard {
                        fence: held[0].fence(),
                        set: GuardSet::new(held),
                    }));
                }
                Ok(Some(false)) => {
                    release_all(held).await;
                    return Ok(None);
                }
                // A part was lost meanwhile: start again.
                Ok(None) => release_all(held).await,
                Err(error) => {
                    release_all(held).await;
                    return Err(error);
                }
            }
        }
    }

    /// Takes the lock for reading, waiting as configured (forever by default).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the wait runs out; [`Error::InvalidName`] /
    /// [`Error::InvalidArgument`] before any store call; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe as [`MutexBuilder::acquire`](crate::MutexBuilder::acquire).
    pub async fn read(self) -> Result<ReadGuard> {
        self.until_held(Self::run_read).await
    }

    /// Takes the lock for reading if it can within the configured wait (default none).
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read), except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn try_read(self) -> Result<Option<ReadGuard>> {
        self.run_read(WaitSpec::No).await
    }

    /// Takes the lock for writing, waiting as configured (forever by default).
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read): places taken before the drop are released in the background.
    pub async fn write(self) -> Result<WriteGuard> {
        self.until_held(Self::run_write).await
    }

    /// Takes the lock for writing if it can within the configured wait (default none).
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write), except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`write`](Self::write).
    pub async fn try_write(self) -> Result<Option<WriteGuard>> {
        self.run_write(WaitSpec::No).await
    }
}

/// A read hold of a read-write lock; made by [`RwLockBuilder::read`]. Dropping it releases in
/// the background.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://read-guard-doc").await?;
/// let reading = locks.rwlock("config").read().await?;
/// println!("reading with fence {}", reading.fence());
/// reading.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused the lock will immediately be released"]
pub struct ReadGuard {
    place: MutexGuard,
    fence: FencingToken,
}

/// A write hold of a read-write lock; made by [`RwLockBuilder::write`]. Dropping it releases
/// in the background.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://write-guard-doc").await?;
/// let writing = locks.rwlock("config").max_readers(4).write().await?;
/// assert!(locks.rwlock("config").max_readers(4).try_read().await?.is_none());
/// writing.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused the lock will immediately be released"]
pub struct WriteGuard {
    set: GuardSet,
    fence: FencingToken,
}

impl ReadGuard {
    /// The fence of this hold: from the gate, so greater than every earlier reader's and
    /// writer's of this lock.
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    hold_methods!(place);
}

impl WriteGuard {
    /// The fence of this hold: greater than every earlier reader's and writer's of this lock.
    pub fn fence(&self) -> FencingToken {
        self.fence
    }

    hold_methods!(set);
}
