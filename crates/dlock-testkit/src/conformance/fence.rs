//! Fencing tokens: strictly increasing per name across holders, clients and takeovers.

use std::time::Duration;

use anyhow::ensure;
use dlock::FencingToken;

use super::primitive::{EVERY, Held};
use super::{Ctx, Needs, cases};
use crate::checker::FencedResource;

cases!["fence",
    Needs::Any, EVERY =>
        fence_increases_across_holders,
        fence_increases_across_takeovers,
        fences_of_different_names_are_independent,
        stale_holder_writes_are_rejected_by_the_fence;
    // Breaking by name is a mutex's (see `lost.rs`).
    Needs::Monitor =>
        fence_increases_after_force_release
];

async fn fence_increases_across_holders(cx: Ctx) -> anyhow::Result<()> {
    let clients = [cx.locks().await?, cx.locks().await?, cx.locks().await?];
    let name = cx.name("fenced");
    let mut fences: Vec<FencingToken> = Vec::new();
    for round in 0..9 {
        let guard = cx.lock(&clients[round % 3], &name).acquire().await?;
        fences.push(guard.fence());
        guard.release().await?;
    }
    ensure!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    Ok(())
}

async fn fence_increases_across_takeovers(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("taken");
    let mut last = cx.lock(&a, &name).acquire().await?;
    last.release().await.map_err(|e| anyhow::anyhow!(e))?;
    let mut previous = FencingToken::new(0);
    let mut held: Vec<Held> = Vec::new();
    for round in 0..3 {
        let client = if round % 2 == 0 { &a } else { &b };
        last = cx
            .lock(client, &name)
            .ttl(Duration::from_millis(150))
            .wait(Duration::from_secs(10))
            .acquire()
            .await?;
        ensure!(
            last.fence() > previous,
            "{:?} after {:?}",
            last.fence(),
            previous
        );
        // The holder taken over knows it by the time the new holder has the lock.
        if let Some(taken) = held.last() {
            ensure!(
                taken.is_lost(),
                "round {round}: the holder taken over was not told by the takeover"
            );
        }
        previous = last.fence();
        // Not released: the next round takes the lock over when this lease expires.
        held.push(last);
    }
    Ok(())
}

async fn fences_of_different_names_are_independent(cx: Ctx) -> anyhow::Result<()> {
    // Fences are ordered per name, and only per name: interleaving two names keeps each
    // sequence increasing. (Where a sequence starts is the store's business: Redis starts
    // from its clock so fences survive a data loss.)
    let (first, second) = (cx.locks().await?, cx.locks().await?);
    let (name_a, name_b) = (cx.name("a"), cx.name("b"));
    let mut fences_a = Vec::new();
    let mut fences_b = Vec::new();
    for round in 0..4 {
        let client = if round % 2 == 0 { &first } else { &second };
        let a = cx.lock(client, &name_a).acquire().await?;
        let b = cx.lock(client, &name_b).acquire().await?;
        fences_a.push(a.fence());
        fences_b.push(b.fence());
        b.release().await?;
        a.release().await?;
    }
    ensure!(fences_a.windows(2).all(|w| w[0] < w[1]), "{fences_a:?}");
    ensure!(fences_b.windows(2).all(|w| w[0] < w[1]), "{fences_b:?}");
    Ok(())
}

async fn fence_increases_after_force_release(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("broken");
    let broken = cx.lock(&a, &name).acquire().await?;
    ensure!(b.force_release(&name).await?, "force_release found nothing");
    let next = cx.lock(&b, &name).no_wait().acquire().await?;
    ensure!(next.fence() > broken.fence());
    Ok(())
}

async fn stale_holder_writes_are_rejected_by_the_fence(cx: Ctx) -> anyhow::Result<()> {
    // The Kleppmann scenario: a holder pauses past its lease, another takes over and writes,
    // then the first wakes up and writes. The fence is what stops that write.
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("paused");
    let resource = FencedResource::new();
    let paused = cx
        .lock(&a, &name)
        .ttl(Duration::from_millis(200))
        .acquire()
        .await?;
    resource
        .write(paused.fence())
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let next = cx
        .lock(&b, &name)
        .wait(Duration::from_secs(10))
        .acquire()
        .await?;
    ensure!(
        paused.is_lost(),
        "the paused holder was not told by the time another holder got the lock"
    );
    resource
        .write(next.fence())
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    let stale = resource.write(paused.fence());
    ensure!(stale.is_err(), "a stale holder's write was accepted");
    ensure!(resource.report().rejected.len() == 1);
    next.release().await?;
    Ok(())
}
