//! Counters, count-down latches, barriers and double barriers: no update lost between
//! clients, waiters opened by another client's last step, deadlines kept, a participant gone
//! without leaving not wedging the rest, bad input refused with no state.

use std::time::Duration;

use anyhow::ensure;
use dlock::coordination::MAX_PARTICIPANTS;
use dlock::{Error, Locks};

use super::{Ctx, Needs, cases, drop_after_polls, expect_err};

cases!["coordination",
    Needs::Values =>
        counter_adds_and_compare_and_sets_from_two_clients_lose_no_update,
        an_absent_counter_reads_zero_and_an_overflow_writes_nothing,
        a_latch_opens_for_its_waiters_at_the_last_count_down_in_another_client,
        a_latch_wait_times_out_while_closed_and_leaves_nothing_queued,
        a_double_barrier_lets_nobody_in_before_all_have_entered,
        a_double_barrier_of_three_is_not_wedged_by_a_participant_dropped_without_leaving,
        cancelled_waits_leave_nothing_queued_and_are_not_counted,
        bad_coordination_input_gives_a_typed_error_and_no_state;
    Needs::Any =>
        removing_a_barrier_wakes_its_waiters_in_other_clients;
    Needs::Monitor =>
        a_barrier_removed_by_another_client_wakes_its_waiters;
    Needs::NotValues =>
        counters_latches_and_double_barriers_without_versioned_values_are_unsupported;
    Needs::CrossProcess =>
        the_blocking_primitives_work_across_threads_and_release_on_drop
];

const LONG: Duration = Duration::from_secs(30);

/// A pause long enough for a waiter that should still be blocked to have returned if the
/// primitive let it through wrongly: the check can only fail on a bug, never on a slow store.
const SETTLE: Duration = Duration::from_millis(200);

async fn counter_adds_and_compare_and_sets_from_two_clients_lose_no_update(
    cx: Ctx,
) -> anyhow::Result<()> {
    let name = cx.name("hits");
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let mut tasks = Vec::new();
    for locks in [&a, &b, &a, &b] {
        let counter = locks.counter(&name);
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                counter.add(1).await?;
            }
            // Increments by compare-and-set: each success is one step from the value read.
            let mut won = 0;
            while won < 5 {
                let seen = counter.get().await?;
                if counter.compare_and_set(seen, seen + 1).await? {
                    won += 1;
                }
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let total = a.counter(&name).get().await?;
    ensure!(
        total == 60,
        "4 × (10 adds + 5 CAS steps) made {total}, not 60"
    );
    ensure!(b.counter(&name).add(-60).await? == 0);
    Ok(())
}

async fn an_absent_counter_reads_zero_and_an_overflow_writes_nothing(
    cx: Ctx,
) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let counter = locks.counter(cx.name("edge"));
    ensure!(
        counter.get().await? == 0,
        "a counter never written is not 0"
    );
    ensure!(counter.compare_and_set(0, i64::MAX).await?);
    expect_err!(counter.add(1).await, Error::InvalidArgument { .. });
    ensure!(
        counter.get().await? == i64::MAX,
        "a refused add changed the count"
    );
    ensure!(counter.compare_and_set(i64::MAX, i64::MIN).await?);
    expect_err!(counter.add(-1).await, Error::InvalidArgument { .. });
    ensure!(
        !counter.compare_and_set(0, 1).await?,
        "a stale CAS was taken"
    );
    ensure!(counter.get().await? == i64::MIN);
    Ok(())
}

async fn a_latch_opens_for_its_waiters_at_the_last_count_down_in_another_client(
    cx: Ctx,
) -> anyhow::Result<()> {
    let name = cx.name("started");
    let (a, b, c) = (cx.locks().await?, cx.locks().await?, cx.locks().await?);
    ensure!(a.latch(&name).try_set_count(2).await?);
    ensure!(
        !c.latch(&name).try_set_count(5).await?,
        "a closed latch was set again"
    );
    let waiters: Vec<_> = [&a, &c, &c]
        .into_iter()
        .map(|locks| {
            let latch = locks.latch(&name);
            tokio::spawn(async move { latch.wait(LONG).await })
        })
        .collect();
    ensure!(b.latch(&name).count_down().await? == 1);
    tokio::time::sleep(SETTLE).await;
    ensure!(
        waiters.iter().all(|w| !w.is_finished()),
        "a waiter went on before the count reached zero"
    );
    ensure!(b.latch(&name).count_down().await? == 0);
    for waiter in waiters {
        waiter.await??;
    }
    ensure!(
        b.latch(&name).count_down().await? == 0,
        "an open latch went below zero"
    );
    ensure!(a.latch(&name).count().await? == 0);
    ensure!(
        c.latch(&name).try_set_count(1).await?,
        "an open latch could not be set again"
    );
    Ok(())
}

