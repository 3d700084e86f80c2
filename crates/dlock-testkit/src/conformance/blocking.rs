//! The blocking facade (`dlock::blocking`) on every store with a URL: its calls run the lock's
//! future on the caller's own thread, where a store may use blocking I/O instead of its async
//! connection (Redis does), so its promises are checked here store by store.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use dlock::blocking::Locks;
use dlock::{Error, LostReason};

use super::{Ctx, Needs, cases, expect_err};

cases!["blocking",
    Needs::CrossProcess =>
        blocking_clients_exclude_each_other_and_fences_rise,
        a_blocking_waiter_is_handed_the_lock_when_it_is_released,
        a_blocking_hold_is_told_when_its_fixed_lease_ends,
        a_blocking_watchdog_hold_outlives_its_lease_while_the_thread_sleeps,
        a_dropped_blocking_guard_has_released_when_drop_returns,
        a_blocking_task_run_while_held_is_told_to_stop_and_lost_is_returned
];

/// Runs `work` on a thread of its own, outside any runtime (the blocking facade refuses to run
/// on a runtime's threads, `spawn_blocking`'s included), and waits for it without blocking
/// the case's runtime.
pub(super) async fn on_plain_thread<T: Send + 'static>(
    work: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = done.send(work());
    });
    result.await.context("the blocking thread panicked")?
}

async fn blocking_clients_exclude_each_other_and_fences_rise(cx: Ctx) -> anyhow::Result<()> {
    const THREADS: usize = 3;
    const ROUNDS: usize = 12;
    let url = cx.url()?;
    let name = cx.name("shared");
    let inside = Arc::new(AtomicBool::new(false));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let (url, name, inside, fences) =
                (url.clone(), name.clone(), inside.clone(), fences.clone());
            on_plain_thread(move || {
                let locks = Locks::connect(&url)?;
                for _ in 0..ROUNDS {
                    let guard = locks
                        .mutex(&name)
                        .ttl(Duration::from_secs(30))
                        .wait(Duration::from_secs(60))
                        .acquire()?;
                    ensure!(
                        !inside.swap(true, Ordering::SeqCst),
                        "two blocking holders at once"
                    );
                    fences
                        .lock()
                        .map_err(|_| anyhow::anyhow!("poisoned"))?
                        .push(guard.fence());
                    std::thread::sleep(Duration::from_millis(2));
                    inside.store(false, Ordering::SeqCst);
                    guard.release()?;
                }
                Ok(())
            })
        })
        .collect();
    for thread in futures::future::join_all(threads).await {
        thread?;
    }
    let fences = fences.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    ensure!(fences.len() == THREADS * ROUNDS, "{} holds", fences.len());
    ensure!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences did not rise in hold order: {fences:?}"
    );
    Ok(())
}

async fn a_blocking_waiter_is_handed_the_lock_when_it_is_released(cx: Ctx) -> anyhow::Result<()> {
    let url = cx.url()?;
    let name = cx.name("handed");
    on_plain_thread(move || {
        let holder = Locks::connect(&url)?;
        let waiter = Locks::connect(&url)?;
        let held = holder.mutex(&name).ttl(Duration::from_secs(30)).acquire()?;
        let held_fence = held.fence();
        let wanted = name.clone();
        let waiting = std::thread::spawn(move || {
            waiter
                .mutex(&wanted)
                .ttl(Duration::from_secs(30))
                .wait(Duration::from_secs(30))
                .acquire()
                .map(|guard| (guard.fence(), guard))
        });
        std::thread::sleep(Duration::from_millis(300));
        ensure!(
            !waiting.is_finished(),
            "the waiter got the lock while it was held"
        );
        held.release()?;
        let (fence, next) = waiting
            .join()
            .map_err(|_| anyhow::anyhow!("the waiter panicked"))??;
        ensure!(fence > held_fence, "fence {fence} after {held_fence}");
        next.release()?;
        Ok(())
    })
    .await
}

async fn a_blocking_hold_is_told_when_its_fixed_lease_ends(cx: Ctx) -> anyhow::Result<()> {
    let url = cx.url()?;
    let name = cx.name("expiring");
    on_plain_thread(move || {
        let locks = Locks::connect(&url)?;
        let guard = locks
            .mutex(&name)
            .ttl(Duration::from_millis(300))
            .acquire()?;
        ensure!(!guard.is_lost(), "lost at once");
        ensure!(
            guard.wait_lost(Duration::from_secs(10))?,
            "no lost signal after the lease ended"
        );
        expect_err!(guard.release(), Error::NotOwned { .. });
        Ok(())
    })
    .await
}

