//! Deliberately broken stores for the safety suite's canaries: each wraps a real backend and
//! breaks one promise, and the checker must report the violation (a checker that passes a
//! canary proves nothing about the library).
//!
//! - [`Canary::LateSignal`]: the store keeps each lease for half the TTL the client asked for,
//!   while the client's keeper still trusts the whole TTL: a keeper that trusts leases twice as
//!   long as the store, so a holder hears of its loss after another holder got in.
//! - [`Canary::RepeatFence`]: every fourth grant reports the fence of this process's previous
//!   grant of the same name instead of its own, so two holds carry fences that do not grow
//!   (a composed semaphore's slot locks have names of their own: a slot's fence repeats).
//! - [`Canary::FenceBehind`]: every fourth grant reports its fence less one, the fence of the
//!   name's previous grant on stores that count fences up by one per name: a store handing
//!   the same term to two leaders (the election's record accepts it, as the term it holds is
//!   not lower than the record's).
//! - [`Canary::NeverTold`]: the keeper and the store fire a hold's loss signal as always, but
//!   the guard never hears of it: a keeper that never tells.
//! - [`Canary::ToldLate`]: the guard hears of a loss one lease after it was signalled: a
//!   keeper that tells a lease late.
//! - [`Canary::StaleReads`]: an election observer's reads come from a replica
//!   [`STALE_READ_LAG`](super::election::STALE_READ_LAG) behind (the workers' store is
//!   untouched).
//! - [`Canary::StopsRenewing`]: a hold's first renewal reaches the store, every later one is
//!   dropped while the keeper is told it succeeded: a keeper that stops renewing a watchdog
//!   hold mid-hold and tells nobody (the renewal soak must flag it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use dlock::FencingToken;
use dlock::backend::{
    AcquireRequest, Backend, BackendInfo, DynBackend, Lease, LeaseCore, MonitorStore, ValueStore,
};
use tokio_util::sync::CancellationToken;

/// Which promise the worker's store breaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Canary {
    /// None: the store as it is.
    #[default]
    None,
    /// Leases last half as long in the store as the keeper believes.
    LateSignal,
    /// Every fourth grant repeats the process's previous fence of the same name.
    RepeatFence,
    /// Every fourth grant reports its fence less one.
    FenceBehind,
    /// The guard is never told of a loss.
    NeverTold,
    /// The guard is told of a loss one lease (the TTL asked for) after it was signalled.
    ToldLate,
    /// An election observer reads from a lagging replica.
    StaleReads,
    /// Renewals after a hold's first one never reach the store, and are reported done.
    StopsRenewing,
}

impl Canary {
    /// The worker argument's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Canary::None => "none",
            Canary::LateSignal => "late-signal",
            Canary::RepeatFence => "repeat-fence",
            Canary::FenceBehind => "fence-behind",
            Canary::NeverTold => "never-told",
            Canary::ToldLate => "told-late",
            Canary::StaleReads => "stale-reads",
            Canary::StopsRenewing => "stops-renewing",
        }
    }

    /// The inverse of [`as_str`](Self::as_str).
    pub fn parse(text: &str) -> Option<Canary> {
        [
            Canary::None,
            Canary::LateSignal,
            Canary::RepeatFence,
            Canary::FenceBehind,
            Canary::NeverTold,
            Canary::ToldLate,
            Canary::StaleReads,
            Canary::StopsRenewing,
        ]
        .into_iter()
        .find(|canary| canary.as_str() == text)
    }

    /// Whether the workers' store is the one broken (not only an observer's).
    pub fn breaks_holders(self) -> bool {
        !matches!(self, Canary::None | Canary::StaleReads)
    }

    /// `backend` broken as this canary says.
    pub fn wrap(self, backend: DynBackend) -> DynBackend {
        match self {
            Canary::None => backend,
            Canary::StaleReads => super::election::lagging(backend),
            canary => Arc::new(Broken {
                inner: backend,
                canary,
                grants: Mutex::new((0, HashMap::new())),
            }),
        }
    }
}