async fn a_latch_wait_times_out_while_closed_and_leaves_nothing_queued(
    cx: Ctx,
) -> anyhow::Result<()> {
    let name = cx.name("closed");
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    ensure!(a.latch(&name).try_set_count(1).await?);
    let waits = [&a, &b].map(|locks| {
        let latch = locks.latch(&name);
        tokio::spawn(async move { latch.wait(Duration::from_millis(300)).await })
    });
    for wait in waits {
        match wait.await? {
            Err(Error::Timeout {
                name: timed_out, ..
            }) => ensure!(timed_out == name),
            other => anyhow::bail!("a wait on a closed latch ended with {other:?}"),
        }
    }
    ensure!(
        b.latch(&name).count().await? == 1,
        "a timed-out wait changed the count"
    );
    // A waiter's queued attempt that ends at its deadline is cleaned up in the background on
    // some stores: the lock must be free well before a lease would free it, not at once.
    let lease_third = a.watchdog_lease() / 3;
    let gate = a
        .mutex(format!("{name}#latch"))
        .wait(lease_third)
        .acquire()
        .await;
    ensure!(
        gate.is_ok(),
        "a timed-out wait left the waiters' lock held: {gate:?}"
    );
    Ok(())
}

/// `participants` of the double barrier `name` entering from `clients`, each in a task.
fn enter_all(
    clients: &[Locks],
    name: &str,
    participants: u32,
) -> Vec<tokio::task::JoinHandle<dlock::Result<dlock::Inside>>> {
    clients
        .iter()
        .map(|locks| {
            let barrier = locks.double_barrier(name, participants);
            tokio::spawn(async move { barrier.enter(LONG).await })
        })
        .collect()
}

async fn a_double_barrier_lets_nobody_in_before_all_have_entered(cx: Ctx) -> anyhow::Result<()> {
    let name = cx.name("round");
    let clients = [cx.locks().await?, cx.locks().await?];
    let early = enter_all(&clients, &name, 3);
    tokio::time::sleep(SETTLE).await;
    ensure!(
        early.iter().all(|e| !e.is_finished()),
        "a participant went in with 2 of 3 entered"
    );
    let last = cx
        .locks()
        .await?
        .double_barrier(&name, 3)
        .enter(LONG)
        .await?;
    let mut inside = vec![last];
    for entry in early {
        inside.push(entry.await??);
    }
    let leaving: Vec<_> = inside
        .into_iter()
        .map(|one| tokio::spawn(one.leave(LONG)))
        .collect();
    for leave in leaving {
        leave.await??;
    }
    // The round ended: the barrier takes another size now.
    let alone = clients[0].double_barrier(&name, 1).enter(LONG).await?;
    alone.leave(LONG).await?;
    Ok(())
}

async fn a_double_barrier_of_three_is_not_wedged_by_a_participant_dropped_without_leaving(
    cx: Ctx,
) -> anyhow::Result<()> {
    let name = cx.name("crash");
    let clients = [cx.locks().await?, cx.locks().await?];
    let entries = enter_all(&clients, &name, 3);
    // The third holds its presence with a fixed lease, then "crashes": it never leaves, never
    // releases and never renews.
    let doomed = cx.locks().await?;
    let crashed = doomed
        .double_barrier(&name, 3)
        .ttl(Duration::from_secs(3))
        .enter(LONG)
        .await?;
    std::mem::forget(crashed);
    let mut inside = Vec::new();
    for entry in entries {
        inside.push(entry.await??);
    }
    let leaving: Vec<_> = inside
        .into_iter()
        .map(|one| tokio::spawn(one.leave(LONG)))
        .collect();
    for leave in leaving {
        leave.await??;
    }
    let alone = clients[1].double_barrier(&name, 1).enter(LONG).await?;
    alone.leave(LONG).await?;
    Ok(())
}

