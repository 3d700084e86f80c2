//! The exclusive lock: [`MutexBuilder`] and its [`MutexGuard`].

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::backend::{AcquireRequest, Backend, DynBackend, HoldKind, Lease, Wait};
use crate::error::{Error, Result};
use crate::fence::FencingToken;
use crate::lease::keeper::KeepPolicy;
use crate::lease::{HeldLease, Lost};
use crate::locks::Locks;
use crate::name::{LockName, Owner};
use crate::ttl::{WaitSpec, validate_max_hold, validate_ttl};

/// Options for one exclusive lock; made by [`Locks::mutex`].
///
/// Defaults: no TTL (a watchdog lease of [`Locks::watchdog_lease`], renewed while the guard
/// lives), wait forever for [`acquire`](Self::acquire) and not at all for
/// [`try_acquire`](Self::try_acquire), not reentrant, not fair.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// use std::time::Duration;
/// let locks = dlock::connect("memory://builder-doc").await?;
/// let guard = locks
///     .mutex("orders/42")
///     .ttl(Duration::from_secs(10))
///     .wait(Duration::from_secs(5))
///     .acquire()
///     .await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
#[must_use = "a lock builder does nothing until `acquire` or `try_acquire` is awaited"]
pub struct MutexBuilder {
    locks: Locks,
    name: String,
    ttl: Option<Duration>,
    wait: Option<WaitSpec>,
    reentrant: bool,
    fair: bool,
    max_hold: Option<Duration>,
}

impl MutexBuilder {
    pub(crate) fn new(locks: Locks, name: String) -> MutexBuilder {
        MutexBuilder {
            locks,
            name,
            ttl: None,
            wait: None,
            reentrant: false,
            fair: false,
            max_hold: None,
        }
    }

