//! [`SemaphoreBuilder`]: a counting semaphore whose permits are leased like locks.

use crate::backend::LockKind;
use crate::backend::Wait;
use crate::error::{Error, Result};
use crate::hold::acquire;
use crate::hold::options::{HoldOptions, Terms};
use crate::locks::Locks;
use crate::mutex::MutexGuard;
use crate::name::LockName;
use crate::primitives::ComposedPart;
use crate::primitives::Permit;
use crate::primitives::guard_set::{release_all, release_part, settle};
use crate::primitives::options::{base_name, hold_option_setters, part_name};
use crate::primitives::slots::{self, MAX_SLOTS};
use crate::ttl::WaitSpec;

/// Options for taking one permit of a counting semaphore; made by [`Locks::semaphore`].
///
/// Every permit has the store's full lock semantics: a lease, renewed by the watchdog or fixed
/// by [`ttl`](Self::ttl); a fence; a lost signal; and a crashed holder's permit comes back when
/// its lease ends. Every client must use the same `permits` for the same name: asking with
/// another size than the current holders use is [`Error::SizeMismatch`] (on every store but
/// those that can neither keep the size nor list their locks: Redlock and the SQL session
/// modes).
///
/// - Where the store has native semaphores (Redis: one sorted set, one script per operation,
///   releases published to waiters), a permit is one entry there, and fences grow across all
///   permits of the semaphore.
/// - Elsewhere, the semaphore `name` is made of `permits` exclusive locks (slots) named
///   `<name>#p<i>of<permits>`, plus a gate `<name>#pgate` for waiters; a permit is one slot (its fence
///   grows per slot), so the count can never be exceeded. When all permits are taken, waiters
///   queue on the gate (FIFO where the store has fair locks) and only the first waits for a
///   slot. Newcomers may take a permit that frees up ahead of queued waiters.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://semaphore-doc").await?;
/// let a = locks.semaphore("crawler", 2).acquire().await?;
/// let b = locks.semaphore("crawler", 2).acquire().await?;
/// assert!(locks.semaphore("crawler", 2).try_acquire().await?.is_none());
/// a.release().await?;
/// assert!(locks.semaphore("crawler", 2).try_acquire().await?.is_some());
/// # drop(b);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a lock builder does nothing until `acquire` or `try_acquire` is awaited"]
pub struct SemaphoreBuilder {
    locks: Locks,
    name: String,
    permits: u32,
    /// How many permits one acquisition takes, all or nothing.
    count: u32,
    options: HoldOptions,
}

impl SemaphoreBuilder {
    pub(crate) fn new(locks: Locks, name: String, permits: u32) -> SemaphoreBuilder {
        SemaphoreBuilder {
            locks,
            name,
            permits,
            count: 1,
            options: HoldOptions::default(),
        }
    }

    hold_option_setters!("a permit");

    /// Takes `count` permits at once (default 1), all or nothing: the acquisition holds none
    /// of them until it holds every one, and gives back those it took if the wait runs out.
    /// The permits live and die together: one lost signal (any of them lost), one release, and
    /// the largest of their fences.
    ///
    /// An acquisition of several permits collects them one by one while it holds the
    /// semaphore's gate `<name>#pgate`, so two such acquisitions never each hold part of what
    /// the other waits for; acquisitions of one permit may take a permit that frees up before
    /// it. `count` must be in `1..=permits` ([`Error::InvalidArgument`] otherwise).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://semaphore-count-doc").await?;
    /// let big_job = locks.semaphore("gpus", 4).count(3).acquire().await?;
    /// assert_eq!(big_job.count(), 3);
    /// // One permit is left: two at once cannot be had, one can.
    /// assert!(locks.semaphore("gpus", 4).count(2).try_acquire().await?.is_none());
    /// assert!(locks.semaphore("gpus", 4).try_acquire().await?.is_some());
    /// # Ok(()) }
    /// ```
    pub fn count(mut self, count: u32) -> Self {
        self.count = count;
        self
    }

