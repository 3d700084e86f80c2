//! [`SemaphoreBuilder`]: a counting semaphore whose permits are leased like locks.

use crate::backend::LockKind;
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::hold::acquire;
use crate::hold::options::{HoldOptions, Terms};
use crate::locks::Locks;
use crate::mutex::MutexGuard;
use crate::name::LockName;
use crate::primitives::ComposedPart;
use crate::primitives::guard_set::hold_methods;
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
    options: HoldOptions,
}

impl SemaphoreBuilder {
    pub(crate) fn new(locks: Locks, name: String, permits: u32) -> SemaphoreBuilder {
        SemaphoreBuilder {
            locks,
            name,
            permits,
            options: HoldOptions::default(),
        }
    }

    hold_option_setters!("a permit");

    async fn run(self, default_wait: WaitSpec) -> Result<Option<Permit>> {
        let base = base_name(&self.name)?;
        if self.permits == 0 || self.permits > MAX_SLOTS {
            return Err(Error::invalid_argument(
                "permits",
                format!("{} permits; must be 1..={MAX_SLOTS}", self.permits),
            ));
        }
        let terms = self.options.validate(&self.locks, default_wait)?;
        if self.locks.info().capabilities.permits {
            // The store's own semaphore (Redis): one request, woken by releases.
            let kind = LockKind::Permit {
                permits: self.permits,
            };
            let request = terms.request(base, kind, terms.deadline);
            let guard = acquire::take(&self.locks, &terms, request).await?;
            return Ok(guard.map(|guard| Permit { guard }));
        }
        let slots = (0..self.permits)
            .map(|slot| {
                let permits = self.permits;
                part_name(&base, ComposedPart::PermitSlot { slot, permits })
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some(guard) = slots::try_any(&self.locks, &terms, &slots).await? {
            return self.checked(&base, guard).await.map(Some);
        }
        if terms.deadline.passed() {
            return Ok(None);
        }
        let Some(gate) = self.gate(&base, &terms).await? else {
            return Ok(None);
        };
        let permit = slots::wait_any(&self.locks, &terms, &slots, terms.deadline).await;
        if let Err(error) = gate.release().await {
            tracing::debug!(%error, "releasing a semaphore gate failed");
        }
        match permit? {
            Some(guard) => self.checked(&base, guard).await.map(Some),
            None => Ok(None),
        }
    }

    /// The gate waiters of a composed semaphore queue on (FIFO where the store can).
    async fn gate(&self, base: &LockName, terms: &Terms) -> Result<Option<MutexGuard>> {
        let gate = part_name(base, ComposedPart::PermitGate)?;
        let mut request = terms.request(gate, LockKind::Exclusive, terms.deadline);
        request.fair = self.locks.info().capabilities.fair;
        acquire::take(&self.locks, terms, request).await
    }

    /// Keeps a composed permit only if no holder of the semaphore uses another size. The
    /// slots' names carry their semaphore's size (`<name>#p<i>of<n>`), and the check lists
    /// them after the slot is taken, so of two clients with different sizes the later one
    /// always sees the earlier (both may refuse, never both keep). Stores that cannot list
    /// their locks skip the check.
    async fn checked(&self, base: &LockName, guard: MutexGuard) -> Result<Permit> {
        if !self.locks.info().capabilities.list {
            return Ok(Permit { guard });
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
            return Ok(Permit { guard });
        };
        if let Err(error) = guard.release().await {
            tracing::debug!(%error, "returning a permit of the wrong size failed");
        }
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

/// One held permit of a semaphore; made by [`SemaphoreBuilder`]. Dropping it returns the
/// permit in the background.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://permit-doc").await?;
/// let permit = locks.semaphore("uploads", 4).acquire().await?;
/// tokio::select! {
///     () = permit.lost() => { /* the lease is gone: stop */ }
///     () = async { /* work */ } => {}
/// }
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused the permit will immediately be returned"]
pub struct Permit {
    guard: MutexGuard,
}

impl Permit {
    /// What this permit holds in the store: the slot lock `<name>#p<i>of<permits>`, or the semaphore's
    /// own name where the store has native semaphores.
    pub fn slot(&self) -> &LockName {
        self.guard.name()
    }

    /// This permit's fence: greater than every earlier permit's of the semaphore (native
    /// semaphores) or of the same slot (composed ones).
    pub fn fence(&self) -> FencingToken {
        self.guard.fence()
    }

    hold_methods!(guard);
}