    /// A fixed lease: the lock expires `ttl` after it is taken unless
    /// [`MutexGuard::extend`] is called; the watchdog does not renew it, but asks the store
    /// every third of `ttl` whether the lock is still held (without extending it), so
    /// [`MutexGuard::lost`] fires within a third of `ttl` of a break or of a store that lost
    /// its data. Between [`MIN_TTL`](crate::limits::MIN_TTL) and [`MAX_TTL`](crate::limits::MAX_TTL).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Waits at most `wait` for the lock.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(WaitSpec::For(wait));
        self
    }

    /// Tries once and does not wait.
    pub fn no_wait(mut self) -> Self {
        self.wait = Some(WaitSpec::No);
        self
    }

    /// Waits as long as it takes (the default for `acquire`).
    pub fn wait_forever(mut self) -> Self {
        self.wait = Some(WaitSpec::Forever);
        self
    }

    /// Reentrant: the hold can be re-entered through its guard
    /// ([`MutexGuard::reenter`]), which succeeds at once with the same fence and adds one to a
    /// hold count kept in the store; the lock is free when every guard has been released. A
    /// crashed holder's count expires with its lease.
    ///
    /// Re-entry needs the guard as proof of holding: another acquisition through the builder,
    /// even from the same client, is a different holder and waits like any other, so two tasks
    /// can never both hold the lock.
    pub fn reentrant(mut self) -> Self {
        self.reentrant = true;
        self
    }

    /// Fair: waiters get the lock in arrival order. Backends without a queue return
    /// [`Error::Unsupported`].
    pub fn fair(mut self) -> Self {
        self.fair = true;
        self
    }

    /// With the watchdog: stop renewing `max` after the lock was acquired (not counting the
    /// wait), so a holder that forgot its guard loses the lock at most one watchdog lease later.
    /// Ignored with a fixed [`ttl`](Self::ttl).
    pub fn max_hold(mut self, max: Duration) -> Self {
        self.max_hold = Some(max);
        self
    }

    /// Validates everything before any store is contacted, so bad input leaves no state behind.
    pub(crate) fn request(
        &self,
        default_wait: WaitSpec,
    ) -> Result<(AcquireRequest, KeepPolicy, WaitSpec)> {
        let name = LockName::new(self.name.clone())?;
        let caps = self.locks.info().capabilities;
        let backend = self.locks.info().name;
        if self.fair && !caps.fair {
            return Err(Error::Unsupported {
                operation: "fair locks",
                backend,
            });
        }
        if self.reentrant && !caps.reentrant {
            return Err(Error::Unsupported {
                operation: "reentrant locks",
                backend,
            });
        }
        let (ttl, renew) = match self.ttl {
            Some(ttl) => (validate_ttl("ttl", ttl)?, false),
            None => (self.locks.watchdog_lease(), true),
        };
        validate_max_hold(self.max_hold)?;
        let wait_spec = self.wait.unwrap_or(default_wait);
        let wait = wait_spec.to_wait()?;
        // Unique per acquisition, reentrant or not: only the guard re-enters (with this token).
        let token = uuid::Uuid::new_v4().simple().to_string();
        let owner: Owner = self.locks.owner().clone();
        let mut request = AcquireRequest::new(name, token, owner, ttl, wait);
        // The first hold is a plain grant (a retry of it must not count a second hold); only
        // re-entries through the guard ask the store to count one more.
        request.reentrant = false;
        request.fair = self.fair;
        let policy = KeepPolicy {
            ttl,
            renew,
            max_hold: self.max_hold,
        };
        Ok((request, policy, wait_spec))
    }

    async fn run(self, default_wait: WaitSpec) -> Result<Result<MutexGuard, Duration>> {
        let (request, policy, wait) = self.request(default_wait)?;
        let lease = acquire_observed(&self.locks, &request).await;
        let lease = lease?;
        let Some(lease) = lease else {
            return Ok(Err(wait.duration()));
        };
        // No await from here on: a dropped future cannot strand the lease between the store
        // and the guard.
        let reentry = self.reentrant.then(|| {
            let mut again = request.clone();
            again.wait = Wait::No;
            again.reentrant = true;
            Arc::new(Reentry {
                locks: self.locks.clone(),
                request: again,
                policy,
            })
        });
        let mut guard = MutexGuard::new(&self.locks, request.name, policy, lease);
        guard.reentry = reentry;
        Ok(Ok(guard))
    }

    /// Acquires the lock, waiting as configured (forever by default).
    ///
    /// # Errors
    ///
    /// - [`Error::Timeout`] when the wait runs out (at once with [`no_wait`](Self::no_wait));
    /// - [`Error::InvalidName`] / [`Error::InvalidArgument`] for bad input, before any store call;
    /// - [`Error::Unsupported`] for `fair` or `reentrant` on a store without them;
    /// - store errors ([`Error::Unavailable`], …). When one leaves the outcome unknown (a
    ///   reply lost after the store may have granted), one repeated attempt with the same
    ///   token finds the grant and releases it before the error is returned, so none is left
    ///   held.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future while it waits leaves no lock held; if it is dropped
    /// while the store is granting the lock, the lock is released at once where the backend
    /// can tell, and in any case expires within its TTL.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://acquire-doc").await?;
    /// let held = locks.mutex("a").acquire().await?;
    /// let err = locks.mutex("a").wait(Duration::from_millis(20)).acquire().await.unwrap_err();
    /// assert!(matches!(err, dlock::Error::Timeout { .. }));
    /// # drop(held);
    /// # Ok(()) }
    /// ```
    pub async fn acquire(self) -> Result<MutexGuard> {
        let name = self.name.clone();
        match self.run(WaitSpec::Forever).await? {
            Ok(guard) => Ok(guard),
            Err(waited) => Err(Error::Timeout { name, waited }),
        }
    }

    /// Acquires the lock if it is free (or frees up within the configured wait, which defaults
    /// to none); `Ok(None)` when it is held elsewhere.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), except that a busy lock is `Ok(None)`, not a timeout.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://try-doc").await?;
    /// let first = locks.mutex("b").try_acquire().await?;
    /// assert!(first.is_some());
    /// assert!(locks.mutex("b").try_acquire().await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(self) -> Result<Option<MutexGuard>> {
        Ok(self.run(WaitSpec::No).await?.ok())
    }
}

