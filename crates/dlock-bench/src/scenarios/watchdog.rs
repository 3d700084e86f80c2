//! Watchdog scale: one process holds K locks renewed by its lease keeper; renewals per
//! second reaching the store, the process's CPU and its memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::results::WatchdogScale;
use crate::stats::Spread;
use crate::system::{cpu_time, rss_mib};
use crate::{BenchArgs, unique_name};

/// Counts the renewals that reach the store, by wrapping every lease.
#[derive(Debug)]
struct Counting {
    inner: dlock::backend::DynBackend,
    extends: Arc<AtomicU64>,
}

#[derive(Debug)]
struct CountingLease {
    inner: Arc<dyn dlock::backend::Lease>,
    extends: Arc<AtomicU64>,
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl dlock::backend::Backend for Counting {
    fn info(&self) -> &dlock::backend::BackendInfo {
        self.inner.info()
    }

    async fn acquire(
        &self,
        req: &dlock::backend::AcquireRequest,
    ) -> dlock::Result<Option<Arc<dyn dlock::backend::Lease>>> {
        Ok(self.inner.acquire(req).await?.map(|inner| {
            Arc::new(CountingLease {
                inner,
                extends: self.extends.clone(),
            }) as Arc<dyn dlock::backend::Lease>
        }))
    }

    fn monitor(&self) -> Option<&dyn dlock::backend::MonitorStore> {
        self.inner.monitor()
    }

    async fn try_acquire_all(
        &self,
        _reqs: &[dlock::backend::AcquireRequest],
    ) -> Option<dlock::Result<Option<Vec<Arc<dyn dlock::backend::Lease>>>>> {
        None // counted one by one
    }

    fn values(&self) -> Option<&dyn dlock::backend::ValueStore> {
        self.inner.values()
    }
}

#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl dlock::backend::Lease for CountingLease {
    fn core(&self) -> &dlock::backend::LeaseCore {
        self.inner.core()
    }

    fn fence(&self) -> dlock::FencingToken {
        self.inner.fence()
    }

    fn lost(&self) -> &tokio_util::sync::CancellationToken {
        self.inner.lost()
    }

    fn lease_start(&self) -> tokio::time::Instant {
        self.inner.lease_start()
    }

    async fn extend(&self, ttl: Duration) -> dlock::Result<()> {
        self.extends.fetch_add(1, Ordering::Relaxed);
        self.inner.extend(ttl).await
    }

    async fn release(&self) -> dlock::Result<()> {
        self.inner.release().await
    }

    async fn release_elsewhere(&self) -> dlock::Result<()> {
        self.inner.release_elsewhere().await
    }

    async fn put_fenced(
        &self,
        value: &dlock::LockName,
        bytes: &[u8],
    ) -> dlock::Result<Option<u64>> {
        self.inner.put_fenced(value, bytes).await
    }
}

/// How long a release refused as not owned waits for the hold's lost signal before it counts
/// as an error: the keeper's deadline is before the store's, so the signal is due already.
const LOSS_SIGNAL_GRACE: Duration = Duration::from_millis(200);

pub(crate) async fn watchdog(url: &str, args: &BenchArgs) -> anyhow::Result<WatchdogScale> {
    let base = dlock::connect(url).await?;
    let extends = Arc::new(AtomicU64::new(0));
    let locks = dlock::Locks::new(Counting {
        inner: base.backend().clone(),
        extends: extends.clone(),
    })
    .with_watchdog_lease(args.lease)?;
    let (mut rates, mut cpus, mut rss, mut rss_total) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut lost = 0;
    let mut serve = None;
    for run in 0..args.repeat.max(1) {
        let prefix = unique_name("watchdog");
        let rss_before = rss_mib();
        let mut guards = Vec::with_capacity(args.held as usize);
        for i in 0..args.held {
            guards.push(locks.mutex(format!("{prefix}/{i}")).acquire().await?);
        }
        // Let the first renewals spread out, then measure a steady stretch.
        tokio::time::sleep(args.lease / 3).await;
        let (count0, cpu0, t0) = (extends.load(Ordering::Relaxed), cpu_time(), Instant::now());
        tokio::time::sleep(args.duration).await;
        let elapsed = t0.elapsed().as_secs_f64();
        rates.push((extends.load(Ordering::Relaxed) - count0) as f64 / elapsed);
        cpus.push(100.0 * (cpu_time() - cpu0).as_secs_f64() / elapsed);
        rss_total.push(rss_mib());
        rss.push(rss_mib() - rss_before);
        // `dlock serve` lists the locks it serves: a store that cannot list them (files, the
        // SQL session modes) has no serve figures.
        if run == 0 && locks.info().capabilities.list {
            // Outside the measured stretch: the serving process loads the store, not this one.
            let url = url.to_owned();
            let rounds = args.repeat;
            serve = tokio::task::spawn_blocking(move || super::serve_scrape::scrape(&url, rounds))
                .await??;
        }
        lost += guards.iter().filter(|g| g.is_lost()).count() as u64;
        for guard in guards {
            let (was_lost, signal) = (guard.is_lost(), guard.lost_token());
            match guard.release().await {
                // Counted above; the run reports it rather than stopping at it.
                Err(dlock::Error::NotOwned { .. }) if was_lost => {}
                // A lease that ran out while these releases went one by one: its keeper tells
                // it by the time the store has let go (its deadline comes first), so it is a
                // loss to count, not an error; a release refused without that signal is one.
                Err(dlock::Error::NotOwned { .. })
                    if tokio::time::timeout(LOSS_SIGNAL_GRACE, signal.cancelled())
                        .await
                        .is_ok() =>
                {
                    lost += 1;
                }
                other => other?,
            }
        }
    }
    Ok(WatchdogScale {
        held: args.held,
        lease_ms: args.lease.as_secs_f64() * 1e3,
        renewals_per_sec: Spread::of(rates),
        cpu_percent: Spread::of(cpus),
        rss_growth_mib: Spread::of(rss),
        rss_mib: Some(Spread::of(rss_total)),
        serve,
        lost,
    })
}
