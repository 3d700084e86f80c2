//! The bounded-state workload: many distinct names, each taken and released, or taken by a
//! holder that vanished, or waited for by a fair waiter that vanished while queued. Once the
//! leases and the waiters' places have ended, nothing of any name may be left in the store.
//!
//! Holders and waiters vanish as a crashed process does: they use a client that reaches the
//! store through a [`FaultProxy`], which goes silent before the client is dropped, so no
//! clean-up of theirs ever arrives. (Forgetting the futures of a live client is not a crash:
//! a forgotten future can keep a permit of its connection's request queue, and enough of them
//! stall the client; and a live client keeps a session, with its ephemeral state, alive.)

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::time::Duration;

use anyhow::{Context, ensure};
use dlock::Locks;
use futures::StreamExt;
use tokio::time::{Instant, sleep, timeout};

use crate::fault_proxy::{FaultProxy, NetFault};

/// A question about the store, asked by the workload.
pub type Probe<T> = Pin<Box<dyn Future<Output = anyhow::Result<T>> + Send>>;

/// How many names share one crashing client.
const ROUND: usize = 3_000;

/// Parallel acquire calls at once.
const CONCURRENCY: usize = 64;

/// The store under test and how to look into it.
pub struct BoundedStore {
    /// The client of the holders that stay (they release, or their lease runs out).
    pub holders: Locks,
    /// The store's address, which the crashing clients reach through a proxy.
    pub upstream: SocketAddr,
    /// The URL of a client that reaches the store at the given (proxy) address.
    pub url_via: Box<dyn Fn(SocketAddr) -> String + Send + Sync>,
    /// Distinct names; every third vanishes as a holder, every third as a waiter.
    pub names: usize,
    /// The holders' fixed lease.
    pub ttl: Duration,
    /// Whether the store shows a waiter of `name` (its queue entry).
    pub queued: Box<dyn Fn(String) -> Probe<bool> + Send + Sync>,
    /// What the store holds for lock names: how many entries, and a few of them.
    pub left: Box<dyn Fn() -> Probe<(usize, Vec<String>)> + Send + Sync>,
    /// Entries that may stay however many names were used (store-wide counters).
    pub allowed: usize,
    /// How long clean-up may take once every lease and waiter place has ended.
    pub settle: Duration,
}

impl std::fmt::Debug for BoundedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundedStore")
            .field("upstream", &self.upstream)
            .field("names", &self.names)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Runs the workload on `store` and checks that nothing per name is left.
///
/// # Errors
///
/// A busy name, a waiter that never queued or got in beside its holder, a store error, a
/// workload that left nothing to clean up (it would prove nothing), or entries left once
/// `settle` has passed.
pub async fn nothing_per_name_is_left(store: BoundedStore) -> anyhow::Result<()> {
    let store = &store;
    let mut start = 0;
    while start < store.names {
        let names = start..(start + ROUND).min(store.names);
        start = names.end;
        let proxy = FaultProxy::start(&[store.upstream])?;
        let crashing = dlock::connect(&(store.url_via)(proxy.addrs()[0])).await?;
        let outcomes = futures::stream::iter(names)
            .map(|i| one_name(store, &crashing, i))
            .buffer_unordered(CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        let vanishing = outcomes.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
        // The crash: nothing more from this client reaches the store.
        proxy.set(NetFault::Blackhole);
        drop(vanishing);
        drop(crashing);
        drop(proxy);
    }
    let (entries, _) = (store.left)().await?;
    ensure!(
        entries > store.allowed,
        "the workload left no state at all to clean up"
    );
    sleep(store.ttl + Duration::from_secs(1)).await;
    let deadline = Instant::now() + store.settle;
    loop {
        let (entries, some) = (store.left)().await?;
        if entries <= store.allowed {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{entries} entries left for {} names after {:?}, e.g. {some:?}",
            store.names,
            store.settle
        );
        sleep(Duration::from_millis(500)).await;
    }
}

/// What a vanishing holder or waiter leaves to drop with its crashed client.
type Vanishing = Option<Box<dyn std::any::Any + Send>>;

/// One name's share of the workload.
async fn one_name(store: &BoundedStore, crashing: &Locks, i: usize) -> anyhow::Result<Vanishing> {
    let name = format!("bounded/{i}");
    let holders = if i % 3 == 1 { crashing } else { &store.holders };
    let asked = Instant::now();
    let guard = holders.mutex(&name).ttl(store.ttl).try_acquire().await?;
    let guard = guard.with_context(|| format!("{name} was busy"))?;
    match i % 3 {
        0 => {
            release(guard).await?;
            Ok(None)
        }
        // The holder vanishes with its client.
        1 => Ok(Some(Box::new(guard))),
        // A fair waiter queues behind the holder, then vanishes with its client.
        _ => {
            let mut waiting = Box::pin(
                crashing
                    .mutex(&name)
                    .fair()
                    .wait(Duration::from_secs(60))
                    .acquire(),
            );
            let until = Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(got) = timeout(Duration::from_millis(5), &mut waiting).await {
                    // Only once the holder's lease ran out (a slow, loaded machine): then the
                    // waiter vanishes as a holder instead.
                    ensure!(
                        asked.elapsed() >= store.ttl,
                        "{name}: the waiter got in beside the holder"
                    );
                    let got = got?;
                    release(guard).await?;
                    return Ok(Some(Box::new(got)));
                }
                if (store.queued)(name.clone()).await? {
                    break;
                }
                ensure!(Instant::now() < until, "{name}: the waiter never queued");
            }
            release(guard).await?;
            Ok(Some(Box::new(waiting)))
        }
    }
}

/// Releases `guard`; on a loaded machine its short lease may have run out already.
async fn release(guard: dlock::MutexGuard) -> anyhow::Result<()> {
    match guard.release().await {
        Ok(()) | Err(dlock::Error::NotOwned { .. }) => Ok(()),
        Err(error) => Err(error.into()),
    }
}