/// Counts an acquire call in the `dlock_waiting` gauge while it runs.
struct Waiting(&'static str);

impl Waiting {
    fn new(backend: &'static str) -> Waiting {
        metrics::gauge!("dlock_waiting", "backend" => backend).increment(1.0);
        Waiting(backend)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        metrics::gauge!("dlock_waiting", "backend" => self.0).decrement(1.0);
    }
}

/// A held exclusive lock.
///
/// It carries the hold's [fencing token](Self::fence) and [lost signal](Self::lost). Release it
/// with [`release`](Self::release) to see errors; dropping it releases in the background on the
/// runtime it was acquired on (best effort: if that runtime is gone, the lease's TTL frees the
/// lock). Owned, `Send` and `'static`: move it into tasks freely.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> dlock::Result<()> {
/// let locks = dlock::connect("memory://guard-doc").await?;
/// let guard = locks.mutex("orders/7").acquire().await?;
/// tokio::select! {
///     () = guard.lost() => { /* the lease is gone: stop touching the resource */ }
///     () = async { /* work, passing guard.fence() to every write */ } => {}
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[clippy::has_significant_drop]
#[must_use = "if unused the lock will immediately be released"]
pub struct MutexGuard {
    held: HeldLease,
    /// The backend's scheme name, for spans.
    backend: &'static str,
    /// Set for a reentrant hold: what [`MutexGuard::reenter`] asks the store again.
    reentry: Option<Arc<Reentry>>,
}

/// The request that re-enters a reentrant hold: the same token, no wait.
#[derive(Debug)]
struct Reentry {
    locks: Locks,
    request: AcquireRequest,
    policy: KeepPolicy,
}

impl MutexGuard {
    /// Wraps a lease the store granted: the keeper starts looking after it at once.
    pub(crate) fn new(
        locks: &Locks,
        name: LockName,
        policy: KeepPolicy,
        lease: std::sync::Arc<dyn crate::backend::Lease>,
    ) -> MutexGuard {
        let label = crate::lease::keeper::LeaseLabel {
            name: name.as_str().into(),
            backend: locks.info().name,
        };
        let registration =
            locks
                .keeper()
                .register(lease.clone(), label, policy, lease.lease_start());
        tracing::debug!(%name, fence = %lease.fence(), "acquired");
        MutexGuard {
            held: HeldLease::new(name, lease, registration),
            backend: locks.info().name,
            reentry: None,
        }
    }

    /// Re-enters this reentrant hold: a new guard for the same lock with the same fence, and
    /// one more count in the store's hold count. The lock is free once every guard of the hold
    /// has been released.
    ///
    /// # Errors
    ///
    /// - [`Error::InvalidArgument`] when the lock was not acquired with
    ///   [`reentrant`](MutexBuilder::reentrant);
    /// - [`Error::NotOwned`] when the hold is lost (expired, broken, taken over);
    /// - store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the store call runs on a task of its own, and a re-entry whose caller was
    /// dropped is released as soon as the store answers, so the hold count never stays raised.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://reenter-doc").await?;
    /// let outer = locks.mutex("ledger").reentrant().acquire().await?;
    /// let inner = outer.reenter().await?;
    /// assert_eq!(inner.fence(), outer.fence());
    /// // Another acquisition is another holder, even from this client.
    /// assert!(locks.mutex("ledger").reentrant().try_acquire().await?.is_none());
    /// inner.release().await?;
    /// outer.release().await?;
    /// assert!(locks.inspect("ledger").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn reenter(&self) -> Result<MutexGuard> {
        let Some(reentry) = self.reentry.clone() else {
            return Err(Error::invalid_argument(
                "reenter",
                "the lock was not acquired with .reentrant()",
            ));
        };
        if self.is_lost() {
            return Err(Error::not_owned(self.name().as_str()));
        }
        let backend = reentry.locks.backend().clone();
        let request = reentry.request.clone();
        let granted = crate::lease::detached::run_detached(
            reentry.locks.info().name,
            async move { backend.acquire(&request).await },
            |lease: Option<Arc<dyn crate::backend::Lease>>| {
                Box::pin(async move {
                    if let Some(lease) = lease {
                        let _ = lease.release().await;
                    }
                })
            },
        )
        .await?;
        let Some(lease) = granted else {
            return Err(Error::not_owned(self.name().as_str()));
        };
        let mut guard = MutexGuard::new(
            &reentry.locks,
            reentry.request.name.clone(),
            reentry.policy,
            lease,
        );
        guard.reentry = Some(reentry);
        Ok(guard)
    }

    /// The lock's name.
    pub fn name(&self) -> &LockName {
        self.held.name()
    }

    /// This hold's fencing token: strictly greater than every earlier holder's.
    pub fn fence(&self) -> FencingToken {
        self.held.fence()
    }

    /// Completes when the lock is lost (lease expired, renewal refused, lock broken, store
    /// session gone), or at once if it already was. It also completes after release.
    pub fn lost(&self) -> Lost<'_> {
        self.held.lost()
    }

    /// An owned token cancelled when the lock is lost, for tasks that outlive a borrow of the
    /// guard. Cancelling it yourself does not affect the lock.
    pub fn lost_token(&self) -> CancellationToken {
        self.held.lost_token()
    }

    /// Whether the lock is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Why the lock was lost, once it is; `None` while it is held. See [`LostReason`](crate::LostReason).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://lost-reason-guard-doc").await?;
    /// let guard = locks.mutex("report").ttl(Duration::from_millis(100)).acquire().await?;
    /// guard.lost().await; // a fixed TTL, not renewed
    /// assert_eq!(guard.lost_reason(), Some(dlock::LostReason::Expired));
    ///
    /// let broken = locks.mutex("import").acquire().await?;
    /// assert_eq!(broken.lost_reason(), None);
    /// locks.force_release("import").await?; // the in-process store announces breaks
    /// assert_eq!(broken.lost_reason(), Some(dlock::LostReason::Broken));
    /// # Ok(()) }
    /// ```
    pub fn lost_reason(&self) -> Option<crate::LostReason> {
        self.held.lost_reason()
    }

    /// Makes the lease last at least `ttl` from now, if the lock is still ours (it never
    /// shortens a lease).
    ///
    /// # Errors
    ///
    /// [`Error::NotOwned`] when the lock was lost (the lost signal then fires);
    /// [`Error::InvalidArgument`] for a TTL out of range; store errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if dropped, the lease is either extended or not, and the keeper's deadline
    /// stays the conservative one.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// use std::time::Duration;
    /// let locks = dlock::connect("memory://extend-doc").await?;
    /// let guard = locks.mutex("c").ttl(Duration::from_secs(1)).acquire().await?;
    /// guard.extend(Duration::from_secs(60)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let span = self.span("dlock.extend");
        let result = self.held.extend(ttl).instrument(span.clone()).await;
        span.record("outcome", outcome_of(&result));
        result
    }

    /// A span for a call on this hold, its outcome recorded when the call ends.
    fn span(&self, name: &'static str) -> tracing::Span {
        let backend = self.backend;
        match name {
            "dlock.extend" => tracing::info_span!(
                "dlock.extend",
                lock = %self.name(),
                backend,
                fence = self.fence().get(),
                outcome = tracing::field::Empty,
            ),
            _ => tracing::info_span!(
                "dlock.release",
                lock = %self.name(),
                backend,
                fence = self.fence().get(),
                outcome = tracing::field::Empty,
            ),
        }
    }

    /// Asks the store whether this hold is still the lock's (redis-py's `owned()`); it changes
    /// nothing. `false` also fires the lost signal. For a local answer with no round trip, use
    /// [`is_lost`](Self::is_lost).
    ///
    /// # Errors
    ///
    /// Store errors (the answer is then unknown).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://owned-doc").await?;
    /// let guard = locks.mutex("e").acquire().await?;
    /// assert!(guard.is_owned().await?);
    /// locks.force_release("e").await?;
    /// assert!(!guard.is_owned().await?);
    /// assert!(guard.is_lost());
    /// # Ok(()) }
    /// ```
    pub async fn is_owned(&self) -> Result<bool> {
        self.held.is_owned().await
    }

    /// Releases the lock (one hold count for a reentrant lock).
    ///
    /// # Errors
    ///
    /// [`Error::NotOwned`] when the lock had already been lost (expired, broken, taken over):
    /// whatever was done under it since may have overlapped another holder. Store errors
    /// otherwise; the lease then expires within its TTL.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in the sense that a dropped release may or may not have reached the
    /// store; the lock is then freed by its TTL at the latest.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> dlock::Result<()> {
    /// let locks = dlock::connect("memory://release-doc").await?;
    /// locks.mutex("d").acquire().await?.release().await?;
    /// assert!(locks.inspect("d").await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn release(self) -> Result<()> {
        let span = self.span("dlock.release");
        let result = self.held.release().instrument(span.clone()).await;
        span.record("outcome", outcome_of(&result));
        result
    }
}

