//! An acquire repeated with its own token (an acquire loop's retry after the reply to a
//! granting attempt was lost) takes the grant it already has, and that grant's lease then runs
//! a full TTL from the retry. The lease keeper dates the lease from the retry's reply: a store
//! that kept the first grant's end would let the hold expire while its holder still trusts it,
//! and a second holder in before the first is told. One case per kind of hold.

use std::time::{Duration, Instant};

use anyhow::ensure;
use dlock::backend::{AcquireRequest, LockKind, Wait};
use dlock::{LockName, Owner};

use super::{Ctx, Needs, cases};

cases!["retry",
    Needs::RetryFindsItsGrant => a_retried_mutex_grant_runs_a_full_lease_from_the_retry;
    Needs::RetryFindsItsPermit => a_retried_permit_runs_a_full_lease_from_the_retry;
    Needs::RetryFindsItsRwHold =>
        a_retried_read_hold_runs_a_full_lease_from_the_retry,
        a_retried_write_hold_runs_a_full_lease_from_the_retry
];

/// The lease: the retry comes at half of it, the check a quarter past the first grant's end,
/// so each side has a quarter of a lease (a second) of slack.
const TTL: Duration = Duration::from_secs(4);

async fn a_retried_mutex_grant_runs_a_full_lease_from_the_retry(cx: Ctx) -> anyhow::Result<()> {
    renewed_by_its_retry(cx, LockKind::Exclusive, LockKind::Exclusive).await
}

async fn a_retried_permit_runs_a_full_lease_from_the_retry(cx: Ctx) -> anyhow::Result<()> {
    let one = LockKind::Permit { permits: 1 };
    renewed_by_its_retry(cx, one, one).await
}

async fn a_retried_read_hold_runs_a_full_lease_from_the_retry(cx: Ctx) -> anyhow::Result<()> {
    // Another reader would share the hold: a writer is the one it keeps out.
    renewed_by_its_retry(cx, LockKind::Read { max_readers: 64 }, LockKind::Write).await
}

async fn a_retried_write_hold_runs_a_full_lease_from_the_retry(cx: Ctx) -> anyhow::Result<()> {
    renewed_by_its_retry(cx, LockKind::Write, LockKind::Write).await
}

fn request(name: &str, kind: LockKind) -> anyhow::Result<AcquireRequest> {
    let mut request = AcquireRequest::new(
        LockName::new(name)?,
        uuid::Uuid::new_v4().simple().to_string(),
        Owner::current(),
        TTL,
        Wait::No,
    );
    request.kind = kind;
    Ok(request)
}

/// Grants `kind`, repeats the same request at half the lease, and checks past the first
/// grant's end that a rival of kind `rival` is still kept out; after the release it gets in.
async fn renewed_by_its_retry(cx: Ctx, kind: LockKind, rival: LockKind) -> anyhow::Result<()> {
    let (locks, other) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("renewed");
    let held = request(&name, kind)?;
    let asked = Instant::now();
    let _first = locks
        .backend()
        .acquire(&held)
        .await?
        .ok_or_else(|| anyhow::anyhow!("not acquired"))?;
    tokio::time::sleep_until((asked + TTL / 2).into()).await;
    let retried = locks
        .backend()
        .acquire(&held)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the retry found its own grant busy"))?;
    // The first grant's lease ended by TTL after `asked` (plus one round trip); the retry's
    // runs until TTL after it, at 1.5 TTL.
    tokio::time::sleep_until((asked + TTL * 5 / 4).into()).await;
    let probe = request(&name, rival)?;
    let rival_got = other.backend().acquire(&probe).await?;
    ensure!(
        rival_got.is_none(),
        "a rival ({rival:?}) got in {:?} after a {kind:?} grant that was retried at half its \
         {TTL:?} lease: the retry kept the first grant's lease end instead of a full lease",
        asked.elapsed()
    );
    retried.release().await?;
    let after = other
        .backend()
        .acquire(&probe)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the released hold still kept the rival out"))?;
    after.release().await?;
    Ok(())
}
