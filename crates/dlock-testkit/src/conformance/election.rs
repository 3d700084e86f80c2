//! Leader election: one leader at a time, terms that only rise, a published value that
//! follows the leader, hand-over on resign, losses told with their reason and never observed
//! after, nothing left by a cancelled campaign, bad input refused with no state.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use dlock::election::MAX_ELECTION_VALUE_LEN;
use dlock::{Error, FencingToken, Leader, Locks};
use futures::StreamExt;

use super::{Ctx, Needs, cases, drop_after_polls, expect_err};

cases!["election",
    Needs::Any =>
        one_leader_at_a_time_across_clients_with_rising_terms,
        resign_hands_over_to_the_next_campaigner,
        a_leader_whose_term_runs_out_is_told_with_its_reason,
        cancelling_a_campaign_leaves_nothing_behind,
        bad_election_input_gives_a_typed_error_and_no_state;
    Needs::Monitor =>
        leader_reports_the_holder_and_nobody_after_resign,
        a_broken_leader_is_told_and_never_observed_after,
        observe_reports_every_term_in_rising_order;
    Needs::MonitorValues =>
        proclaim_is_visible_to_leader_and_observe;
    Needs::NotValues =>
        publishing_a_value_without_versioned_values_is_unsupported;
    Needs::NotMonitor =>
        leader_and_observe_without_inspection_are_unsupported;
    Needs::CrossProcess =>
        the_blocking_election_hands_over_and_reports_its_leader
];

const LONG: Duration = Duration::from_secs(10);

/// `value`, or nothing on a store without versioned values (where only an empty value can be
/// published; `publishing_a_value_without_versioned_values_is_unsupported` checks that).
fn value<'a>(locks: &Locks, value: &'a [u8]) -> &'a [u8] {
    if locks.info().capabilities.values {
        value
    } else {
        b""
    }
}

