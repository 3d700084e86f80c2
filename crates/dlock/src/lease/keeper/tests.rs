//! The keeper against scripted leases, on tokio's paused clock.

use super::*;
use crate::backend::LeaseCore;
use crate::error::Error;
use crate::fence::FencingToken;
use async_trait::async_trait;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// A scripted lease: counts renewals and refuses them once `owned` is false.
#[derive(Debug)]
struct ScriptedLease {
    core: LeaseCore,
    renewals: AtomicU32,
    checks: AtomicU32,
    disowned: AtomicBool,
    unreachable: AtomicBool,
}

impl Default for ScriptedLease {
    fn default() -> ScriptedLease {
        ScriptedLease {
            core: LeaseCore::new(FencingToken::new(1), Instant::now()),
            renewals: AtomicU32::default(),
            checks: AtomicU32::default(),
            disowned: AtomicBool::default(),
            unreachable: AtomicBool::default(),
        }
    }
}

#[async_trait]
impl Lease for ScriptedLease {
    fn core(&self) -> &LeaseCore {
        &self.core
    }
    /// Always just renewed: the keeper's local deadline never ends these holds.
    fn lease_start(&self) -> Instant {
        Instant::now()
    }
    async fn extend(&self, ttl: Duration) -> crate::Result<()> {
        if self.unreachable.load(Ordering::SeqCst) {
            return Err(Error::Unavailable {
                backend: "scripted",
                source: "down".into(),
            });
        }
        if self.disowned.load(Ordering::SeqCst) {
            return Err(Error::not_owned("x"));
        }
        if ttl.is_zero() {
            self.checks.fetch_add(1, Ordering::SeqCst);
        } else {
            self.renewals.fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
    async fn release(&self) -> crate::Result<()> {
        Ok(())
    }
}

fn label() -> LeaseLabel {
    LeaseLabel {
        name: "keeper-test".into(),
        backend: "test",
    }
}

fn watchdog(ttl_ms: u64) -> KeepPolicy {
    KeepPolicy {
        ttl: Duration::from_millis(ttl_ms),
        renew: true,
        max_hold: None,
    }
}

/// A scripted lease that `keeper` keeps under `policy` from now: the lease, the instant it
/// started and its registration.
fn kept(keeper: &Keeper, policy: KeepPolicy) -> (Arc<ScriptedLease>, Instant, Registration) {
    let lease = Arc::new(ScriptedLease::default());
    let start = Instant::now();
    let reg = keeper.register(lease.clone(), label(), policy, start);
    (lease, start, reg)
}

/// A fixed TTL: the keeper checks the lease but never renews it.
fn fixed(ttl_ms: u64) -> KeepPolicy {
    KeepPolicy {
        renew: false,
        ..watchdog(ttl_ms)
    }
}

#[tokio::test(start_paused = true)]
async fn watchdog_renews_through_many_ttls() {
    let keeper = Keeper::default();
    let (lease, _, reg) = kept(&keeper, watchdog(300));
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert!(!lease.lost().is_cancelled());
    let n = lease.renewals.load(Ordering::SeqCst);
    assert!((25..=31).contains(&n), "{n} renewals in 10 TTLs");
    drop(reg);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        lease.renewals.load(Ordering::SeqCst),
        n,
        "renewal continued after release"
    );
    assert_eq!(keeper.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn refused_renewal_fires_lost_at_once() {
    let keeper = Keeper::default();
    let (lease, _, _reg) = kept(&keeper, watchdog(300));
    lease.disowned.store(true, Ordering::SeqCst);
    let start = Instant::now();
    lease.lost().cancelled().await;
    assert!(start.elapsed() <= Duration::from_millis(101));
}

#[tokio::test(start_paused = true)]
async fn unreachable_store_fires_lost_at_the_deadline() {
    let keeper = Keeper::default();
    let (lease, start, _reg) = kept(&keeper, watchdog(300));
    lease.unreachable.store(true, Ordering::SeqCst);
    lease.lost().cancelled().await;
    assert_eq!(start.elapsed(), trusted(Duration::from_millis(300)));
}

#[tokio::test(start_paused = true)]
async fn fixed_ttl_is_not_renewed_and_fires_lost_at_expiry() {
    let keeper = Keeper::default();
    let (lease, start, reg) = kept(&keeper, fixed(500));
    tokio::time::sleep(Duration::from_millis(400)).await;
    reg.extended(Instant::now(), Duration::from_millis(500));
    lease.lost().cancelled().await;
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(400) + trusted(Duration::from_millis(500))
    );
    assert_eq!(lease.renewals.load(Ordering::SeqCst), 0);
}

#[tokio::test(start_paused = true)]
async fn fixed_ttl_is_checked_every_third_and_a_break_fires_lost_at_the_next_check() {
    let keeper = Keeper::default();
    let (lease, start, _reg) = kept(&keeper, fixed(600));
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        lease.checks.load(Ordering::SeqCst),
        1,
        "one check at 200 ms"
    );
    lease.disowned.store(true, Ordering::SeqCst);
    lease.lost().cancelled().await;
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(400),
        "lost at the second check"
    );
    assert_eq!(
        lease.renewals.load(Ordering::SeqCst),
        0,
        "a fixed lease was extended"
    );
}

#[tokio::test(start_paused = true)]
async fn the_keeper_restarts_after_its_runtime_died() {
    let keeper = Keeper::default();
    let first = Arc::new(ScriptedLease::default());
    let stale = std::thread::spawn({
        let (keeper, first) = (keeper.clone(), first.clone());
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let registration = runtime
                .block_on(async { keeper.register(first, label(), watchdog(300), Instant::now()) });
            drop(runtime); // the keeper task dies mid-sleep
            registration
        }
    })
    .join()
    .unwrap();
    let second = Arc::new(ScriptedLease::default());
    let _reg = keeper.register(second.clone(), label(), watchdog(300), Instant::now());
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        second.renewals.load(Ordering::SeqCst) >= 5,
        "no keeper after the first runtime died"
    );
    drop(stale);
}

#[tokio::test(start_paused = true)]
async fn max_hold_stops_renewal() {
    let keeper = Keeper::default();
    let policy = KeepPolicy {
        max_hold: Some(Duration::from_millis(1000)),
        ..watchdog(300)
    };
    let (lease, start, _reg) = kept(&keeper, policy);
    lease.lost().cancelled().await;
    let held = start.elapsed();
    assert!(
        held >= Duration::from_millis(1000) && held <= Duration::from_millis(1300),
        "{held:?}"
    );
}