    async fn run(self, default_wait: WaitSpec) -> Result<Option<Permit>> {
        let base = base_name(&self.name)?;
        if self.permits == 0 || self.permits > MAX_SLOTS {
            return Err(Error::invalid_argument(
                "permits",
                format!("{} permits; must be 1..={MAX_SLOTS}", self.permits),
            ));
        }
        if self.count == 0 || self.count > self.permits {
            return Err(Error::invalid_argument(
                "count",
                format!(
                    "{} permits at once from a semaphore of {}; must be 1..={}",
                    self.count, self.permits, self.permits
                ),
            ));
        }
        let terms = self.options.validate(&self.locks, default_wait)?;
        let taker = Taker::new(&self, &base)?;
        if self.count == 1
            && let Taker::Native(_) = taker
        {
            // The store's own semaphore (Redis): one request, woken by releases.
            let guard = taker.one(&self, &terms, terms.deadline).await?;
            return Ok(guard.map(Permit::one));
        }
        let terms = terms.collecting();
        loop {
            let taken = if self.count > 1 {
                self.several(&base, &terms, &taker).await?
            } else {
                self.gated(&base, &terms, &taker).await?
            };
            let Some(taken) = taken else {
                return Ok(None);
            };
            match settle(&taken, &terms).await {
                Ok(true) => return self.checked(&base, taken).await.map(Some),
                // A permit taken early was lost while the others were awaited: start again.
                Ok(false) => release_all(taken).await,
                Err(error) => {
                    release_all(taken).await;
                    return Err(error);
                }
            }
        }
    }

    /// One composed permit: a try without waiting, then waiting behind the gate.
    async fn gated(
        &self,
        base: &LockName,
        terms: &Terms,
        taker: &Taker,
    ) -> Result<Option<Vec<MutexGuard>>> {
        if let Some(guard) = taker.one(self, terms, Wait::No).await? {
            return Ok(Some(vec![guard]));
        }
        if terms.deadline.passed() {
            return Ok(None);
        }
        let Some(gate) = self.gate(base, terms).await? else {
            return Ok(None);
        };
        let permit = taker.one(self, terms, terms.deadline).await;
        if let Err(error) = release_part(gate).await {
            tracing::debug!(%error, "releasing a semaphore gate failed");
        }
        Ok(permit?.map(|guard| vec![guard]))
    }

    /// [`count`](Self::count) permits, all or nothing: first a try of each without waiting
    /// (given back unless every one was had), then, holding the gate, one by one until the
    /// deadline.
    async fn several(
        &self,
        base: &LockName,
        terms: &Terms,
        taker: &Taker,
    ) -> Result<Option<Vec<MutexGuard>>> {
        let wanted = self.count as usize;
        let mut taken = Vec::with_capacity(wanted);
        while taken.len() < wanted {
            match taker.one(self, terms, Wait::No).await? {
                Some(guard) => taken.push(guard),
                None => break,
            }
        }
        if taken.len() == wanted {
            return Ok(Some(taken));
        }
        release_all(taken).await;
        if terms.deadline.passed() {
            return Ok(None);
        }
        let Some(gate) = self.gate(base, terms).await? else {
            return Ok(None);
        };
        let mut taken = Vec::with_capacity(wanted);
        let mut failed = None;
        while taken.len() < wanted {
            match taker.one(self, terms, terms.deadline).await {
                Ok(Some(guard)) => taken.push(guard),
                Ok(None) => break,
                Err(error) => {
                    failed = Some(error);
                    break;
                }
            }
        }
        if let Err(error) = release_part(gate).await {
            tracing::debug!(%error, "releasing a semaphore gate failed");
        }
        if taken.len() < wanted {
            release_all(taken).await;
            return failed.map_or(Ok(None), Err);
        }
        Ok(Some(taken))
    }