async fn one_leader_at_a_time_across_clients_with_rising_terms(cx: Ctx) -> anyhow::Result<()> {
    let name = cx.name("office");
    let in_office = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(std::sync::Mutex::new(Vec::<FencingToken>::new()));
    let mut tasks = Vec::new();
    for who in 0..3u8 {
        let locks = cx.locks().await?;
        let (name, in_office, terms) = (name.clone(), in_office.clone(), terms.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..4u8 {
                let mine = [who, round];
                let leading = locks.election(&name).campaign(value(&locks, &mine)).await?;
                ensure!(
                    in_office.fetch_add(1, Ordering::SeqCst) == 0,
                    "two leaders at once"
                );
                terms.lock().unwrap().push(leading.term());
                tokio::time::sleep(Duration::from_millis(15)).await;
                in_office.fetch_sub(1, Ordering::SeqCst);
                leading.resign().await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let terms = terms.lock().unwrap().clone();
    ensure!(terms.len() == 12, "{} terms instead of 12", terms.len());
    ensure!(
        terms.windows(2).all(|pair| pair[0] < pair[1]),
        "terms did not rise from leader to leader: {terms:?}"
    );
    Ok(())
}

async fn resign_hands_over_to_the_next_campaigner(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("handover");
    let first = a.election(&name).campaign(value(&a, b"a")).await?;
    let first_term = first.term();
    let election = b.election(&name);
    let mine = value(&b, b"b");
    let next = tokio::spawn(async move { election.campaign(mine).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    ensure!(!next.is_finished(), "a second leader while the first leads");
    expect_err!(
        b.election(&name)
            .wait(Duration::from_millis(50))
            .campaign(value(&b, b"c"))
            .await,
        Error::Timeout { .. }
    );
    first.resign().await?;
    let second = tokio::time::timeout(LONG, next)
        .await
        .context("the waiting campaigner was not elected after the resign")???;
    ensure!(
        second.term() > first_term,
        "term {} after {first_term}",
        second.term()
    );
    ensure!(!second.is_lost() && second.is_owned().await?);
    second.resign().await?;
    Ok(())
}

async fn a_leader_whose_term_runs_out_is_told_with_its_reason(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("expiring");
    let leading = a
        .election(&name)
        .ttl(Duration::from_millis(300))
        .campaign(b"")
        .await?;
    tokio::time::timeout(LONG, leading.lost())
        .await
        .context("the lost signal did not fire after the term's lease ran out")?;
    ensure!(
        leading.lost_reason() == Some(dlock::LostReason::Expired),
        "reason {:?}",
        leading.lost_reason()
    );
    let proclaimed = leading.proclaim(b"late").await;
    if b.info().capabilities.values {
        expect_err!(proclaimed, Error::NotOwned { .. });
    } else {
        expect_err!(proclaimed, Error::Unsupported { .. });
    }
    let next = b.election(&name).wait(LONG).campaign(b"").await?;
    ensure!(next.term() > leading.term(), "the next term is not greater");
    Ok(())
}

async fn cancelling_a_campaign_leaves_nothing_behind(cx: Ctx) -> anyhow::Result<()> {
    let (a, b, c) = (cx.locks().await?, cx.locks().await?, cx.locks().await?);
    let name = cx.name("cancelled");
    let leading = a.election(&name).campaign(value(&a, b"a")).await?;
    let election = b.election(&name);
    let mine = value(&b, b"b");
    let waiting = tokio::spawn(async move { election.campaign(mine).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiting.abort();
    ensure!(waiting.await.is_err_and(|e| e.is_cancelled()));
    leading.resign().await?;
    // Campaigns dropped at every point of their way: waiting, granted, publishing.
    let election = b.election(&name);
    for polls in 0..12 {
        let campaign = election.campaign(value(&b, b"dropped"));
        let _ = drop_after_polls(campaign, polls, Duration::ZERO).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    ensure!(
        b.kept_leases() == 0,
        "a dropped campaign still keeps a lease"
    );
    let next = c
        .election(&name)
        .wait(LONG)
        .campaign(value(&c, b"c"))
        .await
        .context("a cancelled campaign kept the election")?;
    if c.info().capabilities.monitor {
        let now = c.election(&name).leader().await?.context("no leader")?;
        ensure!(now.term == next.term(), "leader {:?}", now.term);
    }
    next.resign().await?;
    Ok(())
}

async fn bad_election_input_gives_a_typed_error_and_no_state(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    expect_err!(
        locks.election("").campaign(b"x").await,
        Error::InvalidName { .. }
    );
    expect_err!(
        locks.election("a\0b").campaign(b"x").await,
        Error::InvalidName { .. }
    );
    expect_err!(locks.election("").leader().await, Error::InvalidName { .. });
    let first = locks.election("").observe().next().await;
    ensure!(
        matches!(first, Some(Err(Error::InvalidName { .. }))),
        "observe of an empty name gave {first:?}"
    );
    // Too long for the record's name beside the lock, though a valid lock name.
    let long = format!("{}/{}", cx.prefix(), "n".repeat(600 - cx.prefix().len()));
    let long = &long[..512];
    expect_err!(
        locks.election(long).campaign(b"x").await,
        Error::InvalidName { .. }
    );
    let name = cx.name("oversize");
    let oversize = vec![7u8; MAX_ELECTION_VALUE_LEN + 1];
    expect_err!(
        locks.election(&name).campaign(&oversize).await,
        Error::InvalidArgument { .. }
    );
    expect_err!(
        locks
            .election(&name)
            .ttl(Duration::ZERO)
            .campaign(b"")
            .await,
        Error::InvalidArgument { .. }
    );
    for free in [long, name.as_str()] {
        let probe = locks.mutex(free).try_acquire().await?;
        ensure!(probe.is_some(), "bad input left the election {free:?} held");
    }
    if locks.info().capabilities.values {
        let record = locks.value(format!("{name}#leader")).get().await?;
        ensure!(record.is_none(), "bad input wrote a record");
    }
    let ok = value(&locks, b"ok");
    let leading = locks.election(&name).campaign(ok).await?;
    expect_err!(
        leading.proclaim(&oversize).await,
        Error::InvalidArgument { .. }
    );
    ensure!(leading.value() == ok);
    Ok(())
}

async fn leader_reports_the_holder_and_nobody_after_resign(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (
        cx.locks().await?.with_label("elector-a")?,
        cx.locks().await?,
    );
    let election = b.election(cx.name("who"));
    ensure!(
        election.leader().await?.is_none(),
        "a leader before any campaign"
    );
    let leading = a.election(election.name()).campaign(b"").await?;
    let now = election
        .leader()
        .await?
        .context("no leader while one leads")?;
    ensure!(now.term == leading.term(), "term {:?}", now.term);
    ensure!(
        now.owner.label.as_deref() == Some("elector-a"),
        "owner {:?}",
        now.owner
    );
    ensure!(now.owner.pid == std::process::id());
    leading.resign().await?;
    ensure!(
        election.leader().await?.is_none(),
        "a leader after the resign"
    );
    Ok(())
}

/// Collects what `observe` reports until `until` holds for an item, or fails after `LONG`.
async fn observe_until(
    stream: &mut dlock::election::LeaderStream,
    seen: &mut Vec<Option<Leader>>,
    until: impl Fn(&Option<Leader>) -> bool,
) -> anyhow::Result<()> {
    tokio::time::timeout(LONG, async {
        while let Some(item) = stream.next().await {
            let item = item?;
            let done = until(&item);
            seen.push(item);
            if done {
                return Ok(());
            }
        }
        anyhow::bail!("the stream ended")
    })
    .await
    .with_context(|| format!("not observed; saw {seen:?}"))?
}

async fn a_broken_leader_is_told_and_never_observed_after(cx: Ctx) -> anyhow::Result<()> {
    let a = cx
        .locks()
        .await?
        .with_watchdog_lease(Duration::from_millis(600))?;
    let (b, c) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("broken");
    let mut stream = c
        .election(&name)
        .observe_interval(Duration::from_millis(20))
        .observe();
    let mut seen = Vec::new();
    let leading = a.election(&name).campaign(b"").await?;
    let old = leading.term();
    observe_until(&mut stream, &mut seen, |l| {
        l.as_ref().is_some_and(|l| l.term == old)
    })
    .await?;
    ensure!(
        b.force_release(&name).await?,
        "the leader's lock was not held"
    );
    let now = b.election(&name).leader().await?;
    ensure!(
        now.is_none_or(|l| l.term != old),
        "leader() reports the broken leader"
    );
    tokio::time::timeout(LONG, leading.lost())
        .await
        .context("the broken leader was not told")?;
    let reason = leading.lost_reason().context("lost without a reason")?;
    ensure!(
        matches!(
            reason,
            dlock::LostReason::Broken
                | dlock::LostReason::RenewalRefused
                | dlock::LostReason::StoreSignal
                | dlock::LostReason::SessionEnded
        ),
        "reason {reason:?}"
    );
    let next = b.election(&name).campaign(b"").await?;
    ensure!(next.term() > old);
    let new = next.term();
    observe_until(&mut stream, &mut seen, |l| {
        l.as_ref().is_some_and(|l| l.term == new)
    })
    .await?;
    let gone = seen
        .iter()
        .position(|l| l.as_ref().is_none_or(|l| l.term != old));
    let after = &seen[gone.context("never saw the broken leader go")?..];
    ensure!(
        after
            .iter()
            .all(|l| l.as_ref().is_none_or(|l| l.term != old)),
        "observe showed the broken leader again: {seen:?}"
    );
    expect_err!(run_after_loss(&leading).await, Error::Lost { .. });
    Ok(())
}

async fn run_after_loss(leading: &dlock::Leadership) -> dlock::Result<()> {
    dlock::run_while_held(leading, std::future::pending()).await
}

async fn observe_reports_every_term_in_rising_order(cx: Ctx) -> anyhow::Result<()> {
    let watcher = cx.locks().await?;
    let name = cx.name("terms");
    let mut stream = watcher
        .election(&name)
        .observe_interval(Duration::from_millis(20))
        .observe();
    let mut seen = Vec::new();
    observe_until(&mut stream, &mut seen, Option::is_none).await?;
    let mut terms = Vec::new();
    for who in 0..3u8 {
        let locks = cx.locks().await?;
        let mine = [who];
        let leading = locks.election(&name).campaign(value(&locks, &mine)).await?;
        let term = leading.term();
        terms.push(term);
        observe_until(&mut stream, &mut seen, |l| {
            l.as_ref().is_some_and(|l| l.term == term)
        })
        .await?;
        leading.resign().await?;
    }
    let observed: Vec<FencingToken> = seen.iter().flatten().map(|l| l.term).collect();
    ensure!(
        observed.windows(2).all(|pair| pair[0] <= pair[1]),
        "observed terms went back: {observed:?}"
    );
    ensure!(
        terms.iter().all(|t| observed.contains(t)),
        "missed a term: {seen:?}"
    );
    Ok(())
}

async fn proclaim_is_visible_to_leader_and_observe(cx: Ctx) -> anyhow::Result<()> {
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let name = cx.name("proclaimed");
    let election = b
        .election(&name)
        .observe_interval(Duration::from_millis(20));
    let mut stream = election.observe();
    let mut seen = Vec::new();
    let leading = a.election(&name).campaign(b"starting").await?;
    let now = election.leader().await?.context("no leader")?;
    ensure!(
        now.value == b"starting" && now.term == leading.term(),
        "{now:?}"
    );
    observe_until(&mut stream, &mut seen, |l| {
        l.as_ref().is_some_and(|l| l.value == b"starting")
    })
    .await?;
    leading.proclaim(b"ready").await?;
    let now = election.leader().await?.context("no leader")?;
    ensure!(
        now.value == b"ready" && now.term == leading.term(),
        "{now:?}"
    );
    observe_until(&mut stream, &mut seen, |l| {
        l.as_ref().is_some_and(|l| l.value == b"ready")
    })
    .await?;
    // A deposed leader's proclaim is refused, and its value never shows for its successor.
    ensure!(b.force_release(&name).await?);
    expect_err!(leading.proclaim(b"stale").await, Error::NotOwned { .. });
    let next = b.election(&name).campaign(b"second").await?;
    let now = election.leader().await?.context("no leader")?;
    ensure!(now.value == b"second" && now.term == next.term(), "{now:?}");
    expect_err!(leading.proclaim(b"stale").await, Error::NotOwned { .. });
    ensure!(election.leader().await?.context("no leader")?.value == b"second");
    Ok(())
}

async fn publishing_a_value_without_versioned_values_is_unsupported(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let name = cx.name("no-values");
    expect_err!(
        locks.election(&name).campaign(b"v").await,
        Error::Unsupported { .. }
    );
    ensure!(
        locks.mutex(&name).try_acquire().await?.is_some(),
        "left held"
    );
    let leading = locks.election(&name).campaign(b"").await?;
    expect_err!(leading.proclaim(b"v").await, Error::Unsupported { .. });
    ensure!(!leading.is_lost());
    Ok(())
}

async fn leader_and_observe_without_inspection_are_unsupported(cx: Ctx) -> anyhow::Result<()> {
    let locks: Locks = cx.locks().await?;
    let election = locks.election(cx.name("blind"));
    expect_err!(election.leader().await, Error::Unsupported { .. });
    let mut stream = election.observe();
    ensure!(matches!(
        stream.next().await,
        Some(Err(Error::Unsupported { .. }))
    ));
    ensure!(
        stream.next().await.is_none(),
        "the stream went on after Unsupported"
    );
    Ok(())
}

/// The blocking facade's election, on a plain thread (it refuses a runtime's threads): the
/// same hand-over, rising terms and leader as the async one; a dropped leadership has resigned
/// when `drop` returns.
async fn the_blocking_election_hands_over_and_reports_its_leader(cx: Ctx) -> anyhow::Result<()> {
    let (url, name) = (cx.url()?, cx.name("blocking"));
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = done.send((|| -> anyhow::Result<()> {
            let a = dlock::blocking::Locks::connect(&url)?;
            let b = dlock::blocking::Locks::connect(&url)?;
            let caps = a.info().capabilities;
            let v =
                |bytes: &'static [u8]| -> &'static [u8] { if caps.values { bytes } else { b"" } };
            let first = a.election(&name).campaign(v(b"a"))?;
            let late = b
                .election(&name)
                .wait(Duration::from_millis(50))
                .campaign(v(b"b"));
            expect_err!(late, Error::Timeout { .. });
            if caps.monitor {
                let now = b.election(&name).leader()?.context("no leader")?;
                ensure!(now.term == first.term() && now.value == v(b"a"), "{now:?}");
                let mut changes = b
                    .election(&name)
                    .observe_interval(Duration::from_millis(20))
                    .observe();
                let seen = changes.next().context("no item")??.context("no leader")?;
                ensure!(seen.term == first.term(), "{seen:?}");
            }
            let first_term = first.term();
            first.resign()?;
            let second = b.election(&name).wait(LONG).campaign(v(b"b"))?;
            ensure!(second.term() > first_term, "the term did not rise");
            if caps.values {
                second.proclaim(b"b2")?;
                ensure!(second.value() == b"b2");
            }
            if caps.monitor && caps.values {
                let now = a.election(&name).leader()?.context("no leader")?;
                ensure!(now.value == b"b2" && now.term == second.term(), "{now:?}");
            }
            drop(second);
            let third = a
                .election(&name)
                .wait(Duration::from_secs(1))
                .campaign(v(b"c"));
            ensure!(
                third.is_ok(),
                "the dropped leadership had not resigned: {third:?}"
            );
            Ok(())
        })());
    });
    result.await.context("the blocking thread panicked")?
}