#[derive(Debug)]
struct Broken {
    inner: DynBackend,
    canary: Canary,
    /// Grants so far, and the fence of the last one of each name.
    grants: Mutex<(u64, HashMap<String, FencingToken>)>,
}

#[async_trait]
impl Backend for Broken {
    fn info(&self) -> &BackendInfo {
        self.inner.info()
    }

    async fn acquire(&self, req: &AcquireRequest) -> dlock::Result<Option<Arc<dyn Lease>>> {
        let mut req = req.clone();
        if self.canary == Canary::LateSignal {
            req.ttl /= 2;
        }
        let Some(lease) = self.inner.acquire(&req).await? else {
            return Ok(None);
        };
        let fence = {
            let mut grants = self.grants.lock().unwrap_or_else(PoisonError::into_inner);
            grants.0 += 1;
            let real = lease.fence();
            let name = req.name.as_str().to_owned();
            let fourth = grants.0.is_multiple_of(4);
            let shown = match grants.1.get(&name) {
                Some(&previous) if self.canary == Canary::RepeatFence && fourth => previous,
                _ if self.canary == Canary::FenceBehind && fourth && real.get() > 1 => {
                    FencingToken::new(real.get() - 1)
                }
                _ => real,
            };
            grants.1.insert(name, real);
            shown
        };
        // What the guard hears: the loss signal itself, or one that stays silent, or one that
        // follows it a lease late.
        let told = match self.canary {
            Canary::NeverTold => Some(CancellationToken::new()),
            Canary::ToldLate => {
                let (told, signal, lease_ttl) =
                    (CancellationToken::new(), lease.lost().clone(), req.ttl);
                let telling = told.clone();
                tokio::spawn(async move {
                    signal.cancelled().await;
                    tokio::time::sleep(lease_ttl).await;
                    telling.cancel();
                });
                Some(told)
            }
            _ => None,
        };
        Ok(Some(Arc::new(BrokenLease {
            core: lease.core().with_fence(fence),
            inner: lease,
            halve: self.canary == Canary::LateSignal,
            renewals_left: (self.canary == Canary::StopsRenewing).then(|| AtomicU32::new(1)),
            told,
        })))
    }

    // `try_acquire_all` is left to its default (none), so multi-locks go through `acquire`
    // one lock at a time and every part is broken alike.

    fn monitor(&self) -> Option<&dyn MonitorStore> {
        self.inner.monitor()
    }

    fn values(&self) -> Option<&dyn ValueStore> {
        self.inner.values()
    }
}

#[derive(Debug)]
struct BrokenLease {
    inner: Arc<dyn Lease>,
    /// The inner lease's, under the canary's fence (the loss signal is shared).
    core: LeaseCore,
    halve: bool,
    /// Renewals that still reach the store (`None`: every one does).
    renewals_left: Option<AtomicU32>,
    /// The token the guard watches instead of the loss signal, if the canary says so.
    told: Option<CancellationToken>,
}

#[async_trait]
impl Lease for BrokenLease {
    fn core(&self) -> &LeaseCore {
        &self.core
    }

    // The keeper fires the core's signal; the guard reads this.
    fn lost(&self) -> &CancellationToken {
        self.told.as_ref().unwrap_or_else(|| self.core.lost())
    }

    async fn extend(&self, ttl: Duration) -> dlock::Result<()> {
        if let Some(left) = &self.renewals_left
            && left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_err()
        {
            // Dropped, and reported done: the store's lease runs out under a trusting keeper.
            return Ok(());
        }
        self.inner
            .extend(if self.halve { ttl / 2 } else { ttl })
            .await
    }

    async fn release(&self) -> dlock::Result<()> {
        self.inner.release().await
    }

    async fn release_elsewhere(&self) -> dlock::Result<()> {
        self.inner.release_elsewhere().await
    }
}