/// Asks the store for `request`, inside a `dlock.acquire` span (lock, backend, kind, fence,
/// outcome) and with the acquire metrics (`dlock_acquire_seconds`, `dlock_wait_seconds`, the
/// `dlock_waiting` gauge): every kind of hold is acquired through here.
pub(crate) async fn acquire_observed(
    locks: &Locks,
    request: &AcquireRequest,
) -> Result<Option<Arc<dyn Lease>>> {
    let backend = locks.info().name;
    let span = tracing::info_span!(
        "dlock.acquire",
        lock = %request.name,
        backend,
        kind = HoldKind::of(request.kind).as_str(),
        fence = tracing::field::Empty,
        outcome = tracing::field::Empty,
    );
    let started = std::time::Instant::now();
    let lease = {
        // Counted as waiting while the call runs, however it ends (dropped included).
        let _waiting = Waiting::new(backend);
        let store = locks.backend();
        async {
            let answered = store.acquire(request).await;
            if let Err(error) = &answered
                && outcome_unknown(request, error)
            {
                give_back_unknown_grant(store, request).await;
            }
            answered
        }
        .instrument(span.clone())
        .await
    };
    let outcome = match &lease {
        Ok(Some(_)) => "acquired",
        Ok(None) if request.wait == Wait::No => "busy",
        Ok(None) => "timed_out",
        Err(_) => "error",
    };
    let took = started.elapsed().as_secs_f64();
    metrics::histogram!("dlock_acquire_seconds", "backend" => backend, "outcome" => outcome)
        .record(took);
    if request.wait != Wait::No {
        metrics::histogram!("dlock_wait_seconds", "backend" => backend, "outcome" => outcome)
            .record(took);
    }
    span.record("outcome", outcome);
    if let Ok(Some(lease)) = &lease {
        span.record("fence", lease.fence().get());
    }
    lease
}