async fn cancelled_waits_leave_nothing_queued_and_are_not_counted(cx: Ctx) -> anyhow::Result<()> {
    let name = cx.name("cancelled");
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    ensure!(a.latch(&name).try_set_count(1).await?);
    let latch = a.latch(&name);
    let cut = drop_after_polls(latch.wait(LONG), 50, Duration::from_millis(2)).await;
    ensure!(cut.is_none(), "a wait on a closed latch finished: {cut:?}");
    let lease_third = a.watchdog_lease() / 3;
    let gate = b
        .mutex(format!("{name}#latch"))
        .wait(lease_third)
        .acquire()
        .await;
    ensure!(
        gate.is_ok(),
        "a cancelled wait left the waiters' lock held: {gate:?}"
    );
    drop(gate);
    // A participant whose entry was cancelled is not counted: with it, the next entry would
    // complete a round of 2 on its own.
    let barrier = a.double_barrier(&name, 2);
    let cut = drop_after_polls(barrier.enter(LONG), 50, Duration::from_millis(2)).await;
    ensure!(cut.is_none(), "an entry into a barrier of 2 went in alone");
    // A dropped guard is released in the background: its presence must be freed well before
    // its lease would free it. (An entry probing at the very instant of a drop may still see
    // it present, as it may see a participant that crashes an instant later.)
    // Read twice: a registration in flight at the drop may land a moment after it.
    for _ in 0..2 {
        let members = a.value(format!("{name}#members")).get().await?;
        let text = members.map(|m| String::from_utf8_lossy(&m.value).into_owned());
        for id in text.iter().flat_map(|text| text.lines().skip(1)) {
            let presence = b.mutex(format!("{name}#member-{id}"));
            let freed = presence.wait(lease_third).acquire().await;
            ensure!(
                freed.is_ok(),
                "a cancelled entry kept its presence: {freed:?}"
            );
        }
        tokio::time::sleep(SETTLE).await;
    }
    let second = enter_all(std::slice::from_ref(&b), &name, 2);
    tokio::time::sleep(SETTLE).await;
    ensure!(
        second.iter().all(|e| !e.is_finished()),
        "a cancelled entry was counted"
    );
    let third = a.double_barrier(&name, 2).enter(LONG).await?;
    let mut inside = vec![third];
    for entry in second {
        inside.push(entry.await??);
    }
    for one in inside {
        drop(one);
    }
    Ok(())
}

async fn removing_a_barrier_wakes_its_waiters_in_other_clients(cx: Ctx) -> anyhow::Result<()> {
    let name = cx.name("deploy");
    let (a, b, c) = (cx.locks().await?, cx.locks().await?, cx.locks().await?);
    let raised = a.barrier(&name).set(LONG).await?;
    match b.barrier(&name).wait_on(Duration::from_millis(200)).await {
        Err(Error::Timeout {
            name: timed_out, ..
        }) => ensure!(timed_out == name),
        other => anyhow::bail!("waiting on a raised barrier ended with {other:?}"),
    }
    let waiters: Vec<_> = [&b, &c, &c]
        .into_iter()
        .map(|locks| {
            let barrier = locks.barrier(&name);
            tokio::spawn(async move { barrier.wait_on(LONG).await })
        })
        .collect();
    tokio::time::sleep(SETTLE).await;
    ensure!(
        waiters.iter().all(|w| !w.is_finished()),
        "a waiter passed a raised barrier"
    );
    raised.remove().await?;
    for waiter in waiters {
        waiter.await??;
    }
    // Down again: set and wait work as before.
    b.barrier(&name).wait_on(LONG).await?;
    c.barrier(&name).set(LONG).await?.remove().await?;
    Ok(())
}