    /// The gate waiters of a composed semaphore queue on (FIFO where the store can).
    async fn gate(&self, base: &LockName, terms: &Terms) -> Result<Option<MutexGuard>> {
        let gate = part_name(base, ComposedPart::PermitGate)?;
        let mut request = terms.request(gate, LockKind::Exclusive, terms.deadline);
        request.fair = self.locks.info().capabilities.fair;
        acquire::take(&self.locks, terms, request).await
    }

    /// Keeps composed permits only if no holder of the semaphore uses another size. The
    /// slots' names carry their semaphore's size (`<name>#p<i>of<n>`), and the check lists
    /// them after the slots are taken, so of two clients with different sizes the later one
    /// always sees the earlier (both may refuse, never both keep). Native semaphores check the
    /// size in the store; stores that cannot list their locks skip the check.
    async fn checked(&self, base: &LockName, guards: Vec<MutexGuard>) -> Result<Permit> {
        if self.locks.info().capabilities.permits || !self.locks.info().capabilities.list {
            return Ok(Permit::several(guards));
        }
        let prefix = format!("{base}#p");
        let mut held = self.locks.list(&prefix);
        let mut other = None;
        while let Some(info) = futures::TryStreamExt::try_next(&mut held).await? {
            let size = info.name[prefix.len()..]
                .split_once("of")
                .filter(|(slot, _)| slot.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|(_, size)| size.parse::<u32>().ok());
            if let Some(size) = size.filter(|&size| size != self.permits) {
                other = Some(size);
                break;
            }
        }
        let Some(held_with) = other else {
            return Ok(Permit::several(guards));
        };
        release_all(guards).await;
        Err(Error::SizeMismatch {
            name: self.name.clone(),
            asked: self.permits,
            held_with,
        })
    }

    /// Acquires a permit, waiting as configured (forever by default).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the wait runs out; [`Error::SizeMismatch`] when the current
    /// holders use another number of permits; [`Error::InvalidName`] /
    /// [`Error::InvalidArgument`] (0 or more than 1024 permits, a bad TTL) before any store
    /// call; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe as [`MutexBuilder::acquire`](crate::MutexBuilder::acquire).
    pub async fn acquire(self) -> Result<Permit> {
        let name = self.name.clone();
        let waited = self.options.waited(WaitSpec::Forever);
        self.run(WaitSpec::Forever)
            .await?
            .ok_or(Error::Timeout { name, waited })
    }

    /// Acquires a permit if one is free (or frees up within the configured wait, which
    /// defaults to none); `Ok(None)` otherwise.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), except that no free permit is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(self) -> Result<Option<Permit>> {
        self.run(WaitSpec::No).await
    }
}

/// How one permit is taken: one request of the store's own semaphore, or one of the slots a
/// composed semaphore is made of.
enum Taker {
    Native(LockName),
    Slots(Vec<LockName>),
}

impl Taker {
    fn new(builder: &SemaphoreBuilder, base: &LockName) -> Result<Taker> {
        if builder.locks.info().capabilities.permits {
            return Ok(Taker::Native(base.clone()));
        }
        let permits = builder.permits;
        (0..permits)
            .map(|slot| part_name(base, ComposedPart::PermitSlot { slot, permits }))
            .collect::<Result<Vec<_>>>()
            .map(Taker::Slots)
    }

    /// One permit of `builder`'s semaphore, waiting until `deadline`. A composed semaphore's
    /// waiting taker holds the gate, so it is the only one waiting for a slot.
    async fn one(
        &self,
        builder: &SemaphoreBuilder,
        terms: &Terms,
        deadline: Wait,
    ) -> Result<Option<MutexGuard>> {
        let locks = &builder.locks;
        match self {
            Taker::Native(name) => {
                let kind = LockKind::Permit {
                    permits: builder.permits,
                };
                acquire::take(locks, terms, terms.request(name.clone(), kind, deadline)).await
            }
            Taker::Slots(slots) if deadline == Wait::No => {
                slots::try_any(locks, terms, slots).await
            }
            Taker::Slots(slots) => slots::wait_any(locks, terms, slots, deadline).await,
        }
    }
}