/// Whether an acquire call that failed with `error` may have left a grant in the store: its
/// last attempt may have reached the store, been granted, and had its reply lost. A retryable
/// error ([`Error::is_retryable`]) says the store could not be heard, so it may have; other
/// errors are answers. A re-entry is never repeated: its token is its hold's, and a repeat
/// would count a second hold.
pub(crate) fn outcome_unknown(request: &AcquireRequest, error: &Error) -> bool {
    error.is_retryable() && !request.reentrant
}

/// Gives back the grant a call that failed with its outcome unknown may have left: one more
/// attempt with the request's own token, without waiting, finds it (or takes the lock fresh
/// where the call never reached the store), and it is released at once, by its token and
/// fence, so no other holder's lock is touched. A busy answer means nothing of this token's
/// is held. The grant is released rather than handed over, since a store's own clean-up of
/// the failed call (by the same token, in the background) may free it at any moment. When
/// the store still cannot be heard, a grant it made ends with its lease.
///
/// # Cancel safety
///
/// A dropped call leaves no hold past its lease ([`Backend::acquire`]'s contract), but may
/// leave one until then: callers run it where the caller cannot cut it short.
pub(crate) async fn give_back_by_token(store: &dyn Backend, request: &AcquireRequest) {
    let mut again = request.clone();
    again.wait = Wait::No;
    match store.acquire(&again).await {
        Ok(Some(lease)) => {
            if let Err(error) = lease.release().await {
                tracing::debug!(%error, "releasing a grant whose reply was lost failed; its lease ends it");
            }
            lease.lost().cancel();
        }
        Ok(None) => {}
        Err(error) => {
            tracing::debug!(%error, "the store still fails after an acquire of unknown outcome; a grant it made ends with its lease");
        }
    }
}

/// [`give_back_by_token`], so that it is not held until its lease ends while every other
/// contender finds the lock busy: awaited, so the lock is free when the call's error reaches
/// its caller, and on a task of its own, so a caller dropped meanwhile does not cut it short.
async fn give_back_unknown_grant(store: &DynBackend, request: &AcquireRequest) {
    let (store, request) = (store.clone(), request.clone());
    let give_back = async move { give_back_by_token(store.as_ref(), &request).await };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            let _ = runtime.spawn(give_back).await;
        }
        Err(_) => give_back.await,
    }
}

/// The `outcome` field of an extend or release span.
fn outcome_of(result: &Result<()>) -> &'static str {
    match result {
        Ok(()) => "ok",
        Err(Error::NotOwned { .. }) => "not_owned",
        Err(_) => "error",
    }
}