async fn a_barrier_removed_by_another_client_wakes_its_waiters(cx: Ctx) -> anyhow::Result<()> {
    let name = cx.name("maintenance");
    let (a, b) = (cx.locks().await?, cx.locks().await?);
    let raised = a.barrier(&name).set(LONG).await?;
    let waiter = {
        let barrier = a.barrier(&name);
        tokio::spawn(async move { barrier.wait_on(LONG).await })
    };
    ensure!(
        b.barrier(&name).remove().await?,
        "a raised barrier was not standing"
    );
    waiter.await??;
    ensure!(
        !b.barrier(&name).remove().await?,
        "a removed barrier still stood"
    );
    drop(raised);
    Ok(())
}

async fn bad_coordination_input_gives_a_typed_error_and_no_state(cx: Ctx) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let name = cx.name("bad");
    for bad in ["", "a\0b"] {
        expect_err!(locks.counter(bad).add(1).await, Error::InvalidName { .. });
        expect_err!(locks.latch(bad).count().await, Error::InvalidName { .. });
        expect_err!(
            locks.barrier(bad).wait_on(LONG).await,
            Error::InvalidName { .. }
        );
        let barrier = locks.double_barrier(bad, 2);
        expect_err!(barrier.enter(LONG).await, Error::InvalidName { .. });
    }
    // A valid lock name too long for the names kept beside it.
    let long = format!("{}/{}", cx.prefix(), "n".repeat(600));
    let long = &long[..510];
    expect_err!(
        locks.latch(long).try_set_count(1).await,
        Error::InvalidName { .. }
    );
    expect_err!(
        locks.barrier(long).set(LONG).await,
        Error::InvalidName { .. }
    );
    let barrier = locks.double_barrier(long, 2);
    expect_err!(barrier.enter(LONG).await, Error::InvalidName { .. });
    let latch = locks.latch(&name);
    for count in [0, u64::MAX] {
        expect_err!(
            latch.try_set_count(count).await,
            Error::InvalidArgument { .. }
        );
    }
    let zero_poll = latch.clone().poll_interval(Duration::ZERO);
    expect_err!(zero_poll.wait(LONG).await, Error::InvalidArgument { .. });
    expect_err!(
        latch.wait(Duration::MAX).await,
        Error::InvalidArgument { .. }
    );
    for size in [0, MAX_PARTICIPANTS + 1] {
        let barrier = locks.double_barrier(&name, size);
        expect_err!(barrier.enter(LONG).await, Error::InvalidArgument { .. });
    }
    let zero_ttl = locks.double_barrier(&name, 2).ttl(Duration::ZERO);
    expect_err!(zero_ttl.enter(LONG).await, Error::InvalidArgument { .. });
    let zero_ttl = locks.barrier(&name).ttl(Duration::ZERO);
    expect_err!(zero_ttl.set(LONG).await, Error::InvalidArgument { .. });
    for value in ["#latch", "#members"] {
        let left = locks.value(format!("{name}{value}")).get().await?;
        ensure!(left.is_none(), "bad input wrote {name}{value}");
    }
    for lock in ["#latch", "#entry", "#barrier"] {
        let free = locks.mutex(format!("{name}{lock}")).try_acquire().await?;
        ensure!(free.is_some(), "bad input left {name}{lock} held");
    }
    negative_and_mismatched_sizes_are_refused(&cx, &locks).await
}

/// A latch whose count was written negative by hand, and a participant whose size differs
/// from the registered ones', are refused with typed errors; the refused one is not counted.
async fn negative_and_mismatched_sizes_are_refused(cx: &Ctx, locks: &Locks) -> anyhow::Result<()> {
    let name = cx.name("negative");
    locks.value(format!("{name}#latch")).set(b"-3").await?;
    let latch = locks.latch(&name);
    expect_err!(latch.count().await, Error::WrongType { .. });
    expect_err!(latch.count_down().await, Error::WrongType { .. });
    expect_err!(latch.try_set_count(1).await, Error::WrongType { .. });
    let name = cx.name("sizes");
    let waiting = enter_all(std::slice::from_ref(locks), &name, 3);
    tokio::time::sleep(SETTLE).await;
    let other = cx.locks().await?;
    let wrong = other.double_barrier(&name, 2).enter(LONG).await;
    expect_err!(wrong, Error::InvalidArgument { .. });
    // The refused participant was not counted: two more of the right size complete it.
    let late = enter_all(&[other.clone(), other], &name, 3);
    for entry in waiting.into_iter().chain(late) {
        drop(entry.await??);
    }
    Ok(())
}