async fn a_blocking_watchdog_hold_outlives_its_lease_while_the_thread_sleeps(
    cx: Ctx,
) -> anyhow::Result<()> {
    let url = cx.url()?;
    let name = cx.name("watched");
    on_plain_thread(move || {
        let lease = Duration::from_millis(1500);
        let locks = Locks::connect(&url)?.with_watchdog_lease(lease)?;
        let other = Locks::connect(&url)?;
        let guard = locks.mutex(&name).acquire()?;
        // The thread does other work: only the client's runtime can renew meanwhile.
        std::thread::sleep(lease * 2);
        ensure!(!guard.is_lost(), "the watched hold was lost");
        ensure!(guard.is_owned()?, "the store no longer has the hold");
        ensure!(
            other.mutex(&name).try_acquire()?.is_none(),
            "another client got the watched lock"
        );
        guard.release()?;
        Ok(())
    })
    .await
}

async fn a_dropped_blocking_guard_has_released_when_drop_returns(cx: Ctx) -> anyhow::Result<()> {
    let url = cx.url()?;
    let name = cx.name("dropped");
    on_plain_thread(move || {
        let locks = Locks::connect(&url)?;
        let other = Locks::connect(&url)?;
        drop(locks.mutex(&name).ttl(Duration::from_secs(30)).acquire()?);
        let next = other
            .mutex(&name)
            .ttl(Duration::from_secs(30))
            .try_acquire()?;
        ensure!(next.is_some(), "the dropped guard's lock was still held");
        Ok(())
    })
    .await
}

/// Runs a task under `$guard` (a 400 ms fixed lease) that waits for its token, and checks that
/// the token told it to stop and `Error::Lost` came with the guard's reason, `Expired`.
macro_rules! lost_mid_task {
    ($guard:expr) => {{
        let guard = $guard;
        let mut told = false;
        let outcome = guard.run_while_held(|lost| {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !lost.is_cancelled() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            told = lost.is_cancelled();
        });
        ensure!(told, "the task was never told the hold was lost");
        match outcome {
            Err(Error::Lost { reason }) => ensure!(
                reason == LostReason::Expired && Some(reason) == guard.lost_reason(),
                "reason {reason:?}, the guard says {:?}",
                guard.lost_reason()
            ),
            other => anyhow::bail!("{other:?} from a task whose hold was lost"),
        }
    }};
}

async fn a_blocking_task_run_while_held_is_told_to_stop_and_lost_is_returned(
    cx: Ctx,
) -> anyhow::Result<()> {
    let url = cx.url()?;
    let [mutex, rw_read, rw_write, permits, leader] =
        ["mutex", "read", "write", "permit", "leader"].map(|part| cx.name(part));
    on_plain_thread(move || {
        let locks = Locks::connect(&url)?;
        let long = locks.mutex(&mutex).ttl(Duration::from_secs(30)).acquire()?;
        ensure!(
            long.run_while_held(|_| 7)? == 7,
            "the output was not returned"
        );
        ensure!(!long.is_lost(), "running a task gave the hold up");
        long.release()?;
        // Long enough for a composed write (33 locks) or a campaign and its published value
        // to be whole on a loaded machine before the lease runs out.
        let ttl = Duration::from_millis(1500);
        lost_mid_task!(locks.mutex(&mutex).ttl(ttl).acquire()?);
        lost_mid_task!(locks.rwlock(&rw_read).ttl(ttl).read()?);
        lost_mid_task!(locks.rwlock(&rw_write).ttl(ttl).write()?);
        lost_mid_task!(locks.semaphore(&permits, 2).ttl(ttl).acquire()?);
        lost_mid_task!(locks.election(&leader).ttl(ttl).campaign(b"")?);
        // A hold already lost never starts the task.
        let gone = locks.mutex(&mutex).ttl(ttl).acquire()?;
        ensure!(gone.wait_lost(Duration::from_secs(10))?, "never lost");
        let mut started = false;
        let outcome = gone.run_while_held(|_| started = true);
        ensure!(matches!(outcome, Err(Error::Lost { .. })), "{outcome:?}");
        ensure!(!started, "the task ran on a lost hold");
        Ok(())
    })
    .await
}
