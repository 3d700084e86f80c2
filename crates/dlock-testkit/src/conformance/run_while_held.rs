//! Run under a hold: a task run with `dlock::run_while_held` gives its output while the hold
//! lasts, and is dropped, with `Error::Lost` and the reason, as soon as the hold is lost,
//! whatever the kind of hold.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use dlock::{Error, Hold, Locks, LostReason};

use super::{Ctx, Needs, cases};

cases!["run_while_held",
    Needs::Any =>
        a_task_that_completes_returns_its_output_for_every_kind_of_hold,
        a_lost_hold_drops_the_task_and_returns_lost_for_every_kind_of_hold,
        a_hold_already_lost_never_starts_the_task;
    Needs::Monitor =>
        a_broken_hold_drops_the_task_within_one_lease
];

/// One hold of each kind, with a fixed lease of `ttl` (or the watchdog's with `None`).
async fn every_kind(
    locks: &Locks,
    cx: &Ctx,
    ttl: Option<Duration>,
) -> anyhow::Result<Vec<Box<dyn Hold>>> {
    let ttl = ttl.unwrap_or(locks.watchdog_lease());
    let fixed = ttl != locks.watchdog_lease();
    let mut holds: Vec<Box<dyn Hold>> = Vec::new();
    let mutex = locks.mutex(cx.name("mutex"));
    holds.push(Box::new(
        if fixed { mutex.ttl(ttl) } else { mutex }.acquire().await?,
    ));
    let rw = locks.rwlock(cx.name("read"));
    holds.push(Box::new(if fixed { rw.ttl(ttl) } else { rw }.read().await?));
    let rw = locks.rwlock(cx.name("write"));
    holds.push(Box::new(
        if fixed { rw.ttl(ttl) } else { rw }.write().await?,
    ));
    let permits = locks.semaphore(cx.name("permit"), 2);
    holds.push(Box::new(
        if fixed { permits.ttl(ttl) } else { permits }
            .acquire()
            .await?,
    ));
    let election = locks.election(cx.name("leader"));
    let election = if fixed { election.ttl(ttl) } else { election };
    holds.push(Box::new(election.campaign(b"").await?));
    Ok(holds)
}

/// Sets its flag when dropped: the proof a task was cancelled, not left running.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

async fn a_task_that_completes_returns_its_output_for_every_kind_of_hold(
    cx: Ctx,
) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    for hold in every_kind(&locks, &cx, None).await? {
        let fence = hold.fence();
        let out = dlock::run_while_held(&hold, async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            fence.get() + 1
        })
        .await
        .with_context(|| format!("{hold:?}"))?;
        ensure!(out == fence.get() + 1);
        ensure!(!hold.is_lost(), "the hold was given up by running a task");
        Hold::release(hold).await?;
    }
    Ok(())
}

async fn a_lost_hold_drops_the_task_and_returns_lost_for_every_kind_of_hold(
    cx: Ctx,
) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let holds = every_kind(&locks, &cx, Some(Duration::from_millis(400))).await?;
    for hold in &holds {
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(dropped.clone());
        let task = async move {
            let _flag = flag;
            std::future::pending::<()>().await;
        };
        let outcome =
            tokio::time::timeout(Duration::from_secs(10), dlock::run_while_held(hold, task))
                .await
                .with_context(|| format!("the task outlived its lost hold {hold:?}"))?;
        match outcome {
            Err(Error::Lost { reason }) => {
                ensure!(
                    reason == LostReason::Expired,
                    "reason {reason:?} for {hold:?}"
                );
                ensure!(Some(reason) == hold.lost_reason());
            }
            other => anyhow::bail!("{other:?} for {hold:?}"),
        }
        ensure!(dropped.load(Ordering::SeqCst), "the task was not dropped");
    }
    Ok(())
}

async fn a_hold_already_lost_never_starts_the_task(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let guard = locks
        .mutex(cx.name("gone"))
        .ttl(Duration::from_millis(100))
        .acquire()
        .await?;
    guard.lost().await;
    let started = AtomicBool::new(false);
    let outcome =
        dlock::run_while_held(&guard, async { started.store(true, Ordering::SeqCst) }).await;
    ensure!(
        matches!(
            outcome,
            Err(Error::Lost {
                reason: LostReason::Expired
            })
        ),
        "{outcome:?}"
    );
    ensure!(
        !started.load(Ordering::SeqCst),
        "the task ran on a lost hold"
    );
    Ok(())
}

async fn a_broken_hold_drops_the_task_within_one_lease(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx
        .locks()
        .await?
        .with_watchdog_lease(Duration::from_millis(600))?;
    let breaker = cx.locks().await?;
    let name = cx.name("broken");
    let guard = locks.mutex(&name).acquire().await?;
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = DropFlag(dropped.clone());
    let breaking = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        breaker.force_release(&name).await
    });
    let task = async move {
        let _flag = flag;
        std::future::pending::<()>().await;
    };
    let outcome =
        tokio::time::timeout(Duration::from_secs(10), dlock::run_while_held(&guard, task))
            .await
            .context("the task outlived its broken hold")?;
    ensure!(breaking.await??, "the lock was not held when broken");
    ensure!(matches!(outcome, Err(Error::Lost { .. })), "{outcome:?}");
    ensure!(dropped.load(Ordering::SeqCst), "the task was not dropped");
    Ok(())
}