async fn counters_latches_and_double_barriers_without_versioned_values_are_unsupported(
    cx: Ctx,
) -> anyhow::Result<()> {
    let locks = cx.locks().await?;
    let name = cx.name("none");
    expect_err!(locks.counter(&name).get().await, Error::Unsupported { .. });
    expect_err!(locks.counter(&name).add(1).await, Error::Unsupported { .. });
    expect_err!(
        locks.latch(&name).try_set_count(1).await,
        Error::Unsupported { .. }
    );
    expect_err!(
        locks.latch(&name).wait(LONG).await,
        Error::Unsupported { .. }
    );
    let barrier = locks.double_barrier(&name, 2);
    expect_err!(barrier.enter(LONG).await, Error::Unsupported { .. });
    let free = locks.mutex(format!("{name}#entry")).try_acquire().await?;
    ensure!(free.is_some(), "an unsupported entry left a lock held");
    // The plain barrier needs only locks.
    locks.barrier(&name).set(LONG).await?.remove().await?;
    Ok(())
}

/// Runs `work` on a plain thread (the blocking facade refuses a runtime's threads) and waits
/// for it without blocking the case's runtime.
async fn on_plain_thread<T: Send + 'static>(
    work: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let (done, result) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = done.send(work());
    });
    result.await?
}

async fn the_blocking_primitives_work_across_threads_and_release_on_drop(
    cx: Ctx,
) -> anyhow::Result<()> {
    let (url, name) = (cx.url()?, cx.name("blocking"));
    let locks = cx.locks().await?;
    let values = locks.info().capabilities.values;
    let raised = {
        let (url, name) = (url.clone(), name.clone());
        on_plain_thread(move || {
            let blocking = dlock::blocking::Locks::connect(&url)?;
            let raised = blocking.barrier(&name).set(LONG)?;
            expect_err!(
                blocking.barrier(&name).wait_on(Duration::from_millis(50)),
                Error::Timeout { .. }
            );
            drop(raised);
            // Dropped on a plain thread: released by the drop, not left for its lease (a
            // loaded machine may still be finishing the release when the drop returns).
            let free = blocking
                .mutex(format!("{name}#barrier"))
                .wait(LONG / 3)
                .try_acquire()?;
            ensure!(
                free.is_some(),
                "a dropped blocking barrier guard still stood"
            );
            drop(free);
            blocking.barrier(&name).wait_on(LONG)?;
            if !values {
                let barrier = blocking.double_barrier(&name, 2);
                expect_err!(barrier.enter(LONG), Error::Unsupported { .. });
                expect_err!(blocking.latch(&name).count(), Error::Unsupported { .. });
                return Ok(false);
            }
            ensure!(blocking.counter(&name).add(2)? == 2);
            ensure!(blocking.latch(&name).try_set_count(1)?);
            Ok(true)
        })
        .await?
    };
    if !raised {
        return Ok(());
    }
    // A blocking waiter opened by this client's count-down, and a blocking participant that
    // drops out without leaving: the async partner's leave is not wedged.
    let partner = locks.double_barrier(&name, 2);
    let partner = tokio::spawn(async move { partner.enter(LONG).await });
    let blocking = {
        let (url, name) = (url.clone(), name.clone());
        on_plain_thread(move || {
            let blocking = dlock::blocking::Locks::connect(&url)?;
            let inside = blocking.double_barrier(&name, 2).enter(LONG)?;
            blocking.latch(&name).wait(LONG)?;
            drop(inside);
            Ok(())
        })
    };
    let opener = locks.latch(&name);
    let (waited, counted) = tokio::join!(blocking, async {
        tokio::time::sleep(SETTLE).await;
        opener.count_down().await
    });
    ensure!(counted? == 0);
    waited?;
    // Within a third of a lease: a participant dropped on a plain thread has left when the
    // drop returns; one left to its lease would not be gone yet.
    let lease_third = locks.watchdog_lease() / 3;
    partner.await??.leave(lease_third).await?;
    ensure!(locks.counter(&name).get().await? == 2);
    Ok(())
}
